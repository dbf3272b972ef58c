"""A health suite run's outcome per node, and the actions it may take on the failed ones.

Each node of a suite run is **healthy**, **suspect** or **failed**, with reason codes and their evidence:

- ``step_failed:STEP`` (failed): the node's own command exited non-zero in a run of the step.
- ``unreachable`` (failed): a run of the step could not reach the node (it does not answer SSH).
- ``outlier:STEP.METRIC`` (failed): the node's value is an outlier against the fleet (robust score at or below
  ``-threshold``, analysis.fleet), the value and the fleet's median as evidence.
- ``low:STEP.METRIC`` (suspect): below the fleet but not an outlier (score at or below ``-suspect_threshold``).
- ``run_failed:STEP`` (suspect): a run the node took part in failed, its own part did not, and no other host's did (a
  collective that failed in mpirun): that run alone cannot tell which node was at fault.
- ``not_run:STEP`` (suspect): the step was cancelled or has no finished run for the node.

Only the latest attempt of each matrix point and repetition counts. A node is judged on the metrics the suite
step names in ``judge`` (default: its higher-is-better ones): a lower-is-better count such as retransmits has a fleet
median of 0 on a healthy lab, against which any non-zero value would be an outlier.

Actions, off unless asked for, once every step has ended: a failed node is set to maintenance in the inventory with
its reasons (in its status history), and on Slurm drained with them (``scontrol update ... State=DRAIN``); a node a
suite had put in maintenance returns to active (and is resumed on Slurm) only when a later run of a suite on it
finds it healthy. Asked for at launch (campaigns.suites.suite_launch), they are taken by ``suite_run_ended`` as the
last step ends (a task); asked for later, by ``suite_run_act``. Each action is recorded once per suite run
(campaigns.models.SuiteAction, unique per run, node and action), in the transaction that makes the change: a task
that arrives twice, or a hand-made act after the automatic one, neither drains twice nor records two status changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from accounts.models import Team
from analysis import fleet
from analysis.selectors import campaign_fleet_samples
from campaigns import suites
from campaigns.errors import CampaignError
from campaigns.models import CAMPAIGN_TERMINAL, Campaign, CampaignStatus, Run, RunHost, RunStatus, SuiteAction
from common import numbers
from common.errors import NotFound
from inventory.models import Node, NodeStatus
from inventory.services import node_set_status
from plugins.benchmarks.base import Benchmark, get_benchmark
from runners import remote, slurm

HEALTHY, SUSPECT, FAILED = "healthy", "suspect", "failed"
SEVERITY = (HEALTHY, SUSPECT, FAILED)  # worst last
DEFAULT_SUSPECT_THRESHOLD = 2.5
RUN_FAILED = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT})
SOURCE_PREFIX = "suite run "  # NodeStatusChange.source of a change a suite's action made


@dataclass
class Finding:
    code: str  # step_failed:STEP, unreachable, outlier:STEP.METRIC, ...
    severity: str  # failed or suspect
    step: str
    campaign: int
    detail: str
    run: int | None = None
    value: float | None = None
    fleet_median: float | None = None
    score: float | None = None
    unit: str = ""


@dataclass
class NodeOutcome:
    node: str
    verdict: str = HEALTHY
    findings: list[Finding] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        return list(dict.fromkeys(f.code for f in self.findings))

    def add(self, finding: Finding) -> None:
        self.findings.append(finding)
        self.verdict = max(self.verdict, finding.severity, key=SEVERITY.index)


@dataclass
class StepState:
    name: str
    campaign: int
    campaign_name: str
    status: str
    drift: list[str] = field(default_factory=list)  # what the drift gate warned about at the step's launch


@dataclass
class SuiteOutcome:
    name: str
    suite: str
    steps: list[StepState]
    nodes: list[NodeOutcome]
    threshold: float
    suspect_threshold: float
    actions: list[dict[str, Any]] = field(default_factory=list)  # taken so far (SuiteAction rows)
    actions_asked: dict[str, Any] = field(default_factory=dict)  # at launch, taken when the run ends

    @property
    def finished(self) -> bool:
        return all(s.status in CAMPAIGN_TERMINAL for s in self.steps)

    @property
    def drift(self) -> list[str]:
        """Every drift warning of the run's steps, once (the steps compare the same nodes)."""
        return list(dict.fromkeys(m for step in self.steps for m in step.drift))

    def counts(self) -> dict[str, int]:
        counts = {HEALTHY: 0, SUSPECT: 0, FAILED: 0}
        for node in self.nodes:
            counts[node.verdict] += 1
        return counts

    def payload(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "suite": self.suite,
            "finished": self.finished,
            "threshold": self.threshold,
            "suspect_threshold": self.suspect_threshold,
            "counts": self.counts(),
            "drift": self.drift,
            "steps": [asdict(s) for s in self.steps],
            "nodes": [self._node_payload(n) for n in self.nodes],
            "actions_asked": {k: v for k, v in self.actions_asked.items() if k != "user"},
            "actions": self.actions,
        }

    @staticmethod
    def _node_payload(node: NodeOutcome) -> dict[str, Any]:
        evidence = [asdict(f) for f in node.findings]
        return {"node": node.node, "verdict": node.verdict, "reasons": node.reasons, "evidence": evidence}


