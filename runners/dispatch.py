"""runners' side of the ports campaigns and inventory call (connected in RunnersConfig.ready)."""

from __future__ import annotations

from inventory.models import Node
from runners import facts, remote, tasks


class CeleryRunner:
    """Every step a Celery task on the "ssh" queue."""

    def start(self, run_id: int) -> None:
        tasks.run_start_task.delay(run_id)

    def poll(self, run_id: int, token: str) -> None:
        tasks.run_poll_task.delay(run_id, token)

    def collect(self, run_id: int) -> None:
        tasks.run_collect_task.delay(run_id)

    def kill(self, run_id: int, *, once: bool = False) -> None:
        if once:
            tasks.run_kill_task.apply_async((run_id,), {"once": True})
        else:
            tasks.run_kill_task.delay(run_id)

    def teardown(self, campaign_id: int) -> None:
        tasks.campaign_teardown_task.delay(campaign_id)

    def teardown_time_limit(self) -> float:
        return float(tasks.campaign_teardown_task.time_limit or 0)

    def reprobe_suspect_nodes(self) -> None:
        tasks.nodes_reprobe_task.delay()


def collect_facts(node_id: int) -> None:
    tasks.collect_facts_task.delay(node_id)


def refresh_facts(node_ids: list[int]) -> dict[int, str]:
    """Collect and store these nodes' facts at once, over the pooled fan-out; {node id: error} for the failures."""
    nodes = list(Node.objects.select_related("credential").filter(pk__in=node_ids))
    results = remote.fan_out(nodes, facts.collect_facts)
    return {node.pk: str(result) for node, result in zip(nodes, results, strict=True) if isinstance(result, Exception)}
