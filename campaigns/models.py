from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from accounts.models import Team
from inventory.models import Node, NodeStatus, StorageSystem, Tag


class CampaignStatus(models.TextChoices):
    DRAFT = "draft"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


CAMPAIGN_TERMINAL = frozenset({CampaignStatus.SUCCEEDED, CampaignStatus.FAILED, CampaignStatus.CANCELLED})
SUITE_FAMILY_PREFIX = "suite-"  # the family of a health suite step's campaign: suite-SLUG-STEP (campaigns.suites)


class Statistic(models.TextChoices):
    """What a matrix point's repetitions are summed up by, everywhere the campaign's numbers are shown or judged."""

    MEAN = "mean"
    MEDIAN = "median"  # seed 004: "the median of 3 runs after steady state"


class Campaign(models.Model):
    name = models.CharField(max_length=100)  # unique per team (Meta.constraints)
    description = models.TextField(blank=True)
    kind = models.CharField(max_length=50, default="fio")
    # [[name, [values...]], ...]: a list, because PostgreSQL's jsonb does not keep a mapping's key order.
    matrix = models.JSONField(default=list, blank=True, help_text="axes of the parameter matrix (cross product)")
    fixed = models.JSONField(default=dict, blank=True, help_text="parameters shared by every run")
    env = models.JSONField(default=dict, blank=True, help_text="environment of every command (NCCL_*, ...)")
    mounts = models.JSONField(default=dict, blank=True, help_text="{count, path, options}: storage mounts per node")
    container = models.JSONField(default=dict, blank=True, help_text="runtime, image, ssh_port, ...: where jobs run")
    launcher = models.JSONField(
        default=dict, blank=True, help_text="{kind: slurm, login_node, partition, ...}; empty: started detached"
    )
    # A fresh key pair per launch, for MPI hops between the campaign's containers; the private key is
    # encrypted like credentials, written only into a 0700 directory on the nodes while the campaign runs.
    ssh_private_key_encrypted = models.TextField(blank=True, editable=False)
    ssh_public_key = models.TextField(blank=True, editable=False)
    # zip / exclude / overrides / derived: see campaigns.planning.expand
    rules = models.JSONField(default=dict, blank=True, help_text="how the matrix expands beyond the cross product")
    nodes = models.ManyToManyField(Node, blank=True, related_name="campaigns")
    node_tags = models.ManyToManyField(Tag, blank=True, related_name="campaigns")
    # What a launch reserves (see campaigns.reservations): the nodes its runs use, resolved when it joins the queue.
    reserved_nodes = models.ManyToManyField(
        Node, blank=True, related_name="reserving_campaigns", help_text="the nodes its runs use (held while it runs)"
    )
    storage = models.ForeignKey(
        StorageSystem, null=True, blank=True, on_delete=models.PROTECT, related_name="campaigns"
    )
    repetitions = models.PositiveIntegerField(default=1)
    warmup_runs = models.PositiveIntegerField(default=0)
    flush_storage = models.BooleanField(default=False)
    flush_clients = models.BooleanField(default=True)
    run_timeout_s = models.PositiveIntegerField(default=3600)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    team = models.ForeignKey(
        Team, null=True, blank=True, on_delete=models.PROTECT, related_name="campaigns", help_text="empty: shared"
    )
    family = models.CharField(
        max_length=100, blank=True, help_text="campaigns that measure the same thing share a baseline (default: name)"
    )
    verdict = models.JSONField(
        default=dict, blank=True, help_text="{threshold_pct, alpha, rerun_regressions, metrics, webhook}"
    )
    telemetry = models.JSONField(default=dict, blank=True, help_text="samplers and their intervals during runs")
    # The mean by default: what every page, export and verdict used before the choice existed.
    statistic = models.CharField(
        max_length=10, choices=Statistic.choices, default=Statistic.MEAN,
        help_text="what a point's repetitions are summed up by in show, charts, compare, verdicts and exports",
    )  # fmt: skip
    status = models.CharField(max_length=20, choices=CampaignStatus.choices, default=CampaignStatus.DRAFT)
    created_at = models.DateTimeField(auto_now_add=True)
    launched_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    waiting_since = models.DateTimeField(
        null=True, blank=True, db_index=True, help_text="in the queue for its nodes since; empty once it holds them"
    )
    # What the drift gate found at launch when it only warns ({mode, findings, unreachable, messages, ...}; empty
    # when it was off or clean): shown on the campaign's page, its suite run's page and in the API.
    drift_report = models.JSONField(default=dict, blank=True)
    # A health suite step's actions, asked for at launch and taken when the suite run ends ({maintenance,
    # slurm_login_node, user}; empty: none). See analysis.health.
    suite_actions = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="campaign_name_unique_per_team"),
            models.UniqueConstraint(fields=["name"], condition=models.Q(team=None), name="campaign_name_unique_shared"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_terminal(self) -> bool:
        return self.status in CAMPAIGN_TERMINAL

    @property
    def family_name(self) -> str:
        return self.family or self.name

    @property
    def is_health_check(self) -> bool:
        """A step of a health suite: it may run on nodes in maintenance, since a clean re-run is how they return."""
        return self.family.startswith(SUITE_FAMILY_PREFIX)

    @property
    def suite_run_name(self) -> str:
        """The health suite run this campaign is a step of (its name is RUN-STEP); empty for other campaigns."""
        return self.name.rsplit("-", 1)[0] if self.is_health_check else ""

    @property
    def usable_node_statuses(self) -> frozenset[str]:
        """The node statuses its runs may start on."""
        if self.is_health_check:
            return frozenset({NodeStatus.ACTIVE, NodeStatus.MAINTENANCE})
        return frozenset({NodeStatus.ACTIVE})


class RunStatus(models.TextChoices):
    PENDING = "pending"
    QUEUED = "queued"
    PREPARING = "preparing"
    RUNNING = "running"
    COLLECTING = "collecting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed-out"


RUN_TERMINAL = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})
RUN_ACTIVE = frozenset({RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.COLLECTING})


