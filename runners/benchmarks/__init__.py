"""Benchmark plug-ins. Importing this package registers every kind."""

from runners.benchmarks import fio  # noqa: F401
