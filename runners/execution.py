"""What a run does on its hosts: flush caches, write its files, start it detached, poll, collect, kill.

Called by the tasks in runners.tasks; every state change goes through campaigns.services.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from campaigns import services
from campaigns.models import Run, RunHost, RunStatus
from runners import remote, ssh
from runners.benchmarks.base import Benchmark, HostContext, Metric, ParseError, get_benchmark

TAIL = 4000


@dataclass
class RunTarget:
    """One host of a run, with the SSH target to reach it."""

    row: RunHost
    target: remote.Target


@dataclass
class HostJob(RunTarget):
    context: HostContext


def run_targets(run: Run, *, started: bool = False) -> list[RunTarget]:
    """The run's hosts in name order (only those with a run directory when ``started``)."""
    rows = list(run.hosts.select_related("node__credential").order_by("host"))
    missing = [r.host for r in rows if r.node is None]
    if missing:
        raise ssh.PermanentSSHError(None, f"nodes removed from the inventory: {', '.join(missing)}")
    return [RunTarget(r, remote.node_target(r.node)) for r in rows if r.node and (r.remote_dir or not started)]


def _raise_first(results: list[Any]) -> None:
    """Raise the first failure of a fan-out, permanent ones first (they decide the run's fate)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    errors.sort(key=lambda e: getattr(e, "transient", False))
    if errors:
        raise errors[0]


def _fan_out(items: list[Any], fn: Any) -> list[Any]:
    return ssh.fan_out(items, fn, workers=settings.RACKBENCH["SSH_FANOUT"])


def data_dir_for(run: Run, node_name: str, root: str) -> str:
    storage = run.campaign.storage
    base = storage.export_path.rstrip("/") if storage and storage.export_path else f"{root}/data"
    return f"{base}/{node_name}"


def host_jobs(run: Run) -> list[HostJob]:
    """Targets and contexts for every host of the run (asks each host for its home directory once)."""
    hosts = run_targets(run)
    roots = _fan_out([h.target for h in hosts], remote.remote_root)
    _raise_first(roots)
    jobs = []
    for i, (host, root) in enumerate(zip(hosts, roots, strict=True)):
        row = host.row
        context = HostContext(
            node=row.host,
            index=i,
            run_dir=f"{root}/{row.host}/{run_dir_name(run)}",
            data_dir=data_dir_for(run, row.host, root),
        )
        jobs.append(HostJob(row, host.target, context))
    return jobs


def run_dir_name(run: Run) -> str:
    return f"run-{run.pk}-{run.uid.hex[:12]}"


def display_command(run_dir: str, argv: list[str], env: dict[str, str]) -> str:
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"cd {shlex.quote(run_dir)} && {exports + ' ' if exports else ''}{shlex.join(argv)}"


# --- prepare ----------------------------------------------------------------------------------------


def run_prepare(run: Run) -> list[HostJob]:
    """Write the run's files on every host, flush caches per the policy, record provenance."""
    benchmark = get_benchmark(run.campaign.kind)
    jobs = host_jobs(run)
    _raise_first(_fan_out(jobs, lambda job: _prepare_host(run, benchmark, job)))
    provenance = dict(run.provenance)
    provenance["hosts"] = dict(
        zip([j.row.host for j in jobs], _fan_out(jobs, lambda j: _host_info(benchmark, j)), strict=True)
    )
    provenance["params"] = run.params
    provenance["flush"] = flush_caches(run, jobs)
    Run.objects.filter(pk=run.pk).update(provenance=provenance, heartbeat_at=timezone.now())
    return jobs


def _prepare_host(run: Run, benchmark: Benchmark, job: HostJob) -> None:
    command = benchmark.build(run.params, job.context)
    files = dict(command.files)
    files["command.sh"] = remote.command_script(command.argv, command.env)
    remote.job_prepare(job.target, job.context.run_dir, extra_dirs=[job.context.data_dir], files=files)
    RunHost.objects.filter(pk=job.row.pk).update(
        command=display_command(job.context.run_dir, command.argv, command.env), remote_dir=job.context.run_dir
    )


def _host_info(benchmark: Benchmark, job: HostJob) -> dict[str, Any]:
    node = job.row.node
    assert node is not None
    version = shlex.join(benchmark.version_argv) if benchmark.version_argv else "true"
    result = job.target.run(f"uname -srm; {version} 2>&1 | head -n 3")
    kernel, _, tool = result.stdout.partition("\n")
    return {
        "kernel": kernel.strip(),
        "tool_version": tool.strip(),
        "node": {
            "address": node.address,
            "cpu_model": node.cpu_model,
            "cpu_cores": node.cpu_cores,
            "ram_mb": node.ram_mb,
            "gpu_model": node.gpu_model,
            "gpu_count": node.gpu_count,
            "facts": node.facts,
            "facts_collected_at": node.facts_collected_at.isoformat() if node.facts_collected_at else None,
        },
    }


def client_flush_command(user: str) -> str:
    if user == "root":
        return "sync && echo 3 > /proc/sys/vm/drop_caches"
    return "sync && echo 3 | sudo -n tee /proc/sys/vm/drop_caches > /dev/null"