class Run(models.Model):
    """One matrix point x repetition x attempt."""

    # Names the run's directory on its hosts: unique even across databases sharing nodes, or a reset one.
    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="runs")
    sequence = models.PositiveIntegerField(help_text="execution order within the campaign")
    point = models.PositiveIntegerField(help_text="index of the matrix point")
    params = models.JSONField(default=dict)
    repetition = models.PositiveIntegerField(help_text="1-based; 0 for a warm-up run")
    attempt = models.PositiveIntegerField(default=1)
    is_warmup = models.BooleanField(default=False)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True, help_text="last time a task worked on this run")
    resumes = models.PositiveIntegerField(default=0, help_text="times the reconciler resumed this run")
    # Each poll chain carries a token, and each poll hands the next one a new token (a conditional update): a
    # duplicated poll message, or a chain a resume replaced, stops by itself.
    poll_token = models.CharField(max_length=32, blank=True)
    # The step lease: the task working on a step (start, poll, collect) holds it and renews it while it works, so a
    # duplicate of that task backs off, and the reconciler resumes a step only once its lease has expired (a slow
    # step is never run twice; a lost one is resumed within seconds).
    lease_owner = models.CharField(max_length=32, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    # An ended run whose processes are still being killed on its hosts: its campaign starts nothing else, and
    # gives its nodes back, only once the kill is done (no run measures beside another's leftovers).
    kill_pending = models.BooleanField(default=False)
    # While a run is active and its campaign page is open, each poll stores the last lines of its first main
    # host's output here ({host, text, error, at}), so that the web process never opens an SSH connection.
    live_log = models.JSONField(default=dict, blank=True)
    live_log_wanted_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    stdout_tail = models.TextField(blank=True)
    stderr_tail = models.TextField(blank=True)
    provenance = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["campaign", "sequence"]
        constraints = [models.UniqueConstraint(fields=["campaign", "sequence"], name="run_unique_sequence")]
        # A point's runs without reading the campaign's others (what refreshing a point's summaries reads), and the
        # first run of each point from the index alone (the analysis pages' point pickers).
        indexes = [models.Index(fields=["campaign", "point", "id"], name="run_campaign_point")]

    def __str__(self) -> str:
        return f"{self.campaign.name} #{self.sequence}"

    @property
    def is_terminal(self) -> bool:
        return self.status in RUN_TERMINAL

    @property
    def cache_flags(self) -> list[dict[str, str]]:
        """What makes the run's cache discipline doubtful ({code, message}; plugins/cache.py): a flush that did not
        take effect, cache hits in a run meant to read storage, storage reads in a run meant to read the cache."""
        return list((self.provenance.get("cache") or {}).get("flags") or [])


class RunHost(models.Model):
    """What a run did on one host: the exact command, where, its exit code and its full output."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="hosts")
    node = models.ForeignKey(Node, null=True, on_delete=models.SET_NULL, related_name="run_hosts")
    host = models.CharField(max_length=100, help_text="node name at the time of the run")
    address = models.CharField(max_length=255)
    command = models.TextField(help_text="the main command; empty when this host only takes part (MPI ranks)")
    service_command = models.TextField(blank=True, help_text="a server started before the main commands")
    remote_dir = models.CharField(max_length=500)
    pid = models.IntegerField(null=True, blank=True)
    # Under a Slurm launcher, the primary host's main command is this Slurm job (submitted on the login node).
    slurm_job_id = models.CharField(max_length=50, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    stdout = models.TextField(blank=True)
    stderr = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "host"]
        constraints = [models.UniqueConstraint(fields=["run", "host"], name="runhost_unique")]

    def __str__(self) -> str:
        return f"{self.run} @ {self.host}"


class Result(models.Model):
    """One metric of a run: per host, or the aggregate across hosts when host is empty."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="results")
    name = models.CharField(max_length=100)
    value = models.FloatField()
    unit = models.CharField(max_length=30)
    host = models.CharField(max_length=100, blank=True, help_text="empty for the aggregate across hosts")
    labels = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "name", "host"]
        indexes = [
            models.Index(fields=["run", "name"]),
            # A run's aggregates without its per-host rows (a thousand hosts: a thousand times fewer): what refreshing
            # a point's summaries reads.
            models.Index(fields=["run"], condition=models.Q(host=""), name="result_aggregates"),
        ]
        # One number per run, metric, host and labels: a run's results are stored once, whatever collects it.
        constraints = [models.UniqueConstraint(fields=["run", "name", "host", "labels"], name="result_unique")]

    def __str__(self) -> str:
        return f"{self.name}={self.value} {self.unit}"


