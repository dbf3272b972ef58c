"""Reads of the inventory used by views and the API."""

from __future__ import annotations

from django.db.models import QuerySet

from inventory.models import Node, StorageSystem


def node_list(*, status: str | None = None, tag: str | None = None, gpu_model: str | None = None) -> QuerySet[Node]:
    nodes = Node.objects.select_related("site", "credential").prefetch_related("tags")
    if status:
        nodes = nodes.filter(status=status)
    if tag:
        nodes = nodes.filter(tags__name=tag)  # tag names are unique: the join cannot duplicate a node
    if gpu_model:
        nodes = nodes.filter(gpu_model=gpu_model)
    return nodes


def storage_list() -> QuerySet[StorageSystem]:
    return StorageSystem.objects.select_related("site", "admin_credential")
