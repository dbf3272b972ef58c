"""Slurm as a launcher: a run's main command submitted with ``sbatch`` on a login node, instead of started
detached on its first host.

A campaign says ``launcher: {kind: slurm, login_node: NODE, partition: ..., account: ..., qos: ...,
time: "01:00:00", exclusive: true, extra: ["--gres=gpu:8"]}``. The run still has its compute nodes (inventory
nodes whose Slurm names are their inventory names): rackbench flushes their caches, mounts the storage on them
and hands them to the plug-in as usual. Only the primary's main command changes hands: rackbench writes it with
a batch script into the primary's run directory, at the same path on the login node (a Slurm cluster shares
that file system with its compute nodes), and submits it there::

    rackbench.sbatch  the batch script (below); runs command.sh, then writes exit_code
    submitted         marker written before sbatch (removed again if sbatch refuses): never submitted twice
    slurm_job_id      what ``sbatch --parsable`` answered
    stdout, stderr    the job's output (--output, --error)
    exit_code         command.sh's exit status, for clusters whose accounting (sacct) is off

The job is polled with ``sacct`` (``squeue`` when accounting is off or has not recorded the job yet),
cancelled with ``scancel``. Every value that reaches the batch script is checked here against an allowlist;
every command line is built from argv with shlex.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import ParamError

KINDS = ("direct", "slurm")
FIELDS = ("kind", "login_node", "partition", "account", "qos", "time", "exclusive", "extra")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # node, partition, account and QOS names
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
TIME = re.compile(r"^(\d+|\d+:\d\d|\d+:\d\d:\d\d|\d+-\d+|\d+-\d+:\d\d|\d+-\d+:\d\d:\d\d)$")
# One long option per item, its value with no blanks, quotes, shell characters or %-patterns.
EXTRA = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.,:/+=@-]+)?$")
# Options rackbench sets itself, or that would change what a job id or the batch script means.
MANAGED = frozenset(
    {
        "job-name", "nodes", "nodelist", "ntasks-per-node", "output", "error", "chdir", "requeue", "no-requeue",
        "partition", "account", "qos", "time", "exclusive", "array", "wrap", "parsable", "test-only", "export-file",
        "open-mode", "input", "batch", "het-group", "clusters", "cluster-constraint",
    }
)  # fmt: skip
PATH = re.compile(r"^/[A-Za-z0-9_./+-]+$")
# sbatch's words when the controller is down, slow or full for now (worth another try)
BUSY = re.compile(r"Unable to contact slurm controller|Socket timed out|Resource temporarily unavailable", re.I)
JOB_ID = re.compile(r"^[0-9]+$")
SCRIPT = "rackbench.sbatch"

# https://slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES
ACTIVE = frozenset(
    {
        "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING",
        "STAGE_OUT", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
    }
)  # fmt: skip
ENDED = {
    "COMPLETED": "completed",
    "FAILED": "failed",
    "TIMEOUT": "reached its time limit",
    "CANCELLED": "was cancelled",
    "NODE_FAIL": "lost a node (node failure)",
    "OUT_OF_MEMORY": "ran out of memory",
    "PREEMPTED": "was preempted by another job",
    "BOOT_FAIL": "could not boot its nodes",
    "DEADLINE": "missed its deadline",
    "REVOKED": "was revoked (federation)",
    "SPECIAL_EXIT": "ended in a special exit state",
}


@dataclass(frozen=True)
class SlurmOptions:
    """A campaign's ``launcher`` with ``kind: slurm``, validated."""

    login_node: str
    partition: str = ""
    account: str = ""
    qos: str = ""
    time: str = ""
    exclusive: bool = False
    extra: tuple[str, ...] = ()


