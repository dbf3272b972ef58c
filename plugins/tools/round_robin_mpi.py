#!/usr/bin/env python3
"""Spread MPI ranks round-robin over several data directories, then become the real command.

Usage (every MPI rank runs it, e.g. ``mpirun ... python3 round_robin_mpi.py --dirs ... -- python3 train.py ...``)::

    round_robin_mpi.py [--by global|local] --dirs DIR [DIR ...] -- COMMAND [ARG ...]

Contract (rackbench plug-ins rely on it; keep it stable):

1. The rank is read from the environment the MPI launcher sets. ``--by global`` (the default) uses the rank in
   the whole job (``OMPI_COMM_WORLD_RANK``, ``PMIX_RANK``, ``PMI_RANK``, ``MV2_COMM_WORLD_RANK``,
   ``SLURM_PROCID``, first one set); ``--by local`` the rank on this node (``OMPI_COMM_WORLD_LOCAL_RANK``,
   ``MPI_LOCALRANKID``, ``MV2_COMM_WORLD_LOCAL_RANK``, ``SLURM_LOCALID``). Without any of them (no MPI) the
   rank is 0, so the program also works as a single process.
2. The data directory is ``DIRS[rank % len(DIRS)]``, in the order given: with 16 mount points and ranks
   0..47, rank 17 uses the second one. Global ranks spread a job evenly over every mount point even when a
   node has fewer ranks than there are mount points; local ranks give every node the same mapping.
3. Every literal ``{data_dir}`` inside any argument after ``--`` is replaced by that directory, also inside a
   longer argument (``--data_dir={data_dir}/train`` becomes ``--data_dir=/mnt/isilon3/train``). Nothing else
   is interpreted: no other braces, no shell, no environment expansion.
4. ``RACKBENCH_DATA_DIR`` is set to the directory in the command's environment.
5. The command then replaces this process (``os.execvp``, searched in ``PATH``): same process id, so the MPI
   launcher sees and signals the real program, and the exit status is the command's own.

It prints nothing on success. Bad usage exits with status 2 and a message on stderr; a command that cannot be
started exits with status 127. The seed papers' ``round_robin_mpi.py`` picked one of many ``--data_dir=``
arguments; this one is written from that idea, not from its code.
"""

from __future__ import annotations

import os
import sys

TOKEN = "{data_dir}"
ENV_VAR = "RACKBENCH_DATA_DIR"
GLOBAL_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")
LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
USAGE = "usage: round_robin_mpi.py [--by global|local] --dirs DIR [DIR ...] -- COMMAND [ARG ...]"


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """(by, dirs, command) from the arguments after the program name."""
    if "--" not in argv:
        raise UsageError("missing '--' before the command")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    by, dirs = "global", []
    i = 0
    while i < len(options):
        if options[i] == "--by" and i + 1 < len(options):
            by = options[i + 1]
            i += 2
        elif options[i] == "--dirs":
            dirs = options[i + 1 :]
            break
        else:
            raise UsageError(f"unexpected argument {options[i]!r}")
    if by not in ("global", "local"):
        raise UsageError(f"--by must be 'global' or 'local', got {by!r}")
    if not dirs:
        raise UsageError("--dirs needs at least one directory")
    if not command:
        raise UsageError("no command after '--'")
    return by, dirs, command


def rank_from(environ: dict[str, str], by: str) -> int:
    """The first rank variable set, as a number; 0 when none is (a plain process without MPI)."""
    for name in GLOBAL_RANK_VARS if by == "global" else LOCAL_RANK_VARS:
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit():
                raise UsageError(f"{name}={value!r} is not a rank")
            return int(value)
    return 0


def pick(dirs: list[str], rank: int) -> str:
    return dirs[rank % len(dirs)]


def substitute(command: list[str], data_dir: str) -> list[str]:
    return [arg.replace(TOKEN, data_dir) for arg in command]


def main(argv: list[str]) -> int:
    try:
        by, dirs, command = parse_args(argv)
        data_dir = pick(dirs, rank_from(dict(os.environ), by))
    except UsageError as exc:
        print(f"round_robin_mpi.py: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    os.environ[ENV_VAR] = data_dir
    final = substitute(command, data_dir)
    sys.stdout.flush()
    try:
        os.execvp(final[0], final)
    except OSError as exc:
        print(f"round_robin_mpi.py: cannot run {final[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp only returns by raising


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
