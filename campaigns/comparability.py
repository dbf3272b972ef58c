"""Whether two campaigns measured the same thing: a comparison or a verdict across different configurations says so.

Two campaigns are comparable when they ran the same benchmark kind with the same fixed parameters, on the same node
hardware and the same software stack. Hardware and software are read from the runs' provenance (what each host was
when the run started: CPU, GPUs and memory of the node, the tool's version and the kernel), so a node upgraded
between the two campaigns counts as a difference even under the same name. What differs is listed in words, e.g.
``fixed bs: 128k (baseline) vs 4k``; an empty list means comparable.
"""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Subquery

from campaigns.models import Campaign, Run, RunStatus


def configurations(campaigns: list[Campaign]) -> dict[int, dict[str, Any]]:
    """configuration() of each campaign, in one query: the hosts of each campaign's last succeeded run (the run
    with the most hosts of a node-count sweep, in the usual ascending order), found from the end of the campaign's
    runs by sequence (the unique index) rather than by reading all of them."""
    last = Run.objects.filter(campaign=OuterRef("pk"), status=RunStatus.SUCCEEDED, is_warmup=False)
    hosts = dict(
        Campaign.objects.filter(pk__in=[c.pk for c in campaigns])
        .annotate(hosts=Subquery(last.order_by("-sequence").values("provenance__hosts")[:1]))
        .order_by()
        .values_list("pk", "hosts")
    )
    return {c.pk: configuration(c, hosts.get(c.pk) or {}) for c in campaigns}


def configuration(campaign: Campaign, per_host: Any = None) -> dict[str, Any]:
    """What a campaign's results depend on besides its matrix: kind, fixed parameters, and the hardware and software
    of the hosts of one of its runs (``per_host``: a run's provenance["hosts"]; read here when not given)."""
    if per_host is None:
        return configurations([campaign])[campaign.pk]
    hardware: set[str] = set()
    software: set[str] = set()
    if isinstance(per_host, dict):
        for info in per_host.values():
            if not isinstance(info, dict):
                continue
            node = info.get("node") or {}
            gpus = f"{node.get('gpu_count') or 0} x {node.get('gpu_model') or 'GPU'}" if node.get("gpu_count") else ""
            parts = [node.get("cpu_model") or "", f"{node.get('cpu_cores')} cores" if node.get("cpu_cores") else "",
                     f"{node.get('ram_mb')} MB" if node.get("ram_mb") else "", gpus]  # fmt: skip
            if any(parts):
                hardware.add(", ".join(p for p in parts if p))
            stack = [str(info.get("tool_version") or "").strip(), str(info.get("kernel") or "").strip()]
            if any(stack):
                software.add(" / ".join(s for s in stack if s))
    return {
        "kind": campaign.kind,
        "fixed": dict(campaign.fixed),
        "hardware": sorted(hardware),
        "software": sorted(software),
    }


def _value(value: Any) -> str:
    return "(unset)" if value is None else str(value)


def subject(difference: str) -> str:
    """What a difference is about: a fixed parameter's name, or kind, hardware, software."""
    head = difference.split(":", 1)[0]
    return head.removeprefix("fixed ")


def differences(baseline: Campaign, candidate: Campaign) -> list[str]:
    """What differs between the two campaigns' configurations (configuration()), in words; [] when comparable."""
    found = configurations([baseline, candidate])
    return between(found[baseline.pk], found[candidate.pk])


def between(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs from configuration ``a`` (the baseline's) to ``b``. Hardware and software are compared only where
    both campaigns recorded them (results imported without provenance say nothing either way)."""
    found = []
    if a["kind"] != b["kind"]:
        found.append(f"kind: {a['kind']} (baseline) vs {b['kind']}")
    for key in sorted(set(a["fixed"]) | set(b["fixed"])):
        before, after = a["fixed"].get(key), b["fixed"].get(key)
        if before != after:
            found.append(f"fixed {key}: {_value(before)} (baseline) vs {_value(after)}")
    for what in ("hardware", "software"):
        if a[what] and b[what] and a[what] != b[what]:
            found.append(f"{what}: {'; '.join(a[what])} (baseline) vs {'; '.join(b[what])}")
    return found
