"""Representations with explicit fields. A credential appears by name and public half only, never its key."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from accounts.selectors import Scope
from campaigns.models import Baseline, Campaign, Result, Run, RunHost, Verdict
from campaigns.selectors import run_start_summary
from inventory.commands import CommandError, command_normalise
from inventory.models import Credential, Interface, Node, Site, StorageSystem
from inventory.selectors import credential_usable
from inventory.services import tags_from_names
from telemetry.models import Series

Slug = serializers.SlugRelatedField


def scope_of(serializer: serializers.Serializer[Any]) -> Scope:
    return serializer.context["scope"]


class VisibleSlugField(serializers.SlugRelatedField):
    """A reference by name, to objects the request may see (another team's are 'not found')."""

    def get_queryset(self) -> Any:
        return scope_of(self.parent).filter(super().get_queryset())  # type: ignore[arg-type]


class UsableCredentialField(serializers.SlugRelatedField):
    """A credential by name, among those the object's team may use: its own and those staff shared on purpose
    (inventory.selectors.credential_usable); any other is 'not found'."""

    def get_queryset(self) -> Any:
        scope = scope_of(self.parent)  # type: ignore[arg-type]
        return credential_usable(user=scope.user, team_ids=scope.team_ids)


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class TagListField(serializers.ListField):
    """Tag names; reading a node gives its tags' names (prefetched), writing creates missing tags."""

    child = serializers.SlugField(max_length=64)

    def to_representation(self, data: Any) -> list[str]:
        return [t.name for t in data.all()]


class NodeSerializer(serializers.ModelSerializer):
    site: Slug[Any] = Slug(slug_field="name", queryset=Site.objects.all(), required=False, allow_null=True)
    credential = UsableCredentialField(
        slug_field="name", queryset=Credential.objects.all(), required=False, allow_null=True
    )
    team: Slug[Any] = Slug(slug_field="name", read_only=True, allow_null=True)
    tags = TagListField(required=False, help_text="tag names; missing tags are created")

    class Meta:
        model = Node
        fields = [
            "id", "name", "team", "site", "address", "ssh_port", "ssh_user", "credential", "role", "status", "tags",
            "gpu_model", "gpu_count", "gpu_memory_mb", "cpu_model", "cpu_cores", "ram_mb", "container_runtime",
            "facts", "facts_collected_at", "created_at",
        ]  # fmt: skip
        read_only_fields = ["facts", "facts_collected_at", "created_at"]

    def create(self, validated_data: dict[str, Any]) -> Node:
        tags = validated_data.pop("tags", [])
        node = Node.objects.create(**validated_data)  # the view gives the team
        node.tags.set(tags_from_names(tags))
        return node

    def update(self, instance: Node, validated_data: dict[str, Any]) -> Node:
        tags = validated_data.pop("tags", None)
        node = super().update(instance, validated_data)
        if tags is not None:
            node.tags.set(tags_from_names(tags))
        return node


class InterfaceSerializer(serializers.ModelSerializer):
    node: Slug[Any] = Slug(slug_field="name", read_only=True)

    class Meta:
        model = Interface
        fields = ["id", "node", "name", "role", "speed_mbps", "mtu", "addresses"]


class CredentialSerializer(serializers.ModelSerializer):
    team: Slug[Any] = Slug(slug_field="name", read_only=True, allow_null=True)

    class Meta:
        model = Credential
        fields = ["id", "name", "team", "shared", "username", "public_key", "fingerprint", "created_at"]


class StorageSystemSerializer(serializers.ModelSerializer):
    site: Slug[Any] = Slug(slug_field="name", queryset=Site.objects.all(), required=False, allow_null=True)
    team: Slug[Any] = Slug(slug_field="name", read_only=True, allow_null=True)
    admin_credential = UsableCredentialField(
        slug_field="name", queryset=Credential.objects.all(), required=False, allow_null=True
    )

    class Meta:
        model = StorageSystem
        fields = [
            "id", "name", "team", "site", "kind", "data_addresses", "export_path", "mount_options", "flush_command",
            "stats_command", "stats_interval_s", "admin_address", "admin_port", "admin_user", "admin_credential",
            "rated_read_mbps", "rated_write_mbps", "node_count",
        ]  # fmt: skip

    def validate_data_addresses(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(a, str) and a.strip() for a in value):
            raise serializers.ValidationError("must be a list of addresses")
        return value

    def validate_flush_command(self, value: str) -> str:
        return self._command("flush_command", value)

    def validate_stats_command(self, value: str) -> str:
        return self._command("stats_command", value)

    def _command(self, field: str, value: str) -> str:
        """The normalised command; only those ``storage_can_set_commands`` names may change it (checked against
        the storage's team in the view, where a new one's team is known)."""
        try:
            return command_normalise(field, value)
        except CommandError as exc:
            raise serializers.ValidationError(exc.message) from None

    def create(self, validated_data: dict[str, Any]) -> StorageSystem:
        return StorageSystem.objects.create(**validated_data)  # the view gives the team


class CampaignSerializer(serializers.ModelSerializer):
    nodes: Slug[Any] = Slug(slug_field="name", many=True, read_only=True)
    node_tags: Slug[Any] = Slug(slug_field="name", many=True, read_only=True)
    storage: Slug[Any] = Slug(slug_field="name", read_only=True, allow_null=True)
    owner: Slug[Any] = Slug(slug_field="username", read_only=True, allow_null=True)
    team: Slug[Any] = Slug(slug_field="name", read_only=True, allow_null=True)
    family = serializers.CharField(source="family_name", read_only=True)
    # Annotations of campaigns.selectors.campaign_list().
    run_total = serializers.IntegerField(read_only=True)
    run_done = serializers.IntegerField(read_only=True)
    run_failed = serializers.IntegerField(read_only=True)
    matrix = serializers.SerializerMethodField(help_text="parameter name -> values, in expansion order")

    class Meta:
        model = Campaign
        fields = [
            "id", "name", "description", "kind", "family", "team", "status", "matrix", "fixed", "env", "nodes",
            "node_tags", "storage", "repetitions", "warmup_runs", "flush_clients", "flush_storage", "run_timeout_s",
            "statistic", "verdict", "owner", "created_at", "launched_at", "finished_at", "run_total", "run_done",
            "run_failed", "drift_report",
        ]  # fmt: skip
        read_only_fields = ["drift_report"]  # what the drift gate warned about at launch ({} when clean or off)

    def get_matrix(self, campaign: Campaign) -> dict[str, list[Any]]:
        return {name: values for name, values in campaign.matrix}


class CampaignDefinitionSerializer(serializers.Serializer):
    """A campaign definition: the YAML text, or the same definition as a JSON object."""

    yaml = serializers.CharField(required=False, help_text="the campaign as YAML (see the README's format)")
    spec = serializers.DictField(required=False, help_text="the campaign as a JSON object, instead of yaml")
    team = serializers.CharField(required=False, help_text="the team to create it in, if you belong to several")
    name = serializers.CharField(required=False, max_length=100, help_text="overrides the definition's name")
    family = serializers.CharField(required=False, max_length=100, help_text="overrides the definition's family")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("yaml" in attrs) == ("spec" in attrs):
            raise serializers.ValidationError({"yaml": ["give the definition as either yaml or spec"]})
        return attrs


class PresetSerializer(serializers.Serializer):
    slug = serializers.CharField()
    title = serializers.CharField()
    seed = serializers.CharField()
    description = serializers.CharField()
    needs = serializers.ListField(child=serializers.CharField())
    campaigns = serializers.ListField(child=serializers.DictField())


class PresetInstantiatedSerializer(serializers.Serializer):
    """What instantiating a preset created: one campaign, or a suite's several."""

    campaigns = CampaignSerializer(many=True, read_only=True)


class ErrorSerializer(serializers.Serializer):
    """The one error shape: ``extra`` names the offending field(s) of a 400, what is in the way of a 409, ..."""

    message = serializers.CharField()
    extra = serializers.DictField()


class PresetInstantiateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    nodes = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    node_tags = serializers.ListField(child=serializers.CharField(), required=False, default=list)
    storage = serializers.CharField(required=False, default="", allow_blank=True)
    team = serializers.CharField(required=False)


class SuiteStepSerializer(serializers.Serializer):
    """One step of a health suite (the API's description of it)."""

    name = serializers.CharField()
    kind = serializers.CharField()
    judge = serializers.ListField(child=serializers.CharField())


class SuiteSerializer(serializers.Serializer):
    """A health suite as ``/api/v1/suites/`` lists it."""

    slug = serializers.CharField()
    title = serializers.CharField()
    description = serializers.CharField()
    steps = SuiteStepSerializer(many=True)


class SuiteRunLaunchSerializer(serializers.Serializer):
    nodes = serializers.ListField(child=serializers.CharField(max_length=100), min_length=1, max_length=10_000)
    name = serializers.CharField(max_length=71, required=False, default="", allow_blank=True)
    steps = serializers.ListField(child=serializers.CharField(max_length=20), required=False, default=list)
    env = serializers.DictField(child=serializers.CharField(max_length=4096), required=False, default=dict)
    params = serializers.DictField(
        child=serializers.DictField(), required=False, default=dict,
        help_text="a step's parameters overridden, e.g. {network: {duration: 2}}",
    )  # fmt: skip
    repetitions = serializers.IntegerField(required=False, min_value=1, max_value=100,
                                           help_text="every step's repetitions (default: each step's own)")  # fmt: skip
    drift = serializers.ChoiceField(
        choices=["", "off", "warn", "refuse"], required=False, default="",
        help_text="the drift gate of every step (default: the suite's, warn)",
    )  # fmt: skip
    maintenance = serializers.BooleanField(
        required=False, default=False, help_text="when the run ends: failed nodes to maintenance, clean ones back"
    )
    slurm_login_node = serializers.CharField(
        max_length=100, required=False, default="", allow_blank=True,
        help_text="when the run ends: drain failed nodes in Slurm through this node, resume clean ones",
    )  # fmt: skip
    threshold = serializers.FloatField(required=False, min_value=0.1, max_value=1000, help_text="for the actions")
    suspect_threshold = serializers.FloatField(required=False, min_value=0.1, max_value=1000)
    team = serializers.CharField(required=False)


class SuiteRunActSerializer(serializers.Serializer):
    """Actions on an ended suite run, each off unless asked for."""

    maintenance = serializers.BooleanField(required=False, default=False)
    slurm_login_node = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)


