"""The Slurm launcher: validation, the batch script and command lines, states read from real Slurm output, the
campaign round trip, and runs submitted through a lab node to a real single-node Slurm on this machine."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from campaigns import selectors, services
from campaigns import spec as spec_module
from campaigns.models import Campaign, CampaignStatus, RunStatus
from campaigns.spec import SpecError
from inventory.services import node_upsert
from plugins.benchmarks.base import ParamError
from plugins.launchers import slurm
from runners import remote, ssh
from runners import slurm as slurm_jobs
from tests.conftest import finished, wait_for

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


# --- validation -------------------------------------------------------------------------------------------


def test_it_normalises_a_slurm_launcher() -> None:
    value = {
        "kind": "slurm",
        "login_node": "login1",
        "partition": "gpu",
        "account": "bench",
        "qos": "normal",
        "time": "01:00:00",
        "exclusive": True,
        "extra": ["--gres=gpu:8", "--constraint=a100"],
    }

    assert slurm.validate_launcher(value) == value
    minimal = {"kind": "slurm", "login_node": "login1"}
    assert slurm.validate_launcher(minimal) == minimal


@pytest.mark.parametrize("value", [None, {}, {"kind": "direct"}])
def test_the_direct_launch_is_no_launcher_at_all(value: Any) -> None:
    assert slurm.validate_launcher(value) == {}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ("slurm", "launcher"),
        ({"kind": "pbs"}, "launcher.kind"),
        ({"login_node": "login1"}, "launcher.kind"),
        ({"kind": "slurm"}, "launcher.login_node"),
        ({"kind": "slurm", "login_node": "login1; reboot"}, "launcher.login_node"),
        ({"kind": "slurm", "login_node": "l", "partition": "gpu --uid=0"}, "launcher.partition"),
        ({"kind": "slurm", "login_node": "l", "account": ""}, "launcher.account"),
        ({"kind": "slurm", "login_node": "l", "qos": "a\nb"}, "launcher.qos"),
        ({"kind": "slurm", "login_node": "l", "time": 3600}, "launcher.time"),
        ({"kind": "slurm", "login_node": "l", "time": "1 hour"}, "launcher.time"),
        ({"kind": "slurm", "login_node": "l", "exclusive": "yes"}, "launcher.exclusive"),
        ({"kind": "slurm", "login_node": "l", "extra": "--gres=gpu:8"}, "launcher.extra"),
        ({"kind": "slurm", "login_node": "l", "extra": ["--gres=gpu:8", "-C a100"]}, "launcher.extra[1]"),
        ({"kind": "slurm", "login_node": "l", "extra": ["--comment=$(reboot)"]}, "launcher.extra[0]"),
        ({"kind": "slurm", "login_node": "l", "extra": ["--mail-user=a b"]}, "launcher.extra[0]"),
        ({"kind": "slurm", "login_node": "l", "extra": ["--output=/tmp/x"]}, "launcher.extra[0]"),
        ({"kind": "slurm", "login_node": "l", "extra": ["--array=1-4"]}, "launcher.extra[0]"),
        ({"kind": "slurm", "login_node": "l", "extra": ["--job-name=%j"]}, "launcher.extra[0]"),
        ({"kind": "slurm", "login_node": "l", "nodes": 4}, "launcher.nodes"),
        ({"kind": "direct", "partition": "gpu"}, "launcher.partition"),
    ],
)
def test_it_refuses_a_bad_launcher_naming_the_field(value: Any, field: str) -> None:
    with pytest.raises(ParamError) as caught:
        slurm.validate_launcher(value)
    assert caught.value.field == field


def test_a_campaign_file_reports_the_launchers_field() -> None:
    data = {"name": "s", "kind": "fio", "nodes": ["n1"], "launcher": {"kind": "slurm", "login_node": "l", "qos": "-"}}

    with pytest.raises(SpecError) as caught:
        spec_module.validate(data)
    assert caught.value.field == "launcher.qos"


# --- the batch script and the command lines ----------------------------------------------------------------

RUN_DIR = "/home/bench/.rackbench/gpu1/run-12-0123456789ab"


def test_it_writes_the_batch_script() -> None:
    options = slurm.SlurmOptions(
        login_node="login1",
        partition="gpu",
        account="bench",
        qos="normal",
        time="01:00:00",
        exclusive=True,
        extra=("--gres=gpu:8",),
    )

    script = slurm.batch_script(
        job_name="rackbench-12", nodes=["gpu1", "gpu2"], tasks_per_node=8, run_dir=RUN_DIR, options=options
    )

    assert script == (
        "#!/bin/sh\n"
        "# Written by rackbench: this run's main command (command.sh) as one Slurm job.\n"
        "#SBATCH --job-name=rackbench-12\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --nodelist=gpu1,gpu2\n"
        "#SBATCH --ntasks-per-node=8\n"
        f"#SBATCH --output={RUN_DIR}/stdout\n"
        f"#SBATCH --error={RUN_DIR}/stderr\n"
        f"#SBATCH --chdir={RUN_DIR}\n"
        "#SBATCH --no-requeue\n"
        "#SBATCH --partition=gpu\n"
        "#SBATCH --account=bench\n"
        "#SBATCH --qos=normal\n"
        "#SBATCH --time=01:00:00\n"
        "#SBATCH --exclusive\n"
        "#SBATCH --gres=gpu:8\n"
        f"cd {RUN_DIR} || exit 90\n"
        "sh ./command.sh < /dev/null\n"
        "rc=$?\n"
        "echo $rc > exit_code.tmp && mv exit_code.tmp exit_code\n"
        "exit $rc\n"
    )


@pytest.mark.parametrize(
    ("nodes", "run_dir", "field"),
    [
        (["gpu 1"], RUN_DIR, "nodes"),
        (["gpu1,gpu2"], RUN_DIR, "nodes"),
        ([], RUN_DIR, "nodes"),
        (["gpu1"], "/home/bench/run %j", "launcher"),
        (["gpu1"], "relative/run", "launcher"),
        (["gpu1"], "/home/bench/../etc", "launcher"),
    ],
)
def test_nothing_unchecked_reaches_the_batch_script(nodes: list[str], run_dir: str, field: str) -> None:
    options = slurm.SlurmOptions(login_node="login1")
    with pytest.raises(ParamError) as caught:
        slurm.batch_script(job_name="rackbench-1", nodes=nodes, tasks_per_node=1, run_dir=run_dir, options=options)
    assert caught.value.field == field


def test_it_builds_the_exact_command_lines() -> None:
    assert shlex.join(slurm.sbatch_argv(slurm.SCRIPT)) == "sbatch --parsable rackbench.sbatch"
    assert shlex.join(slurm.sacct_argv("4242")) == "sacct -j 4242 -n -P -X -o State,ExitCode"
    assert shlex.join(slurm.squeue_argv("4242")) == "squeue -h -j 4242 -t all -o %T"
    assert shlex.join(slurm.scancel_argv("4242")) == "scancel 4242"
    assert slurm.submit_line(RUN_DIR) == (
        f"cd {RUN_DIR} && if [ ! -e submitted ]; then : > submitted; "
        "if sbatch --parsable rackbench.sbatch > slurm_job_id.tmp; then mv slurm_job_id.tmp slurm_job_id; "
        "else rc=$?; rm -f submitted slurm_job_id.tmp; exit $rc; fi; fi; cat slurm_job_id"
    )
    assert slurm.submit_line("/home/b/run x").startswith("cd '/home/b/run x' && ")
    shlex.split(slurm.submit_line(RUN_DIR))  # well-formed shell


# --- states, on real output ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    stdout: str
    stderr: str
    exit_code: int


def read_transcript(name: str) -> list[tuple[str, str, Answer]]:
    """(label, command, answer) for every command of a transcript written by fixtures/slurm/capture.sh."""
    entries: list[tuple[str, str, Answer]] = []
    label, command, out, err, code = "", "", [], [], 0

    def close() -> None:
        if command:
            entries.append((label, command, Answer("".join(out), "".join(err), code)))

    for line in (FIXTURES / name).read_text().splitlines(keepends=True):
        if line.startswith("$ "):
            close()
            command, out, err, code = line[2:].strip(), [], [], 0
        elif line.startswith("# "):
            close()
            label, command = line[2:].strip(), ""
        elif line.startswith("! "):
            err.append(line[2:])
        elif line.startswith("[exit "):
            code = int(line[6:].rstrip("]\n"))
        else:
            out.append(line)
    close()
    return entries


def polls(name: str) -> dict[str, tuple[str, dict[str, Answer]]]:
    """label -> (job id, {command: answer}) for the sacct/squeue pairs of a transcript."""
    found: dict[str, tuple[str, dict[str, Answer]]] = {}
    for label, command, answer in read_transcript(name):
        argv = shlex.split(command)
        if argv[0] in ("sacct", "squeue"):
            job_id = argv[argv.index("-j") + 1]
            found.setdefault(label, (job_id, {}))[1][command] = answer
    return found


class ReplayedLogin:
    """A login node answering each command with what real Slurm printed for it (a KeyError for any other)."""

    endpoint = ssh.Endpoint(address="192.0.2.10", port=22, username="bench", name="login1")

    def __init__(self, answers: dict[str, Answer], files: dict[str, bytes] | None = None) -> None:
        self.answers = answers
        self.files = files or {}
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float | None = None) -> ssh.CommandResult:
        self.commands.append(command)
        answer = self.answers[command]
        return ssh.CommandResult(answer.exit_code, answer.stdout, answer.stderr, 0.01)

    def get(self, path: str, *, limit: int | None = None) -> bytes | None:
        return self.files.get(path)


# label in transcript-22.05.txt -> (state, exit code, finished, what the error says)
WITH_ACCOUNTING = {
    "completed": ("COMPLETED", 0, True, ""),
    "failed (exit 3)": ("FAILED", 3, True, "failed with exit code 3"),
    "killed by signal 9": ("FAILED", 137, True, "failed with exit code 137 (ExitCode 0:9)"),
    "running": ("RUNNING", None, False, ""),
    "pending (not in the accounting database yet)": ("PENDING", None, False, ""),
    "cancelled while running": ("CANCELLED", None, True, "was cancelled"),
    "over its memory limit (OverMemoryKill)": ("FAILED", 137, True, "failed with exit code 137"),
    "preempted": ("PREEMPTED", None, True, "was preempted by another job"),
    "node failure (its node set DOWN)": ("NODE_FAIL", None, True, "lost a node (node failure)"),
    "time limit (--time=1)": ("TIMEOUT", None, True, "reached its time limit"),
    "unknown job id": ("", None, True, "no longer known to Slurm"),
}


def test_the_transcripts_hold_exactly_the_commands_the_launcher_runs() -> None:
    for name in ("transcript-22.05.txt", "transcript-22.05-no-accounting.txt"):
        for job_id, answers in polls(name).values():
            assert set(answers) <= {shlex.join(slurm.sacct_argv(job_id)), shlex.join(slurm.squeue_argv(job_id))}
    assert set(polls("transcript-22.05.txt")) == set(WITH_ACCOUNTING)


@pytest.mark.parametrize("label", sorted(WITH_ACCOUNTING))
def test_it_maps_real_slurm_states(label: str) -> None:
    job_id, answers = polls("transcript-22.05.txt")[label]
    state, exit_code, finished, error = WITH_ACCOUNTING[label]

    found = slurm_jobs.job_state(ReplayedLogin(answers), job_id, RUN_DIR)  # type: ignore[arg-type]

    assert (found.state, found.exit_code, found.finished) == (state, exit_code, finished)
    assert error in found.error if error else found.error == ""
    if found.finished and found.error:
        assert found.error.startswith(f"Slurm job {job_id} ")


def test_a_job_accounting_has_not_recorded_yet_is_read_from_squeue() -> None:
    job_id, answers = polls("transcript-22.05.txt")["pending (not in the accounting database yet)"]
    login = ReplayedLogin(answers)

    found = slurm_jobs.job_state(login, job_id, RUN_DIR)  # type: ignore[arg-type]

    assert (found.state, found.source) == ("PENDING", "squeue")
    assert login.commands == [shlex.join(slurm.sacct_argv(job_id)), shlex.join(slurm.squeue_argv(job_id))]


@pytest.mark.parametrize(
    ("line", "state", "exit_code", "error"),
    [
        ("OUT_OF_MEMORY|0:125\n", "OUT_OF_MEMORY", None, "ran out of memory (ExitCode 0:125)"),
        ("CANCELLED by 1000|0:15\n", "CANCELLED", 143, "was cancelled (ExitCode 0:15)"),
        ("COMPLETING|0:0\n", "COMPLETING", None, ""),
        ("BOOT_FAIL|0:0\n", "BOOT_FAIL", None, "could not boot its nodes"),
        ("SOMETHING_NEW|0:0\n", "SOMETHING_NEW", None, "ended in state SOMETHING_NEW, which rackbench does not know"),
    ],
)
def test_it_maps_the_states_a_single_node_cannot_show(line: str, state: str, exit_code: Any, error: str) -> None:
    if line.startswith("OUT_OF_MEMORY"):
        assert line in (FIXTURES / "public-samples.txt").read_text()

    found = slurm.parse_sacct("77", line)

    assert found is not None
    assert (found.state, found.exit_code) == (state, exit_code)
    assert found.error == (f"Slurm job 77 {error}" if error else "")


def test_without_accounting_it_reads_squeue_then_the_exit_code_the_batch_script_left() -> None:
    recorded = polls("transcript-22.05-no-accounting.txt")
    job_id, answers = recorded["ended, still listed by squeue"]

    found = slurm_jobs.job_state(
        ReplayedLogin(answers, {f"{RUN_DIR}/exit_code": b"3\n"}),  # type: ignore[arg-type]
        job_id,
        RUN_DIR,
    )
    assert (found.state, found.exit_code, found.source) == ("FAILED", 3, "squeue")
    assert found.error == f"Slurm job {job_id} failed with exit code 3"

    job_id, answers = recorded["ended and forgotten by squeue"]
    done = slurm_jobs.job_state(ReplayedLogin(answers, {f"{RUN_DIR}/exit_code": b"0\n"}), job_id, RUN_DIR)  # type: ignore[arg-type]
    gone = slurm_jobs.job_state(ReplayedLogin(answers), job_id, RUN_DIR)  # type: ignore[arg-type]
    assert (done.finished, done.exit_code, done.error, done.source) == (True, 0, "", "exit_code file")
    assert gone.finished and gone.exit_code is None and "no longer known to Slurm" in gone.error


def test_a_controller_that_does_not_answer_is_a_transient_error() -> None:
    job_id = "42"
    login = ReplayedLogin(
        {
            shlex.join(slurm.sacct_argv(job_id)): Answer("", "sacct: error: Problem talking to the database\n", 1),
            shlex.join(slurm.squeue_argv(job_id)): Answer(
                "", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n", 1
            ),
        }
    )

    with pytest.raises(ssh.TransientSSHError, match="Unable to contact slurm controller"):
        slurm_jobs.job_state(login, job_id, RUN_DIR)  # type: ignore[arg-type]


def test_it_reads_the_job_id_sbatch_answers() -> None:
    answers = [a for _, command, a in read_transcript("transcript-22.05.txt") if command.startswith("sbatch")]
    plain, with_cluster, refused = answers

    assert slurm.parse_job_id(plain.stdout) == plain.stdout.strip()
    assert slurm.parse_job_id(with_cluster.stdout) == with_cluster.stdout.split(";")[0]
    assert refused.exit_code == 1 and "Invalid partition name specified" in refused.stderr
    with pytest.raises(ValueError, match="not a job id"):
        slurm.parse_job_id(refused.stdout)


def test_it_submits_once_and_tells_a_refusal_from_a_controller_that_does_not_answer() -> None:
    line = slurm.submit_line(RUN_DIR)
    answers = {c: a for _, c, a in read_transcript("transcript-22.05.txt") if c.startswith("sbatch")}
    plain, _, refused = answers.values()
    (down,) = [a for _, _, a in read_transcript("transcript-22.05-controller-down.txt")]

    assert slurm_jobs.submit(ReplayedLogin({line: plain}), RUN_DIR) == plain.stdout.strip()  # type: ignore[arg-type]
    with pytest.raises(ssh.PermanentSSHError, match="Invalid partition name specified") as caught:
        slurm_jobs.submit(ReplayedLogin({line: refused}), RUN_DIR)  # type: ignore[arg-type]
    assert not caught.value.transient
    with pytest.raises(ssh.TransientSSHError, match="Unable to contact slurm controller"):
        slurm_jobs.submit(ReplayedLogin({line: down}), RUN_DIR)  # type: ignore[arg-type]


def test_a_refused_scancel_is_judged_by_the_jobs_own_state() -> None:
    """scancel's words are not parsed (only a controller that does not answer is recognised): sacct/squeue, as
    real Slurm answered them, say whether the job has ended anyway."""
    refused = Answer("", "", 1)
    (down,) = [a for _, _, a in read_transcript("transcript-22.05-controller-down.txt")]
    for label, raises in (("completed", None), ("running", ssh.PermanentSSHError)):
        job_id, answers = polls("transcript-22.05.txt")[label]
        login = ReplayedLogin({shlex.join(slurm.scancel_argv(job_id)): refused, **answers})
        if raises is None:
            slurm_jobs.cancel(login, job_id, RUN_DIR)  # type: ignore[arg-type]
        else:
            with pytest.raises(raises, match=f"cancelling Slurm job {job_id}"):
                slurm_jobs.cancel(login, job_id, RUN_DIR)  # type: ignore[arg-type]
    login = ReplayedLogin({shlex.join(slurm.scancel_argv("38")): down})
    with pytest.raises(ssh.TransientSSHError, match="Unable to contact slurm controller"):
        slurm_jobs.cancel(login, "38", RUN_DIR)  # type: ignore[arg-type]
    ok = ReplayedLogin({shlex.join(slurm.scancel_argv("38")): Answer("", "", 0)})
    slurm_jobs.cancel(ok, "38", RUN_DIR)  # type: ignore[arg-type]
    assert ok.commands == ["scancel 38"]


# --- campaigns ----------------------------------------------------------------------------------------------

LAUNCHER = {
    "kind": "slurm",
    "login_node": "login1",
    "partition": "gpu",
    "time": "02:00:00",
    "exclusive": True,
    "extra": ["--gres=gpu:8"],
}


def nccl_campaign(name: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "kind": "nccl",
        "nodes": ["gpu1", "gpu2"],
        "launcher": LAUNCHER,
        "matrix": {"nodes": [1, 2]},
    }
    data.update(overrides)
    return data


@pytest.mark.django_db
def test_a_campaign_keeps_its_launcher_through_export_and_clone() -> None:
    for name in ("login1", "gpu1", "gpu2"):
        node_upsert(name=name, address=f"10.0.0.{len(name)}", gpu_count=8)

    campaign = services.campaign_apply(data=nccl_campaign("nccl-slurm"))
    exported = selectors.campaign_spec(campaign=campaign)
    again = spec_module.load_yaml(spec_module.to_yaml(exported))
    clone = services.campaign_clone(campaign=campaign, name="nccl-slurm-2")

    assert campaign.launcher == LAUNCHER
    assert exported["launcher"] == LAUNCHER and again["launcher"] == LAUNCHER
    assert Campaign.objects.get(pk=clone.pk).launcher == LAUNCHER


@pytest.mark.django_db
def test_a_campaign_needs_its_login_node_in_the_inventory() -> None:
    for name in ("gpu1", "gpu2"):
        node_upsert(name=name, address="10.0.0.1")

    with pytest.raises(SpecError) as caught:
        services.campaign_apply(data=nccl_campaign("no-login"))
    assert caught.value.field == "launcher.login_node"

    direct = services.campaign_apply(data=nccl_campaign("direct", launcher={"kind": "direct"}))
    assert direct.launcher == {} and "launcher" not in selectors.campaign_spec(campaign=direct)


# --- a real Slurm, through a lab node -----------------------------------------------------------------------

SLURM_CONF = Path("/etc/slurm/slurm.conf")
OURS = "# Written by rackbench's tests/test_slurm.py for its single-node test Slurm; test process"
SLURM_NODE = "lab1"  # the lab node the Slurm node stands for: Slurm names nodes as the inventory does
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "sacct", "scancel", "sinfo", "munged", "munge", "unmunge")
SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"


def _which(name: str) -> str | None:
    return shutil.which(name, path=SBIN_PATH)


def _why_no_slurm() -> str:
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return (
            f"no Slurm on this machine ({', '.join(missing)} missing; "
            "apt-get install slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return "slurmd must run as root to start jobs as the lab user"
    if SLURM_CONF.exists():
        text = SLURM_CONF.read_text()
        if OURS not in text:
            return f"{SLURM_CONF} belongs to a Slurm setup these tests did not make; not touching it"
        owner = text.split(OURS, 1)[1].split()[0]
        if owner.isdigit() and int(owner) != os.getpid() and Path(f"/proc/{owner}").exists():
            return f"another test session (pid {owner}) runs the test Slurm"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _munge_works() -> bool:
    token = subprocess.run([_which("munge") or "munge", "-n"], capture_output=True, timeout=10)
    if token.returncode != 0:
        return False
    return subprocess.run([_which("unmunge") or "unmunge"], input=token.stdout, capture_output=True).returncode == 0


def _start_munge() -> int | None:
    """Start munged when none answers; returns its pid when this session started it."""
    if _munge_works():
        return None
    if not Path("/etc/munge/munge.key").exists():
        pytest.skip("munge has no key (/etc/munge/munge.key): reinstall the munge package")
    run_dir = Path("/run/munge")
    run_dir.mkdir(exist_ok=True)
    shutil.chown(run_dir, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _which("munged") or "munged"], check=True, timeout=30)
    wait_for(_munge_works, timeout=10, what="munged to answer")
    pid = (run_dir / "munged.pid").read_text().strip()
    return int(pid) if pid.isdigit() else None


def slurm_conf(state_dir: Path, ctld_port: int, slurmd_port: int) -> str:
    host = socket.gethostname()
    return f"""{OURS} {os.getpid()}
