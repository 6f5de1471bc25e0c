from django.db import migrations

from apps.core.immutability import MakeImmutable


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]
    operations = [
        MakeImmutable("runs_runspec"),
    ]