class RunHostSerializer(serializers.ModelSerializer):
    """Where and what a run executed on one host; the full output is on the run page's log download."""

    class Meta:
        model = RunHost
        fields = ["id", "node", "host", "address", "command", "service_command", "remote_dir", "exit_code"]


START_SCHEMA = {
    "type": "object",
    "nullable": True,
    "description": "how together the hosts started (the start barrier): spread = max - min of their recorded start "
    "instants; null for a run started without the barrier",
    "properties": {
        "spread_s": {"type": "number", "nullable": True},
        "spread": {"type": "string"},
        "statistic": {"type": "string"},
        "hosts": {"type": "integer"},
        "first_host": {"type": "string"},
        "last_host": {"type": "string"},
        "after_instant_s": {"type": "number", "nullable": True},
        "after_instant": {"type": "string"},
        "margin_s": {"type": "number", "nullable": True},
        "margin": {"type": "string"},
        "attempts": {"type": "integer"},
        "late_attempts": {"type": "integer"},
    },
}


class RunSerializer(serializers.ModelSerializer):
    hosts = RunHostSerializer(many=True, read_only=True)
    start = serializers.SerializerMethodField()
    cache_flags = serializers.ListField(
        child=serializers.DictField(child=serializers.CharField()),
        read_only=True,
        help_text="why the run's cache discipline is in doubt ({code, message}); the evidence is in provenance.cache",
    )

    class Meta:
        model = Run
        fields = [
            "id", "uid", "campaign", "sequence", "point", "params", "repetition", "attempt", "is_warmup", "status",
            "created_at", "queued_at", "started_at", "finished_at", "heartbeat_at", "error", "stdout_tail",
            "stderr_tail", "provenance", "cache_flags", "start", "hosts",
        ]  # fmt: skip

    @extend_schema_field(START_SCHEMA)
    def get_start(self, run: Run) -> dict[str, Any] | None:
        return run_start_summary(run.provenance or {})


