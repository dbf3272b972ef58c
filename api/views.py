"""Resources (viewsets with filtersets) and actions (small views calling services).

Every queryset goes through the request's scope (accounts.selectors): another team's objects are not found
(404), never forbidden. Services raise their own errors; api.errors turns them into the one error shape.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Team
from accounts.selectors import Scope, may_share, scope_for
from analysis import fleet, health
from analysis import selectors as analysis_selectors
from api import filters, serializers
from api.errors import error
from api.models import IdempotentRequest
from api.pagination import StrictCursorPagination
from api.permissions import InventoryChangePermission, inventory_check_create
from api.renderers import CSVRenderer
from campaigns import baselines, selectors, services, suites
from campaigns.models import Baseline, Campaign, CampaignStatus, Result, Run, Verdict
from campaigns.presets import preset_get, preset_list
from campaigns.spec import SpecError, load_yaml
from inventory import selectors as inventory_selectors
from inventory.models import Credential, Interface, Node, StorageSystem
from inventory.services import storage_commands, storage_commands_audit
from telemetry import selectors as telemetry_selectors
from telemetry.models import Series

SERIES_POINTS = 2000  # a telemetry window's points by default: about a chart's width in pixels, twice
SERIES_MAX_POINTS = 1_000_000


# JSON (and the browsable API) plus CSV: the endpoints a pipeline exports from (``?format=csv``)
EXPORTS: list[type[BaseRenderer]] = [JSONRenderer, BrowsableAPIRenderer, CSVRenderer]


def verdict_rows(verdict: dict[str, Any]) -> list[dict[str, Any]]:
    """A verdict as CSV rows: one per item (point and metric), led by the verdict it belongs to."""
    head = {"verdict": verdict.get("id"), "campaign": verdict.get("campaign"),
            "baseline_campaign": (verdict.get("baseline_campaign") or {}).get("id"),
            "verdict_outcome": verdict.get("outcome")}  # fmt: skip
    return [{**head, **item, **_judged_values(item)} for item in verdict.get("items") or []]


def _judged_values(item: dict[str, Any]) -> dict[str, Any]:
    """Each side's number by the statistic the item was judged by (older verdicts: the mean)."""
    statistic = item.get("statistic") or "mean"
    return {f"{side}_value": (item.get(side) or {}).get(statistic) for side in ("baseline", "candidate")}


class ScopedMixin:
    """Views that see through the request's scope (built once per request by ``scope_for``). Errors are always
    the one JSON shape, whatever format was asked for (a CSV export's 404 is JSON, as documented)."""

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)  # type: ignore[misc]
        failed = isinstance(response, Response) and response.status_code >= 400
        if failed and not isinstance(response.accepted_renderer, JSONRenderer):
            response.accepted_renderer = JSONRenderer()
            response.accepted_media_type = "application/json"
        return response

    @property
    def scope(self) -> Scope:
        return scope_for(self.request)  # type: ignore[attr-defined]

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "scope": self.scope}  # type: ignore[misc]


class InventoryGuard(ScopedMixin):
    """Nodes and storage systems: seen through the scope, changed by whom ``inventory_can_change`` names."""

    def get_permissions(self) -> list[BasePermission]:
        return [*super().get_permissions(), InventoryChangePermission()]  # type: ignore[misc]

    def perform_create(self, serializer: Any) -> None:
        """A new node or storage system goes in the caller's team (``team`` names one when it has several)."""
        team = team_for_new(self.scope, self.request.data.get("team"))  # type: ignore[attr-defined]
        obj = serializer.Meta.model(team=team)
        inventory_check_create(user=self.request.user, obj=obj)  # type: ignore[attr-defined]
        self.check_sensitive(serializer, obj)
        self.audited(serializer, lambda: serializer.save(team=team), {})

    def perform_update(self, serializer: Any) -> None:
        self.check_sensitive(serializer, serializer.instance)
        before = storage_commands(serializer.instance) if isinstance(serializer.instance, StorageSystem) else {}
        self.audited(serializer, serializer.save, before)

    def check_sensitive(self, serializer: Any, obj: Node | StorageSystem) -> None:
        """A credential of another team is refused; a storage system's commands are set only by whom
        ``storage_can_set_commands`` names."""
        data = serializer.validated_data
        credential = data.get("credential") or data.get("admin_credential")
        if credential is not None and credential.team_id not in (None, obj.team_id):
            field = "credential" if "credential" in data else "admin_credential"
            raise ValidationError({field: [f"credential {credential.name} belongs to another team"]})
        if isinstance(obj, StorageSystem):
            changed = [f for f in ("flush_command", "stats_command") if f in data and data[f] != getattr(obj, f)]
            if changed and not inventory_selectors.storage_can_set_commands(user=self.request.user, storage=obj):  # type: ignore[attr-defined]
                raise PermissionDenied(
                    f"{', '.join(changed)}: only staff or an admin of the storage system's team set the commands "
                    "it runs"
                )

    def audited(self, serializer: Any, save: Any, before: dict[str, str]) -> None:
        with transaction.atomic():
            save()
            if isinstance(serializer.instance, StorageSystem):
                storage_commands_audit(storage=serializer.instance, before=before, user=self.request.user)  # type: ignore[attr-defined]


