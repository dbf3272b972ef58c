from django.db import migrations, models


def drop_duplicates(apps, schema_editor):
    """Results stored twice by concurrent collects (before the constraint): keep the first of each."""
    schema_editor.execute(
        "DELETE FROM campaigns_result WHERE id NOT IN "
        "(SELECT MIN(id) FROM campaigns_result GROUP BY run_id, name, host, labels)"
    )


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0013_run_step_lease'),
    ]

    operations = [
        migrations.RunPython(drop_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='result',
            constraint=models.UniqueConstraint(fields=('run', 'name', 'host', 'labels'), name='result_unique'),
        ),
    ]