class ResultSerializer(serializers.ModelSerializer):
    campaign = serializers.IntegerField(source="run.campaign_id", read_only=True)
    params = serializers.JSONField(source="run.params", read_only=True)
    finished_at = serializers.DateTimeField(source="run.finished_at", read_only=True)
    run_status = serializers.CharField(source="run.status", read_only=True)

    class Meta:
        model = Result
        fields = [
            "id", "run", "campaign", "params", "name", "value", "unit", "host", "labels", "finished_at", "run_status"
        ]  # fmt: skip


class BaselineSerializer(serializers.ModelSerializer):
    campaign_name = serializers.CharField(source="campaign.name", read_only=True)
    team: Slug[Any] = Slug(slug_field="name", read_only=True, allow_null=True)
    created_by: Slug[Any] = Slug(slug_field="username", read_only=True, allow_null=True)
    runs: serializers.PrimaryKeyRelatedField[Any] = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True, help_text="the chosen runs; empty: every succeeded run of the campaign"
    )

    class Meta:
        model = Baseline
        fields = ["id", "family", "team", "campaign", "campaign_name", "runs", "note", "active", "created_by",
                  "created_at"]  # fmt: skip


class BaselineCreateSerializer(serializers.Serializer):
    campaign = serializers.IntegerField()
    runs = serializers.ListField(child=serializers.IntegerField(), required=False, default=list)
    note = serializers.CharField(required=False, default="", allow_blank=True)


