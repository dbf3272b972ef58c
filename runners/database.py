"""A process's database connections, bounded: SSH threads hand their database work to a small pool.

Django gives every thread a connection of its own. A run's SSH fan-out has up to RACKBENCH_SSH_FANOUT threads, and
each one that looked up a pinned host key or stored a node's facts opened a connection: a worker process could hold
one per thread (a 64-node run went past PostgreSQL's default limit of 100 before they were closed per thread, and
peaked at 66 after). Here such threads hold none:

- a thread marked with ``refuse_connections`` (every SSH fan-out thread, the telemetry fetch threads, a step
  lease's renewer) cannot open a connection: Django's per-thread connection is replaced by a stand-in that raises
  ``DatabaseInSSHThread`` on any use, before anything is opened;
- such a thread passes its database work to ``call``, which runs it on one of at most RACKBENCH_DB_POOL_SIZE
  threads of the process, each with its connection (kept while work comes, closed after ``IDLE_CLOSE`` seconds
  without), and waits for the answer.

A process therefore holds at most RACKBENCH_DB_POOL_SIZE + 1 connections: the pool's and that of the thread that
runs its task (or request). ``call`` from any other thread runs the work in that thread, on its own connection.
Work handed to the pool is short database work: it must not itself wait for SSH threads (they could be waiting for
the pool).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from django import db
from django.conf import settings

R = TypeVar("R")

IDLE_CLOSE = 5.0  # seconds without work after which a pool thread closes its connection


class DatabaseInSSHThread(RuntimeError):
    """Database access from a thread that must hold no connection: a programming error, named clearly."""


class _Refused:
    """Stands in for Django's connection in a thread marked by ``refuse_connections``."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def close(self) -> None:
        """Nothing was opened (Django's close_all calls this)."""

    def __getattr__(self, name: str) -> Any:
        raise DatabaseInSSHThread(
            f"database access ({self.alias!r}) from {threading.current_thread().name}, a thread that does SSH only: "
            "hand the database work to runners.database.call, which runs it on the process's bounded pool "
            "(RACKBENCH_DB_POOL_SIZE connections)"
        )


_marks = threading.local()


def refuse_connections() -> None:
    """Mark the calling thread: it opens no database connection, and ``call`` runs its work on the pool."""
    db.connections.close_all()  # a connection it may have opened before (none, in the threads that do this)
    for alias in db.connections:
        db.connections[alias] = _Refused(alias)  # type: ignore[assignment]  # a stand-in, on purpose
    _marks.refused = True


def refused() -> bool:
    return getattr(_marks, "refused", False)


_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class _Pool:
    """Up to ``size`` daemon threads, started as work arrives, each running queued work on its own connection."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def submit(self, fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        future: Future[R] = Future()
        self.jobs.put((future, fn, args, kwargs))
        with self.lock:
            if len(self.threads) < self.size:
                thread = threading.Thread(target=self._serve, name=f"db-pool-{len(self.threads)}", daemon=True)
                self.threads.append(thread)
                thread.start()
        return future

    def _serve(self) -> None:
        try:
            while True:
                try:
                    job = self.jobs.get(timeout=IDLE_CLOSE)
                except queue.Empty:
                    db.connections.close_all()
                    job = self.jobs.get()
                if job is None:
                    return
                future, fn, args, kwargs = job
                if not future.set_running_or_notify_cancel():
                    continue
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
                    future.set_exception(exc)
                    # As Django does after a failed request: a connection left unusable is not reused.
                    for connection in db.connections.all(initialized_only=True):
                        connection.close_if_unusable_or_obsolete()
                else:
                    future.set_result(result)
        finally:
            db.connections.close_all()

    def close(self) -> None:
        """Stop the threads once the work queued so far is done; each closes its connection as it ends."""
        with self.lock:
            threads, self.threads = self.threads, []
        for _ in threads:
            self.jobs.put(None)
        for thread in threads:
            thread.join(timeout=30)


_pool: _Pool | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def _the_pool() -> _Pool:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child does not inherit the parent's threads
            _pool, _pool_pid = _Pool(settings.RACKBENCH["DB_POOL_SIZE"]), os.getpid()
        return _pool


def call(fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
    """``fn(*args, **kwargs)``: on the pool from a thread marked by ``refuse_connections`` (waiting for it, and
    raising what it raised), else in the calling thread."""
    if not refused():
        return fn(*args, **kwargs)
    return _the_pool().submit(fn, args, kwargs).result()


def pool_close() -> None:
    """Close the pool's connections and stop its threads (a later ``call`` starts new ones): before a test
    database is dropped, or when the pool's size changed."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None and _pool_pid == os.getpid():  # a forked child has none of the parent's threads to stop
        pool.close()


atexit.register(pool_close)  # a command that ends closes the pool's connections instead of dropping them
