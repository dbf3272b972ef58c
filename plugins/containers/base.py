"""The container runtime plug-in interface: one subclass per runtime, registered by ``name``.

A runtime turns a campaign's container settings into argv lists: the commands that start one long-lived
container per node (its sshd on ``ssh_port`` is what mpirun hops over, as in seeds 000 and 001), check it,
run a command inside it, stop it, and print the image's digest. Nothing here touches SSH: the runner joins
each argv with ``shlex.join`` and runs it on the node.

Every value that comes from a campaign ends up as one argv element of its own, after validation. Where a
runtime needs a shell (enroot has no daemon to ask which process is the container), the script is a
constant of the module and the values reach it as positional parameters (``sh -c SCRIPT sh VALUE...``),
never pasted into the script.

The key directory (``key_dir`` of ``start_argv``) is a host directory, mode 0700, mounted read-only at
``/rackbench-keys``. The image's entrypoint (``docker/bench-node/entrypoint.sh``) reads from it:

    authorized_keys        required: the keys allowed to log in to the container's sshd
    id_ed25519             optional: the per-campaign private key, for hopping to the other containers
    ssh_host_ed25519_key   optional: the containers' host key; generated at start when absent
    known_hosts            optional: pins the other containers' host key (StrictHostKeyChecking yes)
    hosts                  optional: one host per line; without known_hosts, only these are accepted on
                           first contact (StrictHostKeyChecking accept-new), every other host is refused
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from plugins.benchmarks.base import ParamError

KEYS_MOUNT = "/rackbench-keys"  # where key_dir appears inside the container
SSH_PORT_ENV = "RACKBENCH_SSH_PORT"  # read by the image's entrypoint
SSH_STATE_DIR = "/run/rackbench-ssh"  # where the entrypoint writes the sshd and ssh client configuration
SSHD_PIDFILE = f"{SSH_STATE_DIR}/sshd.pid"  # written by the container's sshd

DEFAULT_ULIMITS = {"memlock": "-1", "stack": "67108864"}  # seeds 000 and 001: --ulimit memlock=-1 --ulimit stack=...

# Docker's image reference grammar, kept conservative: lower-case repository components, an optional
# registry (with port), tag and sha256 digest. Nothing a shell or a CLI parser could read as anything else.
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
IMAGE_REFERENCE = re.compile(
    rf"^(?P<name>(?:(?P<domain>{_DOMAIN})/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[a-f0-9]{{64}}))?$"
)
HOST_PATH = re.compile(r"^/[A-Za-z0-9._@+/-]*$")  # absolute, no commas, colons, spaces or quotes
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
GPUS = re.compile(r"^(?:all|none|(?:[0-9]+|GPU-[0-9A-Fa-f-]+)(?:,(?:[0-9]+|GPU-[0-9A-Fa-f-]+))*)$")
SHM_SIZE = re.compile(r"^[1-9][0-9]{0,12}[bkmgBKMG]?$")
ULIMIT_VALUE = re.compile(r"^(?:-1|[0-9]{1,20})(?::(?:-1|[0-9]{1,20}))?$")
NETWORK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
EXTRA_VALUE = re.compile(r"^[A-Za-z0-9_./:=,+@-]+$")
# The rlimit names docker/podman accept for --ulimit.
# fmt: off
ULIMIT_NAMES = frozenset({
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss", "rtprio",
    "rttime", "sigpending", "stack",
})
# fmt: on


@dataclass(frozen=True)
class ContainerSpec:
    runtime: str  # bare, docker, podman, enroot, apptainer
    image: str  # a registry reference (nvcr.io/nvidia/tensorflow:19.09-py3), or a .sqsh/.sif path
    ssh_port: int = 2222  # the container's sshd, for MPI between containers
    gpus: str = "all"  # "all", "none", or a list like "0,1"
    shm_size: str = "1g"
    ulimits: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_ULIMITS))
    volumes: list[str] = field(default_factory=list)  # host:container[:ro|rw]
    env: dict[str, str] = field(default_factory=dict)
    network: str = "host"
    privileged: bool = False
    # Further flags, each one argv element "--flag" or "--flag=value", the flag from the runtime's
    # allowlist (``extra_flags``). Never a shell string.
    extra_args: list[str] = field(default_factory=list)


class ContainerRuntime:
    name: ClassVar[str]
    description: ClassVar[str] = ""
    # Allowed extra_args: flag -> whether it takes a value ("--ipc=host") or stands alone ("--init").
    extra_flags: ClassVar[dict[str, bool]] = {}

    def validate(self, spec: ContainerSpec) -> None:
        """Raise ParamError naming the first invalid setting of ``spec``."""
        if spec.runtime != self.name:
            raise ParamError("container.runtime", f"expected {self.name!r}, got {spec.runtime!r}")
        if not isinstance(spec.image, str) or not spec.image:
            raise ParamError("container.image", "must name an image")
        check_port(spec.ssh_port)
        check_text("container.gpus", spec.gpus, GPUS, "must be all, none, or GPU indexes/UUIDs like 0,1")
        check_text("container.shm_size", spec.shm_size, SHM_SIZE, "must be a size like 1g, 512m or 1073741824")
        check_ulimits(spec.ulimits)
        for volume in check_list("container.volumes", spec.volumes):
            parse_volume(volume)
        check_env("container.env", spec.env)
        check_text("container.network", spec.network, NETWORK, "must be a network name such as host")
        if not isinstance(spec.privileged, bool):
            raise ParamError("container.privileged", "must be true or false")
        for arg in check_list("container.extra_args", spec.extra_args):
            self.check_extra_arg(arg)

    def start_argv(self, spec: ContainerSpec, *, name: str, key_dir: str) -> list[list[str]]:
        """Commands that start one long-lived container ``name`` running sshd on ``spec.ssh_port``.

        ``key_dir`` is mounted read-only at ``/rackbench-keys``. The runner runs ``running_argv`` first and
        these only when it fails; they replace a stopped leftover of the same name.
        """
        raise NotImplementedError

    def running_argv(self, name: str) -> list[str]:
        """A command that exits 0 when the container runs."""
        raise NotImplementedError

    def exec_argv(self, name: str, argv: list[str], *, env: dict[str, str], workdir: str) -> list[str]:
        """``argv`` run inside the container, in ``workdir``, with ``env`` added to its environment."""
        raise NotImplementedError

    def stop_argv(self, name: str) -> list[list[str]]:
        """Commands that stop and remove the container; they succeed when it is already gone."""
        raise NotImplementedError

    def digest_argv(self, spec: ContainerSpec) -> list[str] | None:
        """A command printing what identifies the image exactly (a digest or checksum), or None."""
        return None

    def check_extra_arg(self, arg: str) -> None:
        flag, sep, value = arg.partition("=")
        if flag not in self.extra_flags:
            allowed = ", ".join(sorted(self.extra_flags)) or "none"
            raise ParamError("container.extra_args", f"{arg!r} is not allowed for {self.name} (allowed: {allowed})")
        if self.extra_flags[flag] and not (sep and EXTRA_VALUE.match(value)):
            raise ParamError("container.extra_args", f"{arg!r}: {flag} needs a value, as {flag}=VALUE")
        if not self.extra_flags[flag] and sep:
            raise ParamError("container.extra_args", f"{arg!r}: {flag} takes no value")


# --- validation helpers ---------------------------------------------------------------------------


def check_text(field_name: str, value: object, pattern: re.Pattern[str], message: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise ParamError(field_name, f"{message}, got {value!r}")
    return value


def check_list(field_name: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ParamError(field_name, "must be a list of strings")
    return value


def check_port(port: object, *, lowest: int = 1) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not lowest <= port <= 65535:
        raise ParamError("container.ssh_port", f"must be a whole number from {lowest} to 65535, got {port!r}")
    return port


def check_ulimits(ulimits: object) -> None:
    if not isinstance(ulimits, dict):
        raise ParamError("container.ulimits", "must be a mapping of limit name to value")
    for limit, value in ulimits.items():
        if limit not in ULIMIT_NAMES:
            raise ParamError("container.ulimits", f"{limit!r} is not a limit name ({', '.join(sorted(ULIMIT_NAMES))})")
        check_text(f"container.ulimits.{limit}", value, ULIMIT_VALUE, "must be -1, a number, or soft:hard")


def check_env(field_name: str, env: object, *, reserve: bool = True) -> dict[str, str]:
    """Names and single-line values; ``reserve``: RACKBENCH_* configures the image's entrypoint."""
    if not isinstance(env, dict):
        raise ParamError(field_name, "must be a mapping of variable name to value")
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ParamError(field_name, f"{name!r} is not an environment variable name")
        if reserve and name.startswith("RACKBENCH_"):
            raise ParamError(field_name, f"{name}: names starting with RACKBENCH_ are reserved for rackbench")
        if not isinstance(value, str) or "\n" in value or "\0" in value:
            raise ParamError(f"{field_name}.{name}", "must be a single line of text")
    return env


