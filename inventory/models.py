from __future__ import annotations

from collections.abc import Collection
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from accounts.models import Team
from common.errors import FieldError
from common.names import name_check
from inventory.commands import (
    validate_addresses,
    validate_export_path,
    validate_flush_command,
    validate_host,
    validate_mount_options,
    validate_stats_command,
    validate_step_pattern,
    validate_step_program,
    validate_step_words,
)


def validate_name(value: str) -> None:
    """Names of nodes and storage systems become parts of paths (a run's directory on each node): one rule for them
    and campaign names (``common.names``)."""
    try:
        name_check("name", value)
    except FieldError as exc:
        raise ValidationError(exc.message) from None


class Site(models.Model):
    name = models.CharField(max_length=100, unique=True)
    description = models.TextField(blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Tag(models.Model):
    name = models.SlugField(max_length=64, unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Credential(models.Model):
    """An SSH identity. The private key is encrypted at rest and never shown again after saving."""

    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="credentials", help_text="empty: shared"
    )
    name = models.CharField(max_length=100, unique=True)
    username = models.CharField(max_length=64)
    private_key_encrypted = models.TextField(editable=False)
    public_key = models.TextField(editable=False)
    fingerprint = models.CharField(max_length=100, editable=False)
    shared = models.BooleanField(
        default=False,
        help_text="without a team only: every team may use it for its own nodes and storage (set by staff, on "
        "purpose); an unshared credential without a team is for shared inventory only",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.username})"


class NodeStatus(models.TextChoices):
    ACTIVE = "active"
    MAINTENANCE = "maintenance"
    RETIRED = "retired"


class NodeRole(models.TextChoices):
    COMPUTE = "compute"
    STORAGE_CLIENT = "storage-client"
    LOGIN = "login"
    OTHER = "other"


