"""Store results of runs made by hand outside rackbench."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from campaigns.models import Campaign
from campaigns.services import CampaignError, results_import
from plugins.benchmarks.base import ParamError, ParseError


class Command(BaseCommand):
    help = "Import the output of a run made by hand (one file per host; the file name is the host) into a campaign."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--campaign", required=True)
        parser.add_argument("--kind", required=True)
        parser.add_argument("files", nargs="+")

    def handle(self, *args: Any, **opts: Any) -> None:
        found = list(Campaign.objects.filter(name=opts["campaign"])[:2])
        if len(found) > 1:  # names are unique per team
            raise CommandError(f"several teams have a campaign named {opts['campaign']!r}; import through the pages")
        campaign = found[0] if found else None
        if campaign is None:
            raise CommandError(f"no campaign named {opts['campaign']!r} (create it first: manage.py campaign apply)")
        outputs = []
        for file in opts["files"]:
            try:
                outputs.append((Path(file).stem, Path(file).read_text(errors="replace")))
            except OSError as exc:
                raise CommandError(f"{file}: {exc.strerror}") from None
        try:
            run = results_import(campaign=campaign, kind=opts["kind"], outputs=outputs)
        except (CampaignError, ParamError, ParseError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"imported run #{run.sequence} into {campaign.name}: {run.results.count()} results")
