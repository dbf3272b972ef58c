"""Campaign-level node reservations (data): running campaigns reserve the nodes of their runs.

A run's lease becomes its campaign's. Every running campaign joins the queue in launch order for the nodes of
its runs; one that already holds some of them keeps them while its run goes on, and takes the rest (or gives
them back, if it must wait) the next time it advances.
"""

from django.db import migrations


def forwards(apps, schema_editor):
    Campaign = apps.get_model('campaigns', 'Campaign')
    NodeLease = apps.get_model('campaigns', 'NodeLease')
    RunHost = apps.get_model('campaigns', 'RunHost')
    for lease in NodeLease.objects.select_related('run'):
        lease.campaign_id = lease.run.campaign_id
        lease.save(update_fields=['campaign'])
    for campaign in Campaign.objects.filter(status='running').order_by('launched_at', 'pk'):
        nodes = RunHost.objects.filter(run__campaign=campaign).exclude(node=None).values_list('node_id', flat=True)
        campaign.reserved_nodes.set(set(nodes))
        campaign.waiting_since = campaign.launched_at or campaign.created_at
        campaign.save(update_fields=['waiting_since'])


class Migration(migrations.Migration):

    dependencies = [
        ('campaigns', '0008_campaign_reservations'),
    ]

    operations = [
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