def suite_run_outcome(
    *,
    name: str,
    team: Team | None,
    threshold: float = fleet.DEFAULT_THRESHOLD,
    suspect_threshold: float | None = None,
) -> SuiteOutcome:
    """Every node of the suite run ``name`` judged over its steps' campaigns (NotFound when there is no such run)."""
    campaigns = list(suites.suite_run_campaigns(name=name, team=team).prefetch_related("nodes"))
    if not campaigns:
        raise NotFound(f"no suite run named {name[:80]!r}", field="name")
    slug = suites.step_of(campaigns[0])[0]
    suspect_at = min(suspect_threshold or DEFAULT_SUSPECT_THRESHOLD, threshold)
    nodes: dict[str, NodeOutcome] = {}
    for campaign in campaigns:
        for node in campaign.nodes.all():
            nodes.setdefault(node.name, NodeOutcome(node.name))
    steps = []
    for campaign in campaigns:
        step = suites.step_of(campaign)[1]
        warned = list((campaign.drift_report or {}).get("messages") or [])
        steps.append(StepState(step, campaign.pk, campaign.name, campaign.status, warned))
        _judge_runs(campaign, step, nodes)
        _judge_fleet(campaign, step, _judged_metrics(slug, step), nodes, threshold, suspect_at)
    ordered = sorted(nodes.values(), key=lambda n: n.node)
    taken = [_action_payload(a) for a in SuiteAction.objects.filter(campaign=campaigns[0])]
    asked = dict(campaigns[0].suite_actions or {})
    return SuiteOutcome(name, slug, steps, ordered, threshold, suspect_at, taken, asked)


def _action_payload(action: SuiteAction) -> dict[str, Any]:
    return {"node": action.node, "action": action.action, "reason": action.reason, "error": action.error,
            "automatic": action.automatic, "at": action.created_at.isoformat()}  # fmt: skip


def _judged_metrics(slug: str, step: str) -> tuple[str, ...]:
    try:
        found = suites.suite_get(slug).step(step)
    except NotFound:  # the suite file is gone: judge on the default
        return ()
    return found.judge if found else ()


def _latest_runs(campaign: Campaign) -> list[Run]:
    """The last attempt of every matrix point and repetition (warm-ups left out), with their hosts."""
    latest: dict[tuple[int, int], Run] = {}
    runs = campaign.runs.filter(is_warmup=False).prefetch_related("hosts__node").order_by("sequence")
    for run in runs:
        key = (run.point, run.repetition)
        if key not in latest or run.attempt >= latest[key].attempt:
            latest[key] = run
    return list(latest.values())


def _judge_runs(campaign: Campaign, step: str, nodes: dict[str, NodeOutcome]) -> None:
    seen: set[str] = set()
    for run in _latest_runs(campaign):
        hosts = list(run.hosts.all())
        culprit = any(h.exit_code not in (None, 0) for h in hosts)  # then the others are not to blame
        for host in hosts:
            seen.add(host.host)
            outcome = nodes.setdefault(host.host, NodeOutcome(host.host))
            finding = _host_finding(campaign, step, run, host, culprit=culprit)
            if finding is not None:
                outcome.add(finding)
    if campaign.status == CampaignStatus.CANCELLED:
        for name in sorted(set(nodes) - seen):
            nodes[name].add(Finding(f"not_run:{step}", SUSPECT, step, campaign.pk, "the step was cancelled"))