def team_for_new(scope: Scope, name: str | None) -> Team | None:
    """Where a new object goes: the named team (one of the caller's), else the caller's only team."""
    if name:
        teams = Team.objects.filter(name=name)
        if scope.team_ids is not None:
            teams = teams.filter(pk__in=scope.team_ids)
        team = teams.first()
        if team is None:
            raise ValidationError({"team": [f"you are not a member of a team named {name!r}"]})
        return team
    team = scope.team
    if team is None and scope.team_ids:
        raise ValidationError({"team": ["you belong to several teams: say which one"]})
    return team


class NodeViewSet(InventoryGuard, viewsets.ModelViewSet):
    """Compute nodes. Filters: ``status``, ``role``, ``tag``, ``gpu_model``, ``site``, ``name``."""

    serializer_class = serializers.NodeSerializer
    filterset_class = filters.NodeFilter

    def get_queryset(self) -> QuerySet[Node]:
        return self.scope.filter(inventory_selectors.node_list()).order_by("name")

    def perform_destroy(self, instance: Node) -> None:
        if hasattr(instance, "lease"):
            raise services.CampaignError(f"node {instance.name} is in use by a running campaign", conflict=True)
        instance.delete()


class InterfaceViewSet(ScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Network interfaces found by fact collection. Filters: ``node`` (name), ``role``."""

    serializer_class = serializers.InterfaceSerializer
    filterset_class = filters.InterfaceFilter

    def get_queryset(self) -> QuerySet[Interface]:
        return self.scope.filter(Interface.objects.select_related("node"), "node__team").order_by("node__name", "name")


class CredentialViewSet(ScopedMixin, viewsets.ReadOnlyModelViewSet):
    """SSH identities: name, user and public half; the private key never leaves the server."""

    serializer_class = serializers.CredentialSerializer

    def get_queryset(self) -> QuerySet[Credential]:
        return self.scope.filter(Credential.objects.select_related("team")).order_by("name")


class StorageSystemViewSet(InventoryGuard, viewsets.ModelViewSet):
    serializer_class = serializers.StorageSystemSerializer
    filterset_class = filters.StorageFilter

    def get_queryset(self) -> QuerySet[StorageSystem]:
        return self.scope.filter(inventory_selectors.storage_list()).order_by("name")


class PresetViewSet(ScopedMixin, viewsets.ViewSet):
    """The seeds' campaigns, ready to instantiate against your inventory."""

    lookup_field = "slug"
    lookup_value_regex = r"[A-Za-z0-9_-]+"

    @extend_schema(responses=serializers.PresetSerializer(many=True))
    def list(self, request: Request) -> Response:
        return Response(serializers.PresetSerializer([vars(p) for p in preset_list()], many=True).data)

    @extend_schema(responses=serializers.PresetSerializer)
    def retrieve(self, request: Request, slug: str) -> Response:
        preset = preset_get(slug)
        if preset is None:
            raise NotFound(f"no preset named {slug!r}")
        return Response(serializers.PresetSerializer(vars(preset)).data)

    @extend_schema(
        request=serializers.PresetInstantiateSerializer, responses={201: serializers.PresetInstantiatedSerializer}
    )
    @action(detail=True, methods=["post"])
    def instantiate(self, request: Request, slug: str) -> Response:
        form = serializers.PresetInstantiateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        team = team_for_new(self.scope, data.pop("team", None))
        created = services.preset_instantiate(slug=slug, owner=request.user, team=team, **data)
        rows = campaigns_queryset().filter(pk__in=[c.pk for c in created]).order_by("name")
        return Response({"campaigns": serializers.CampaignSerializer(rows, many=True).data}, status=201)


def campaigns_queryset() -> QuerySet[Campaign]:
    return selectors.campaign_list().select_related("storage", "owner", "team").prefetch_related("nodes", "node_tags")


def definition_from(request: Request) -> tuple[dict[str, Any], str | None]:
    form = serializers.CampaignDefinitionSerializer(data=request.data)
    form.is_valid(raise_exception=True)
    data = form.validated_data
    spec = load_yaml(data["yaml"]) if "yaml" in data else dict(data["spec"])
    spec.update({key: data[key] for key in ("name", "family") if key in data})
    return spec, data.get("team")


class IdempotentMixin:
    """A POST with an ``Idempotency-Key`` header is answered once; a retry with that key gets the same answer."""

    def idempotent(self, request: Request, act: Any) -> Response:
        key = request.headers.get("Idempotency-Key", "").strip()
        if not key:
            return act()
        if len(key) > 200:
            raise ValidationError({"Idempotency-Key": ["at most 200 characters"]})
        user = request.user
        assert isinstance(user, get_user_model())  # IsAuthenticated ran first
        seen = IdempotentRequest.objects.filter(user=user, key=key).first()
        if seen is not None:
            if (seen.method, seen.path) != (request.method, request.path):
                return error("this Idempotency-Key was used for another request", 422, key=key, path=seen.path)
            return Response(seen.body, status=seen.status_code, headers={"Idempotent-Replayed": "true"})
        response: Response = act()
        if response.status_code < 500:
            try:
                with transaction.atomic():
                    IdempotentRequest.objects.create(user=user, key=key, method=request.method or "POST",
                                                     path=request.path, status_code=response.status_code,
                                                     body=response.data)  # fmt: skip
            except IntegrityError:
                pass  # a concurrent retry recorded it first; the state machine kept the action single
        return response


@extend_schema(parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False)])
class CampaignViewSet(ScopedMixin, IdempotentMixin, viewsets.ModelViewSet):
    """Campaigns as code: create and update from YAML (or the same as JSON); launch, cancel, re-run, judge.

    Filters: ``status``, ``kind``, ``family``, ``name``.
    """

    serializer_class = serializers.CampaignSerializer
    filterset_class = filters.CampaignFilter
    http_method_names = ["get", "post", "put", "delete", "head", "options"]

    def get_queryset(self) -> QuerySet[Campaign]:
        return self.scope.filter(campaigns_queryset())

    def answer(self, campaign: Campaign, status: int = 200) -> Response:
        return Response(serializers.CampaignSerializer(campaigns_queryset().get(pk=campaign.pk)).data, status=status)

    @extend_schema(request=serializers.CampaignDefinitionSerializer, responses={201: serializers.CampaignSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        spec, team_name = definition_from(request)
        team = team_for_new(self.scope, team_name)
        if Campaign.objects.filter(name=spec.get("name"), team=team).exists():
            raise SpecError("name", f"a campaign named {spec.get('name')!r} already exists; PUT updates a draft")
        return self.answer(services.campaign_apply(data=spec, owner=request.user, team=team), 201)

    def check_shared(self, campaign: Campaign) -> None:
        """A shared campaign (no team) is replaced or deleted by staff only, like shared inventory."""
        if campaign.team_id is None and not may_share(user=self.request.user):
            raise PermissionDenied("a shared campaign is changed and deleted by staff only; clone it into your team")

    @extend_schema(request=serializers.CampaignDefinitionSerializer, responses=serializers.CampaignSerializer)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        campaign = self.get_object()
        self.check_shared(campaign)
        spec, _ = definition_from(request)
        if spec.get("name") != campaign.name:
            raise SpecError("name", f"must stay {campaign.name!r}; clone the campaign to rename it")
        return self.answer(services.campaign_apply(data=spec, owner=campaign.owner, team=campaign.team))

    def perform_destroy(self, instance: Campaign) -> None:
        self.check_shared(instance)
        if instance.status == CampaignStatus.RUNNING:
            raise services.CampaignError(f"campaign {instance.name} is running: cancel it first", conflict=True)
        instance.delete()

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def preview(self, request: Request, pk: str) -> Response:
        """How many runs it expands to and the exact command of each point on each host."""
        return Response(selectors.campaign_preview(campaign=self.get_object()))

    @extend_schema(request=None, responses=serializers.CampaignSerializer)
    @action(detail=True, methods=["post"])
    def launch(self, request: Request, pk: str) -> Response:
        campaign = self.get_object()
        return self.idempotent(request, lambda: self.answer(services.campaign_launch(campaign=campaign,
                                                                                     user=request.user)))  # fmt: skip

    @extend_schema(request=None, responses=serializers.CampaignSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        return self.answer(services.campaign_cancel(campaign=self.get_object()))

    @extend_schema(request=None, responses=serializers.CampaignSerializer)
    @action(detail=True, methods=["post"], url_path="rerun-failed")
    def rerun_failed(self, request: Request, pk: str) -> Response:
        """New attempts of the failed, timed-out and cancelled runs of a finished campaign."""
        campaign = self.get_object()
        return self.idempotent(request, lambda: self._rerun(campaign, failed=True))

    @extend_schema(request=serializers.RerunSerializer, responses=serializers.CampaignSerializer)
    @action(detail=True, methods=["post"])
    def rerun(self, request: Request, pk: str) -> Response:
        """Fresh repetitions of chosen matrix points of a finished campaign."""
        campaign = self.get_object()
        form = serializers.RerunSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        return self.idempotent(request, lambda: self._rerun(campaign, points=form.validated_data.get("points", [])))

    def _rerun(self, campaign: Campaign, **how: Any) -> Response:
        services.campaign_rerun(campaign=campaign, **how)
        return self.answer(campaign)

    @extend_schema(methods=["GET"], responses=serializers.VerdictSerializer)
    @extend_schema(methods=["POST"], request=serializers.VerdictRequestSerializer,
                   responses={201: serializers.VerdictSerializer})  # fmt: skip
    @action(detail=True, methods=["get", "post"], renderer_classes=EXPORTS)
    def verdict(self, request: Request, pk: str) -> Response:
        """GET: the latest verdict. POST: judge the finished campaign against its family's baseline (or
        ``baseline``, a campaign id) now, with the policy's options overridden for this verdict."""
        campaign = self.get_object()
        if request.method == "GET":
            verdict = campaign.verdicts.first()
            if verdict is None:
                raise NotFound(f"campaign {campaign.name} has no verdict yet")
            return Response(serializers.VerdictSerializer(verdict).data)
        form = serializers.VerdictRequestSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        options = dict(form.validated_data)
        other = None
        if "baseline" in options:
            other = self.get_queryset().filter(pk=options.pop("baseline")).first()
            if other is None:
                raise ValidationError({"baseline": ["no such campaign"]})
        verdict = baselines.verdict_compute(campaign=campaign, baseline_campaign=other, overrides=options)
        return Response(serializers.VerdictSerializer(verdict).data, status=201)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "threshold",
                float,
                description="robust score at or below minus which a node is an outlier (default 3.5)",
            )
        ],  # fmt: skip
        responses={200: dict},
    )
    @action(detail=True, methods=["get"])
    def fleet(self, request: Request, pk: str) -> Response:
        """Node x metric against the fleet's median at each point: a verdict per node, outliers with evidence; and
        each GPU and NIC against the fleet's devices of its kind (a node with an outlier device is ``suspect``)."""
        campaign = self.get_object()
        threshold = fleet.parse_threshold(request.query_params.get("threshold"))
        data = analysis_selectors.campaign_fleet_data(campaign=campaign)
        payload = fleet.fleet_payload(fleet.fleet_view_by_column(data.by_column, threshold=threshold))
        devices = fleet.device_views(data.devices, groups=data.groups, threshold=threshold)
        return Response(fleet.devices_payload(payload, devices))

    @extend_schema(
        parameters=[
            OpenApiParameter("threshold", float, description="robust score threshold (default 3.5)"),
            OpenApiParameter("point", int, description="one matrix point (default: every point's flows)"),
        ],
        responses={200: dict},
    )
    @action(detail=True, methods=["get"])
    def links(self, request: Request, pk: str) -> Response:
        """The N x N matrix of a pairwise campaign (iperf3 sender x receiver, perftest client x server, nccl-tests and
        torch_dist pairs: metric, unit and statistic named), outlier nodes and bad links."""
        campaign = self.get_object()
        threshold = fleet.parse_threshold(request.query_params.get("threshold"))
        point = (
            _bounded_int(request.query_params, "point", -1, 0, 1_000_000) if "point" in request.query_params else None
        )
        links = analysis_selectors.campaign_links(campaign=campaign, point=point)
        payload = fleet.links_payload(analysis_selectors.link_matrix(links, threshold=threshold))
        payload["points"] = links.points
        payload["localisation"] = analysis_selectors.campaign_localisation(campaign=campaign)
        return Response(payload)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"], renderer_classes=EXPORTS, pagination_class=None, filterset_class=None)
    def statistics(self, request: Request, pk: str) -> Response:
        """Per matrix point and aggregate metric: n, mean, median, stdev, min, max, cv over the succeeded
        repetitions (the campaign page's Statistics table), values exact. ``?format=csv`` for a CSV."""
        return Response(selectors.campaign_summary(campaign=self.get_object()))

    def csv_rows(self, data: Any) -> list[dict[str, Any]]:
        if self.action == "verdict":
            return verdict_rows(data)
        return data if isinstance(data, list) else [data]


