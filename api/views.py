"""Read-only resources and the campaign actions. Every error answers {"message": ..., "extra": {...}}."""

from __future__ import annotations

from django.db.models import F, QuerySet
from django.shortcuts import get_object_or_404
from rest_framework import viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api import serializers
from campaigns import selectors, services
from campaigns.models import Campaign, Result, Run
from inventory import selectors as inventory_selectors
from inventory.models import Node


def int_param(request: Request, name: str) -> int | None:
    """An optional whole-number query parameter; a bad value is a 400 naming it."""
    value = request.query_params.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValidationError({name: [f"must be a whole number, got {value!r}"]}) from None


class NodeViewSet(viewsets.ReadOnlyModelViewSet):
    """Nodes; ``?status=``, ``?tag=`` and ``?gpu_model=`` narrow them."""

    serializer_class = serializers.NodeSerializer

    def get_queryset(self) -> QuerySet[Node]:
        params = self.request.query_params
        return inventory_selectors.node_list(**{key: params.get(key) for key in ("status", "tag", "gpu_model")})


class StorageSystemViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = inventory_selectors.storage_list()
    serializer_class = serializers.StorageSystemSerializer


def campaigns_queryset() -> QuerySet[Campaign]:
    return selectors.campaign_list().select_related("storage", "owner").prefetch_related("nodes", "node_tags")


class CampaignViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = serializers.CampaignSerializer

    def get_queryset(self) -> QuerySet[Campaign]:
        return campaigns_queryset()


class RunViewSet(viewsets.ReadOnlyModelViewSet):
    """Runs; ``?campaign=<id>`` keeps one campaign's."""

    serializer_class = serializers.RunSerializer

    def get_queryset(self) -> QuerySet[Run]:
        runs = Run.objects.prefetch_related("hosts").order_by("campaign_id", "sequence")
        campaign = int_param(self.request, "campaign")
        return runs if campaign is None else runs.filter(campaign_id=campaign)


class ResultViewSet(viewsets.ReadOnlyModelViewSet):
    """Results; ``?campaign=<id>`` and ``?name=<metric>`` narrow them."""

    serializer_class = serializers.ResultSerializer

    def get_queryset(self) -> QuerySet[Result]:
        results = Result.objects.annotate(campaign_id=F("run__campaign_id")).order_by("run_id", "name", "host", "id")
        campaign = int_param(self.request, "campaign")
        if campaign is not None:
            results = results.filter(run__campaign_id=campaign)
        name = self.request.query_params.get("name")
        return results.filter(name=name) if name else results


class CampaignActionView(APIView):
    """POST /campaigns/<id>/<action>/: 409 for an invalid state transition, 400 for another refusal."""

    def post(self, request: Request, pk: int) -> Response:
        campaign = get_object_or_404(Campaign, pk=pk)
        try:
            self.act(request, campaign)
        except services.CampaignError as exc:
            extra = {"field": exc.field} if exc.field else {}
            return Response({"message": exc.message, "extra": extra}, status=409 if exc.conflict else 400)
        data = serializers.CampaignSerializer(campaigns_queryset().get(pk=pk)).data
        return Response(data)

    def act(self, request: Request, campaign: Campaign) -> None:
        raise NotImplementedError


class CampaignLaunchView(CampaignActionView):
    def act(self, request: Request, campaign: Campaign) -> None:
        services.campaign_launch(campaign=campaign, user=request.user)


class CampaignCancelView(CampaignActionView):
    def act(self, request: Request, campaign: Campaign) -> None:
        services.campaign_cancel(campaign=campaign)
