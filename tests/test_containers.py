"""Container runtime plug-ins: the exact commands each runtime runs, validation, and the bench-node image.

No container engine runs on this machine, so the runtimes are tested by the argv they build; the shell
scripts some of them carry (enroot's, the running/stop checks) are run for real against fake CLIs that
behave like the real ones at the points the scripts rely on. The image's entrypoint runs for real, with
its paths moved into a temporary directory, and in one test serves a real sshd that ssh logs in to.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugins.benchmarks.base import ParamError
from plugins.containers import ContainerSpec, get_runtime, runtime_names, spec_from_dict
from plugins.containers.base import KEYS_MOUNT, SSH_PORT_ENV, SSH_STATE_DIR, SSHD_PIDFILE
from plugins.containers.enroot import CHDIR_SCRIPT
from runners.remote import command_script

ROOT = Path(__file__).resolve().parent.parent
BENCH_NODE = ROOT / "docker" / "bench-node"
ENTRYPOINT = BENCH_NODE / "entrypoint.sh"
KEY_DIR = "/home/bench/.rackbench/keys/campaign-7"

# Seed 001's command (seed 000 is the same with nvidia-docker instead of --gpus all).
SEED_DOCKER_RUN = (
    "docker run --rm --detach --privileged --gpus all -v /mnt:/mnt --network=host --shm-size=1g "
    "--ulimit memlock=-1 --ulimit stack=67108864 --name tf user/tensorflow:19.09-py3-custom "
    'bash -c "/usr/sbin/sshd ; sleep infinity"'
)
# Shell metacharacters that must reach the command as plain text.
NASTY_ARGV = ["a b", "$(touch pwned)", ";", "*", "'", '"', "`id`", "-x", "|", "&&"]


def seed_spec(runtime: str = "docker", **overrides: Any) -> ContainerSpec:
    values: dict[str, Any] = {
        "runtime": runtime,
        "image": "user/tensorflow:19.09-py3-custom",
        "privileged": True,
        "volumes": ["/mnt:/mnt"],
    }
    return ContainerSpec(**{**values, **overrides})


def option_pairs(argv: list[str]) -> set[tuple[str, str]]:
    """Options of a docker command line as (flag, value) pairs, with --flag=value split."""
    flags_alone = {"--rm", "--detach", "-d", "--privileged", "--init"}
    pairs, i = set(), 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            break
        if arg.startswith("--") and "=" in arg:
            flag, value = arg.split("=", 1)
            pairs.add((flag, value))
            i += 1
        elif arg in flags_alone:
            pairs.add((arg, ""))
            i += 1
        else:
            pairs.add((arg, argv[i + 1]))
            i += 2
    return pairs


# --- the registry ---------------------------------------------------------------------------------


def test_it_lists_all_five_runtimes() -> None:
    assert runtime_names() == ["apptainer", "bare", "docker", "enroot", "podman"]
    assert [get_runtime(name).name for name in runtime_names()] == runtime_names()


def test_an_unknown_runtime_names_the_field() -> None:
    with pytest.raises(ParamError) as error:
        get_runtime("lxc")
    assert error.value.field == "container.runtime" and "docker" in error.value.message


# --- docker ---------------------------------------------------------------------------------------


def test_docker_starts_the_container_the_way_the_seeds_do() -> None:
    commands = get_runtime("docker").start_argv(seed_spec(), name="tf", key_dir=KEY_DIR)

    assert commands == [
        ["docker", "rm", "-f", "tf"],
        [
            "docker", "run", "--detach", "--init", "--name", "tf", "--privileged", "--network", "host",
            "--gpus", "all", "--shm-size", "1g", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
            "-v", f"{KEY_DIR}:{KEYS_MOUNT}:ro", "-v", "/mnt:/mnt", "-e", "RACKBENCH_SSH_PORT=2222",
            "user/tensorflow:19.09-py3-custom",
        ],
    ]  # fmt: skip
    seed = shlex.split(SEED_DOCKER_RUN)[2:]
    ours = commands[1][2:]
    # Every option of the seed's docker run is there, except --rm (a leftover is removed before the run).
    assert option_pairs(seed) - {("--rm", "")} <= option_pairs(ours)
    # The image's entrypoint runs sshd: nothing follows the image.
    assert ours[-1] == "user/tensorflow:19.09-py3-custom"


def test_docker_passes_gpu_lists_env_and_extra_flags_as_single_arguments() -> None:
    spec = seed_spec(
        gpus="0,1",
        privileged=False,
        volumes=["/data/imagenet:/data:ro"],
        env={"NCCL_SOCKET_IFNAME": "^docker0,lo", "NCCL_DEBUG": "INFO"},
        ulimits={"memlock": "-1", "nofile": "65536:65536"},
        extra_args=["--ipc=host", "--device=/dev/infiniband"],
        ssh_port=2299,
    )

    (_, run) = get_runtime("docker").start_argv(spec, name="rb-7-node1", key_dir=KEY_DIR)

    assert run == [
        "docker", "run", "--detach", "--init", "--name", "rb-7-node1", "--network", "host",
        "--gpus", '"device=0,1"',  # the CLI reads --gpus as CSV: the quotes keep the list one field
        "--shm-size", "1g", "--ulimit", "memlock=-1", "--ulimit", "nofile=65536:65536",
        "-v", f"{KEY_DIR}:{KEYS_MOUNT}:ro", "-v", "/data/imagenet:/data:ro",
        "-e", "RACKBENCH_SSH_PORT=2299", "-e", "NCCL_DEBUG=INFO", "-e", "NCCL_SOCKET_IFNAME=^docker0,lo",
        "--ipc=host", "--device=/dev/infiniband", "user/tensorflow:19.09-py3-custom",
    ]  # fmt: skip

    no_gpus = get_runtime("docker").start_argv(seed_spec(gpus="none"), name="tf", key_dir=KEY_DIR)[1]
    assert "--gpus" not in no_gpus


def test_docker_exec_running_stop_and_digest() -> None:
    docker = get_runtime("docker")

    assert docker.exec_argv("tf", ["python", "-u", "bench.py"], env={"B": "2", "A": "1"}, workdir="/runs/42") == [
        "docker", "exec", "-e", "A=1", "-e", "B=2", "-w", "/runs/42", "tf", "python", "-u", "bench.py",
    ]  # fmt: skip
    assert docker.stop_argv("tf") == [["docker", "rm", "-f", "tf"]]
    assert docker.running_argv("tf")[:2] == ["sh", "-c"] and docker.running_argv("tf")[3:] == ["sh", "tf", "docker"]
    assert docker.digest_argv(seed_spec()) == [
        "docker", "image", "inspect", "--format",
        "{{if .RepoDigests}}{{index .RepoDigests 0}}{{else}}{{.Id}}{{end}}",
        "user/tensorflow:19.09-py3-custom",
    ]  # fmt: skip


@pytest.mark.parametrize("runtime", ["docker", "enroot", "apptainer", "podman", "bare"])
def test_exec_keeps_shell_metacharacters_as_separate_arguments(runtime: str) -> None:
    argv = ["printf", "[%s]", *NASTY_ARGV]

    built = get_runtime(runtime).exec_argv("tf", argv, env={"FOO": "x y;$(z)"}, workdir="/runs/1")

    assert built[-len(argv) :] == argv
    assert shlex.split(shlex.join(built)) == built


# --- podman ---------------------------------------------------------------------------------------


def test_podman_uses_cdi_devices_for_gpus() -> None:
    podman = get_runtime("podman")

    (remove, run) = podman.start_argv(seed_spec("podman"), name="tf", key_dir=KEY_DIR)
    (_, some) = podman.start_argv(seed_spec("podman", gpus="0,3"), name="tf", key_dir=KEY_DIR)

    assert remove == ["podman", "rm", "-f", "tf"]
    assert run == [
        "podman", "run", "--detach", "--init", "--name", "tf", "--privileged", "--network", "host",
        "--device", "nvidia.com/gpu=all", "--shm-size", "1g", "--ulimit", "memlock=-1",
        "--ulimit", "stack=67108864", "-v", f"{KEY_DIR}:{KEYS_MOUNT}:ro", "-v", "/mnt:/mnt",
        "-e", "RACKBENCH_SSH_PORT=2222", "user/tensorflow:19.09-py3-custom",
    ]  # fmt: skip
    assert "--gpus" not in run
    assert some[some.index("--shm-size") - 4 : some.index("--shm-size")] == [
        "--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=3",
    ]  # fmt: skip
    assert podman.exec_argv("tf", ["hostname"], env={}, workdir="/") == ["podman", "exec", "-w", "/", "tf", "hostname"]
    assert podman.stop_argv("tf") == [["podman", "rm", "-f", "tf"]]
    assert podman.running_argv("tf")[-1] == "podman"
    assert podman.digest_argv(seed_spec("podman")) == [
        "podman", "image", "inspect", "--format",
        "{{if .RepoDigests}}{{index .RepoDigests 0}}{{else}}{{.ID}}{{end}}",
        "user/tensorflow:19.09-py3-custom",
    ]  # fmt: skip


# --- enroot ---------------------------------------------------------------------------------------


def enroot_spec(**overrides: Any) -> ContainerSpec:
    values: dict[str, Any] = {
        "runtime": "enroot",
        "image": "nvcr.io/nvidia/tensorflow:19.09-py3",
        "volumes": ["/mnt:/mnt"],
    }
    return ContainerSpec(**{**values, **overrides})


def test_enroot_imports_creates_and_starts_detached() -> None:
    (imp, create, start) = get_runtime("enroot").start_argv(
        enroot_spec(env={"NCCL_DEBUG": "INFO"}, gpus="0,1"), name="rb-7", key_dir=KEY_DIR
    )

    assert imp[:2] == ["sh", "-c"] and imp[3:] == [
        "sh", "nvcr.io+nvidia+tensorflow+19.09-py3.sqsh", "docker://nvcr.io#nvidia/tensorflow:19.09-py3",
    ]  # fmt: skip
    assert create[3:] == ["sh", "rb-7", "nvcr.io+nvidia+tensorflow+19.09-py3.sqsh"]
    assert start[3:] == [
        "sh", "rb-7",
        "enroot", "start", "--rw",
        "--mount", f"{KEY_DIR}:{KEYS_MOUNT}:none:x-create=dir,bind,ro",
        "--mount", "/mnt:/mnt:none:x-create=dir,bind",
        "--env", "RACKBENCH_SSH_PORT=2222", "--env", "NVIDIA_VISIBLE_DEVICES=0,1", "--env", "NCCL_DEBUG=INFO",
        "--", "rb-7",
    ]  # fmt: skip


def test_enroot_uses_a_local_squashfs_as_it_is() -> None:
    enroot = get_runtime("enroot")
    spec = enroot_spec(image="/shared/images/tf.sqsh", gpus="none")

    commands = enroot.start_argv(spec, name="rb-7", key_dir=KEY_DIR)

    assert len(commands) == 2 and commands[0][3:] == ["sh", "rb-7", "/shared/images/tf.sqsh"]
    assert "NVIDIA_VISIBLE_DEVICES=void" in commands[1]
    assert enroot.digest_argv(spec) == ["sha256sum", "--", "/shared/images/tf.sqsh"]
    assert enroot.digest_argv(enroot_spec())[-1] == "nvcr.io+nvidia+tensorflow+19.09-py3.sqsh"  # type: ignore[index]


def test_enroot_exec_enters_the_container_by_pid() -> None:
    built = get_runtime("enroot").exec_argv("rb-7", ["hostname"], env={"A": "1"}, workdir="/runs/3")

    assert built[3:] == ["sh", "rb-7", "env", "A=1", "sh", "-c", CHDIR_SCRIPT, "sh", "/runs/3", "hostname"]
    assert "enroot exec" in built[2]


FAKE_ENROOT = """#!/bin/sh
# Enough of enroot for rackbench's scripts: records its calls, keeps a list of root filesystems, and
# starts a "container" that, like enroot, execs down to the command (a sleep).
echo "enroot $*" >> "$FAKE/calls"
cmd="$1"; shift
case "$cmd" in
import) [ "$1" = --output ] && echo squashfs > "$2" ;;
create) echo "$2" >> "$FAKE/list" ;;
list) cat "$FAKE/list" 2>/dev/null ;;
remove) grep -vxF -- "$3" "$FAKE/list" > "$FAKE/list.new"; mv "$FAKE/list.new" "$FAKE/list" ;;
start) while [ "$1" != -- ]; do shift; done; exec sleep 300 ;;
exec) [ "$1" = -- ] && shift; kill -0 "$1" || exit 1; shift; exec "$@" ;;
esac
"""


@pytest.fixture
def fake_node(tmp_path: Path) -> Iterator[dict[str, str]]:
    """An environment with fake CLIs first on PATH and a HOME of its own."""
    bin_dir, home, fake = tmp_path / "bin", tmp_path / "home", tmp_path / "fake"
    for d in (bin_dir, home, fake):
        d.mkdir()
    (bin_dir / "enroot").write_text(FAKE_ENROOT)
    (bin_dir / "enroot").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home), "FAKE": str(fake)}
    yield env
    pid_file = home / ".rackbench" / "enroot" / "rb-7.pid"
    if pid_file.exists():  # a failed test must not leave its sleep behind
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)


def run_like_the_runner(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The runner writes command.sh with command_script and runs it with sh."""
    script = cwd / "command.sh"
    script.write_text(command_script(argv, {}))
    return subprocess.run(["sh", str(script)], env=env, cwd=cwd, capture_output=True, text=True, timeout=30)