@extend_schema_field({"type": "object", "nullable": True, "properties": {"id": {"type": "integer"},
                                                                       "name": {"type": "string"}}})  # fmt: skip
class CampaignRefField(serializers.Field):
    def to_representation(self, value: Campaign | None) -> dict[str, Any] | None:
        return {"id": value.pk, "name": value.name} if value else None


class VerdictSerializer(serializers.ModelSerializer):
    baseline_campaign = CampaignRefField(read_only=True)

    class Meta:
        model = Verdict
        fields = ["id", "campaign", "baseline", "baseline_campaign", "outcome", "method", "method_version", "policy",
                  "final", "counts", "created_at", "webhook_status", "items"]  # fmt: skip


class VerdictRequestSerializer(serializers.Serializer):
    baseline = serializers.IntegerField(required=False, help_text="compare with this campaign, not the family's")
    threshold_pct = serializers.FloatField(required=False, min_value=0)
    alpha = serializers.FloatField(required=False, min_value=0, max_value=1)
    min_repetitions = serializers.IntegerField(required=False, min_value=2)
    statistic = serializers.ChoiceField(
        choices=["mean", "median"], required=False, help_text="default: the campaign's statistic"
    )


class RerunSerializer(serializers.Serializer):
    points = serializers.ListField(
        child=serializers.IntegerField(min_value=0), required=False, help_text="matrix points to measure again"
    )


class SeriesSummarySerializer(serializers.Serializer[Any]):
    """What the chunks' stored statistics say (of the rates, for a counter); p99 where the series was summarised."""

    count = serializers.IntegerField()
    mean = serializers.FloatField(allow_null=True)
    min = serializers.FloatField(allow_null=True)
    max = serializers.FloatField(allow_null=True)
    p99 = serializers.FloatField(allow_null=True)


class SeriesSerializer(serializers.ModelSerializer):
    unit = serializers.CharField(
        source="rate_unit", read_only=True, help_text="of what is read: per second for counters"
    )
    sample_unit = serializers.CharField(source="unit", read_only=True)

    class Meta:
        model = Series
        fields = [
            "id", "host", "name", "labels", "kind", "source", "unit", "sample_unit", "interval_ns", "sample_count",
            "first_ns", "last_ns",
        ]  # fmt: skip


class SeriesOverviewSerializer(SeriesSerializer):
    """A series (of telemetry.selectors.SeriesOverview) with its summary."""

    summary = SeriesSummarySerializer(read_only=True)

    class Meta(SeriesSerializer.Meta):
        fields = [*SeriesSerializer.Meta.fields, "summary"]

    def to_representation(self, instance: Any) -> dict[str, Any]:
        return {**super().to_representation(instance.series), "summary": SeriesSummarySerializer(instance).data}


class SeriesDataSerializer(SeriesSerializer):
    """A window of a series: at full resolution one point per sample (min == max), else one per bucket."""

    start_ns = serializers.IntegerField()
    end_ns = serializers.IntegerField()
    bucket_ns = serializers.IntegerField(help_text="0: every sample")
    points = serializers.ListField(
        child=serializers.ListField(child=serializers.FloatField()), help_text="[t_ns, min, max] per point"
    )

    class Meta(SeriesSerializer.Meta):
        fields = [*SeriesSerializer.Meta.fields, "start_ns", "end_ns", "bucket_ns", "points"]
