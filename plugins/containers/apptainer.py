"""Apptainer (formerly Singularity): a named instance per node, running the image's sshd.

``apptainer instance run`` (Apptainer 1.1+) starts the instance in the background and runs the image's
runscript, which for an image built from Docker is its ENTRYPOINT: the bench-node entrypoint installs the
keys and execs ``sshd -D``. The image is read-only: ``--scratch /run/rackbench-ssh`` gives the entrypoint a
private directory, owned by the login user, for the keys and the sshd and ssh client configuration (the image
includes that client configuration from /etc/ssh/ssh_config at build time). Commands run with
``apptainer exec instance://NAME``, which joins the instance's namespaces and so sees the binds made at start.

Environment variables go in as ``APPTAINERENV_NAME=value`` in apptainer's own environment (through ``env``),
not ``--env``: that flag splits its value on commas, and NCCL/CUDA values hold commas (``0,1``, ``^docker0,lo``).

Apptainer runs as the node's login user and shares the node's network and /dev/shm: the sshd is unprivileged
(port 1024 or above), ``network`` must be ``host``, ``shm_size`` and ``ulimits`` do not apply (limits are the
node's, from limits.conf). ``--nv`` binds the NVIDIA driver and every GPU; a GPU list ("0,1") is applied with
``CUDA_VISIBLE_DEVICES``, which CUDA honours but does not enforce. Images: a ``.sif`` path, or a registry
reference run as ``docker://REF`` (apptainer converts and caches it; no digest is recorded then).
"""

from __future__ import annotations

from plugins.containers.base import (
    KEYS_MOUNT,
    SSH_PORT_ENV,
    SSH_STATE_DIR,
    SSHD_PIDFILE,
    ContainerRuntime,
    ContainerSpec,
    check_exec,
    check_host_path,
    check_image_file_or_reference,
    check_login_user_runtime,
    check_name,
    gpu_list,
    is_local_image,
    parse_volume,
    register,
)

ENV_PREFIX = "APPTAINERENV_"

# Stopping a missing instance is not an error: exit 0 when the instance is gone afterwards.
STOP_SCRIPT = 'apptainer instance stop -- "$1" || ! apptainer exec "instance://$1" true > /dev/null 2>&1'
# The instance runs and so does its sshd (no pid namespace: the pid in the pidfile is the node's).
RUNNING_SCRIPT = 'p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] && kill -0 "$p"'


def image_uri(image: str) -> str:
    """What apptainer is given: the .sif path, or ``docker://REF`` (the prefix is optional in a campaign)."""
    if check_image_file_or_reference(image, runtime="apptainer", suffix=".sif", scheme="docker://") is None:
        return image
    return f"docker://{image.removeprefix('docker://')}"


def with_env(env: dict[str, str], argv: list[str]) -> list[str]:
    if not env:
        return argv
    return ["env", *(f"{ENV_PREFIX}{key}={value}" for key, value in sorted(env.items())), *argv]


@register
class ApptainerRuntime(ContainerRuntime):
    name = "apptainer"
    description = "Apptainer/Singularity instances (Apptainer 1.1+ for instance run)"
    extra_flags = {
        "--cleanenv": False,
        "--contain": False,
        "--no-home": False,
        "--nvccli": False,
        "--rocm": False,
        "--userns": False,
    }

    def validate(self, spec: ContainerSpec) -> None:
        super().validate(spec)
        image_uri(spec.image)
        check_login_user_runtime(spec, containers="apptainer instances")

    def start_argv(self, spec: ContainerSpec, *, name: str, key_dir: str) -> list[list[str]]:
        self.validate(spec)
        check_name(name)
        check_host_path("key_dir", key_dir)
        env = {SSH_PORT_ENV: str(spec.ssh_port), **spec.env}
        run = ["apptainer", "instance", "run", "--scratch", SSH_STATE_DIR]
        if spec.gpus != "none":
            run.append("--nv")
        if gpu_list(spec.gpus):
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_list(spec.gpus))
        run += ["--bind", f"{key_dir}:{KEYS_MOUNT}:ro"]
        for volume in spec.volumes:
            v = parse_volume(volume)
            run += ["--bind", f"{v.host}:{v.container}" + (":ro" if v.read_only else "")]
        run += spec.extra_args
        run += [image_uri(spec.image), name]
        return [self.stop_argv(name)[0], with_env(env, run)]

    def running_argv(self, name: str) -> list[str]:
        check_name(name)
        return ["apptainer", "exec", f"instance://{name}", "sh", "-c", RUNNING_SCRIPT, "sh", SSHD_PIDFILE]

    def exec_argv(self, name: str, argv: list[str], *, env: dict[str, str], workdir: str) -> list[str]:
        check_name(name)
        check_exec(argv, env, workdir)
        return with_env(env, ["apptainer", "exec", "--pwd", workdir, f"instance://{name}", *argv])

    def stop_argv(self, name: str) -> list[list[str]]:
        check_name(name)
        return [["sh", "-c", STOP_SCRIPT, "sh", name]]

    def digest_argv(self, spec: ContainerSpec) -> list[str] | None:
        """The sha256 of the .sif file; None for a registry image (apptainer's cache holds the conversion)."""
        if is_local_image(spec.image):
            return ["sha256sum", "--", check_host_path("container.image", spec.image)]
        return None