def test_enroot_scripts_start_run_exec_and_stop_a_container(fake_node: dict[str, str], tmp_path: Path) -> None:
    enroot = get_runtime("enroot")
    work = tmp_path / "work"
    work.mkdir()
    state = Path(fake_node["HOME"]) / ".rackbench" / "enroot"

    assert run_like_the_runner(enroot.running_argv("rb-7"), fake_node, tmp_path).returncode == 1
    # Detached: start does not wait for the container (which sleeps 300 s; waiting for it would time out).
    for command in enroot.start_argv(enroot_spec(), name="rb-7", key_dir=KEY_DIR):
        result = run_like_the_runner(command, fake_node, tmp_path)
        assert result.returncode == 0, result.stderr
    assert (state / "images" / "nvcr.io+nvidia+tensorflow+19.09-py3.sqsh").read_text() == "squashfs\n"
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert run_like_the_runner(enroot.running_argv("rb-7"), fake_node, tmp_path).returncode == 0

    argv = ["sh", "-c", 'printf "[%s]" "$@"; printf "{%s}{%s}" "$PWD" "$FOO"', "sh", *NASTY_ARGV]
    result = run_like_the_runner(
        enroot.exec_argv("rb-7", argv, env={"FOO": "x y;$(z)"}, workdir=str(work)), fake_node, tmp_path
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"[{a}]" for a in NASTY_ARGV) + f"{{{work}}}{{x y;$(z)}}"
    assert not list(tmp_path.rglob("pwned"))

    for command in enroot.stop_argv("rb-7"):
        assert run_like_the_runner(command, fake_node, tmp_path).returncode == 0
    assert run_like_the_runner(enroot.running_argv("rb-7"), fake_node, tmp_path).returncode == 1
    assert (Path(fake_node["FAKE"]) / "list").read_text() == ""
    assert run_like_the_runner(enroot.stop_argv("rb-7")[0], fake_node, tmp_path).returncode == 0  # idempotent
    gone = run_like_the_runner(enroot.exec_argv("rb-7", ["true"], env={}, workdir="/"), fake_node, tmp_path)
    assert gone.returncode == 125 and "not running" in gone.stderr

    for command in enroot.start_argv(enroot_spec(), name="rb-7", key_dir=KEY_DIR):  # a second start
        assert run_like_the_runner(command, fake_node, tmp_path).returncode == 0
    calls = (Path(fake_node["FAKE"]) / "calls").read_text().splitlines()
    assert sum(call.startswith("enroot import") for call in calls) == 1  # the imported image is reused
    assert run_like_the_runner(enroot.stop_argv("rb-7")[0], fake_node, tmp_path).returncode == 0


