"""The embedded default, SQLite: campaign statistics, compare (the Python path) and the scaling and sweep pages'
median (the SQLite median aggregate) work there, and agree with each other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, sqlite_data_dir, without_configuration

SCRIPT = """
import json
from accounts.services import team_create
from analysis import selectors as analysis
from campaigns import baselines, selectors
from campaigns.models import Campaign, CampaignStatus, Result, Run, RunStatus
from django.db import connection

team = team_create(name="demo")
made = []
for name, values in (("before", [100.0, 101.0, 99.0]), ("after", [80.0, 81.0, 200.0])):
    c = Campaign.objects.create(name=name, kind="fio", team=team, matrix=[["rw", ["read"]]], statistic="median",
                                status=CampaignStatus.SUCCEEDED)
    for i, value in enumerate(values):
        run = Run.objects.create(campaign=c, sequence=i + 1, point=0, params={"rw": "read"}, repetition=i + 1,
                                 status=RunStatus.SUCCEEDED)
        Result.objects.create(run=run, name="bw_bytes", value=value, unit="B/s")
    made.append(c)
compared = selectors.compare(sets=[("a", made[0], None), ("b", made[1], None)])
print(json.dumps({
    "vendor": connection.vendor,
    "in_sql": baselines.summaries_in_sql(),
    "summary": selectors.campaign_summary(campaign=made[1])[0]["value"],
    "compare": compared["rows"][0]["values"][1]["value"],
    "change": compared["rows"][0]["changes"][1]["change_pct"],
    "scaling": [s.value("median") for s in analysis.point_stats(campaign_ids=[made[1].pk], metric="bw_bytes")],
    "sweep": analysis.sweep_stats(campaign_ids=[made[0].pk], metric="bw_bytes", hosts="aggregate")[0].median,
}))
"""


def test_statistics_compare_and_the_median_of_the_analysis_pages_work_on_sqlite(
    tmp_path: Path, migrated_sqlite: Path
) -> None:
    env = without_configuration(sqlite_data_dir(migrated_sqlite, tmp_path))
    shell = subprocess.run([sys.executable, "manage.py", "shell", "-c", SCRIPT], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shell.returncode == 0, shell.stderr

    found = json.loads(shell.stdout.strip().splitlines()[-1])
    assert (found["vendor"], found["in_sql"]) == ("sqlite", False)
    assert found["summary"] == found["compare"] == 81.0 == found["scaling"][0]
    assert round(found["change"], 6) == -19.0
    assert found["sweep"] == 100.0
