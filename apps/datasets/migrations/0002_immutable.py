from django.db import migrations

from apps.core.immutability import MakeImmutable


class Migration(migrations.Migration):
    dependencies = [("datasets", "0001_initial")]
    operations = [
        MakeImmutable("datasets_taskversion"),
        MakeImmutable("datasets_datasetversion"),
        MakeImmutable("datasets_datasetversiontask"),
    ]
