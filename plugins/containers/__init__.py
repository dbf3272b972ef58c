"""Container runtime plug-ins. Importing this package registers every runtime."""

from plugins.containers import (
    apptainer,  # noqa: F401
    bare,  # noqa: F401
    docker,  # noqa: F401
    enroot,  # noqa: F401
    podman,  # noqa: F401
)
from plugins.containers.base import (
    ContainerRuntime,
    ContainerSpec,
    get_runtime,
    runtime_names,
    spec_from_dict,
)

__all__ = ["ContainerRuntime", "ContainerSpec", "get_runtime", "runtime_names", "spec_from_dict"]
