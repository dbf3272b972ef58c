"""Enroot (what pyxis runs under Slurm), used directly: no daemon, so rackbench keeps the state itself.

How "one long-lived container with sshd" maps onto enroot:

- ``enroot import`` turns a registry image into ``~/.rackbench/enroot/images/<ref>.sqsh`` once (later starts
  reuse the file, as ``docker run`` reuses a pulled image; delete it to pull again). A ``.sqsh`` path is
  used as it is.
- ``enroot create --name NAME`` unpacks it into a root filesystem named after the container (a leftover of
  the same name is removed first).
- ``enroot start --rw --mount ... --env ... NAME`` runs the image's entrypoint (enroot turns the Docker
  ENTRYPOINT into ``/etc/rc``), which installs the keys and execs ``sshd -D``. Enroot stays in the
  foreground, so a fixed ``sh -c`` script starts it in its own session with ``setsid``, output in
  ``~/.rackbench/enroot/NAME.log``, and records its pid in ``~/.rackbench/enroot/NAME.pid``. ``enroot start``
  execs all the way down to the entrypoint, which execs sshd, and enroot makes no pid namespace: that pid
  is the container's sshd, and the process group leader of everything it starts.
- ``running_argv``: that pid is alive. ``exec_argv``: ``enroot exec PID`` enters the container's namespaces,
  so a command sees the mounts made at start; a fixed in-container ``sh -c`` changes to the working
  directory, and ``env`` adds the variables. ``stop_argv``: TERM then KILL the process group, then
  ``enroot remove -f``.

Enroot runs as the node's login user (no ``--root``): the container's sshd is unprivileged, so its port
must be 1024 or above and the login user inside is that same user. Enroot shares the node's network, IPC
and /dev/shm and applies no resource limits: ``network`` must be ``host``; ``shm_size`` and ``ulimits`` do
not apply (limits are the node's, from limits.conf). GPUs are chosen with ``NVIDIA_VISIBLE_DEVICES`` for
enroot's NVIDIA hook. Registry credentials are enroot's own (``$ENROOT_CONFIG_PATH/.credentials``).
"""

from __future__ import annotations

from plugins.benchmarks.base import ParamError
from plugins.containers.base import (
    KEYS_MOUNT,
    SSH_PORT_ENV,
    ContainerRuntime,
    ContainerSpec,
    check_exec,
    check_host_path,
    check_image_file_or_reference,
    check_login_user_runtime,
    check_name,
    gpu_list,
    image_reference,
    is_local_image,
    parse_volume,
    register,
)

STATE_DIR = "$HOME/.rackbench/enroot"  # expanded by the node's shell, inside the fixed scripts below

IMPORT_SCRIPT = f"""set -e
d="{STATE_DIR}/images"
mkdir -p "$d" && chmod 700 "{STATE_DIR}" "$d"
[ -s "$d/$1" ] && exit 0
trap 'rm -f "$d/$1.tmp.$$"' EXIT
enroot import --output "$d/$1.tmp.$$" -- "$2"
mv -f "$d/$1.tmp.$$" "$d/$1"
"""

CREATE_SCRIPT = f"""set -e
case "$2" in /*) image="$2" ;; *) image="{STATE_DIR}/images/$2" ;; esac
if enroot list | grep -qxF -- "$1"; then enroot remove -f -- "$1"; fi
exec enroot create --name "$1" -- "$image"
"""

START_SCRIPT = f"""d="{STATE_DIR}"; n="$1"; shift
mkdir -p "$d" && chmod 700 "$d" || exit 1
setsid "$@" < /dev/null > "$d/$n.log" 2>&1 &
echo $! > "$d/$n.pid.tmp" && mv -f "$d/$n.pid.tmp" "$d/$n.pid"
"""

RUNNING_SCRIPT = f"""p=$(cat "{STATE_DIR}/$1.pid" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null"""

EXEC_SCRIPT = f"""n="$1"; shift
p=$(cat "{STATE_DIR}/$n.pid" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p" 2>/dev/null || {{
    echo "rackbench: enroot container $n is not running" >&2; exit 125; }}
exec enroot exec -- "$p" "$@"
"""