class Node(models.Model):
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.SET_NULL, related_name="nodes")
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes", help_text="empty: shared"
    )
    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    address = models.CharField(max_length=255, help_text="host name or IP address used for SSH")
    ssh_port = models.PositiveIntegerField(default=22)
    ssh_user = models.CharField(max_length=64, blank=True, help_text="defaults to the credential's user name")
    credential = models.ForeignKey(Credential, null=True, blank=True, on_delete=models.PROTECT, related_name="nodes")
    role = models.CharField(max_length=20, choices=NodeRole.choices, default=NodeRole.COMPUTE)
    status = models.CharField(max_length=20, choices=NodeStatus.choices, default=NodeStatus.ACTIVE)
    tags = models.ManyToManyField(Tag, blank=True, related_name="nodes")
    gpu_model = models.CharField(max_length=100, blank=True)
    gpu_count = models.PositiveIntegerField(default=0)
    gpu_memory_mb = models.PositiveIntegerField(null=True, blank=True)
    cpu_model = models.CharField(max_length=200, blank=True)
    cpu_cores = models.PositiveIntegerField(null=True, blank=True)
    ram_mb = models.PositiveIntegerField(null=True, blank=True)
    container_runtime = models.CharField(
        max_length=20, blank=True, help_text="docker, podman, enroot, apptainer or empty for bare metal"
    )
    facts = models.JSONField(default=dict, blank=True)
    facts_collected_at = models.DateTimeField(null=True, blank=True)
    # The circuit breaker: a node that did not answer a short SSH probe after a failure. Runs on it fail at once
    # (instead of each going through its retries) until a probe of the reconciler finds it answering again.
    suspect_since = models.DateTimeField(null=True, blank=True)
    suspect_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    status_loaded: str | None = None  # not a field: the status as read from the database

    # The hardware a node is described by: filled from discovered facts, imported, shown in the admin.
    HARDWARE_FIELDS = (
        "gpu_model",
        "gpu_count",
        "gpu_memory_mb",
        "cpu_model",
        "cpu_cores",
        "ram_mb",
        "container_runtime",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_db(cls, db: str | None, field_names: Collection[str], values: Collection[Any], **kwargs: Any) -> Node:
        node = super().from_db(db, field_names, values, **kwargs)
        node.status_loaded = node.__dict__.get("status")  # what a save changes it from (campaigns/signals.py)
        return node

    @property
    def login_user(self) -> str:
        return self.ssh_user or (self.credential.username if self.credential else "root")


class InterfaceRole(models.TextChoices):
    STORAGE = "storage"
    FABRIC = "fabric"
    MANAGEMENT = "management"
    OTHER = "other"


class Interface(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="interfaces")
    name = models.CharField(max_length=64)
    role = models.CharField(max_length=20, choices=InterfaceRole.choices, default=InterfaceRole.OTHER)
    speed_mbps = models.PositiveIntegerField(null=True, blank=True)
    mtu = models.PositiveIntegerField(null=True, blank=True)
    addresses = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["node", "name"]
        constraints = [models.UniqueConstraint(fields=["node", "name"], name="interface_unique_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.name}"


class StorageKind(models.TextChoices):
    NFS = "nfs"
    LUSTRE = "lustre"
    ISILON = "isilon-powerscale", "Isilon / PowerScale"
    ONTAP = "ontap"
    FLASHBLADE = "flashblade"
    LOCAL = "local"
    OTHER = "other"


class StorageSystem(models.Model):
    site = models.ForeignKey(Site, null=True, blank=True, on_delete=models.SET_NULL, related_name="storage_systems")
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="storage_systems", help_text="empty: shared"
    )
    name = models.CharField(max_length=100, unique=True, validators=[validate_name])
    kind = models.CharField(max_length=30, choices=StorageKind.choices, default=StorageKind.NFS)
    data_addresses = models.JSONField(default=list, blank=True, validators=[validate_addresses])
    export_path = models.CharField(max_length=500, blank=True, validators=[validate_export_path])
    mount_options = models.CharField(max_length=500, blank=True, validators=[validate_mount_options])
    flush_command = models.CharField(
        max_length=500,
        blank=True,
        validators=[validate_flush_command],
        help_text="run over SSH on the admin endpoint: sync, sysctl -w vm.drop_caches=3, isi_for_array isi_flush "
        "-123k or lctl set_param ldlm.namespaces.*.lru_size=clear (set by staff or the team's admins)",
    )
    admin_address = models.CharField(max_length=255, blank=True, validators=[validate_host])
    admin_port = models.PositiveIntegerField(default=22)
    admin_user = models.CharField(max_length=64, blank=True)
    admin_credential = models.ForeignKey(
        Credential, null=True, blank=True, on_delete=models.PROTECT, related_name="storage_systems"
    )
    stats_command = models.CharField(
        max_length=500,
        blank=True,
        validators=[validate_stats_command],
        help_text="run over SSH on the admin endpoint during runs that sample telemetry, every stats interval; "
        "its output becomes series (read: isi statistics system --nodes all --format top)",
    )
    stats_interval_s = models.FloatField(
        default=5.0, validators=[MinValueValidator(1.0)], help_text="seconds between two runs of the stats command"
    )
    rated_read_mbps = models.FloatField(null=True, blank=True, help_text="MB/s")
    rated_write_mbps = models.FloatField(null=True, blank=True, help_text="MB/s")
    node_count = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class StorageCommandChange(models.Model):
    """A change of a storage system's flush or statistics command: who, when, from what to what."""

    storage = models.ForeignKey(StorageSystem, on_delete=models.CASCADE, related_name="command_changes")
    field = models.CharField(max_length=30)
    old = models.CharField(max_length=500, blank=True)
    new = models.CharField(max_length=500, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now_add=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.storage} {self.field}: {self.old!r} -> {self.new!r}"


class HostKey(models.Model):
    """A pinned SSH host key, recorded at first contact. A later mismatch is a permanent failure."""

    address = models.CharField(max_length=255)
    port = models.PositiveIntegerField()
    key_type = models.CharField(max_length=50)
    key_base64 = models.TextField()
    fingerprint = models.CharField(max_length=100)
    first_seen = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["address", "port"]
        constraints = [models.UniqueConstraint(fields=["address", "port"], name="hostkey_unique_endpoint")]

    def __str__(self) -> str:
        return f"{self.address}:{self.port} {self.key_type} {self.fingerprint}"


class AllowedCommand(models.Model):
    """A program the generic command step (benchmark kind "command") may run on nodes. Admins (superusers) keep the
    list in the admin; campaigns only pick an entry by name and add at most ``max_args`` arguments, each matching
    ``arg_pattern`` in full (``plugins.benchmarks.command``)."""

    name = models.SlugField(max_length=64, unique=True, help_text="what campaigns give as the command parameter")
    program = models.CharField(
        max_length=255, validators=[validate_step_program], help_text="a program name (uname) or an absolute path"
    )
    fixed_args = models.JSONField(
        default=list, blank=True, validators=[validate_step_words], help_text='arguments always given, e.g. ["diag"]'
    )
    max_args = models.PositiveSmallIntegerField(default=0, help_text="further arguments a campaign may add")
    arg_pattern = models.CharField(
        max_length=200,
        blank=True,
        validators=[validate_step_pattern],
        help_text="a regular expression each further argument must match in full, e.g. -r|[1-4]",
    )
    description = models.CharField(max_length=200, blank=True)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.max_args and not self.arg_pattern:
            raise ValidationError({"arg_pattern": "further arguments need a pattern they must match"})


class NodeStatusChange(models.Model):
    """A change of a node's status made by a service (a health suite's action, its clean re-run): the node's
    history, with the reason and where it came from."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="status_changes")
    old = models.CharField(max_length=20, choices=NodeStatus.choices)
    new = models.CharField(max_length=20, choices=NodeStatus.choices)
    reason = models.CharField(max_length=500, blank=True)
    source = models.CharField(max_length=200, blank=True, help_text="what changed it, e.g. suite run quick-20261125")
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-changed_at", "-id"]

    def __str__(self) -> str:
        return f"{self.node} {self.old} -> {self.new}: {self.reason}"