ClusterName=rackbench-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={state_dir}/state
SlurmdSpoolDir={state_dir}/spool
SlurmctldPidFile={state_dir}/slurmctld.pid
SlurmdPidFile={state_dir}/slurmd.pid
SlurmctldLogFile={state_dir}/slurmctld.log
SlurmdLogFile={state_dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName={SLURM_NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN
PartitionName=debug Nodes={SLURM_NODE} Default=YES MaxTime=INFINITE State=UP
"""


def slurm_env() -> dict[str, str]:
    return {**os.environ, "SLURM_CONF": str(SLURM_CONF), "PATH": SBIN_PATH}


def slurm_query(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, env=slurm_env(), timeout=30).stdout.strip()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Path]:
    """A single-node Slurm (slurmctld, slurmd, munge) on this machine, its node named like lab node lab1.

    Clients find it through /etc/slurm/slurm.conf, as on a real cluster: sbatch runs in a lab node's SSH session,
    where no SLURM_CONF from this process reaches. Skipped with the reason when this machine cannot run it.
    """
    reason = _why_no_slurm()
    if reason:
        pytest.skip(reason)
    munged = _start_munge()
    # Not under pytest's tmp dir: slurmd starts the batch script from its spool as the lab user, who cannot
    # enter a 0700 directory.
    state_dir = Path(tempfile.mkdtemp(prefix="rackbench-test-slurm-"))
    state_dir.chmod(0o755)
    (state_dir / "state").mkdir()
    (state_dir / "spool").mkdir()
    SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
    SLURM_CONF.write_text(slurm_conf(state_dir, _free_port(), _free_port()))
    SLURM_CONF.chmod(0o644)
    daemons = [
        subprocess.Popen(
            [_which(argv[0]) or argv[0], "-D", *argv[1:], "-f", str(SLURM_CONF)],
            stdout=open(state_dir / f"{argv[0]}.out", "w"),  # noqa: SIM115 - the daemon writes to it until the end
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for argv in (["slurmctld", "-i"], ["slurmd", "-N", SLURM_NODE])
    ]
    try:
        deadline = time.monotonic() + 60
        while slurm_query("sinfo", "-h", "-n", SLURM_NODE, "-o", "%T") != "idle":
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                logs = "\n".join((state_dir / f"{n}.log").read_text()[-1500:] for n in ("slurmctld", "slurmd"))
                pytest.fail(f"the test Slurm did not come up:\n{logs}")
            time.sleep(0.2)
        yield state_dir
    finally:
        for job_id in slurm_query("squeue", "-h", "-o", "%i").split():
            subprocess.run(["scancel", job_id], env=slurm_env(), capture_output=True, timeout=30)
        for daemon in daemons:
            daemon.terminate()
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)
        SLURM_CONF.unlink(missing_ok=True)
        shutil.rmtree(state_dir, ignore_errors=True)
        if munged:
            os.kill(munged, signal.SIGTERM)


def fio_slurm_campaign(name: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "kind": "fio",
        "nodes": [SLURM_NODE],
        "launcher": {"kind": "slurm", "login_node": "lab2", "time": "00:10:00"},
        "timeout": 120,
        "fixed": {"bs": "64k", "size": "8M"},
        "matrix": {"rw": ["read"]},
    }
    data.update(overrides)
    return data


@pytest.mark.lab
@pytest.mark.worker
def test_it_runs_fio_as_a_slurm_job_submitted_on_a_login_node(
    slurm_cluster: Path, lab: dict[str, Any], worker: Any
) -> None:
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=fio_slurm_campaign("slurm-fio")))

    assert finished(campaign).status == CampaignStatus.SUCCEEDED, list(campaign.runs.values_list("error", flat=True))
    run = campaign.runs.get()
    host = run.hosts.get()
    assert host.slurm_job_id.isdigit() and host.pid is None and host.exit_code == 0
    assert '"jobname"' in host.stdout and run.results.filter(name="read_bw_bytes", host=SLURM_NODE).exists()
    assert slurm_query("squeue", "-h", "-j", host.slurm_job_id, "-t", "all", "-o", "%T|%j|%N") == (
        f"COMPLETED|rackbench-{run.pk}|{SLURM_NODE}"
    )
    record = run.provenance["slurm"]
    assert record["login_node"] == "lab2" and record["job_id"] == host.slurm_job_id
    # No accounting here: sacct refuses, squeue gives the state, the batch script left the exit status.
    assert (record["state"], record["exit_code"], record["source"]) == ("COMPLETED", 0, "squeue")
    assert f"#SBATCH --nodelist={SLURM_NODE}\n" in record["script"] and "#SBATCH --time=00:10:00\n" in record["script"]
    assert run.provenance["flush"][0]["target"] == SLURM_NODE  # the compute node's cache, flushed as usual


@pytest.mark.lab
@pytest.mark.worker
def test_a_run_that_times_out_cancels_its_slurm_job(slurm_cluster: Path, lab: dict[str, Any], worker: Any) -> None:
    launcher = {"kind": "slurm", "login_node": "lab2", "extra": ["--begin=now+1hour"]}  # pending until cancelled
    data = fio_slurm_campaign("slurm-timeout", launcher=launcher, timeout=3)
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    finished(campaign)
    run = campaign.runs.get()
    job_id = run.hosts.get().slurm_job_id
    assert run.status == RunStatus.TIMED_OUT and job_id.isdigit()
    wait_for(
        lambda: slurm_query("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T") == "CANCELLED",
        timeout=30,
        what=f"Slurm job {job_id} to be cancelled",
    )


@pytest.mark.lab
@pytest.mark.worker
def test_a_job_sbatch_refuses_fails_the_run_with_sbatchs_words(
    slurm_cluster: Path, lab: dict[str, Any], worker: Any
) -> None:
    launcher = {"kind": "slurm", "login_node": "lab2", "partition": "no-such-partition"}
    data = fio_slurm_campaign("slurm-refused", launcher=launcher)
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.FAILED
    run = campaign.runs.get()
    assert "submitting the Slurm job (sbatch) failed" in run.error
    assert "Invalid partition name specified" in run.error and "gave up" not in run.error
    host = run.hosts.get()
    assert host.slurm_job_id == ""
    assert not (Path(host.remote_dir) / "submitted").exists()  # a corrected resubmission is not blocked


# --- what this version refuses (no Slurm needed: refused before anything is submitted) -------------------


@pytest.mark.lab
@pytest.mark.worker
@pytest.mark.parametrize(
    ("nodes", "fixed", "words"),
    [
        (["lab1"], {"bs": "64k", "size": "8M", "client_mode": True}, "services are not supported under Slurm"),
        (["lab1", "lab2"], {"bs": "64k", "size": "8M"}, "only the first host's command is submitted"),
    ],
)
def test_it_refuses_what_slurm_runs_cannot_do_yet(
    lab: dict[str, Any], worker: Any, nodes: list[str], fixed: dict[str, Any], words: str
) -> None:
    launcher = {"kind": "slurm", "login_node": "lab3"}
    data = fio_slurm_campaign("slurm-refuses", nodes=nodes, fixed=fixed, launcher=launcher)
    campaign = services.campaign_launch(campaign=services.campaign_apply(data=data))

    assert finished(campaign).status == CampaignStatus.FAILED
    run = campaign.runs.get()
    assert run.error.startswith("launcher: ") and words in run.error
    assert not run.hosts.exclude(slurm_job_id="").exists()


# --- draining a node (health suites' action) ------------------------------------------------------------


def sinfo_state() -> tuple[str, str]:
    argv = slurm.node_state_argv(SLURM_NODE)
    return slurm.parse_node_state(subprocess.run(argv, capture_output=True, text=True, env=slurm_env()).stdout)


def test_the_drain_and_resume_command_lines_work_on_a_real_slurm(slurm_cluster: Path) -> None:
    """scontrol update needs a Slurm administrator (here root, as the test Slurm's SlurmUser): the command lines run
    on this machine; on a cluster the worker runs the same argv on the login node over SSH."""
    reason = "rackbench suite run r1: step_failed:check, outlier:network.throughput_bps; `id` $(x)"
    drained = subprocess.run(slurm.drain_argv(SLURM_NODE, reason), capture_output=True, text=True, env=slurm_env())
    try:
        assert drained.returncode == 0, drained.stderr
        state, why = sinfo_state()
        assert "drain" in state
        assert why == "rackbench suite run r1: step_failed:check, outlier:network.throughput_bps; id (x)"
    finally:
        subprocess.run(slurm.resume_argv(SLURM_NODE), capture_output=True, env=slurm_env(), check=True)
    assert "drain" not in sinfo_state()[0]


def test_through_a_login_node_it_reads_the_state_and_a_drain_by_a_non_administrator_fails_with_slurms_words(
    slurm_cluster: Path, lab: dict[str, Any]
) -> None:
    """The lab's login user is no Slurm administrator: the drain reaches scontrol over SSH, which refuses it, and
    the refusal is a permanent error carrying scontrol's own message (an administrator's login drains, as above)."""
    login = remote.node_target(lab["nodes"]["lab2"])

    assert slurm_jobs.node_state(login, SLURM_NODE)[0] == "idle"
    with pytest.raises(ssh.PermanentSSHError) as raised:
        slurm_jobs.node_drain(login, SLURM_NODE, "rackbench suite run r1: step_failed:check")
    assert "draining Slurm node lab1 (scontrol) failed" in str(raised.value)
    assert "drain" not in sinfo_state()[0]