def validate_launcher(value: Any) -> dict[str, Any]:
    """A campaign's ``launcher`` normalised: {} for the direct (detached) launch. ParamError names the field."""
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict):
        raise ParamError("launcher", "must be a mapping: {kind: slurm, login_node: NODE, partition: ...}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ParamError(f"launcher.{unknown[0]}", f"unknown field (known fields: {', '.join(FIELDS)})")
    kind = value.get("kind")
    if kind not in KINDS:
        raise ParamError("launcher.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "direct":
        others = sorted(set(value) - {"kind"})
        if others:
            raise ParamError(f"launcher.{others[0]}", "only applies to kind: slurm")
        return {}
    spec: dict[str, Any] = {"kind": "slurm", "login_node": _name(value, "login_node", required=True)}
    for key in ("partition", "account", "qos"):
        if key in value:
            spec[key] = _name(value, key)
    if "time" in value:
        time = value["time"]
        if not isinstance(time, str) or not TIME.match(time):
            raise ParamError(
                "launcher.time", f'must be a quoted Slurm time limit such as "01:00:00" or "2-00:00:00", got {time!r}'
            )
        spec["time"] = time
    if "exclusive" in value:
        if not isinstance(value["exclusive"], bool):
            raise ParamError("launcher.exclusive", f"must be true or false, got {value['exclusive']!r}")
        spec["exclusive"] = value["exclusive"]
    if "extra" in value:
        spec["extra"] = _extra(value["extra"])
    return spec


def _name(value: dict[str, Any], key: str, *, required: bool = False) -> str:
    name = value.get(key)
    if name is None and required:
        raise ParamError(f"launcher.{key}", "required for kind: slurm")
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamError(f"launcher.{key}", f"must be a name: letters, digits, '.', '_' or '-', got {name!r}")
    return name


def _extra(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise ParamError("launcher.extra", 'must be a list of sbatch options, e.g. ["--gres=gpu:8"]')
    for i, item in enumerate(value):
        if not isinstance(item, str) or not EXTRA.match(item):
            raise ParamError(
                f"launcher.extra[{i}]",
                f"must be one long sbatch option such as --gres=gpu:8 or --constraint=a100, got {item!r}",
            )
        option = item[2:].split("=", 1)[0]
        if option in MANAGED:
            raise ParamError(f"launcher.extra[{i}]", f"--{option} is set by rackbench or by a field of launcher")
    return list(value)


def is_slurm(launcher: dict[str, Any] | None) -> bool:
    return bool(launcher and launcher.get("kind") == "slurm")


def options_from_launcher(launcher: dict[str, Any]) -> SlurmOptions:
    spec = validate_launcher(launcher)
    if not spec:
        raise ParamError("launcher.kind", "is not slurm")
    return SlurmOptions(
        login_node=spec["login_node"],
        partition=spec.get("partition", ""),
        account=spec.get("account", ""),
        qos=spec.get("qos", ""),
        time=spec.get("time", ""),
        exclusive=spec.get("exclusive", False),
        extra=tuple(spec.get("extra", ())),
    )


# --- the batch script and the command lines ----------------------------------------------------------


def batch_script(
    *, job_name: str, nodes: Sequence[str], tasks_per_node: int, run_dir: str, options: SlurmOptions
) -> str:
    """The batch script: runs the run directory's command.sh on the first of ``nodes``, in an allocation of all.

    Submitted with --no-requeue: a preempted or node-failed benchmark must end as such, not silently start over
    and overwrite what it printed.
    """
    if not nodes:
        raise ParamError("nodes", "a Slurm job needs at least one node")
    for node in nodes:
        if not NAME.match(node):
            raise ParamError("nodes", f"{node!r} cannot be a Slurm node name")
    if not PATH.match(run_dir) or ".." in run_dir.split("/"):
        raise ParamError("launcher", f"the run directory {run_dir!r} has characters a batch script must not carry")
    if not 1 <= tasks_per_node <= 4096:
        raise ParamError("mpi_slots", f"{tasks_per_node} tasks per node is not a usable Slurm task count")
    directives = [
        f"--job-name={job_name}",
        f"--nodes={len(nodes)}",
        f"--nodelist={','.join(nodes)}",
        f"--ntasks-per-node={tasks_per_node}",
        f"--output={run_dir}/stdout",
        f"--error={run_dir}/stderr",
        f"--chdir={run_dir}",
        "--no-requeue",
    ]
    for key in ("partition", "account", "qos", "time"):
        if getattr(options, key):
            directives.append(f"--{key}={getattr(options, key)}")
    if options.exclusive:
        directives.append("--exclusive")
    directives += options.extra
    lines = ["#!/bin/sh", "# Written by rackbench: this run's main command (command.sh) as one Slurm job."]
    lines += [f"#SBATCH {d}" for d in directives]
    lines += [
        f"cd {shlex.quote(run_dir)} || exit 90",
        "sh ./command.sh < /dev/null",
        "rc=$?",
        "echo $rc > exit_code.tmp && mv exit_code.tmp exit_code",
        "exit $rc",
    ]
    return "\n".join(lines) + "\n"


def sbatch_argv(script: str) -> list[str]:
    return ["sbatch", "--parsable", script]


def sacct_argv(job_id: str) -> list[str]:
    return ["sacct", "-j", job_id, "-n", "-P", "-X", "-o", "State,ExitCode"]


def squeue_argv(job_id: str) -> list[str]:
    # -t all: without it squeue drops a job the moment it ends; with it, ended jobs stay listed for MinJobAge.
    return ["squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T"]


def scancel_argv(job_id: str) -> list[str]:
    return ["scancel", job_id]


REASON_MAX = 100
_REASON_DROP = re.compile(r"[^A-Za-z0-9 _.,:;/()+=@-]+")


def drain_reason(text: str) -> str:
    """A node's drain reason as Slurm keeps it: printable ASCII without quotes, shell or Slurm metacharacters
    (each run of others becomes one space), at most REASON_MAX characters, never empty."""
    cleaned = " ".join(_REASON_DROP.sub(" ", text).split())[:REASON_MAX].strip()
    return cleaned or "rackbench health check"


def drain_argv(node: str, reason: str) -> list[str]:
    """``scontrol update`` draining ``node``: running jobs end, no new ones start, ``Reason`` says why."""
    if not NAME.match(node):
        raise ParamError("node", f"not a Slurm node name: {node[:40]!r}")
    return ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={drain_reason(reason)}"]


def resume_argv(node: str) -> list[str]:
    """``scontrol update`` giving a drained node back to Slurm's scheduler."""
    if not NAME.match(node):
        raise ParamError("node", f"not a Slurm node name: {node[:40]!r}")
    return ["scontrol", "update", f"NodeName={node}", "State=RESUME"]


def node_state_argv(node: str) -> list[str]:
    """``sinfo`` printing the node's state and reason as ``STATE|REASON``."""
    if not NAME.match(node):
        raise ParamError("node", f"not a Slurm node name: {node[:40]!r}")
    return ["sinfo", "-h", "-N", "-n", node, "-o", "%T|%E"]


def parse_node_state(text: str) -> tuple[str, str]:
    """(state, reason) from ``node_state_argv``'s answer; ("", "") when sinfo does not know the node."""
    line = next((line for line in text.splitlines() if "|" in line), "")
    state, _, reason = line.partition("|")
    return state.strip().lower(), reason.strip()


def submit_line(run_dir: str) -> str:
    """Submit the run directory's batch script at most once; prints the job id (sbatch --parsable's answer)."""
    d = shlex.quote(run_dir)
    sbatch = shlex.join(sbatch_argv(SCRIPT))
    return (
        f"cd {d} && if [ ! -e submitted ]; then : > submitted; "
        f"if {sbatch} > slurm_job_id.tmp; then mv slurm_job_id.tmp slurm_job_id; "
        f"else rc=$?; rm -f submitted slurm_job_id.tmp; exit $rc; fi; fi; cat slurm_job_id"
    )


def parse_job_id(text: str) -> str:
    """The job id from ``sbatch --parsable``: "1234", or "1234;cluster" on a multi-cluster setup."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    job_id = first.split(";", 1)[0].strip()
    if not JOB_ID.match(job_id):
        raise ValueError(f"sbatch answered {text.strip()[:200]!r}, not a job id")
    return job_id


# --- states --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmState:
    """What Slurm says about a job. ``state`` is empty once Slurm no longer knows it (accounting off)."""

    job_id: str
    state: str
    exit_code: int | None = None
    source: str = ""  # sacct, squeue, or the exit_code file
    slurm_exit_code: str = ""  # sacct's ExitCode as it printed it, "status:signal"

    @property
    def finished(self) -> bool:
        return self.state not in ACTIVE

    @property
    def error(self) -> str:
        """Why the job failed, in words; empty for a job that completed with exit code 0 (or still runs)."""
        if not self.finished:
            return ""
        job = f"Slurm job {self.job_id}"
        if not self.state:
            if self.exit_code is None:
                return f"{job} is no longer known to Slurm (accounting is off) and left no exit code"
            return "" if self.exit_code == 0 else f"{job} exited with code {self.exit_code}"
        if self.state == "COMPLETED" and not self.exit_code:
            return ""
        if self.state in ("COMPLETED", "FAILED"):
            what = f"failed with exit code {self.exit_code}" if self.exit_code is not None else "failed"
        else:
            what = ENDED.get(self.state, f"ended in state {self.state}, which rackbench does not know")
        signal = self.slurm_exit_code.partition(":")[2]
        code = f" (ExitCode {self.slurm_exit_code})" if signal not in ("", "0") else ""
        return f"{job} {what}{code}"


def exit_code_of(state: str, exit_code: str) -> int | None:
    """Slurm's ExitCode "status:signal" as one number: the status, else 128 + the signal (as a shell reports
    it); None when Slurm ended the job without either (a time limit, a preemption, a node failure) or with
    its own marker in the signal's place (0:125 for OUT_OF_MEMORY)."""
    status, _, signal = exit_code.partition(":")
    if not status.isdigit() or not (signal or "0").isdigit():
        return None
    if int(status):
        return int(status)
    if 1 <= int(signal or "0") <= 64:
        return 128 + int(signal)
    return 0 if state in ("COMPLETED", "FAILED") and not int(signal or "0") else None


def parse_sacct(job_id: str, text: str) -> SlurmState | None:
    """``sacct -n -P -X -o State,ExitCode``: one line per job, e.g. "COMPLETED|0:0", "CANCELLED by 1000|0:15".

    None when sacct has no record (yet) of the job.
    """
    lines = [line for line in text.splitlines() if "|" in line]
    if not lines:
        return None
    state_text, _, code = lines[-1].partition("|")
    state = state_text.split()[0].rstrip("+") if state_text.split() else ""
    if not state:
        return None
    return SlurmState(job_id, state, exit_code_of(state, code.strip()), "sacct", code.strip())


def parse_squeue(text: str) -> str:
    """``squeue -h -o %T``: the state's name, e.g. "RUNNING"; empty when the job is not listed."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- on the login node ----------------------------------------------------------------------------------
