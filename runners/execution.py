"""What a run does on its hosts: flush caches, write its files, start it detached, poll, collect, kill.

Under a Slurm launcher (plugins/launchers/slurm.py) the primary's main command is submitted with sbatch on the
campaign's login node instead of started detached, and polled, collected and cancelled there. The parts: the hosts
(runners/hosts.py), preparing them (runners/prepare.py), the job's lifecycle (runners/lifecycle.py); this module
gives them to runners.tasks. Every state change goes through campaigns.services.
"""

from __future__ import annotations

from runners.hosts import (
    TAIL as TAIL,
)
from runners.hosts import (
    HostJob as HostJob,
)
from runners.hosts import (
    RunTarget as RunTarget,
)
from runners.hosts import (
    host_jobs as host_jobs,
)
from runners.hosts import (
    main_targets as main_targets,
)
from runners.hosts import (
    run_targets as run_targets,
)
from runners.hosts import (
    slurm_login as slurm_login,
)
from runners.hosts import (
    slurm_options as slurm_options,
)
from runners.lifecycle import (
    LIVE_LOG_BYTES as LIVE_LOG_BYTES,
)
from runners.lifecycle import (
    LIVE_LOG_WANTED_FOR as LIVE_LOG_WANTED_FOR,
)
from runners.lifecycle import (
    SERVICE_READY_TIMEOUT as SERVICE_READY_TIMEOUT,
)
from runners.lifecycle import (
    HostOutcome as HostOutcome,
)
from runners.lifecycle import (
    PollOutcome as PollOutcome,
)
from runners.lifecycle import (
    run_collect as run_collect,
)
from runners.lifecycle import (
    run_keep_output as run_keep_output,
)
from runners.lifecycle import (
    run_kill as run_kill,
)
from runners.lifecycle import (
    run_poll as run_poll,
)
from runners.lifecycle import (
    run_start as run_start,
)
from runners.lifecycle import (
    run_submit as run_submit,
)
from runners.lifecycle import (
    stop_services as stop_services,
)
from runners.lifecycle import (
    store_live_log as store_live_log,
)
from runners.prepare import (
    client_flush_command as client_flush_command,
)
from runners.prepare import (
    flush_caches as flush_caches,
)
from runners.prepare import (
    mount_storage as mount_storage,
)
from runners.prepare import (
    mpi_reachability as mpi_reachability,
)
from runners.prepare import (
    run_prepare as run_prepare,
)
from runners.prepare import (
    start_containers as start_containers,
)
from runners.prepare import (
    stop_containers as stop_containers,
)
from runners.prepare import (
    unmount_storage as unmount_storage,
)