# --- apptainer ------------------------------------------------------------------------------------


def test_apptainer_runs_an_instance_with_the_image_entrypoint() -> None:
    apptainer = get_runtime("apptainer")
    spec = ContainerSpec(
        runtime="apptainer",
        image="/shared/images/tf.sif",
        volumes=["/mnt:/mnt", "/data:/data:ro"],
        env={"NCCL_SOCKET_IFNAME": "^docker0,lo"},
        gpus="0,1",
    )

    (stop, run) = apptainer.start_argv(spec, name="rb-7", key_dir=KEY_DIR)

    assert stop == apptainer.stop_argv("rb-7")[0]
    assert run == [
        "env", "APPTAINERENV_CUDA_VISIBLE_DEVICES=0,1", "APPTAINERENV_NCCL_SOCKET_IFNAME=^docker0,lo",
        "APPTAINERENV_RACKBENCH_SSH_PORT=2222",
        "apptainer", "instance", "run", "--scratch", SSH_STATE_DIR, "--nv",
        "--bind", f"{KEY_DIR}:{KEYS_MOUNT}:ro", "--bind", "/mnt:/mnt", "--bind", "/data:/data:ro",
        "/shared/images/tf.sif", "rb-7",
    ]  # fmt: skip
    assert apptainer.exec_argv("rb-7", ["hostname"], env={"A": "1"}, workdir="/runs/3") == [
        "env", "APPTAINERENV_A=1", "apptainer", "exec", "--pwd", "/runs/3", "instance://rb-7", "hostname",
    ]  # fmt: skip
    assert apptainer.exec_argv("rb-7", ["hostname"], env={}, workdir="/")[0] == "apptainer"
    assert apptainer.running_argv("rb-7")[:3] == ["apptainer", "exec", "instance://rb-7"]
    assert apptainer.running_argv("rb-7")[-1] == SSHD_PIDFILE
    assert apptainer.digest_argv(spec) == ["sha256sum", "--", "/shared/images/tf.sif"]

    registry = ContainerSpec(runtime="apptainer", image="docker://nvcr.io/nvidia/pytorch:24.01-py3", gpus="none")
    run = apptainer.start_argv(registry, name="rb-7", key_dir=KEY_DIR)[1]
    assert run[-2:] == ["docker://nvcr.io/nvidia/pytorch:24.01-py3", "rb-7"] and "--nv" not in run
    assert apptainer.digest_argv(registry) is None


