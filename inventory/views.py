"""Inventory pages: nodes (with filters), one node with its facts (and a button to collect them), storage systems."""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from accounts.selectors import visible
from inventory import selectors, services
from inventory.filters import NodeFilter
from inventory.models import Node


@login_required
def node_list(request: HttpRequest) -> HttpResponse:
    nodes = NodeFilter(request.GET or None, queryset=visible(selectors.node_list(), request=request))
    filtered = any(request.GET.get(key) for key in nodes.filters)
    return render(request, "inventory/node_list.html", {"filter": nodes, "nodes": nodes.qs, "filtered": filtered})


@login_required
def node_detail(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(visible(selectors.node_list(), request=request), pk=pk)
    context = {
        "node": node,
        "interfaces": node.interfaces.all(),
        "campaigns": visible(node.campaigns.order_by("-created_at"), request=request)[:20],
        "facts_json": json.dumps(node.facts, indent=2, sort_keys=True),
        "can_change": selectors.inventory_can_change(user=request.user, obj=node),
    }
    return render(request, "inventory/node_detail.html", context)


@login_required
@require_POST
def node_collect_facts(request: HttpRequest, pk: int) -> HttpResponse:
    node = get_object_or_404(visible(Node.objects.all(), request=request), pk=pk)
    if not selectors.inventory_can_change(user=request.user, obj=node):
        who = "staff" if node.team_id is None else f"staff or a member of team {node.team}"
        messages.error(request, f"Only {who} may collect the facts of {node.name}.")
    else:
        services.node_collect_facts(node_ids=[node.pk])
        messages.success(request, f"Collecting the facts of {node.name}: reload this page in a few seconds.")
    return redirect("inventory:node-detail", pk=node.pk)


@login_required
def storage_list(request: HttpRequest) -> HttpResponse:
    return render(
        request, "inventory/storage_list.html", {"systems": visible(selectors.storage_list(), request=request)}
    )
