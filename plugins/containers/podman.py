"""Podman: Docker's command line, with GPUs through the Container Device Interface.

``--device nvidia.com/gpu=all`` (or one ``--device nvidia.com/gpu=N`` per GPU) needs a CDI specification on
the node (``nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml``, NVIDIA Container Toolkit 1.12+).
Rootless podman cannot raise a limit above the node's hard limit: drop ``memlock`` (``ulimits: {memlock:
null}``) or raise the hard limit on the node. On SELinux nodes, ``extra_args: ["--security-opt=label=disable"]``
lets the container use the CDI-mounted devices. Prefer fully qualified image names (docker.io/library/ubuntu):
a short name may need an interactive choice of registry.
"""

from __future__ import annotations

from plugins.containers.base import gpu_list, register
from plugins.containers.docker import DockerRuntime


@register
class PodmanRuntime(DockerRuntime):
    name = "podman"
    description = "Podman, GPUs through CDI (--device nvidia.com/gpu=...)"
    cli = "podman"
    # podman's templates name the image id .ID (docker's JSON has .Id)
    digest_format = "{{if .RepoDigests}}{{index .RepoDigests 0}}{{else}}{{.ID}}{{end}}"
    extra_flags = {**DockerRuntime.extra_flags, "--group-add": True}

    def gpu_args(self, gpus: str) -> list[str]:
        if gpus == "none":
            return []
        devices = ["all"] if gpus == "all" else gpu_list(gpus)
        return [arg for device in devices for arg in ("--device", f"nvidia.com/gpu={device}")]