FAKE_APPTAINER = """#!/bin/sh
# "up" is a running instance that stops; "stuck" is one that will not stop; any other name does not exist.
case "$1 $2" in
"instance stop") [ "$4" = up ] && exit 0; [ "$4" = stuck ] && exit 255; echo "no instance found" >&2; exit 255 ;;
"exec instance://stuck") exit 0 ;;
"exec "*) exit 255 ;;
esac
"""


def test_apptainer_stop_succeeds_when_the_instance_is_gone_and_fails_when_it_stays(
    fake_node: dict[str, str], tmp_path: Path
) -> None:
    fake = Path(fake_node["PATH"].split(":")[0]) / "apptainer"
    fake.write_text(FAKE_APPTAINER)
    fake.chmod(0o755)
    apptainer = get_runtime("apptainer")

    codes = {
        name: run_like_the_runner(apptainer.stop_argv(name)[0], fake_node, tmp_path).returncode
        for name in ("up", "missing", "stuck")
    }

    assert codes["up"] == 0 and codes["missing"] == 0 and codes["stuck"] != 0


def test_docker_running_check_reads_the_container_state(fake_node: dict[str, str], tmp_path: Path) -> None:
    fake = Path(fake_node["PATH"].split(":")[0]) / "docker"
    fake.write_text('#!/bin/sh\ncase "$6" in up) echo true ;; down) echo false ;; *) exit 1 ;; esac\n')
    fake.chmod(0o755)
    docker = get_runtime("docker")

    codes = [run_like_the_runner(docker.running_argv(n), fake_node, tmp_path).returncode for n in ("up", "down", "x")]

    assert codes[0] == 0 and codes[1] != 0 and codes[2] != 0