def flush_caches(run: Run, jobs: list[HostJob]) -> list[dict[str, Any]]:
    """Flush the storage system's caches, then every client's page cache, per the campaign's policy."""
    campaign = run.campaign
    records: list[dict[str, Any]] = []
    if campaign.flush_storage and campaign.storage:
        target = remote.storage_target(campaign.storage)
        command = shlex.join(shlex.split(campaign.storage.flush_command)) if campaign.storage.flush_command else ""
        if not command:
            raise ssh.PermanentSSHError(None, f"storage system {campaign.storage.name} has no flush command")
        records.append(_flush(target, command, f"storage {campaign.storage.name}", "flushing the storage caches"))
    if campaign.flush_clients:
        results = _fan_out(
            jobs,
            lambda j: _flush(
                j.target, client_flush_command(j.target.endpoint.username), j.row.host, "flushing the page cache"
            ),
        )
        _raise_first(results)
        records += results
    return records


def _flush(target: remote.Target, command: str, label: str, what: str) -> dict[str, Any]:
    at = timezone.now()
    result = target.check(command, what=f"{what} on {label} ({command})")
    return {
        "target": label,
        "command": command,
        "at": at.isoformat(),
        "seconds": round(result.seconds, 3),
        "exit_code": 0,
    }


def run_submit(jobs: list[HostJob]) -> None:
    """Start the run on every host at once; if one host refuses, stop the others."""
    results = _fan_out(jobs, lambda j: remote.job_submit(j.target, j.context.run_dir))
    if any(isinstance(r, BaseException) for r in results):
        _fan_out(jobs, lambda j: remote.job_kill(j.target, j.context.run_dir))
        _raise_first(results)


# --- poll, collect, kill --------------------------------------------------------------------------


@dataclass
class PollOutcome:
    finished: bool
    vanished: list[str]


def run_poll(run: Run) -> PollOutcome:
    hosts = run_targets(run)
    states = _fan_out(hosts, lambda h: remote.job_state(h.target, h.row.remote_dir))
    _raise_first(states)
    for host, state in zip(hosts, states, strict=True):
        if state.pid and host.row.pid != state.pid:
            RunHost.objects.filter(pk=host.row.pk).update(pid=state.pid)
    vanished = [h.row.host for h, state in zip(hosts, states, strict=True) if state.vanished]
    return PollOutcome(finished=all(s.finished for s in states), vanished=vanished)


def run_collect(run: Run) -> tuple[str, str]:
    """Fetch every host's output, store it and the parsed metrics; returns (status, error)."""
    benchmark = get_benchmark(run.campaign.kind)
    hosts = run_targets(run)
    outputs = _fan_out(
        hosts, lambda h: (*remote.job_output(h.target, h.row.remote_dir), remote.job_state(h.target, h.row.remote_dir))
    )
    _raise_first(outputs)
    errors: list[str] = []
    per_host: list[Metric] = []
    for row, (stdout, stderr, state) in zip([h.row for h in hosts], outputs, strict=True):
        RunHost.objects.filter(pk=row.pk).update(stdout=stdout, stderr=stderr, exit_code=state.exit_code)
        if state.exit_code != 0:
            errors.append(f"{row.host}: exited with code {state.exit_code}: {_last_lines(stderr or stdout)}")
            continue
        try:
            per_host += benchmark.parse(stdout, host=row.host)
        except ParseError as exc:
            errors.append(f"{row.host}: output could not be parsed: {exc}")
    Run.objects.filter(pk=run.pk).update(
        stdout_tail=_tails([(h.row.host, o[0]) for h, o in zip(hosts, outputs, strict=True)]),
        stderr_tail=_tails([(h.row.host, o[1]) for h, o in zip(hosts, outputs, strict=True)]),
    )
    metrics = per_host + benchmark.aggregate(per_host) if per_host else []
    services.run_store_results(run=run, metrics=metrics)
    if not errors:
        errors += _missing_metrics(benchmark, metrics, [h.row.host for h in hosts])
    return (RunStatus.FAILED, "\n".join(errors)) if errors else (RunStatus.SUCCEEDED, "")


def _missing_metrics(benchmark: Benchmark, metrics: list[Metric], hosts: list[str]) -> list[str]:
    found = {(m.name, m.host) for m in metrics}
    return [
        f"{host}: expected metric {name} is missing from the output"
        for host in hosts
        for name in benchmark.required_metrics
        if (name, host) not in found
    ]


def _last_lines(text: str, count: int = 3) -> str:
    """The end of a tool's complaint: the cause often comes a line or two before the last one."""
    lines = [line.strip()[:300] for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "(no output)"


def _tails(pairs: list[tuple[str, str]]) -> str:
    if len(pairs) == 1:
        return pairs[0][1][-TAIL:]
    per = max(TAIL // max(len(pairs), 1), 200)
    return "\n".join(f"==> {host} <==\n{text[-per:]}" for host, text in pairs if text)


def run_kill(run: Run) -> None:
    results = _fan_out(run_targets(run, started=True), lambda h: remote.job_kill(h.target, h.row.remote_dir))
    _raise_first(results)


def run_keep_output(run: Run) -> None:
    """Store what a stopped run printed (best effort: a host that cannot be reached keeps nothing)."""
    hosts = run_targets(run, started=True)
    outputs = _fan_out(hosts, lambda h: remote.job_output(h.target, h.row.remote_dir))
    kept = [(h.row, o) for h, o in zip(hosts, outputs, strict=True) if not isinstance(o, BaseException)]
    for row, (stdout, stderr) in kept:
        RunHost.objects.filter(pk=row.pk).update(stdout=stdout, stderr=stderr)
    Run.objects.filter(pk=run.pk).update(
        stdout_tail=_tails([(r.host, o[0]) for r, o in kept]), stderr_tail=_tails([(r.host, o[1]) for r, o in kept])
    )
