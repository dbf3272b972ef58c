"""Docker: one detached container per node, as seeds 000 and 001 start theirs::

    docker run --rm --detach --privileged --gpus all -v /mnt:/mnt --network=host --shm-size=1g
      --ulimit memlock=-1 --ulimit stack=67108864 --name tf IMAGE bash -c "/usr/sbin/sshd ; sleep infinity"

Differences from the seeds, and why:

- No command after the image: the image's entrypoint (docker/bench-node) installs the campaign's keys from
  ``/rackbench-keys`` and runs ``sshd -D`` on ``$RACKBENCH_SSH_PORT``, so no key is baked into the image.
- ``--init`` instead of sshd as PID 1: ranks orphaned when an ssh session ends are reaped, not left as zombies.
- No ``--rm``; a leftover is removed by ``docker rm -f`` before ``docker run``. A container whose sshd died
  keeps its logs (``docker logs NAME``) until the next start or stop.
- ``--privileged`` only when the campaign asks for it (``privileged: true``), as the seeds do for RDMA.

``docker rm -f`` of a missing container exits 0 from Docker 20.10 on.
"""

from __future__ import annotations

from typing import ClassVar

from plugins.containers.base import (
    KEYS_MOUNT,
    SSH_PORT_ENV,
    ContainerRuntime,
    ContainerSpec,
    check_exec,
    check_host_path,
    check_name,
    gpu_list,
    image_reference,
    parse_volume,
    register,
)

# Exits 0 only when the container exists and runs ("$1" is its name; the CLI is "$2").
RUNNING_SCRIPT = '[ "$("$2" container inspect --format "{{.State.Running}}" -- "$1" 2>/dev/null)" = true ]'


@register
class DockerRuntime(ContainerRuntime):
    name = "docker"
    description = "Docker Engine with the NVIDIA Container Toolkit (--gpus)"
    cli: ClassVar[str] = "docker"
    # Go template printing the repository digest, or the image id for an image that was never pushed.
    digest_format: ClassVar[str] = "{{if .RepoDigests}}{{index .RepoDigests 0}}{{else}}{{.Id}}{{end}}"
    extra_flags = {
        "--cap-add": True,
        "--cpuset-cpus": True,
        "--cpuset-mems": True,
        "--device": True,  # e.g. --device=/dev/infiniband without --privileged
        "--ipc": True,
        "--memory": True,
        "--pids-limit": True,
        "--runtime": True,  # --runtime=nvidia: the nvidia-docker of the seeds
        "--security-opt": True,
        "--userns": True,
    }

    def validate(self, spec: ContainerSpec) -> None:
        super().validate(spec)
        image_reference(spec.image)

    def gpu_args(self, gpus: str) -> list[str]:
        if gpus == "none":
            return []
        if gpus == "all":
            return ["--gpus", "all"]
        # The CLI reads --gpus as CSV: a device list needs the inner double quotes to stay one field.
        return ["--gpus", f'"device={",".join(gpu_list(gpus))}"']

    def start_argv(self, spec: ContainerSpec, *, name: str, key_dir: str) -> list[list[str]]:
        self.validate(spec)
        check_name(name)
        check_host_path("key_dir", key_dir)
        run = [self.cli, "run", "--detach", "--init", "--name", name]
        if spec.privileged:
            run.append("--privileged")
        run += ["--network", spec.network]
        run += self.gpu_args(spec.gpus)
        run += ["--shm-size", spec.shm_size]
        for limit, value in spec.ulimits.items():
            run += ["--ulimit", f"{limit}={value}"]
        run += ["-v", f"{key_dir}:{KEYS_MOUNT}:ro"]
        for volume in spec.volumes:
            v = parse_volume(volume)
            run += ["-v", f"{v.host}:{v.container}" + (":ro" if v.read_only else "")]
        run += ["-e", f"{SSH_PORT_ENV}={spec.ssh_port}"]
        for key, value in sorted(spec.env.items()):
            run += ["-e", f"{key}={value}"]
        run += spec.extra_args
        run.append(spec.image)
        return [[self.cli, "rm", "-f", name], run]

    def running_argv(self, name: str) -> list[str]:
        check_name(name)
        return ["sh", "-c", RUNNING_SCRIPT, "sh", name, self.cli]

    def exec_argv(self, name: str, argv: list[str], *, env: dict[str, str], workdir: str) -> list[str]:
        check_name(name)
        check_exec(argv, env, workdir)
        command = [self.cli, "exec"]
        for key, value in sorted(env.items()):
            command += ["-e", f"{key}={value}"]
        # Options end at the container name: argv is passed on untouched, even when it starts with "-".
        return [*command, "-w", workdir, name, *argv]

    def stop_argv(self, name: str) -> list[list[str]]:
        check_name(name)
        return [[self.cli, "rm", "-f", name]]

    def digest_argv(self, spec: ContainerSpec) -> list[str] | None:
        image_reference(spec.image)
        return [self.cli, "image", "inspect", "--format", self.digest_format, spec.image]
