"""Bare metal: no container. Commands run on the node as they are; mpirun hops over the node's own sshd."""

from __future__ import annotations

from plugins.benchmarks.base import ParamError
from plugins.containers.base import ContainerRuntime, ContainerSpec, check_exec, register


@register
class BareRuntime(ContainerRuntime):
    name = "bare"
    description = "no container: commands run directly on the node"

    def validate(self, spec: ContainerSpec) -> None:
        # Only the runtime matters; the other settings describe a container there is none of.
        if spec.runtime != self.name:
            raise ParamError("container.runtime", f"expected {self.name!r}, got {spec.runtime!r}")

    def start_argv(self, spec: ContainerSpec, *, name: str, key_dir: str) -> list[list[str]]:
        return []

    def running_argv(self, name: str) -> list[str]:
        return ["true"]

    def exec_argv(self, name: str, argv: list[str], *, env: dict[str, str], workdir: str) -> list[str]:
        """``argv`` unchanged: the runner sets the environment and starts the command in its directory."""
        check_exec(argv, env, workdir)
        return list(argv)

    def stop_argv(self, name: str) -> list[list[str]]:
        return []
