"""The unmanaged FairQueue model: no table, only its content type and permissions."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="FairQueue",
            fields=[("id", models.AutoField(auto_created=True, primary_key=True,
                                            serialize=False, verbose_name="ID"))],
            options={"verbose_name": "fair queue", "verbose_name_plural": "fair queues",
                     "managed": False, "default_permissions": ("view", "change")},
        ),
    ]
