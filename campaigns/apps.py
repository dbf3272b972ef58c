from django.apps import AppConfig
from django.db.models.signals import post_save


class CampaignsConfig(AppConfig):
    name = "campaigns"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from campaigns import dispatch, tasks
        from campaigns.signals import node_back_to_active
        from inventory.models import Node

        dispatch.advance.connect(tasks.campaign_advance_later)
        post_save.connect(node_back_to_active, sender=Node, dispatch_uid="campaigns-node-back-to-active")
