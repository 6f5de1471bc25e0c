from django.db import migrations

from apps.core.immutability import MakeImmutable


class Migration(migrations.Migration):
    dependencies = [("profiles", "0001_initial")]
    operations = [
        MakeImmutable("profiles_profileversion"),
    ]
