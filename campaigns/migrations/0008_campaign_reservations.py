"""Campaign-level node reservations (schema, part 1): the reserved nodes, the queue, leases held by campaigns."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0007_teams_baselines_verdicts'),
        ('inventory', '0002_teams'),
    ]

    operations = [
        migrations.AddField(
            model_name='campaign',
            name='reserved_nodes',
            field=models.ManyToManyField(blank=True, help_text='the nodes its runs use (held while it runs)', related_name='reserving_campaigns', to='inventory.node'),
        ),
        migrations.AddField(
            model_name='campaign',
            name='waiting_since',
            field=models.DateTimeField(blank=True, db_index=True, help_text='in the queue for its nodes since; empty once it holds them', null=True),
        ),
        migrations.AddField(
            model_name='nodelease',
            name='campaign',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='leases', to='campaigns.campaign'),
        ),
    ]