# Runs inside the container: the working directory, then the command itself.
CHDIR_SCRIPT = 'cd "$1" || exit 126; shift; exec "$@"'

STOP_SCRIPT = f"""d="{STATE_DIR}"; p=$(cat "$d/$1.pid" 2>/dev/null)
if [ -n "$p" ] && kill -0 "$p" 2>/dev/null; then
    kill -TERM -"$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null
    i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
fi
rm -f "$d/$1.pid"
if enroot list 2>/dev/null | grep -qxF -- "$1"; then exec enroot remove -f -- "$1"; fi
"""

IMPORTED_DIGEST_SCRIPT = f'exec sha256sum -- "{STATE_DIR}/images/$1"'


def import_uri(image: str) -> str:
    """Enroot's form of a registry reference: ``docker://[REGISTRY#]IMAGE[:TAG]``."""
    first, slash, rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return f"docker://{first}#{rest}"
    return f"docker://{image}"


def imported_file(image: str) -> str:
    """The file name of an imported image, after enroot's own naming (nvidia+cuda+10.0-base.sqsh)."""
    return image.replace("/", "+").replace(":", "+") + ".sqsh"


@register
class EnrootRuntime(ContainerRuntime):
    name = "enroot"
    description = "NVIDIA enroot (no daemon): sshd started detached, commands via enroot exec"

    def validate(self, spec: ContainerSpec) -> None:
        super().validate(spec)
        reference = check_image_file_or_reference(spec.image, runtime="enroot", suffix=".sqsh")
        if reference is not None and reference["digest"]:
            raise ParamError("container.image", "enroot imports by tag, not by digest: give a tag or a .sqsh path")
        check_login_user_runtime(spec, containers="enroot containers")

    def start_argv(self, spec: ContainerSpec, *, name: str, key_dir: str) -> list[list[str]]:
        self.validate(spec)
        check_name(name)
        check_host_path("key_dir", key_dir)
        commands: list[list[str]] = []
        if is_local_image(spec.image):
            image = spec.image
        else:
            image = imported_file(spec.image)
            commands.append(["sh", "-c", IMPORT_SCRIPT, "sh", image, import_uri(spec.image)])
        commands.append(["sh", "-c", CREATE_SCRIPT, "sh", name, image])
        start = ["enroot", "start", "--rw", "--mount", f"{key_dir}:{KEYS_MOUNT}:none:x-create=dir,bind,ro"]
        for volume in spec.volumes:
            v = parse_volume(volume)
            start += ["--mount", f"{v.host}:{v.container}:none:x-create=dir,bind" + (",ro" if v.read_only else "")]
        visible = {"all": "all", "none": "void"}.get(spec.gpus) or ",".join(gpu_list(spec.gpus))
        start += ["--env", f"{SSH_PORT_ENV}={spec.ssh_port}", "--env", f"NVIDIA_VISIBLE_DEVICES={visible}"]
        for key, value in sorted(spec.env.items()):
            start += ["--env", f"{key}={value}"]
        start += ["--", name]
        commands.append(["sh", "-c", START_SCRIPT, "sh", name, *start])
        return commands

    def running_argv(self, name: str) -> list[str]:
        check_name(name)
        return ["sh", "-c", RUNNING_SCRIPT, "sh", name]

    def exec_argv(self, name: str, argv: list[str], *, env: dict[str, str], workdir: str) -> list[str]:
        check_name(name)
        check_exec(argv, env, workdir)
        inside = ["env", *(f"{key}={value}" for key, value in sorted(env.items()))] if env else []
        return ["sh", "-c", EXEC_SCRIPT, "sh", name, *inside, "sh", "-c", CHDIR_SCRIPT, "sh", workdir, *argv]

    def stop_argv(self, name: str) -> list[list[str]]:
        check_name(name)
        return [["sh", "-c", STOP_SCRIPT, "sh", name]]

    def digest_argv(self, spec: ContainerSpec) -> list[str] | None:
        """The sha256 of the squashfs file the container was created from."""
        if is_local_image(spec.image):
            return ["sha256sum", "--", check_host_path("container.image", spec.image)]
        image_reference(spec.image)
        return ["sh", "-c", IMPORTED_DIGEST_SCRIPT, "sh", imported_file(spec.image)]
