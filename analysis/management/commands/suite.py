"""Health suites from the command line: list, run, show, act."""

from __future__ import annotations

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from analysis import fleet, health
from campaigns import suites
from common.errors import ApplicationError


class Command(BaseCommand):
    help = "Health suites: a verdict per node (healthy, suspect, failed) with reasons; optional actions on failures."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="the suites and their steps")
        p = sub.add_parser("run", help="launch a suite on nodes: one campaign per step")
        p.add_argument("suite")
        p.add_argument("--nodes", required=True, help="comma-separated node names")
        p.add_argument("--name", default="", help="the run's name (default: SUITE-YYYYmmdd-HHMMSS)")
        p.add_argument("--steps", default="", help="comma-separated steps to run (default: all)")
        p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="added to every step's env")
        p.add_argument("--param", action="append", default=[], metavar="STEP.NAME=VALUE",
                       help="override a step's parameter, e.g. network.duration=2 (a YAML value)")  # fmt: skip
        p.add_argument("--drift", default="", choices=["", "off", "warn", "refuse"],
                       help="the drift gate of every step (default: the suite's, warn)")  # fmt: skip
        p.add_argument("--wait", action="store_true", help="wait until every step has ended, then print the verdicts")
        p.add_argument("--timeout", type=float, default=0, help="give up waiting after this many seconds")
        _judging(p)
        _actions(p)
        p = sub.add_parser("show", help="a suite run's verdict per node, with reasons and evidence")
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
        _judging(p)
        p = sub.add_parser("act", help="act on an ended suite run (failed nodes out, clean ones back)")
        p.add_argument("name")
        _judging(p)
        _actions(p)

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "do_" + opts["action"])(**opts)
        except ApplicationError as exc:
            raise CommandError(str(exc)) from None

    def do_list(self, **_: Any) -> None:
        for suite in suites.suite_list():
            steps = ", ".join(f"{s.name} ({s.definition.get('kind', '?')})" for s in suite.steps)
            self.stdout.write(f"{suite.slug:<12} {suite.title}\n{'':<12} steps: {steps}")

    def do_run(self, suite: str, nodes: str, name: str, steps: str, wait: bool, timeout: float, **opts: Any) -> None:
        variables = dict(item.partition("=")[::2] for item in opts["env"])
        created = suites.suite_launch(
            slug=suite, nodes=_csv(nodes), name=name, steps=_csv(steps) or None, env=variables,
            params=_params(opts["param"]), drift=opts["drift"], maintenance=opts["maintenance"],
            slurm_login_node=opts["slurm_login_node"], threshold=opts["threshold"],
            suspect_threshold=opts["suspect_threshold"],
        )  # fmt: skip
        run_name = created[0].suite_run_name
        self.stdout.write(f"launched suite run {run_name}: {', '.join(c.name for c in created)}")
        if opts["maintenance"] or opts["slurm_login_node"]:
            self.stdout.write("its actions are taken as its last step ends (see: suite show)")
        if not wait:
            return
        outcome = self._wait(run_name, timeout, **opts)
        self._print(outcome)
        if outcome.counts()[health.FAILED]:
            raise CommandError(f"suite run {run_name}: {outcome.counts()[health.FAILED]} node(s) failed")

    def do_show(self, name: str, json: bool = False, **opts: Any) -> None:
        outcome = _outcome(name, **opts)
        if json:
            self.stdout.write(_json(outcome.payload()))
        else:
            self._print(outcome)

    def do_act(self, name: str, **opts: Any) -> None:
        self._act(_outcome(name, **opts), **opts)

    def _wait(self, name: str, timeout: float, **opts: Any) -> health.SuiteOutcome:
        started = time.monotonic()
        while True:
            outcome = _outcome(name, **opts)
            if outcome.finished:
                return outcome
            if timeout and time.monotonic() - started > timeout:
                raise CommandError(f"gave up waiting after {timeout:g} s; the suite run goes on")
            time.sleep(2)

    def _act(self, outcome: health.SuiteOutcome, maintenance: bool, slurm_login_node: str, **_: Any) -> None:
        done = health.suite_run_act(outcome=outcome, maintenance=maintenance, slurm_login_node=slurm_login_node)
        for action in done:
            self.stdout.write(f"{action.node}: {action.action} ({action.reason})")
        if not done:
            self.stdout.write("no action taken")

    def _print(self, outcome: health.SuiteOutcome) -> None:
        steps = ", ".join(f"{s.name} {s.status}" for s in outcome.steps)
        self.stdout.write(f"suite run {outcome.name} ({outcome.suite}): {steps}")
        for message in outcome.drift:
            self.stdout.write(f"drift warning: {message}")
        for action in outcome.actions:
            error = f" — not done: {action['error']}" if action["error"] else ""
            self.stdout.write(f"action: {action['node']} {action['action']} ({action['reason']}){error}")
        for node in outcome.nodes:
            self.stdout.write(f"{node.node:<20} {node.verdict:<8} {', '.join(node.reasons)}")
            for finding in node.findings:
                self.stdout.write(f"{'':<20} {finding.code}: {finding.detail}")


def _judging(parser: CommandParser) -> None:
    parser.add_argument("--threshold", type=float, default=fleet.DEFAULT_THRESHOLD, help="robust score of a failure")
    parser.add_argument("--suspect-threshold", type=float, default=health.DEFAULT_SUSPECT_THRESHOLD)


def _actions(parser: CommandParser) -> None:
    parser.add_argument("--maintenance", action="store_true", help="failed nodes to maintenance, clean ones back")
    parser.add_argument(
        "--slurm-login-node", default="", help="drain failed nodes in Slurm (scontrol on this node), resume clean ones"
    )


def _outcome(name: str, threshold: float, suspect_threshold: float, **_: Any) -> health.SuiteOutcome:
    checked = fleet.parse_threshold(threshold)
    suspect = fleet.parse_threshold(suspect_threshold)
    return health.suite_run_outcome(name=name, team=None, threshold=checked, suspect_threshold=suspect)


def _params(items: list[str]) -> dict[str, dict[str, Any]]:
    """``STEP.NAME=VALUE`` options as suite_launch's params (each value read as YAML: 2, 1M, true)."""
    import yaml

    params: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        step, dot, param = key.partition(".")
        if not sep or not dot or not step or not param:
            raise CommandError(f"--param {item!r}: expected STEP.NAME=VALUE, e.g. network.duration=2")
        params.setdefault(step, {})[param] = yaml.safe_load(value)
    return params


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
