"""The drift gate: before a campaign launches, its nodes' facts are compared (inventory/drift.py) and a difference
refuses the launch, or is let through with a warning stored on the campaign (``Campaign.drift_report``, shown on its
page, its suite run's page and in the API), as the campaign's ``drift:`` setting says.

The setting lives in ``Campaign.rules["drift"]`` beside the matrix rules (zip, exclude, ...): it is part of the
definition, not a column of its own. Off by default for a campaign: an existing campaign must not start refusing
launches on fleets whose nodes differ on purpose; on (warn) by default in a health suite's steps (campaigns.suites).
A launch refreshes the facts older than the setting's ``max_age`` (RACKBENCH_FACTS_MAX_AGE) first and waits for them;
previews compare the facts as stored, with their age.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings

from campaigns.errors import CampaignError
from campaigns.models import Campaign
from inventory import drift, services
from inventory.models import Node

log = logging.getLogger(__name__)
SHOWN = 5  # findings spelled out in the error's message; the rest are in its extra


class DriftError(CampaignError):
    """The drift gate refused a launch; ``extra["drift"]`` lists every finding, ``extra["unreachable"]`` the nodes
    whose facts could not be collected."""


@dataclass
class DriftReport:
    mode: str
    nodes: list[str]
    golden: str = ""
    findings: list[drift.Drift] = field(default_factory=list)
    unreachable: dict[str, str] = field(default_factory=dict)
    collected_at: dict[str, datetime | None] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not self.findings and not self.unreachable

    @property
    def messages(self) -> list[str]:
        return [f"{node}: facts could not be collected: {why}" for node, why in sorted(self.unreachable.items())] + [
            d.message for d in self.findings
        ]

    def summary(self) -> str:
        messages = self.messages
        more = f"; and {len(messages) - SHOWN} more" if len(messages) > SHOWN else ""
        return "drift gate: " + "; ".join(messages[:SHOWN]) + more

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "nodes": self.nodes,
            "golden": self.golden,
            "clean": self.clean,
            "findings": [d.as_dict() for d in self.findings],
            "unreachable": self.unreachable,
            "collected_at": {n: t.isoformat() if t else None for n, t in self.collected_at.items()},
        }


def drift_config(campaign: Campaign) -> dict[str, Any]:
    return dict(campaign.rules.get("drift") or {})


def golden_node(config: dict[str, Any], team: Any) -> Node | None:
    """The setting's golden node, in what the campaign's team may use; CampaignError (drift.golden) if none."""
    from campaigns.definition import in_team

    if not config.get("golden"):
        return None
    node = in_team(Node.objects.filter(name=config["golden"]), team).first()
    if node is None:
        raise CampaignError(f"no node named {config['golden']!r} in the inventory", field="drift.golden")
    return node


def campaign_drift_check(*, campaign: Campaign, nodes: list[Node], refresh: bool) -> DriftReport | None:
    """Compare the facts of ``nodes`` (the campaign's targets) as its setting says; None when the gate is off.

    ``refresh``: collect the facts older than the setting's max_age first (a launch); else use them as stored."""
    config = drift_config(campaign)
    if not config:
        return None
    golden = golden_node(config, campaign.team)
    everyone = nodes + ([golden] if golden is not None and golden not in nodes else [])
    unreachable: dict[str, str] = {}
    if refresh:
        max_age = config.get("max_age_s", settings.RACKBENCH["FACTS_MAX_AGE"])
        unreachable = services.node_facts_refresh(nodes=everyone, max_age_s=max_age)
    for node in everyone:
        if not node.facts and node.name not in unreachable:
            unreachable[node.name] = "none collected yet"
    values = {n.name: drift.fact_values(n.facts) for n in nodes if n.name not in unreachable}
    reference = None
    if golden is not None and golden.name not in unreachable:
        reference = drift.fact_values(golden.facts)
    findings = drift.compare(
        values,
        golden=reference,
        golden_name=golden.name if golden else "",
        expect=config.get("expect"),
        fields=config.get("fields"),
        ignore=config.get("ignore"),
    )
    return DriftReport(
        mode=config["mode"],
        nodes=[n.name for n in nodes],
        golden=golden.name if golden else "",
        findings=findings,
        unreachable=unreachable,
        collected_at={n.name: n.facts_collected_at for n in everyone},
    )


def campaign_drift_gate(*, campaign: Campaign, nodes: list[Node]) -> DriftReport | None:
    """The check a launch makes: fresh facts compared; a refusing gate raises DriftError naming every node, field
    and both values, a warning one stores them on the campaign (``drift_report``) and logs them."""
    report = campaign_drift_check(campaign=campaign, nodes=nodes, refresh=True)
    if report is None or report.clean:
        return report
    if report.mode == "refuse":
        raise DriftError(
            report.summary(),
            field="drift",
            drift=[d.as_dict() for d in report.findings],
            unreachable=report.unreachable,
        )
    log.warning("campaign %s launched despite drift: %s", campaign.name, report.summary())
    campaign.drift_report = {**report.as_dict(), "messages": report.messages}
    Campaign.objects.filter(pk=campaign.pk).update(drift_report=campaign.drift_report)
    return report