def _host_finding(campaign: Campaign, step: str, run: Run, host: RunHost, *, culprit: bool) -> Finding | None:
    if run.status == RunStatus.CANCELLED:
        return Finding(f"not_run:{step}", SUSPECT, step, campaign.pk, "the run was cancelled", run=run.pk)
    if run.status not in RUN_FAILED:
        return None
    if host.exit_code not in (None, 0):
        last = (host.stderr or host.stdout).strip().splitlines()[-1:] or [""]
        detail = f"exited with code {host.exit_code}" + (f": {last[0][:200]}" if last[0] else "")
        return Finding(f"step_failed:{step}", FAILED, step, campaign.pk, detail, run=run.pk)
    node: Node | None = host.node
    if node is not None and node.suspect_since is not None:
        detail = f"does not answer: {node.suspect_reason[:200]}"
        return Finding("unreachable", FAILED, step, campaign.pk, detail, run=run.pk)
    if host.exit_code is None and host.host in run.error and "answer" in run.error:
        return Finding("unreachable", FAILED, step, campaign.pk, run.error[:300], run=run.pk)
    if culprit:
        return None
    detail = f"the run failed ({run.status}): {run.error[:200]}"
    return Finding(f"run_failed:{step}", SUSPECT, step, campaign.pk, detail, run=run.pk)


def _judge_fleet(
    campaign: Campaign,
    step: str,
    judged: tuple[str, ...],
    nodes: dict[str, NodeOutcome],
    threshold: float,
    suspect_at: float,
) -> None:
    benchmark = get_benchmark(campaign.kind)
    samples = [s for s in campaign_fleet_samples(campaign=campaign) if _is_judged(benchmark, s[0], judged)]
    view = fleet.fleet_view(samples, threshold=threshold)
    for (node, index), cell in sorted(view.cells.items(), key=lambda item: item[1].score.score):
        score = cell.score
        if score.score > -suspect_at or node not in nodes:
            continue
        column = view.columns[index]
        metric = f"{step}.{column.name}"
        share = f" ({score.ratio:.0%} of it)" if score.ratio is not None else ""
        where = f" at {column.params}" if column.params else ""
        detail = (
            f"{column.title}: {numbers.quantity(score.value, column.unit)} against the fleet's median "
            f"{numbers.quantity(score.median, column.unit)}{share}, "
            f"robust score {score.score:.1f}{where}"
        )
        severity, code = (FAILED, f"outlier:{metric}") if score.outlier else (SUSPECT, f"low:{metric}")
        nodes[node].add(
            Finding(
                code,
                severity,
                step,
                campaign.pk,
                detail,
                value=score.value,
                fleet_median=score.median,
                score=round(score.score, 2),
                unit=column.unit,
            )  # fmt: skip
        )


def _is_judged(benchmark: Benchmark, column: fleet.Column, judged: tuple[str, ...]) -> bool:
    """Named in the step's ``judge``; by default, a metric its plug-in describes as higher-is-better. A metric it
    does not describe (a command step's declared pattern: memory size, a clock) is judged only when named: nodes
    may differ there by design."""
    if judged:
        return column.name in judged
    spec = benchmark.spec(column.name)
    return spec is not None and spec.higher_is_better and column.name != "passed"


# --- actions ---------------------------------------------------------------------------------------------------


@dataclass
class Action:
    node: str
    action: str  # maintenance, drain, returned, resumed
    reason: str


def suite_run_act(
    *,
    outcome: SuiteOutcome,
    maintenance: bool = False,
    slurm_login_node: str = "",
    user: Any = None,
    automatic: bool = False,
) -> list[Action]:
    """Act on a finished suite run: failed nodes to maintenance (``maintenance``) and drained on Slurm through the
    login node (``slurm_login_node``); healthy nodes a suite had put in maintenance back to active (and resumed on
    Slurm). Nothing is done unless asked for; a run still under way is a conflict. Each action is taken once per run
    (recorded in SuiteAction); the list holds the ones taken by this call."""
    if not outcome.finished:
        raise CampaignError(f"suite run {outcome.name} has not ended yet", field="name", conflict=True)
    act = _Acting(outcome, user=user, automatic=automatic)
    login = _login_target(slurm_login_node) if slurm_login_node else None
    by_name = {n.name: n for n in Node.objects.filter(name__in=[o.node for o in outcome.nodes])}
    for result in outcome.nodes:
        node = by_name.get(result.node)
        if node is None:
            continue
        if result.verdict == FAILED:
            reason = f"rackbench {act.source}: {', '.join(result.reasons)}"
            if maintenance:
                act.set_status(node, NodeStatus.MAINTENANCE, reason, "maintenance", only_from=NodeStatus.ACTIVE)
            if login is not None:
                act.remote(node, "drain", reason, lambda n=node.name, r=reason: slurm.node_drain(login, n, r))
        elif result.verdict == HEALTHY:
            reason = f"clean {act.source}"
            if maintenance and _held_by_a_suite(node):
                act.set_status(node, NodeStatus.ACTIVE, reason, "returned", only_from=NodeStatus.MAINTENANCE)
            if login is not None and _drained_by_a_suite(login, node.name):
                act.remote(node, "resumed", reason, lambda n=node.name: slurm.node_resume(login, n))
    return act.done


