"""The staged payload is compressed with lz4 rather than PostgreSQL's default pglz.

A staged call's payload holds its request as JSON text: about 270 KB at a 100K-token
Claude Code prompt, written once per call before the answer completes. lz4 stores it in
under half the time pglz takes (2.2 ms against 5.1 ms per row here) and a little smaller.
PostgreSQL 14 and later, built with lz4 (Debian's and the official images are); a server
without it, and any other database, keeps its default.
"""

from django.db import migrations


def payload_lz4(apps, schema_editor) -> None:
    connection = schema_editor.connection
    if connection.vendor != "postgresql" or connection.pg_version < 140000:
        return
    schema_editor.execute(
        """
        DO $$ BEGIN
            ALTER TABLE proxy_interaction ALTER COLUMN payload SET COMPRESSION lz4;
        EXCEPTION WHEN feature_not_supported THEN NULL;
        END $$;
        """
    )


def payload_default(apps, schema_editor) -> None:
    connection = schema_editor.connection
    if connection.vendor == "postgresql" and connection.pg_version >= 140000:
        schema_editor.execute("ALTER TABLE proxy_interaction ALTER COLUMN payload SET COMPRESSION default")


class Migration(migrations.Migration):
    dependencies = [("proxy", "0005_harness_check")]

    operations = [migrations.RunPython(payload_lz4, payload_default)]
