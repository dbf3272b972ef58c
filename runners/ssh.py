"""Every paramiko call of rackbench lives here.

Connections are pooled per worker process and reused; each socket has TCP_NODELAY (on loopback a
pooled command then takes a few milliseconds instead of ~40 ms of Nagle + delayed-ACK waits).
Host keys are pinned: the key seen at first contact is stored, and a different key later is a
permanent, clearly worded failure. A pooled connection is reused for at most ``Timeouts.max_age``
seconds: the next use then opens a new one, whose handshake checks the node's key against the pinned
one again, so a changed key is noticed within that age and not only when a connection breaks.
Errors are classed transient (worth a retry) or permanent.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import paramiko

from common import sshkeys
from common.sshkeys import fingerprint as fingerprint

T = TypeVar("T")
R = TypeVar("R")


class TransportNoise(logging.Filter):
    """paramiko's transport thread logs every connection it loses at ERROR, traceback line by line ("Socket
    exception: Bad file descriptor", "Error reading SSH protocol banner"). rackbench reports each such failure
    itself, as an SSH error naming the node, retried or failing the run: the thread's lines go down to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


logging.getLogger("paramiko.transport").addFilter(TransportNoise())


# How often the thread of an open connection wakes when nothing arrives (see _Transport).
IDLE_CHECK_S = 1.0


