"""Links from a run to Grafana over the run's time window (RACKBENCH_GRAFANA_URL, RACKBENCH_GRAFANA_DASHBOARD)."""

from __future__ import annotations

import urllib.parse
from datetime import datetime, timedelta

from django.conf import settings

PADDING = timedelta(seconds=30)  # at least: a dashboard's rate() panels need some time before the run starts
PADDING_SHARE = 0.05  # of the run's duration, on each side, for a long run


def grafana_url(start: datetime | None, end: datetime | None) -> str:
    """Grafana's dashboard (or home) from ``start`` to ``end`` padded a little, in epoch ms; "" when not set up.

    A run that has not ended yet is drawn up to ``now``. A dashboard path may carry its own query (variables such
    as ``?var-job=node``): ``from`` and ``to`` are added to it.
    """
    base = settings.RACKBENCH["GRAFANA_URL"]
    if not base or start is None:
        return ""
    path = settings.RACKBENCH["GRAFANA_DASHBOARD"] or "/"
    padding = max(PADDING, ((end or start) - start) * PADDING_SHARE)
    window = {
        "from": str(int((start - padding).timestamp() * 1000)),
        "to": str(int((end + padding).timestamp() * 1000)) if end else "now",
    }
    separator = "&" if "?" in path else "?"
    return f"{base}/{path.lstrip('/')}{separator}{urllib.parse.urlencode(window)}"