class _Acting:
    """The actions of one call on one suite run, each recorded once (campaigns.suites.suite_action_record)."""

    def __init__(self, outcome: SuiteOutcome, *, user: Any, automatic: bool) -> None:
        self.source = f"{SOURCE_PREFIX}{outcome.name}"
        self.campaign = outcome.steps[0].campaign
        self.user, self.automatic = user, automatic
        self.done: list[Action] = []

    def set_status(self, node: Node, status: str, reason: str, action: str, *, only_from: str) -> None:
        """The status change and its record in one transaction: a second call finds the record and changes
        nothing, even where the node was put back by hand meanwhile."""
        with transaction.atomic():
            changed = node_set_status(
                node=node, status=status, reason=reason, source=self.source, user=self.user, only_from=only_from
            )
            if not changed:
                return
            if self._record(node, action, reason) is None:
                transaction.set_rollback(True)
                node.status = only_from
                return
        self.done.append(Action(node.name, action, reason))

    def remote(self, node: Node, action: str, reason: str, call: Any) -> None:
        """An action on another system (Slurm): recorded first, so that it is tried once; a failure is kept on the
        record and raised."""
        record = self._record(node, action, reason)
        if record is None:
            return
        try:
            call()
        except Exception as exc:
            suites.suite_action_failed(action=record, error=str(exc))
            raise
        self.done.append(Action(node.name, action, reason))

    def _record(self, node: Node, action: str, reason: str) -> SuiteAction | None:
        return suites.suite_action_record(
            campaign_id=self.campaign, node=node.name, action=action, reason=reason, automatic=self.automatic
        )


def _drained_by_a_suite(login: remote.Target, name: str) -> bool:
    state, why = slurm.node_state(login, name)
    return "drain" in state and why.startswith(f"rackbench {SOURCE_PREFIX}")


def _held_by_a_suite(node: Node) -> bool:
    """In maintenance because a suite's action put it there (not an administrator)."""
    if node.status != NodeStatus.MAINTENANCE:
        return False
    last = node.status_changes.order_by("-changed_at", "-id").first()
    return last is not None and last.new == NodeStatus.MAINTENANCE and last.source.startswith(SOURCE_PREFIX)


def _login_target(name: str) -> remote.Target:
    node = Node.objects.filter(name=name).select_related("credential").first()
    if node is None:
        raise NotFound(f"no node named {name[:80]!r} to run scontrol on", field="slurm_login_node")
    return remote.node_target(node)


def suite_run_ended(*, campaign_id: int) -> str:
    """A step of a suite run ended: when it was the last, take the actions asked for at launch (as the user who
    asked). Returns what happened: "no actions", "running" (a step has not ended), or "acted: N". Safe to call any
    number of times (each action is recorded once)."""
    campaign = Campaign.objects.filter(pk=campaign_id).select_related("team").first()
    if campaign is None or not campaign.is_health_check:
        return "no actions"
    first = suites.suite_run_campaigns(name=campaign.suite_run_name, team=campaign.team).first()
    asked = dict(first.suite_actions or {}) if first is not None else {}
    if not asked.get("maintenance") and not asked.get("slurm_login_node"):
        return "no actions"
    threshold = asked.get("threshold", fleet.DEFAULT_THRESHOLD)
    outcome = suite_run_outcome(name=campaign.suite_run_name, team=campaign.team, threshold=threshold,
                                suspect_threshold=asked.get("suspect_threshold"))  # fmt: skip
    if not outcome.finished:
        return "running"
    user = get_user_model().objects.filter(pk=asked["user"]).first() if asked.get("user") else None
    done = suite_run_act(outcome=outcome, maintenance=bool(asked.get("maintenance")),
                         slurm_login_node=asked.get("slurm_login_node", ""), user=user, automatic=True)  # fmt: skip
    return f"acted: {len(done)}"