# --- bare -----------------------------------------------------------------------------------------


def test_bare_runs_commands_unchanged_and_has_nothing_to_start() -> None:
    bare = get_runtime("bare")
    spec = spec_from_dict({"runtime": "bare"})

    assert bare.start_argv(spec, name="x", key_dir=KEY_DIR) == []
    assert bare.stop_argv("x") == []
    assert bare.running_argv("x") == ["true"]
    assert bare.digest_argv(spec) is None
    assert bare.exec_argv("x", ["fio", "job.fio"], env={"A": "1"}, workdir="/runs/1") == ["fio", "job.fio"]


# --- validation -----------------------------------------------------------------------------------


def test_a_campaign_mapping_becomes_a_spec_with_the_seed_defaults() -> None:
    spec = spec_from_dict(
        {
            "runtime": "docker",
            "image": "nvcr.io/nvidia/tensorflow:19.09-py3",
            "gpus": [0, 1],
            "ulimits": {"nofile": 65536},
        }
    )

    assert spec.gpus == "0,1" and spec.ssh_port == 2222 and spec.shm_size == "1g" and spec.network == "host"
    assert spec.ulimits == {"memlock": "-1", "stack": "67108864", "nofile": "65536"}
    assert spec_from_dict(
        {"runtime": "podman", "image": "docker.io/library/ubuntu:22.04", "ulimits": {"memlock": None}}
    ).ulimits == {"stack": "67108864"}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"runtime": "docker", "image": "ubuntu; rm -rf /"}, "container.image"),
        ({"runtime": "docker", "image": "--privileged"}, "container.image"),
        ({"runtime": "docker", "image": "Ubuntu"}, "container.image"),
        ({"runtime": "docker", "image": 7}, "container.image"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": ["mnt:/mnt"]}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": ["/a,b:/mnt"]}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": ["/a:/b:/c"]}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": ["/a:/b:z"]}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": ["/../etc:/x"]}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": ["/tmp/k:/rackbench-keys"]}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "volumes": "/mnt:/mnt"}, "container.volumes"),
        ({"runtime": "docker", "image": "ubuntu", "env": {"BAD-NAME": "1"}}, "container.env"),
        ({"runtime": "docker", "image": "ubuntu", "env": {"RACKBENCH_SSH_PORT": "22"}}, "container.env"),
        ({"runtime": "docker", "image": "ubuntu", "env": {"A": "1\n2"}}, "container.env.A"),
        ({"runtime": "docker", "image": "ubuntu", "env": {"A": 1}}, "container.env.A"),
        ({"runtime": "docker", "image": "ubuntu", "ssh_port": 0}, "container.ssh_port"),
        ({"runtime": "docker", "image": "ubuntu", "ssh_port": 70000}, "container.ssh_port"),
        ({"runtime": "docker", "image": "ubuntu", "ssh_port": "2222"}, "container.ssh_port"),
        ({"runtime": "docker", "image": "ubuntu", "ssh_port": True}, "container.ssh_port"),
        ({"runtime": "docker", "image": "ubuntu", "shm_size": "1 g"}, "container.shm_size"),
        ({"runtime": "docker", "image": "ubuntu", "gpus": "0;1"}, "container.gpus"),
        ({"runtime": "docker", "image": "ubuntu", "gpus": 2}, "container.gpus"),
        ({"runtime": "docker", "image": "ubuntu", "ulimits": {"core2": "1"}}, "container.ulimits"),
        ({"runtime": "docker", "image": "ubuntu", "ulimits": {"nofile": "lots"}}, "container.ulimits.nofile"),
        ({"runtime": "docker", "image": "ubuntu", "network": "container:other"}, "container.network"),
        ({"runtime": "docker", "image": "ubuntu", "privileged": "yes"}, "container.privileged"),
        ({"runtime": "docker", "image": "ubuntu", "extra_args": ["--volume=/:/host"]}, "container.extra_args"),
        ({"runtime": "docker", "image": "ubuntu", "extra_args": ["--ipc=host; rm -rf /"]}, "container.extra_args"),
        ({"runtime": "docker", "image": "ubuntu", "extra_args": ["--ipc"]}, "container.extra_args"),
        ({"runtime": "docker", "image": "ubuntu", "extra_args": "--ipc=host"}, "container.extra_args"),
        ({"runtime": "docker", "image": "ubuntu", "command": "sshd"}, "container.command"),
        ({"runtime": "lxc", "image": "ubuntu"}, "container.runtime"),
        ({"image": "ubuntu"}, "container.runtime"),
        ({"runtime": "enroot", "image": "ubuntu", "network": "bridge"}, "container.network"),
        ({"runtime": "enroot", "image": "ubuntu", "privileged": True}, "container.privileged"),
        ({"runtime": "enroot", "image": "ubuntu", "ssh_port": 22}, "container.ssh_port"),
        ({"runtime": "enroot", "image": "ubuntu@sha256:" + "a" * 64}, "container.image"),
        ({"runtime": "enroot", "image": "/images/tf.sif"}, "container.image"),
        ({"runtime": "enroot", "image": "images/tf.sqsh"}, "container.image"),
        ({"runtime": "enroot", "image": "ubuntu", "extra_args": ["--root"]}, "container.extra_args"),
        ({"runtime": "apptainer", "image": "images/tf.sif"}, "container.image"),
        ({"runtime": "apptainer", "image": "/images/tf.sqsh"}, "container.image"),
        ({"runtime": "apptainer", "image": "ubuntu", "extra_args": ["--cleanenv=1"]}, "container.extra_args"),
        ({"runtime": "apptainer", "image": "ubuntu", "ssh_port": 1023}, "container.ssh_port"),
    ],
)
def test_an_invalid_setting_is_refused_naming_its_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ParamError) as error:
        spec_from_dict(data)
    assert error.value.field == field