class RunViewSet(ScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Runs. Filters: ``campaign``, ``status``, ``point``."""

    serializer_class = serializers.RunSerializer
    filterset_class = filters.RunFilter
    lookup_value_regex = r"[0-9]+"  # a run's actions look the id up themselves: "null,null" is a 404, not a 500

    def get_queryset(self) -> QuerySet[Run]:
        runs = Run.objects.prefetch_related("hosts").order_by("campaign_id", "sequence")
        return self.scope.filter(runs, "campaign__team")

    @extend_schema(responses=serializers.SeriesOverviewSerializer(many=True), filters=False)
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def telemetry(self, request: Request, pk: str) -> Response:
        """The run's telemetry series (samplers, Prometheus, storage statistics), each with its summary."""
        run = self.scope.filter(Run.objects.all(), "campaign__team").filter(pk=pk).first()
        if run is None:
            raise NotFound("No Run matches the given query.")
        overviews = telemetry_selectors.run_series_overview(run_id=run.pk)
        return Response(serializers.SeriesOverviewSerializer(overviews, many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("t0", float, required=False, description="window start, seconds since the epoch"),
            OpenApiParameter("t1", float, required=False, description="window end, seconds since the epoch"),
            OpenApiParameter("points", int, required=False, description=f"at most (default {SERIES_POINTS})"),
        ],
        responses=serializers.SeriesDataSerializer,
        filters=False,
    )
    @action(detail=True, methods=["get"], url_path=r"telemetry/(?P<series_id>[0-9]+)", filterset_class=None)
    def telemetry_series(self, request: Request, pk: str, series_id: str) -> Response:
        """A window of one series: every sample when the window holds at most ``points``, else ``points`` buckets
        of min and max (counters as rates per second)."""
        series = self.scope.filter(Series.objects.all(), "run__campaign__team").filter(pk=series_id, run_id=pk).first()
        if series is None:
            raise NotFound("No series matches the given query.")
        query = request.query_params
        window = telemetry_selectors.series_window(
            series=series,
            start_ns=_epoch_ns(query, "t0"),
            end_ns=_epoch_ns(query, "t1"),
            max_points=_bounded_int(query, "points", SERIES_POINTS, 1, SERIES_MAX_POINTS),
        )
        data = serializers.SeriesSerializer(series).data
        return Response({**data, "start_ns": window.start_ns, "end_ns": window.end_ns, "bucket_ns": window.bucket_ns,
                         "points": window.points()})  # fmt: skip


def _epoch_ns(query: Any, name: str) -> int | None:
    text = query.get(name, "")
    if text == "":
        return None
    try:
        value = Decimal(text)  # exact: a float would blur the nanoseconds of a zoomed-in window
    except InvalidOperation:
        value = Decimal(-1)
    if not value.is_finite() or not 0 <= value < Decimal(2**63) / 10**9:
        raise ValidationError({name: ["must be a time in seconds since the epoch, e.g. 1700000000.25"]})
    return int(value * 10**9)


def _bounded_int(query: Any, name: str, default: int, low: int, high: int) -> int:
    text = query.get(name, "")
    if text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValidationError({name: [f"must be a whole number from {low} to {high}"]})
    return value


class ResultCursor(StrictCursorPagination):
    ordering = "-id"
    page_size = 100
    page_size_query_param = "limit"


class ResultViewSet(ScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Metrics of runs, newest first, cursor-paginated. Filters: ``campaign``, ``run``, ``name`` (metric),
    ``host`` (node; empty for aggregates), ``finished_after``/``finished_before``, ``run_status`` (e.g.
    ``succeeded``: only what runs that succeeded measured), and ``param.<name>=<value>`` for the matrix point's
    parameters."""

    serializer_class = serializers.ResultSerializer
    filterset_class = filters.ResultFilter
    pagination_class = ResultCursor
    renderer_classes = EXPORTS  # ?format=csv: one page (``limit`` up to 1000), ``next`` in the Link header

    def get_queryset(self) -> QuerySet[Result]:
        results = self.scope.filter(Result.objects.select_related("run"), "run__campaign__team")
        return filters.by_params(results, self.request.query_params)


class BaselineViewSet(
    ScopedMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet
):  # fmt: skip
    """Baselines of campaign families. POST makes a finished campaign (or some of its runs) the baseline of
    its family; DELETE retires a baseline. Filters: ``family``, ``active``, ``campaign``."""

    serializer_class = serializers.BaselineSerializer
    filterset_class = filters.BaselineFilter

    def get_queryset(self) -> QuerySet[Baseline]:
        rows = Baseline.objects.select_related("campaign", "team", "created_by").prefetch_related("runs")
        return self.scope.filter(rows)

    @extend_schema(request=serializers.BaselineCreateSerializer, responses={201: serializers.BaselineSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        form = serializers.BaselineCreateSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        campaign = self.scope.filter(Campaign.objects.all()).filter(pk=form.validated_data["campaign"]).first()
        if campaign is None:
            raise ValidationError({"campaign": ["no such campaign"]})
        if campaign.team_id is None and not may_share(user=request.user):
            raise PermissionDenied("the baseline of a shared campaign is set and retired by staff only")
        runs = list(Run.objects.filter(pk__in=form.validated_data["runs"]))
        if len(runs) != len(set(form.validated_data["runs"])):
            raise ValidationError({"runs": ["no such run"]})
        baseline = baselines.baseline_set(campaign=campaign, runs=runs, note=form.validated_data["note"],
                                          user=request.user)  # fmt: skip
        return Response(serializers.BaselineSerializer(baseline).data, status=201)

    def perform_destroy(self, instance: Baseline) -> None:
        if instance.team_id is None and not may_share(user=self.request.user):
            raise PermissionDenied("the baseline of a shared campaign is set and retired by staff only")
        Baseline.objects.filter(pk=instance.pk).update(active=False)


class VerdictViewSet(ScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Stored verdicts, newest first. Filters: ``campaign``, ``outcome``, ``final``."""

    serializer_class = serializers.VerdictSerializer
    filterset_class = filters.VerdictFilter
    renderer_classes = EXPORTS

    def csv_rows(self, data: Any) -> list[dict[str, Any]]:
        verdicts = data["results"] if isinstance(data, dict) and "results" in data else [data]
        return [row for verdict in verdicts for row in verdict_rows(verdict)]

    def get_queryset(self) -> QuerySet[Verdict]:
        return self.scope.filter(Verdict.objects.select_related("baseline_campaign"), "campaign__team")


def suite_payload(suite: suites.Suite) -> dict[str, Any]:
    steps = [{"name": s.name, "kind": s.definition.get("kind", ""), "judge": list(s.judge)} for s in suite.steps]
    return {"slug": suite.slug, "title": suite.title, "description": suite.description, "steps": steps}


class SuiteViewSet(ScopedMixin, viewsets.ViewSet):
    """Health suites (quick, acceptance): steps built from the plug-ins; ``run`` launches one on nodes."""

    lookup_field = "slug"
    lookup_value_regex = r"[a-z0-9]+"

    @extend_schema(operation_id="suites_list", responses={200: serializers.SuiteSerializer(many=True)})
    def list(self, request: Request) -> Response:
        return Response([suite_payload(s) for s in suites.suite_list()])

    @extend_schema(responses={200: serializers.SuiteSerializer})
    def retrieve(self, request: Request, slug: str) -> Response:
        return Response(suite_payload(suites.suite_get(slug)))

    @extend_schema(request=serializers.SuiteRunLaunchSerializer, responses={201: dict})
    @action(detail=True, methods=["post"])
    def run(self, request: Request, slug: str) -> Response:
        form = serializers.SuiteRunLaunchSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        data = form.validated_data
        team = team_for_new(self.scope, data.pop("team", None))
        created = suites.suite_launch(slug=slug, owner=request.user, team=team, **data)
        name = created[0].suite_run_name
        return Response({"name": name, "campaigns": [{"id": c.pk, "name": c.name} for c in created]}, status=201)


SUITE_RUN_PARAMETERS = [
    OpenApiParameter(n, str, required=False) for n in ("threshold", "suspect_threshold", "team")
]  # fmt: skip


class SuiteRunViewSet(ScopedMixin, viewsets.ViewSet):
    """A suite run's verdict per node (healthy, suspect, failed) with reason codes and evidence; ``act`` takes the
    actions asked for on an ended run. ``?team=`` names the team when the caller has several."""

    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9][A-Za-z0-9_.-]*"

    def outcome(self, request: Request, name: str) -> health.SuiteOutcome:
        team = team_for_new(self.scope, request.query_params.get("team"))
        threshold = fleet.parse_threshold(request.query_params.get("threshold"))
        raw = request.query_params.get("suspect_threshold")
        suspect = fleet.parse_threshold(raw) if raw else None
        return health.suite_run_outcome(name=name, team=team, threshold=threshold, suspect_threshold=suspect)

    @extend_schema(parameters=SUITE_RUN_PARAMETERS, responses={200: dict})
    def retrieve(self, request: Request, name: str) -> Response:
        return Response(self.outcome(request, name).payload())

    @extend_schema(parameters=SUITE_RUN_PARAMETERS, request=serializers.SuiteRunActSerializer, responses={200: dict})
    @action(detail=True, methods=["post"])
    def act(self, request: Request, name: str) -> Response:
        form = serializers.SuiteRunActSerializer(data=request.data)
        form.is_valid(raise_exception=True)
        outcome = self.outcome(request, name)
        nodes = Node.objects.filter(name__in=[n.node for n in outcome.nodes])
        refused = [n.name for n in nodes if not inventory_selectors.inventory_can_change(user=request.user, obj=n)]
        if refused:
            raise PermissionDenied(f"you may not change nodes {', '.join(refused)} (shared or another team's)")
        done = health.suite_run_act(outcome=outcome, user=request.user, **form.validated_data)
        return Response({"name": outcome.name, "actions": [vars(a) for a in done]})


class CompareView(ScopedMixin, APIView):
    """Side by side against the first: ``?campaigns=1,2``, ``?runs=10,11`` or ``?points=1:0,2:0``
    (campaign:point), mixed in any order (the /compare/ page's ``campaign=``, ``run=``, ``point=`` too). Each change
    is judged against the spread of the repetitions (``threshold_pct``, ``alpha``). ``?format=csv``: one row per
    compared cell (metric, point and side)."""

    renderer_classes = EXPORTS

    def csv_rows(self, data: Any) -> list[dict[str, Any]]:
        rows = []
        for row in data["rows"]:
            for column, value, change in zip(data["columns"], row["values"], row["changes"], strict=True):
                rows.append({"params": row["params"], "metric": row["metric"], "unit": row["unit"],
                             "side": column["label"], "campaign": column["campaign"],
                             "statistic": data["statistic"], **(value or {}),
                             **{k: v for k, v in (change or {}).items()}})  # fmt: skip
        return rows

    @extend_schema(
        parameters=[OpenApiParameter(n, str, required=False) for n in ("campaigns", "runs", "points")]
        + [
            OpenApiParameter("threshold_pct", float, required=False),
            OpenApiParameter("alpha", float, required=False),
            OpenApiParameter(
                "statistic",
                str,
                required=False,
                enum=["mean", "median"],
                description="default: the first set's campaign's statistic",
            ),
        ],
        responses={200: dict},
    )
    def get(self, request: Request) -> Response:
        sets, policy, statistic = filters.comparison_sets(request)
        return Response(selectors.compare(sets=sets, policy=policy, statistic=statistic))
