"""Benchmark plug-ins. Importing this package registers every kind."""

from plugins.benchmarks import (
    command,  # noqa: F401
    fio,  # noqa: F401
    horovod_synthetic,  # noqa: F401
    ior,  # noqa: F401
    iperf,  # noqa: F401
    mdtest,  # noqa: F401
    mlperf,  # noqa: F401
    nccl,  # noqa: F401
    nvidia_smi,  # noqa: F401
    perftest,  # noqa: F401
    pytorch_resnet,  # noqa: F401
    storage_read,  # noqa: F401
    tf_cnn,  # noqa: F401
    torch_dist,  # noqa: F401
)