@pytest.mark.parametrize(
    "image",
    [
        "ubuntu",
        "ubuntu:22.04",
        "nvcr.io/nvidia/tensorflow:19.09-py3",
        "registry.local:5000/team/bench-node:1.2_3",
        "docker.io/library/ubuntu@sha256:" + "0" * 64,
    ],
)
def test_real_image_references_are_accepted(image: str) -> None:
    assert spec_from_dict({"runtime": "docker", "image": image}).image == image


def test_runner_supplied_values_are_checked_too() -> None:
    docker = get_runtime("docker")
    with pytest.raises(ParamError) as bad_name:
        docker.start_argv(seed_spec(), name="tf; reboot", key_dir=KEY_DIR)
    with pytest.raises(ParamError) as bad_keys:
        docker.start_argv(seed_spec(), name="tf", key_dir="keys")
    with pytest.raises(ParamError) as bad_workdir:
        docker.exec_argv("tf", ["true"], env={}, workdir="relative")
    with pytest.raises(ParamError) as empty:
        docker.exec_argv("tf", [], env={}, workdir="/")
    with pytest.raises(ParamError) as wrong_runtime:
        docker.validate(seed_spec("podman"))

    # A plug-in's own variables may use the RACKBENCH_ prefix; only the container's settings may not.
    assert "RACKBENCH_DATA_DIR=/mnt/0" in docker.exec_argv(
        "tf", ["true"], env={"RACKBENCH_DATA_DIR": "/mnt/0"}, workdir="/"
    )
    assert [e.value.field for e in (bad_name, bad_keys, bad_workdir, empty, wrong_runtime)] == [
        "container.name", "key_dir", "workdir", "argv", "container.runtime",
    ]  # fmt: skip


# --- the bench-node image -------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [line for line in (BENCH_NODE / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines() if line.strip()]


