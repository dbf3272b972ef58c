"""Inventory pages: nodes (with filters), one node with its facts, storage systems."""

from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from accounts.selectors import visible
from inventory import selectors
from inventory.models import Node, NodeStatus, Tag

NODE_FILTERS = ("status", "tag", "gpu_model")


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    filters = {key: request.GET.get(key, "").strip() for key in NODE_FILTERS}
    context = {
        "nodes": visible(selectors.node_list(**filters), request=request),
        "filters": filters,
        "filtered": any(filters.values()),
        "statuses": NodeStatus.choices,
        "tags": Tag.objects.filter(nodes__isnull=False).distinct(),
        "gpu_models": Node.objects.exclude(gpu_model="")
        .order_by("gpu_model")
        .values_list("gpu_model", flat=True)
        .distinct(),
    }
    return render(request, "inventory/node_list.html", context)


@login_required
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(visible(selectors.node_list(), request=request), pk=pk)
    context = {
        "node": node,
        "interfaces": node.interfaces.all(),
        "campaigns": visible(node.campaigns.order_by("-created_at"), request=request)[:20],
        "facts_json": json.dumps(node.facts, indent=2, sort_keys=True),
    }
    return render(request, "inventory/node_detail.html", context)


@login_required
def storage_list(request: HttpRequest) -> HttpResponse:
    return render(
        request, "inventory/storage_list.html", {"systems": visible(selectors.storage_list(), request=request)}
    )