class PointSummary(models.Model):
    """The statistics of one aggregate metric (with its labels) at one matrix point of a campaign, over the point's
    succeeded measured runs: what compare and the campaign statistics read instead of every repetition.

    Derived data, never written by Python: on PostgreSQL, triggers on results and runs (migration 0019) refresh a
    point's rows in the transaction that changes its results or which of its runs count (a run succeeding, a run
    deleted), whoever writes them (services, a migration, the ORM in a test, raw SQL). On SQLite the table stays
    empty and the statistics are computed from the rows (campaigns.baselines.summaries_in_sql).

    Counted as campaigns.baselines.aggregated counts: results with no host (the aggregate across hosts) and no
    ``job`` label, of runs that succeeded and are not warm-ups; grouped by name and the labels' jsonb text.
    """

    # No foreign key constraint and no cascade from Django: the rows go when the campaign's runs go (the triggers),
    # and a refresh during the campaign's own deletion never meets a constraint on the row being deleted.
    # Read by campaign: the unique constraint's index, campaign first, serves that.
    campaign = models.ForeignKey(
        Campaign, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    point = models.PositiveIntegerField()
    params = models.JSONField(help_text="parameters of the point's first counted run (by id)")
    name = models.CharField(max_length=100)
    labels_text = models.TextField(help_text="the results' labels as PostgreSQL writes jsonb")
    unit = models.CharField(max_length=30, help_text="max(unit) of the results")
    n = models.PositiveIntegerField()
    mean = models.FloatField()
    stdev = models.FloatField(null=True, help_text="stddev_samp: null for one value")
    low = models.FloatField()
    high = models.FloatField()
    median = models.FloatField(help_text="percentile_cont(0.5)")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["campaign", "point", "name", "labels_text"], name="pointsummary_unique")
        ]

    def __str__(self) -> str:
        return f"{self.campaign_id}:{self.point} {self.name}{self.labels_text} n={self.n}"


