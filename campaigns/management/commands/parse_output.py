"""Parse benchmark output files and print the metrics found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from common import numbers
from plugins.benchmarks.base import ParamError, ParseError, benchmark_kinds, get_benchmark


class Command(BaseCommand):
    help = "Parse benchmark output files and print their metrics (one file per host; the file name is the host)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", required=True, help=f"benchmark kind ({', '.join(benchmark_kinds())})")
        parser.add_argument("files", nargs="+")
        parser.add_argument(
            "--json", action="store_true", help="print a JSON list of {name, value, unit, host, labels}"
        )
        parser.add_argument("--no-aggregate", action="store_true", help="leave out the aggregate across files")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            benchmark = get_benchmark(opts["kind"])
        except ParamError as exc:
            raise CommandError(exc.message) from None
        metrics = []
        for file in opts["files"]:
            path = Path(file)
            try:
                text = path.read_text(errors="replace")
            except OSError as exc:
                raise CommandError(f"{file}: {exc.strerror}") from None
            try:
                metrics += benchmark.parse(text, host=path.stem)
            except ParseError as exc:
                raise CommandError(f"{file}: {exc}") from None
        if not opts["no_aggregate"] and len(opts["files"]) > 1:
            metrics += benchmark.aggregate(metrics)
        if opts["json"]:
            self.stdout.write(json.dumps([m.as_dict() for m in metrics], indent=2))
            return
        for m in metrics:
            labels = " ".join(f"{k}={v}" for k, v in m.labels.items())
            shown = numbers.quantity(m.value, m.unit, network=numbers.is_network(m.name))
            self.stdout.write(f"{m.host or '(all)':<20} {m.name:<24} {shown:>14} {labels}")