def test_the_dockerfile_bakes_no_key_and_makes_the_port_and_base_configurable() -> None:
    instructions = dockerfile_instructions()
    by_kind: dict[str, list[str]] = {}
    for kind, args in instructions:
        by_kind.setdefault(kind, []).append(args)
    text = (BENCH_NODE / "Dockerfile").read_text()

    assert instructions[0] == ("ARG", "BASE=ubuntu:22.04") and instructions[1] == ("FROM", "${BASE}")
    assert "SSH_PORT=2222" in by_kind["ARG"]
    assert by_kind["EXPOSE"] == ["${SSH_PORT}"] and by_kind["ENV"] == [f"{SSH_PORT_ENV}=${{SSH_PORT}}"]
    assert by_kind["COPY"] == ["entrypoint.sh /usr/local/bin/rackbench-entrypoint"]  # no key is copied in
    assert "ADD" not in by_kind
    assert by_kind["ENTRYPOINT"] == ['["/usr/local/bin/rackbench-entrypoint"]']
    run = " ".join(by_kind["RUN"])
    assert "ssh-keygen" not in run and "rm -f /etc/ssh/ssh_host_*" in run  # host keys from the package go
    for package in ("openssh-server", "fio", "iperf3", "openmpi-bin", "python3"):
        assert package in run
    for secret in ("authorized_keys", "id_rsa", "id_ed25519", "PRIVATE KEY", "StrictHostKeyChecking no"):
        assert secret not in text
    assert f"Include {SSH_STATE_DIR}/ssh_config" in run


def test_the_entrypoint_is_valid_posix_shell_and_agrees_with_the_runtimes() -> None:
    for shell in ("sh", "dash", "bash"):
        if shutil.which(shell):
            result = subprocess.run([shell, "-n", str(ENTRYPOINT)], capture_output=True, text=True)
            assert result.returncode == 0, result.stderr
    text = ENTRYPOINT.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert f"${{RACKBENCH_KEYS_DIR:-{KEYS_MOUNT}}}" in text
    assert f"${{{SSH_PORT_ENV}:-2222}}" in text
    assert f"${{RACKBENCH_SSH_STATE_DIR:-{SSH_STATE_DIR}}}" in text
    assert f"PidFile $state/{Path(SSHD_PIDFILE).name}" in text
    assert 'exec "$sshd" -D -e -f "$state/sshd_config" -p "$port"' in text


def keygen(path: Path) -> str:
    """A new ed25519 key at ``path``; its public half."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return Path(f"{path}.pub").read_text().strip()


needs_openssh = pytest.mark.skipif(
    not (shutil.which("ssh-keygen") and shutil.which("ssh") and Path("/usr/sbin/sshd").exists()),
    reason="needs OpenSSH (ssh, ssh-keygen, /usr/sbin/sshd)",
)


@pytest.fixture
def node_keys(tmp_path: Path) -> dict[str, Any]:
    """A campaign key directory as the runner lays it out, and the host key's public half."""
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    client = keygen(keys / "id_ed25519")
    (keys / "authorized_keys").write_text(client + "\n")
    host_public = keygen(keys / "ssh_host_ed25519_key")
    for pub in keys.glob("*.pub"):
        pub.unlink()
    return {"dir": keys, "client": client, "host": host_public}


def entrypoint_env(base: Path, keys: Path, port: int, sshd: str) -> dict[str, str]:
    client_config = base / "ssh_config"
    if not client_config.exists():
        client_config.write_text("Host *\n    SendEnv LANG LC_*\n")
    return {
        **os.environ,
        SSH_PORT_ENV: str(port),
        "RACKBENCH_KEYS_DIR": str(keys),
        "RACKBENCH_SSH_STATE_DIR": str(base / "state"),
        "RACKBENCH_SSH_CLIENT_CONFIG": str(client_config),
        "RACKBENCH_SSHD": sshd,
    }


def fake_sshd(tmp_path: Path) -> str:
    path = tmp_path / "fake-sshd"
    path.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/sshd-args"\n')
    path.chmod(0o755)
    return str(path)