def check_host_path(field_name: str, path: object) -> str:
    if not isinstance(path, str) or not HOST_PATH.match(path) or ".." in path.split("/"):
        raise ParamError(field_name, f"must be an absolute path of letters, digits and ._@+/- only, got {path!r}")
    return path


def check_name(name: object) -> str:
    return check_text("container.name", name, CONTAINER_NAME, "must be letters, digits and ._- (63 at most)")


def check_exec(argv: object, env: object, workdir: object) -> None:
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise ParamError("argv", "must be a non-empty list of strings")
    check_env("env", env, reserve=False)
    check_host_path("workdir", workdir)


@dataclass(frozen=True)
class Volume:
    host: str
    container: str
    read_only: bool


def parse_volume(volume: str) -> Volume:
    parts = volume.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ParamError("container.volumes", f"{volume!r} must be /host/path:/container/path[:ro|:rw]")
    check_host_path("container.volumes", parts[0])
    check_host_path("container.volumes", parts[1])
    if parts[1].rstrip("/") in ("", KEYS_MOUNT):
        raise ParamError("container.volumes", f"{volume!r} mounts over a path rackbench reserves")
    return Volume(parts[0], parts[1], len(parts) == 3 and parts[2] == "ro")


def image_reference(value: object) -> re.Match[str]:
    """A registry reference (``nvcr.io/nvidia/tensorflow:19.09-py3``); ParamError names container.image."""
    match = IMAGE_REFERENCE.match(value) if isinstance(value, str) and len(value) <= 255 else None
    if match is None:
        example = "nvcr.io/nvidia/tensorflow:19.09-py3"
        raise ParamError("container.image", f"{value!r} is not an image reference like {example}")
    return match


