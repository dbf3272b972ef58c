"""Slurm's I/O: submit, poll and cancel a run's batch job on the login node (the pure part, from the batch script
to the parsing of sacct and squeue, is plugins/launchers/slurm.py)."""

from __future__ import annotations

import shlex

from plugins.launchers.slurm import (
    ACTIVE,
    BUSY,
    SlurmState,
    drain_argv,
    node_state_argv,
    parse_job_id,
    parse_node_state,
    parse_sacct,
    parse_squeue,
    resume_argv,
    sacct_argv,
    scancel_argv,
    squeue_argv,
    submit_line,
)
from runners import remote, ssh


def submit(target: remote.Target, run_dir: str) -> str:
    """sbatch the run directory's batch script (once: a repeated call answers the first job id).

    A controller that does not answer is a transient error (retried); any other refusal is sbatch's final word.
    """
    result = target.run(submit_line(run_dir))
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        error = ssh.TransientSSHError if BUSY.search(detail) else ssh.PermanentSSHError
        raise error(target.endpoint, f"submitting the Slurm job (sbatch) failed (exit {result.exit_code}): {detail}")
    try:
        return parse_job_id(result.stdout)
    except ValueError as exc:
        raise ssh.PermanentSSHError(target.endpoint, f"submitting the Slurm job: {exc}") from None


def recorded_job_id(target: remote.Target, run_dir: str) -> str:
    """The job id sbatch answered, from the run directory (empty when none was recorded)."""
    data = target.get(f"{run_dir}/slurm_job_id")
    if not data:
        return ""
    try:
        return parse_job_id(data.decode(errors="replace"))
    except ValueError:
        return ""


def job_state(target: remote.Target, job_id: str, run_dir: str) -> SlurmState:
    """sacct first; squeue when accounting is off or has not recorded the job yet; then the exit_code file."""
    result = target.run(shlex.join(sacct_argv(job_id)))
    found = parse_sacct(job_id, result.stdout) if result.ok else None
    if found is not None:
        return found
    result = target.run(shlex.join(squeue_argv(job_id)))
    if not result.ok and "Invalid job id" not in result.stderr:
        detail = (result.stderr or result.stdout).strip()[-300:]
        raise ssh.TransientSSHError(target.endpoint, f"squeue cannot tell the state of job {job_id}: {detail}")
    state = parse_squeue(result.stdout) if result.ok else ""
    if state in ACTIVE:
        return SlurmState(job_id, state, None, "squeue")
    code = _exit_code_file(target, run_dir)
    if state:  # ended, still listed by squeue: it gives the state, the batch script the exit status
        return SlurmState(job_id, state, code, "squeue")
    return SlurmState(job_id, "", code, "exit_code file" if code is not None else "")


def _exit_code_file(target: remote.Target, run_dir: str) -> int | None:
    data = (target.get(f"{run_dir}/exit_code") or b"").decode(errors="replace").strip()
    return int(data) if data.lstrip("-").isdigit() else None


def cancel(target: remote.Target, job_id: str, run_dir: str) -> None:
    """scancel the job. When scancel refuses, Slurm's own state of the job decides: one that has ended is not an
    error; a controller that does not answer is transient (retried); any other refusal is permanent."""
    result = target.run(shlex.join(scancel_argv(job_id)))
    if result.ok:
        return
    detail = (result.stderr or result.stdout).strip()[-500:]
    if not BUSY.search(detail) and job_state(target, job_id, run_dir).finished:
        return
    error = ssh.TransientSSHError if BUSY.search(detail) else ssh.PermanentSSHError
    raise error(target.endpoint, f"cancelling Slurm job {job_id} (scancel) failed (exit {result.exit_code}): {detail}")


def node_drain(target: remote.Target, node: str, reason: str) -> None:
    """Drain the Slurm node ``node`` with ``reason``, through ``scontrol`` on the login node ``target``."""
    _scontrol(target, drain_argv(node, reason), f"draining Slurm node {node}")


def node_resume(target: remote.Target, node: str) -> None:
    """Give the drained Slurm node ``node`` back to the scheduler."""
    _scontrol(target, resume_argv(node), f"resuming Slurm node {node}")


def node_state(target: remote.Target, node: str) -> tuple[str, str]:
    """The Slurm node's (state, reason), e.g. ("drained", "rackbench suite run ...")."""
    result = target.run(shlex.join(node_state_argv(node)))
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        error = ssh.TransientSSHError if BUSY.search(detail) else ssh.PermanentSSHError
        raise error(target.endpoint, f"reading Slurm node {node}'s state (sinfo) failed: {detail}")
    return parse_node_state(result.stdout)


def _scontrol(target: remote.Target, argv: list[str], what: str) -> None:
    result = target.run(shlex.join(argv))  # every word quoted: the reason reaches scontrol as one argument
    if not result.ok:
        detail = (result.stderr or result.stdout).strip()[-500:]
        error = ssh.TransientSSHError if BUSY.search(detail) else ssh.PermanentSSHError
        raise error(target.endpoint, f"{what} (scontrol) failed (exit {result.exit_code}): {detail}")