def ssh_option(config: Path, host: str, option: str) -> str:
    out = subprocess.run(["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True).stdout
    return next(line.split(None, 1)[1] for line in out.splitlines() if line.split(None, 1)[0] == option)


@needs_openssh
def test_the_entrypoint_installs_the_keys_and_configures_sshd_and_ssh(
    tmp_path: Path, node_keys: dict[str, Any]
) -> None:
    keys: Path = node_keys["dir"]
    (keys / "known_hosts").write_text(f"[node2]:2345 {node_keys['host']}\n")
    env = entrypoint_env(tmp_path, keys, 2345, fake_sshd(tmp_path))

    for _ in range(2):  # a restarted container runs it again
        result = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr

    state = tmp_path / "state"
    assert (tmp_path / "sshd-args").read_text().split() == ["-D", "-e", "-f", f"{state}/sshd_config", "-p", "2345"]
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for name in ("authorized_keys", "id_ed25519", "ssh_host_ed25519_key", "known_hosts"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600
        assert (state / name).read_bytes() == (keys / name).read_bytes()
    sshd_config = (state / "sshd_config").read_text()
    for line in ("PasswordAuthentication no", f"AuthorizedKeysFile {state}/authorized_keys", "UsePAM no"):
        assert line in sshd_config.splitlines()
    check = subprocess.run(["/usr/sbin/sshd", "-t", "-f", str(state / "sshd_config")], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # the real sshd accepts the configuration

    client_config = tmp_path / "ssh_config"
    assert client_config.read_text() == f"Include {state}/ssh_config\nHost *\n    SendEnv LANG LC_*\n"  # once
    assert ssh_option(client_config, "node2", "port") == "2345"
    assert ssh_option(client_config, "node2", "identityfile") == f"{state}/id_ed25519"
    assert ssh_option(client_config, "node2", "stricthostkeychecking") == "true"
    assert ssh_option(client_config, "node2", "userknownhostsfile") == f"{state}/known_hosts"


@needs_openssh
def test_without_pinned_host_keys_only_the_campaign_hosts_are_accepted_on_first_contact(
    tmp_path: Path, node_keys: dict[str, Any]
) -> None:
    keys: Path = node_keys["dir"]
    (keys / "ssh_host_ed25519_key").unlink()
    (keys / "hosts").write_text("node1\nnode2\n10.0.0.3\n")
    env = entrypoint_env(tmp_path, keys, 2222, fake_sshd(tmp_path))

    result = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=30)

    assert result.returncode == 0, result.stderr
    host_key = tmp_path / "state" / "ssh_host_ed25519_key"
    assert host_key.exists() and stat.S_IMODE(host_key.stat().st_mode) == 0o600  # generated at start
    client_config = tmp_path / "ssh_config"
    assert ssh_option(client_config, "node2", "stricthostkeychecking") == "accept-new"
    assert ssh_option(client_config, "10.0.0.3", "stricthostkeychecking") == "accept-new"
    assert ssh_option(client_config, "elsewhere", "stricthostkeychecking") == "true"


def test_the_entrypoint_refuses_to_start_without_keys_or_with_a_bad_port(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    env = entrypoint_env(tmp_path, keys, 2222, "/bin/false")

    missing = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=30)
    (keys / "authorized_keys").write_text("ssh-ed25519 AAAA test\n")
    bad_port = subprocess.run(
        ["sh", str(ENTRYPOINT)], env={**env, SSH_PORT_ENV: "22; reboot"}, capture_output=True, text=True, timeout=30
    )
    (keys / "hosts").write_text("node1\nno$(de)\n")
    bad_host = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True, timeout=30)

    assert missing.returncode == 1 and f"{keys}/authorized_keys is missing" in missing.stderr
    assert bad_port.returncode == 1 and "must be a port number" in bad_port.stderr
    assert bad_host.returncode == 1 and "is not a host name" in bad_host.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def strict_modes_safe(path: Path) -> bool:
    """sshd's StrictModes refuses keys under a directory others can write to (such as /tmp)."""
    uid = os.getuid()
    return all((st.st_uid in (0, uid)) and not (st.st_mode & 0o022) for st in (p.stat() for p in [path, *path.parents]))


@needs_openssh
def test_a_real_sshd_started_by_the_entrypoint_lets_the_campaign_key_in(node_keys: dict[str, Any]) -> None:
    artifacts = ROOT / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="entrypoint-", dir=artifacts))
    base.chmod(0o755)
    if not strict_modes_safe(base):
        shutil.rmtree(base)
        pytest.skip(f"{base} has a directory others can write to: sshd would refuse the keys")
    port = free_port()
    keys: Path = node_keys["dir"]
    (keys / "known_hosts").write_text(f"[127.0.0.1]:{port} {node_keys['host']}\n")
    env = entrypoint_env(base, keys, port, "/usr/sbin/sshd")
    log = (base / "sshd.log").open("w")
    sshd = subprocess.Popen(["sh", str(ENTRYPOINT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert sshd.poll() is None, (base / "sshd.log").read_text()
            time.sleep(0.1)

        result = subprocess.run(
            ["ssh", "-F", str(base / "ssh_config"), "-o", "ConnectTimeout=10", "127.0.0.1", "echo", "logged-in"],
            capture_output=True,
            text=True,
            timeout=60,
        )

        assert result.returncode == 0, result.stderr + (base / "sshd.log").read_text()
        assert result.stdout.strip().splitlines()[-1] == "logged-in"
        assert (base / "state" / "sshd.pid").read_text().strip() == str(sshd.pid)  # sshd replaced the entrypoint
    finally:
        sshd.terminate()
        sshd.wait(timeout=10)
        log.close()
        shutil.rmtree(base, ignore_errors=True)