class NodeLease(models.Model):
    """A node reserved by a running campaign, from its first run until it ends.

    One row per node (the unique constraint): two campaigns never hold one node, so their runs never overlap.
    """

    node = models.OneToOneField(Node, on_delete=models.CASCADE, related_name="lease")
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="leases")
    acquired_at = models.DateTimeField(auto_now_add=True)
    # Kept, even after its campaign ends, while the kill of this run on the node is not confirmed (a job of it may
    # still run there): nobody else gets the node until the reconciler confirms the kill or an operator releases it.
    held_for = models.ForeignKey(
        "Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="held_leases",
        help_text="the run whose kill on this node is not confirmed",
    )  # fmt: skip
    held_reason = models.TextField(blank=True)
    held_since = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        held = f" (kept: the kill of run {self.held_for_id} is not confirmed)" if self.held_for_id else ""
        return f"{self.node} held by {self.campaign}{held}"


class Baseline(models.Model):
    """What a campaign family is compared with: a campaign, or a chosen set of its runs."""

    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="baselines")
    family = models.CharField(max_length=100)
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="baselines")
    runs = models.ManyToManyField(Run, blank=True, help_text="empty: every succeeded run of the campaign")
    note = models.TextField(blank=True)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "family"], condition=models.Q(active=True), name="baseline_one_active_per_family"
            )
        ]

    def __str__(self) -> str:
        return f"baseline of {self.family}: {self.campaign}"


class VerdictOutcome(models.TextChoices):
    PASS = "pass"
    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    INCONCLUSIVE = "inconclusive"


class Verdict(models.Model):
    """A finished campaign judged against its baseline, per matrix point and metric (``items``)."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="verdicts")
    baseline = models.ForeignKey(Baseline, null=True, on_delete=models.SET_NULL, related_name="verdicts")
    baseline_campaign = models.ForeignKey(
        Campaign, null=True, on_delete=models.SET_NULL, related_name="+", help_text="kept if the baseline goes"
    )
    outcome = models.CharField(max_length=20, choices=VerdictOutcome.choices)
    method = models.CharField(max_length=50)
    method_version = models.PositiveIntegerField()
    policy = models.JSONField(default=dict)
    items = models.JSONField(default=list)
    counts = models.JSONField(default=dict, help_text="items per outcome")
    final = models.BooleanField(default=True, help_text="false while a suspected regression is being re-run")
    created_at = models.DateTimeField(auto_now_add=True)
    webhook_status = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.campaign}: {self.outcome}"


class SuiteAction(models.Model):
    """An action a health suite run took on a node (maintenance, drain, returned, resumed), recorded once: the
    unique constraint is what keeps a task that arrives twice from draining a node twice. ``campaign`` is the run's
    first step."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="suite_actions_taken")
    node = models.CharField(max_length=100)
    action = models.CharField(max_length=20)
    reason = models.CharField(max_length=500, blank=True)
    error = models.CharField(max_length=500, blank=True, help_text="why the action could not be taken")
    automatic = models.BooleanField(default=False, help_text="taken as the suite run ended, not asked for after")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["campaign", "node", "action"], name="suite_action_once_per_run")]

    def __str__(self) -> str:
        return f"{self.node} {self.action}: {self.reason}"
