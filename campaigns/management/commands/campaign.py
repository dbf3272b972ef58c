"""Campaign as code: apply, preview, run, show, export, clone, cancel, list."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Avg, F

from campaigns import selectors, services
from campaigns.models import Campaign, CampaignStatus
from campaigns.spec import SpecError, load_yaml, to_yaml
from common import numbers
from common import progress as progress_text


class Command(BaseCommand):
    help = "Manage campaigns as code (see examples/campaigns/ and the README)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        p = sub.add_parser("apply", help="create or update campaigns from YAML files")
        p.add_argument("files", nargs="+")
        p = sub.add_parser("preview", help="how many runs and the exact command of each point on each host")
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
        p = sub.add_parser("run", help="launch a campaign")
        p.add_argument("name")
        p.add_argument("--wait", action="store_true", help="print progress until it ends, then a results table")
        p.add_argument("--timeout", type=float, default=0, help="give up waiting after this many seconds")
        p = sub.add_parser("show", help="a campaign with its runs and statistics")
        p.add_argument("name")
        p.add_argument("--json", action="store_true")
        p = sub.add_parser("export", help="print the campaign as YAML")
        p.add_argument("name")
        p = sub.add_parser("clone", help="copy a campaign's definition under a new name")
        p.add_argument("name")
        p.add_argument("new_name")
        p = sub.add_parser("cancel", help="cancel a running campaign")
        p.add_argument("name")
        sub.add_parser("list", help="every campaign with its status")
        p = sub.add_parser("preset", help="campaigns from the reference papers: list, or apply one to your inventory")
        p.add_argument("preset", nargs="?", help="the preset to apply (omit to list them)")
        p.add_argument("--name", help="name of the new campaign (a suite adds -PART)")
        p.add_argument("--nodes", default="", help="comma-separated node names")
        p.add_argument("--node-tags", default="", help="comma-separated tags")
        p.add_argument("--storage", default="", help="storage system name")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            getattr(self, "do_" + opts["action"])(**opts)
        except (SpecError, services.CampaignError) as exc:
            raise CommandError(str(exc)) from None

    def _get(self, name: str) -> Campaign:
        found = list(Campaign.objects.filter(name=name).select_related("team")[:10])
        if not found:
            raise CommandError(f"no campaign named {name!r}")
        if len(found) > 1:  # names are unique per team: the command line sees every team
            teams = ", ".join(c.team.name if c.team else "shared" for c in found)
            raise CommandError(f"several campaigns are named {name!r} (teams: {teams}); use the API or the pages")
        return found[0]

    def do_apply(self, files: list[str], **_: Any) -> None:
        for file in files:
            try:
                text = Path(file).read_text()
            except OSError as exc:
                raise CommandError(f"{file}: {exc.strerror}") from None
            try:
                campaign = services.campaign_apply(data=load_yaml(text))
            except SpecError as exc:
                raise CommandError(f"{file}: {exc}") from None
            count = selectors.campaign_preview(campaign=campaign, max_points=0)["runs"]
            self.stdout.write(f"applied {campaign.name}: {count} runs")

    def do_preview(self, name: str, json: bool = False, **_: Any) -> None:
        preview = selectors.campaign_preview(campaign=self._get(name))
        if json:
            self.stdout.write(_json(preview))
            return
        self.stdout.write(
            f"{preview['runs']} runs = {preview['points']} points x ({preview['repetitions']} repetitions"
            f" + {preview['warmup_runs']} warm-up) on {', '.join(preview['nodes'])}"
        )
        for point in preview["shown"]:
            self.stdout.write(f"\npoint {point['point']}: {point['params']}")
            for host in point["hosts"]:
                if host["layout"]:
                    self.stdout.write(f"  {host['host']} (layout, before the flush): {host['layout']}")
                self.stdout.write(f"  {host['host']}: {host['command']}")

    def do_run(self, name: str, wait: bool = False, timeout: float = 0, **_: Any) -> None:
        campaign = services.campaign_launch(campaign=self._get(name))
        self.stdout.write(f"launched {campaign.name}: {campaign.runs.count()} runs")
        if not wait:
            return
        campaign = self._wait(campaign, timeout)
        self._print_summary(campaign)
        if campaign.status != CampaignStatus.SUCCEEDED:
            raise CommandError(f"campaign {campaign.name} {campaign.status}")

    def _write(self, text: str) -> None:
        self.stdout.write(text, ending="")
        self.stdout.flush()

    def _wait(self, campaign: Campaign, timeout: float) -> Campaign:
        """Follow the campaign to its end: a progress bar with ETA on a terminal, plain lines in a log."""
        started = time.monotonic()
        printer = progress_text.Printer(self._write, tty=self.stdout.isatty())
        while True:
            campaign.refresh_from_db()
            progress = selectors.campaign_progress(campaign=campaign)
            done, total = progress["done"], progress["total"]
            mean = campaign.runs.filter(finished_at__isnull=False, started_at__isnull=False).aggregate(
                mean=Avg(F("finished_at") - F("started_at"))
            )["mean"]
            eta = selectors.eta_seconds(mean=mean, total=total, done=done)
            counts = " ".join(f"{s}={n}" for s, n in sorted(progress["by_status"].items()))
            printer.show(done, total, eta_s=eta, status=campaign.status, detail=counts)
            if campaign.is_terminal:
                printer.end()
                return campaign
            if timeout and time.monotonic() - started > timeout:
                raise CommandError(f"gave up waiting after {timeout:g} s; the campaign goes on")
            time.sleep(1)

    def _print_summary(self, campaign: Campaign) -> None:
        for run in campaign.runs.exclude(error="").order_by("sequence"):
            self.stdout.write(f"run #{run.sequence} {run.status}: {run.error}")
        rows = selectors.campaign_summary(campaign=campaign)
        if not rows:
            self.stdout.write("no results")
            return
        statistic = campaign.statistic
        self.stdout.write(f"each point: the {statistic} of its repetitions (the campaign's statistic)")
        shown = ("median", "mean") if statistic == "median" else ("mean", "median")
        table = [["point", "params", "metric", "n", *shown, "stdev", "min", "max"]]
        for r in rows:
            params = " ".join(f"{k}={v}" for k, v in r["params"].items() if k in dict(campaign.matrix))
            table.append(
                [
                    str(r["point"]),
                    params,
                    r["metric"],
                    str(r["n"]),
                    *(numbers.quantity(r[k], r["unit"]) for k in (*shown, "stdev", "min", "max")),
                ]  # fmt: skip
            )
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            self.stdout.write("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())

    def do_show(self, name: str, json: bool = False, **_: Any) -> None:
        campaign = self._get(name)
        runs = [
            {
                "sequence": r.sequence,
                "point": r.point,
                "repetition": r.repetition,
                "warmup": r.is_warmup,
                "status": r.status,
                "params": r.params,
                "error": r.error,
                "results": [{"name": m.name, "value": m.value, "unit": m.unit} for m in r.aggregates],  # type: ignore[attr-defined]
            }
            for r in selectors.campaign_runs(campaign=campaign)
        ]
        data = {
            "name": campaign.name,
            "status": campaign.status,
            "kind": campaign.kind,
            "statistic": campaign.statistic,
            "progress": selectors.campaign_progress(campaign=campaign),
            "definition": selectors.campaign_spec(campaign=campaign),
            "runs": runs,
            "summary": selectors.campaign_summary(campaign=campaign),
        }
        if json:
            self.stdout.write(_json(data))
            return
        self.stdout.write(f"{campaign.name} [{campaign.kind}] {campaign.status}")
        for run in runs:
            self.stdout.write(f"  #{run['sequence']:<4} {run['status']:<10} {run['params']} {run['error'][:120]}")
        self._print_summary(campaign)

    def do_export(self, name: str, **_: Any) -> None:
        self.stdout.write(to_yaml(selectors.campaign_spec(campaign=self._get(name))).rstrip())

    def do_clone(self, name: str, new_name: str, **_: Any) -> None:
        clone = services.campaign_clone(campaign=self._get(name), name=new_name)
        self.stdout.write(f"cloned {name} as {clone.name}")

    def do_cancel(self, name: str, **_: Any) -> None:
        campaign = services.campaign_cancel(campaign=self._get(name))
        self.stdout.write(f"{campaign.name} {campaign.status}")

    def do_preset(
        self, preset: str | None, name: str | None, nodes: str, node_tags: str, storage: str, **_: Any
    ) -> None:
        from campaigns.presets import preset_list

        if not preset:
            for p in preset_list():
                self.stdout.write(f"{p.slug:<32} seed {p.seed}\n{'':<32} {p.title} (needs: {', '.join(p.needs)})")
            return
        if not name:
            raise CommandError("--name is required to apply a preset")
        created = services.preset_instantiate(
            slug=preset, name=name, nodes=_csv(nodes), node_tags=_csv(node_tags), storage=storage
        )
        for campaign in created:
            runs = selectors.campaign_preview(campaign=campaign, max_points=0)["runs"]
            self.stdout.write(f"created {campaign.name}: {runs} runs (manage.py campaign run {campaign.name})")

    def do_list(self, **_: Any) -> None:
        for c in selectors.campaign_list():
            done, total = c.run_done, c.run_total  # type: ignore[attr-defined]  # annotations of campaign_list()
            self.stdout.write(f"{c.name:<40} {c.kind:<8} {c.status:<10} {done}/{total} runs")


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
