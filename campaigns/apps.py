from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_save


def sqlite_median(sender: Any, connection: Any, **kwargs: Any) -> None:
    """SQLite, the embedded default, gets the median aggregate the analysis pages ask the database for."""
    if connection.vendor == "sqlite":
        from campaigns.baselines import SQLiteMedian

        connection.connection.create_aggregate(SQLiteMedian.NAME, 1, SQLiteMedian)


class CampaignsConfig(AppConfig):
    name = "campaigns"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from campaigns import dispatch, tasks
        from campaigns.signals import node_back_to_active
        from inventory.models import Node

        dispatch.advance.connect(tasks.campaign_advance_later)
        post_save.connect(node_back_to_active, sender=Node, dispatch_uid="campaigns-node-back-to-active")
        connection_created.connect(sqlite_median, dispatch_uid="campaigns-sqlite-median")