def is_local_image(image: str) -> bool:
    return image.startswith("/")


def check_image_file_or_reference(image: str, *, runtime: str, suffix: str, scheme: str = "") -> re.Match[str] | None:
    """A daemonless runtime's image (apptainer, enroot): an absolute path to a ``suffix`` file (returns None), or a
    registry reference, after an optional ``scheme`` prefix (returns its parts). ParamError names container.image."""
    if is_local_image(image):
        check_host_path("container.image", image)
        if not image.endswith(suffix):
            raise ParamError("container.image", f"{image!r}: a local {runtime} image is a {suffix} file")
        return None
    reference = image.removeprefix(scheme)
    if reference.endswith(suffix):
        raise ParamError("container.image", f"{image!r}: give a {suffix} file as an absolute path")
    return image_reference(reference)


def check_login_user_runtime(spec: ContainerSpec, *, containers: str) -> None:
    """A runtime whose containers run as the node's login user on the node's network (apptainer, enroot): its sshd's
    port is 1024 or above, the network is the host's, nothing is privileged. ``containers`` names them in messages."""
    check_port(spec.ssh_port, lowest=1024)
    if spec.network != "host":
        raise ParamError("container.network", f"{containers} share the node's network: use host")
    if spec.privileged:
        raise ParamError("container.privileged", f"{containers} run unprivileged only")


def gpu_list(gpus: str) -> list[str]:
    """The GPUs of a list like "0,1"; empty for "all" and "none"."""
    return [] if gpus in ("all", "none") else gpus.split(",")


# --- registry and spec parsing --------------------------------------------------------------------

_REGISTRY: dict[str, type[ContainerRuntime]] = {}


def register(cls: type[ContainerRuntime]) -> type[ContainerRuntime]:
    _REGISTRY[cls.name] = cls
    return cls


def get_runtime(name: str) -> ContainerRuntime:
    from plugins import containers  # noqa: F401  (imports every plug-in module, which registers it)

    try:
        return _REGISTRY[name]()
    except (KeyError, TypeError):
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ParamError("container.runtime", f"unknown container runtime {name!r} (known: {known})") from None


def runtime_names() -> list[str]:
    from plugins import containers  # noqa: F401

    return sorted(_REGISTRY)


def spec_from_dict(data: dict[str, Any]) -> ContainerSpec:
    """A validated ContainerSpec from a campaign's ``container`` mapping; ParamError names the bad field.

    ``gpus`` may also be a list of indexes ([0, 1]); ``ulimits`` are merged over the seeds' defaults
    (memlock=-1, stack=67108864), and a limit set to null drops that default.
    """
    if not isinstance(data, dict):
        raise ParamError("container", "must be a mapping")
    known = {f.name for f in fields(ContainerSpec)}
    for key in data:
        if key not in known:
            raise ParamError(f"container.{key}", f"unknown setting (known: {', '.join(sorted(known))})")
    runtime = get_runtime(data.get("runtime", ""))
    values: dict[str, Any] = dict(data)
    values.setdefault("image", "")
    if not isinstance(values["image"], str):
        raise ParamError("container.image", "must be a string")
    gpus = values.get("gpus", "all")
    if isinstance(gpus, list) and gpus and all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
        values["gpus"] = ",".join(str(g) for g in gpus)
    elif not isinstance(gpus, str):
        raise ParamError("container.gpus", f"must be all, none, or a list of GPU indexes, got {gpus!r}")
    ulimits = values.get("ulimits", {})
    if not isinstance(ulimits, dict):
        raise ParamError("container.ulimits", "must be a mapping of limit name to value")
    merged = dict(DEFAULT_ULIMITS)
    for limit, value in ulimits.items():
        if value is None:
            merged.pop(limit, None)
        elif isinstance(value, int) and not isinstance(value, bool):
            merged[limit] = str(value)
        else:
            merged[limit] = value
    values["ulimits"] = merged
    for key, kind, label in (
        ("volumes", list, "a list"),
        ("env", dict, "a mapping"),
        ("extra_args", list, "a list"),
        ("shm_size", str, "a string"),
        ("network", str, "a string"),
    ):
        if key in values and not isinstance(values[key], kind):
            raise ParamError(f"container.{key}", f"must be {label}")
    if "privileged" in values and not isinstance(values["privileged"], bool):
        raise ParamError("container.privileged", "must be true or false")
    spec = ContainerSpec(**values)
    runtime.validate(spec)
    return spec
