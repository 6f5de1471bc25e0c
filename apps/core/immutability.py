"""Database-level immutability for published records (profile versions, run specs, ...).

A migration operation that installs triggers refusing UPDATE (and on PostgreSQL also
DELETE; TRUNCATE, used by test flushes and deliberate purges, is not affected) so that
no code path, bulk update or admin can change a record that others pinned by digest.
"""

from __future__ import annotations

from django.db import migrations


def _sql(vendor: str, table: str) -> tuple[list[str], list[str]]:
    name = f"{table}_immutable"
    if vendor == "postgresql":
        forward = [
            f"""
            CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION '%% of %%: published records are immutable', TG_OP, TG_TABLE_NAME
                    USING ERRCODE = 'integrity_constraint_violation';
            END;
            $$ LANGUAGE plpgsql;
            """,
            f"CREATE TRIGGER {name} BEFORE UPDATE OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION {name}();",
        ]
        backward = [
            f"DROP TRIGGER IF EXISTS {name} ON {table};",
            f"DROP FUNCTION IF EXISTS {name}();",
        ]
        return forward, backward
    if vendor == "sqlite":
        forward = [
            f"""
            CREATE TRIGGER {name} BEFORE UPDATE ON {table}
            BEGIN SELECT RAISE(ABORT, 'UPDATE of {table}: published records are immutable'); END;
            """
        ]
        return forward, [f"DROP TRIGGER IF EXISTS {name};"]
    return [], []


class MakeImmutable(migrations.operations.base.Operation):
    reduces_to_sql = True
    reversible = True

    def __init__(self, table: str) -> None:
        self.table = table

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        for statement in _sql(schema_editor.connection.vendor, self.table)[0]:
            schema_editor.execute(statement)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        for statement in _sql(schema_editor.connection.vendor, self.table)[1]:
            schema_editor.execute(statement)

    def describe(self) -> str:
        return f"Make {self.table} immutable"

    def deconstruct(self):
        return (self.__class__.__qualname__, [self.table], {})