class _Transport(paramiko.Transport):
    """paramiko's transport, whose thread wakes once a second instead of ten times while its connection is idle.

    The thread reads its socket with a timeout (paramiko's ``_active_check_timeout``, 0.1 s) and, at each one, checks
    whether the transport was closed and whether a keepalive is due. That is 10 wake-ups a second per connection: a
    process holding 1,000 idle connections spent ~26% of a core on them. Once a connection is up (``settle``), its
    socket's timeout becomes ``IDLE_CHECK_S``. What the longer timeout governs, in paramiko 5.1: keepalives are sent
    within that much after they fall due (rackbench's come every ``Timeouts.keepalive`` = 15 s), a rekey the sending
    side asks for starts within it, and a send blocked on a full buffer checks for a closed transport that often.
    The handshake keeps paramiko's 0.1 s, so banner, handshake and auth timeouts are as precise as before. Nothing
    arriving is not delayed: a read returns as soon as data comes.

    Closing: a descriptor closed while the thread waits on it neither wakes the thread nor ends the TCP connection
    (the kernel holds the socket until that wait times out, up to ``IDLE_CHECK_S`` later); ``close`` shuts the socket
    down first, which does both at once."""

    def settle(self) -> None:
        self.sock.settimeout(IDLE_CHECK_S)

    def close(self) -> None:
        if isinstance(self.sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed, or the peer left
                self.sock.shutdown(socket.SHUT_RDWR)
        super().close()


def _new_transport(
    sock: Any, /, *, disabled_algorithms: Mapping[str, Iterable[str]] | None = None, **_: object
) -> _Transport:
    """SSHClient's transport factory. paramiko 5.1 passes ``disabled_algorithms`` alone; its type stubs add the GSS
    flags of older versions, which this transport does not take."""
    return _Transport(sock, disabled_algorithms=disabled_algorithms)


class SSHError(Exception):
    transient = False

    def __init__(self, endpoint: Endpoint | None, message: str) -> None:
        where = f"{endpoint.label}: " if endpoint else ""
        super().__init__(where + message)
        self.endpoint = endpoint


class TransientSSHError(SSHError):
    """Timeouts, refused or reset connections: worth retrying."""

    transient = True


class PermanentSSHError(SSHError):
    """Authentication failures, bad host keys, unusable credentials: retrying cannot help."""


class HostKeyMismatch(PermanentSSHError):
    pass


class CommandTimeout(TransientSSHError):
    pass


@dataclass(frozen=True)
class Endpoint:
    address: str
    port: int
    username: str
    name: str = ""  # what the user calls it (node name); for messages
    key_id: str = ""  # identifies the private key, so a changed credential gets a new connection

    @property
    def label(self) -> str:
        where = f"{self.username}@{self.address}:{self.port}"
        return f"{self.name} ({where})" if self.name else where


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class HostKeyStore(Protocol):
    def pinned(self, address: str, port: int) -> tuple[str, str] | None:
        """(key type, base64) pinned for the endpoint, or None before first contact."""

    def pin(self, address: str, port: int, key_type: str, key_base64: str) -> tuple[str, str]:
        """Pin the key unless one is already pinned; returns the pinned one."""


def _known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class _PinOnFirstContact(paramiko.MissingHostKeyPolicy):
    def __init__(self, store: HostKeyStore, endpoint: Endpoint) -> None:
        self.store = store
        self.endpoint = endpoint

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        offered = (key.get_name(), key.get_base64())
        pinned = self.store.pin(self.endpoint.address, self.endpoint.port, *offered)
        if pinned != offered:  # another worker pinned a different key first
            raise HostKeyMismatch(self.endpoint, _mismatch_message(pinned, offered))


def _mismatch_message(pinned: tuple[str, str], offered: tuple[str, str]) -> str:
    return (
        f"host key changed: pinned {pinned[0]} {fingerprint(*pinned)}, the host offered {offered[0]} "
        f"{fingerprint(*offered)}. Refusing to connect. If the node was reinstalled on purpose, forget the "
        f"pinned key (manage.py hostkey forget ADDRESS PORT) and connect again."
    )


def load_private_key(text: str) -> paramiko.PKey:
    try:
        return sshkeys.load_private_key(text)
    except sshkeys.UnreadableKey as exc:
        raise PermanentSSHError(None, str(exc)) from None


@dataclass
class Timeouts:
    connect: float = 10.0
    command: float = 120.0
    keepalive: int = 15
    max_age: float = (
        300.0  # seconds a connection is reused before the next use opens (and verifies) a new one; 0: no bound
    )


class Pool:
    """Open SSH connections, reused across commands; safe to use from several threads."""

    def __init__(
        self,
        store: HostKeyStore,
        timeouts: Timeouts | None = None,
        *,
        disabled_algorithms: dict[str, list[str]] | None = None,
    ) -> None:
        """``disabled_algorithms``: paramiko's, e.g. {"kex": [...]} to hold every connection to one key exchange."""
        self.store = store
        self.timeouts = timeouts or Timeouts()
        self.disabled_algorithms = disabled_algorithms
        self._clients: dict[Endpoint, paramiko.SSHClient] = {}
        self._opened: dict[Endpoint, float] = {}  # monotonic time each pooled connection was opened
        # Connections past their age, closed once whatever still uses them has had its command timeout to finish.
        self._retired: list[tuple[float, paramiko.SSHClient]] = []
        self._homes: dict[Endpoint, str] = {}
        self._lock = threading.Lock()
        self._endpoint_locks: dict[Endpoint, threading.Lock] = {}

    # --- connections ------------------------------------------------------------------------
    def client(self, endpoint: Endpoint, pkey: paramiko.PKey) -> paramiko.SSHClient:
        with self._lock:
            lock = self._endpoint_locks.setdefault(endpoint, threading.Lock())
        with lock:
            self._close_retired()
            client = self._clients.get(endpoint)
            if client and _alive(client):
                if self._young(endpoint):
                    return client
                with self._lock:  # too old: another thread may still be reading from it
                    self._retired.append((time.monotonic() + self.timeouts.command + 5, client))
                    self._homes.pop(endpoint, None)
            elif client:
                client.close()
            client = self._connect(endpoint, pkey)
            self._clients[endpoint] = client
            self._opened[endpoint] = time.monotonic()
            return client

    def connected(self, endpoint: Endpoint) -> bool:
        """Whether the next use of ``endpoint`` finds an open connection young enough to be reused (no handshake)."""
        with self._lock:
            client = self._clients.get(endpoint)
        return client is not None and _alive(client) and self._young(endpoint)

    def _young(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's connection is within ``Timeouts.max_age`` (always, with no bound)."""
        age = time.monotonic() - self._opened.get(endpoint, 0.0)
        return not self.timeouts.max_age or age < self.timeouts.max_age

    def _close_retired(self) -> None:
        now = time.monotonic()
        with self._lock:
            done = [c for deadline, c in self._retired if deadline <= now]
            self._retired = [(deadline, c) for deadline, c in self._retired if deadline > now]
        for client in done:
            client.close()

    def _connect(self, endpoint: Endpoint, pkey: paramiko.PKey) -> paramiko.SSHClient:
        t = self.timeouts
        try:
            sock = socket.create_connection((endpoint.address, endpoint.port), timeout=t.connect)
        except TimeoutError:
            raise TransientSSHError(endpoint, f"connection timed out after {t.connect:g} s") from None
        except OSError as exc:
            raise TransientSSHError(endpoint, f"cannot connect: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = paramiko.SSHClient()
        pinned = self.store.pinned(endpoint.address, endpoint.port)
        if pinned:
            key = paramiko.PKey.from_type_string(pinned[0], base64.b64decode(pinned[1]))
            client.get_host_keys().add(_known_hosts_name(endpoint.address, endpoint.port), pinned[0], key)
        client.set_missing_host_key_policy(_PinOnFirstContact(self.store, endpoint))
        try:
            client.connect(
                endpoint.address,
                port=endpoint.port,
                username=endpoint.username,
                pkey=pkey,
                sock=sock,
                # Negotiation may take longer than the banner: with equal timeouts paramiko reports a silent
                # listener as "No existing session" instead of its banner timeout.
                timeout=2 * t.connect,
                banner_timeout=t.connect,
                auth_timeout=t.connect,
                channel_timeout=t.connect,
                allow_agent=False,
                look_for_keys=False,
                disabled_algorithms=self.disabled_algorithms,
                transport_factory=_new_transport,
            )
        except paramiko.BadHostKeyException as exc:
            sock.close()
            offered = (exc.key.get_name(), exc.key.get_base64())
            expected = (exc.expected_key.get_name(), exc.expected_key.get_base64())
            raise HostKeyMismatch(endpoint, _mismatch_message(expected, offered)) from None
        except paramiko.AuthenticationException as exc:
            sock.close()
            raise PermanentSSHError(endpoint, f"authentication failed for user {endpoint.username!r}: {exc}") from None
        except SSHError:
            sock.close()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            sock.close()
            if "protocol banner" in str(exc):
                raise TransientSSHError(
                    endpoint,
                    f"no SSH banner within {t.connect:g} s: the port accepts connections but no SSH server answers "
                    "(a hung sshd, or another service on that port)",
                ) from None
            raise TransientSSHError(endpoint, f"SSH handshake failed: {exc or type(exc).__name__}") from None
        transport = client.get_transport()
        assert isinstance(transport, _Transport)
        transport.settle()
        if t.keepalive:
            transport.set_keepalive(t.keepalive)
        return client

    def discard(self, endpoint: Endpoint) -> None:
        with self._lock:
            client = self._clients.pop(endpoint, None)
            self._opened.pop(endpoint, None)
            self._homes.pop(endpoint, None)
        if client:
            client.close()

    def close_all(self) -> None:
        with self._lock:
            clients, self._clients = [*self._clients.values(), *(c for _, c in self._retired)], {}
            self._retired, self._homes = [], {}
        for client in clients:
            client.close()

    # --- commands and files -----------------------------------------------------------------
    def run(
        self,
        endpoint: Endpoint,
        pkey: paramiko.PKey,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
    ) -> CommandResult:
        """Run one shell command line (built with shlex by the caller) and wait for it; ``stdin``: what the command
        reads on its standard input, sent with the command (in the same round trip)."""
        timeout = timeout or self.timeouts.command
        started = time.monotonic()
        try:
            client = self.client(endpoint, pkey)
            transport = client.get_transport()
            assert transport is not None
            channel = transport.open_session(timeout=self.timeouts.connect)
        except SSHError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.discard(endpoint)
            raise TransientSSHError(endpoint, f"cannot open a channel: {exc or type(exc).__name__}") from None
        try:
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
                channel.shutdown_write()
            stdout, stderr = _drain(channel, deadline=started + timeout)
            if stdout is None:
                raise CommandTimeout(endpoint, f"command did not finish within {timeout:g} s: {command[:200]}")
            code = channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.discard(endpoint)
            raise TransientSSHError(
                endpoint, f"connection lost during a command: {exc or type(exc).__name__}"
            ) from None
        finally:
            channel.close()
        return CommandResult(code, stdout, stderr or "", time.monotonic() - started)

    def home(self, endpoint: Endpoint, pkey: paramiko.PKey) -> str:
        """The login directory of the endpoint's user (cached per connection)."""
        if endpoint not in self._homes:
            with self._sftp(endpoint, pkey) as sftp:
                self._homes[endpoint] = sftp.normalize(".")
        return self._homes[endpoint]

    def put(self, endpoint: Endpoint, pkey: paramiko.PKey, files: dict[str, str], *, mode: int = 0o644) -> None:
        """Write text files (absolute path -> content); their directories must exist."""
        with self._sftp(endpoint, pkey) as sftp:
            for path, content in files.items():
                with sftp.open(path, "w") as fh:
                    fh.write(content.encode())
                sftp.chmod(path, mode)

    def get(self, endpoint: Endpoint, pkey: paramiko.PKey, path: str, *, limit: int | None = None) -> bytes | None:
        """Read a remote file (up to ``limit`` bytes from its end); None when it does not exist."""
        with self._sftp(endpoint, pkey) as sftp:
            try:
                with sftp.open(path, "rb") as fh:
                    size = fh.stat().st_size or 0
                    if limit is not None and size > limit:
                        fh.seek(size - limit)
                    # Many reads in flight instead of one 32 KiB request per round trip: 84 MB of telemetry came
                    # over a lab node in 0.7 s instead of 3.3 s (measured for runners/samplers.py).
                    fh.prefetch(size)
                    return fh.read()
            except FileNotFoundError:
                return None

    def _sftp(self, endpoint: Endpoint, pkey: paramiko.PKey) -> _SFTPSession:
        return _SFTPSession(self, endpoint, pkey)


class _SFTPSession:
    def __init__(self, pool: Pool, endpoint: Endpoint, pkey: paramiko.PKey) -> None:
        self.pool, self.endpoint, self.pkey = pool, endpoint, pkey
        self.sftp: paramiko.SFTPClient | None = None

    def __enter__(self) -> paramiko.SFTPClient:
        try:
            client = self.pool.client(self.endpoint, self.pkey)
            self.sftp = client.open_sftp()
            channel = self.sftp.get_channel()
            if channel is not None:
                channel.settimeout(self.pool.timeouts.command)
        except SSHError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.pool.discard(self.endpoint)
            raise TransientSSHError(self.endpoint, f"SFTP unavailable: {exc or type(exc).__name__}") from None
        return self.sftp

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.sftp:
            self.sftp.close()
        if exc_type is not None and issubclass(exc_type, (paramiko.SSHException, EOFError, socket.timeout)):
            self.pool.discard(self.endpoint)
            raise TransientSSHError(self.endpoint, f"SFTP failed: {exc or exc_type.__name__}") from None


def _alive(client: paramiko.SSHClient) -> bool:
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _drain(channel: paramiko.Channel, *, deadline: float) -> tuple[str | None, str | None]:
    """Read stdout and stderr together until the command ends; (None, None) on timeout."""
    out: list[bytes] = []
    err: list[bytes] = []
    # poll, not select: a worker holding a thousand connections has descriptors past FD_SETSIZE (1024), which
    # select() refuses ("filedescriptor out of range").
    waiting = select.poll()
    waiting.register(channel, select.POLLIN)
    while True:
        while channel.recv_ready():
            out.append(channel.recv(65536))
        while channel.recv_stderr_ready():
            err.append(channel.recv_stderr(65536))
        drained = not channel.recv_ready() and not channel.recv_stderr_ready()
        if channel.exit_status_ready() and channel.eof_received and drained:
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, None
        waiting.poll(min(remaining, 1.0) * 1000)
    return b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")


def probe(address: str, port: int, *, timeout: float = 2.0) -> str:
    """A short check that an SSH server answers at ``address:port`` (the circuit breaker's test): "" when one
    does, else why not. Sends an identification back, or sshd logs an error per probe."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            banner = sock.recv(256)
            sock.sendall(b"SSH-2.0-rackbench-probe\r\n")
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as exc:
        return f"cannot connect: {exc.strerror or exc}"
    return "" if banner.startswith(b"SSH-") else "the port answers without an SSH banner"


def fan_out(
    items: Iterable[T],
    fn: Callable[[T], R],
    *,
    workers: int = 64,
    on_thread_start: Callable[[], None] | None = None,
    on_thread_exit: Callable[[], None] | None = None,
) -> list[R | BaseException]:
    """Call ``fn`` on every item in a bounded pool of threads; each slot holds a result or the exception raised.

    ``on_thread_start`` runs in each pool thread before its first item (the place to set the thread up: no database
    connection of its own, say), ``on_thread_exit`` once it has no more items, before the call returns (the place
    to give back what the thread opened for itself). A single item is called in the caller's thread, without
    either."""
    items = list(items)
    if not items:
        return []
    if len(items) == 1:
        return [_capture(fn, items[0])]
    results: dict[int, R | BaseException] = {}
    indexes = iter(range(len(items)))
    take = threading.Lock()

    def work() -> None:
        try:
            if on_thread_start is not None:
                on_thread_start()
            while True:
                with take:
                    index = next(indexes, None)
                if index is None:
                    return
                results[index] = _capture(fn, items[index])
        finally:
            if on_thread_exit is not None:
                on_thread_exit()

    threads = [threading.Thread(target=work, name=f"fan-out-{n}") for n in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [results[index] for index in range(len(items))]


def raise_first(results: list[Any]) -> None:
    """Raise the first failure of a fan-out, permanent ones first (they decide the run's fate)."""
    errors = [r for r in results if isinstance(r, BaseException)]
    errors.sort(key=lambda e: getattr(e, "transient", False))
    if errors:
        raise errors[0]


def _capture(fn: Callable[[T], R], item: T) -> R | BaseException:
    try:
        return fn(item)
    except Exception as exc:  # noqa: BLE001 - each host's failure is reported with the host, not raised
        return exc
