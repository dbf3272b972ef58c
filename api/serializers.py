"""Read-only representations with explicit fields. A credential appears by name only, never its key."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from campaigns.models import Campaign, Result, Run, RunHost
from inventory.models import Node, StorageSystem


class NodeSerializer(serializers.ModelSerializer):
    site: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    credential: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    tags: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)

    class Meta:
        model = Node
        fields = [
            "id", "name", "site", "address", "ssh_port", "ssh_user", "credential", "role", "status", "tags",
            "gpu_model", "gpu_count", "gpu_memory_mb", "cpu_model", "cpu_cores", "ram_mb", "container_runtime",
            "facts", "facts_collected_at", "created_at",
        ]  # fmt: skip


class StorageSystemSerializer(serializers.ModelSerializer):
    site: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    admin_credential: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )

    class Meta:
        model = StorageSystem
        fields = [
            "id", "name", "site", "kind", "data_addresses", "export_path", "mount_options", "flush_command",
            "admin_address", "admin_port", "admin_user", "admin_credential", "rated_read_mbps", "rated_write_mbps",
            "node_count",
        ]  # fmt: skip


class CampaignSerializer(serializers.ModelSerializer):
    nodes: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    node_tags: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    storage: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    owner: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="username", read_only=True)
    # Annotations of campaigns.selectors.campaign_list().
    run_total = serializers.IntegerField(read_only=True)
    run_done = serializers.IntegerField(read_only=True)
    run_failed = serializers.IntegerField(read_only=True)
    matrix = serializers.SerializerMethodField(help_text="parameter name -> values, in expansion order")

    class Meta:
        model = Campaign
        fields = [
            "id", "name", "description", "kind", "status", "matrix", "fixed", "nodes", "node_tags", "storage",
            "repetitions", "warmup_runs", "flush_clients", "flush_storage", "run_timeout_s", "owner",
            "created_at", "launched_at", "finished_at", "run_total", "run_done", "run_failed",
        ]  # fmt: skip

    def get_matrix(self, campaign: Campaign) -> dict[str, list[Any]]:
        return {name: values for name, values in campaign.matrix}


class RunHostSerializer(serializers.ModelSerializer):
    """Where and what a run executed on one host; the full output is on the run page's log download."""

    class Meta:
        model = RunHost
        fields = ["id", "node", "host", "address", "command", "remote_dir", "exit_code"]


class RunSerializer(serializers.ModelSerializer):
    hosts = RunHostSerializer(many=True, read_only=True)

    class Meta:
        model = Run
        fields = [
            "id", "uid", "campaign", "sequence", "point", "params", "repetition", "attempt", "is_warmup", "status",
            "created_at", "queued_at", "started_at", "finished_at", "heartbeat_at", "error", "stdout_tail",
            "stderr_tail", "provenance", "hosts",
        ]  # fmt: skip


class ResultSerializer(serializers.ModelSerializer):
    campaign = serializers.IntegerField(source="campaign_id", read_only=True)  # annotated by the view

    class Meta:
        model = Result
        fields = ["id", "run", "campaign", "name", "value", "unit", "host", "labels"]
