"""Campaign-level node reservations (schema, part 2): a lease belongs to a campaign, no longer to a run."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0009_campaign_reservations_data'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='nodelease',
            name='run',
        ),
        migrations.AlterField(
            model_name='nodelease',
            name='campaign',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='leases', to='campaigns.campaign'),
        ),
    ]
