"""iperf plug-ins: TCP (or UDP) throughput between the run's hosts, with iperf3 (kind "iperf3", JSON output) or iperf 2
(kind "iperf2", text output; the ``iperf`` program the seed papers use).

Topology (param ``topology``), as (sender, receiver) flows over the run's host list:

- ``pairs`` (default): host 0 sends to host 1, host 2 to host 3, ...; an odd host count is refused.
- ``to_first``: every other host sends to host 0 at once (many clients to one server, e.g. nodes to storage).
- ``all_to_all``: every host sends to every other host at once.
- ``ring``: every host sends to the next one at once, the last to the first (each host sends one flow, receives one).
- ``two_pass`` (iperf3): two-pass localisation (plugins/localise.py). The run is pass 1: random disjoint pairs
  (``seed``), both directions, in rounds as ``all_pairs`` runs them. A pair whose worse direction is below
  ``threshold`` (0.7) x the median pair is low; when some are and some are not, the campaign adds a run of pass 2
  (``follow_up``: ``localise_pass: 2``, ``partners: SUSPECT:GOOD,...``, ``reference_bps``) re-testing each node of
  a low pair with a node of a good pair; a node is bad only if it is low with a good partner too
  (``localise.judge``; the fleet's links page shows the verdict).
- ``all_pairs`` (iperf3): every host sends to every other host, in rounds of disjoint pairs (the circle method:
  n-1 rounds for n hosts, n rounds when n is odd, one host then sitting out each round); in each round both hosts
  of a pair send to each other. A link is then measured without other flows through its ends, and the N x N matrix
  (sender x receiver) shows a bad link as one cell and a bad node as one row and column. Rounds are kept apart
  without a clock: every host has one server, iperf3 serves one test at a time and answers "busy" to any other,
  and each host runs its clients one round after another, retrying a client whose test did not start (a busy
  server, or one between two tests). No host ever receives two flows, or sends two, at once. ``reverse`` and
  ``bidir`` do not apply (both directions are measured).

Every flow has its own server: the receiver listens on ``port + sender index`` (``all_pairs``: one server per host, on
``port``). iperf3 serves one test at a time, so a receiver of several senders needs several servers, and a sender index
makes each flow's port unique on its receiver. A server binds to its host's address (``-B``) and every client binds to
its own: on the built-in lab, where all nodes share one network stack on distinct loopback addresses, ports then never
collide across hosts; on a cluster it pins the test to the interface that owns the address. The address is
``HostInfo.address`` unless the ``interface_address`` mapping ({host name: IP address}) names another one (a
storage-network NIC, say).

The runner allows one service and one main command per host, so both are a small Python helper
(``rackbench_iperf.py``, Python 3.6+) reading a JSON plan the plug-in writes: ``serve`` starts the host's servers
(``iperf3 -s``, persistent rather than ``-1``: the runner stops the service's process group once the mains have
ended, and a one-off server would also be used up by anything that connects to it early); ``ready`` exits 0 once
every server's port is listening on its address (read from /proc/net/tcp*, so nothing connects to the servers);
``clients`` starts all of the host's clients at once and, when they have ended, prints each one's output after a
``#rackbench-iperf {"peer": ..., ...}`` line, which is how ``parse`` knows which peer each result belongs to.
Campaign values reach the nodes only as argv elements inside those plans; nothing goes through a shell.

UDP (``udp: true``, with ``bitrate`` per stream; iperf's own default is 1 Mbit/s): the throughput is what the
receiver got, and ``jitter_ms``, ``lost_packets``, ``packets`` and ``lost_percent`` come with it, as the receiver
counted them (iperf3's end.sum_received, or end.sum before that existed; iperf 2's "Server Report" per stream). An
iperf 2 UDP server is started with ``-u``; iperf 2 UDP is read in the forward direction only. ``aggregate`` adds the
datagram counts up, gives the loss as their ratio and the jitter of the worst flow.

Metrics, per client host and peer (labels ``{"peer": name, "direction": "send" | "receive"}``; the direction is the
client host's: ``send`` it sends to the peer, ``receive`` the peer sends to it, with ``reverse`` or ``bidir``):
``throughput_bps`` (goodput as the receiver counted it, bit/s), ``retransmits`` (iperf3: TCP retransmissions of the
sending side), and, labelled ``{"peer": name}``, ``cpu_local_percent``/``cpu_remote_percent`` (iperf3). ``aggregate``
sums the throughput (and retransmits) of all simultaneous flows into host="" metrics labelled ``{}``, plus one per
direction when both directions ran. ``all_pairs`` flows carry a ``round`` label too; as they did not all run at
once, their aggregate throughput is the median flow's (and retransmits their sum). iperf 2 reports neither
retransmits (without -e) nor CPU use.

Failures are never turned into numbers: iperf3 exits 0 after many errors (refused connection, busy server, a server
that died), so ``parse`` raises ParseError with iperf3's own message whenever its JSON carries "error", and likewise
for iperf 2's "connect failed"/"write failed" lines. Version notes: ``--bidir`` needs iperf3 3.7; before 3.11 its
JSON repeats the keys "sum_sent"/"sum_received" for both directions (esnet/iperf#952), which cannot be read apart,
so that output is refused. For iperf 2, ``reverse`` (``-R``) and ``bidir`` (``--full-duplex``) need 2.1 or later;
``check`` flags a run whose output shows another direction than was asked for (an old iperf that ignored ``-R``).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from common import parameters
from plugins import localise
from plugins.benchmarks.base import (
    Benchmark,
    HostCommand,
    HostContext,
    HostInfo,
    Metric,
    MetricSpec,
    PairMetric,
    ParamError,
    ParseError,
    header_sections,
    register,
)
from plugins.tools import iperf_helper

pair_rounds = localise.pair_rounds  # where the perftest plug-in and older callers find it

TOPOLOGIES = ("pairs", "to_first", "all_to_all", "all_pairs", "ring", "two_pass")
IN_ROUNDS = ("all_pairs", "two_pass")  # one server per host, clients round after round (see all_pairs)
LOCALISER = localise.Localiser("reference_bps", 1e15)
SEND = "send"
RECEIVE = "receive"
HELPER = "rackbench_iperf.py"
SERVERS_PLAN = "servers.json"
CLIENTS_PLAN = "clients.json"
HEADER = iperf_helper.HEADER  # the line before each client's output, written by the helper
DEFAULT_DURATION = 10
DEFAULT_CONNECT_TIMEOUT = 10  # seconds; iperf3 --connect-timeout (3.2+) takes milliseconds

METRICS = (
    MetricSpec("throughput_bps", "bit/s", True, "TCP goodput of one flow, as its receiver counted it"),
    MetricSpec("retransmits", "count", False, "TCP retransmissions of the flow's sending side (iperf3)"),
    MetricSpec("cpu_local_percent", "%", False, "CPU use of the client host during the test (iperf3)",
               judged=False),
    MetricSpec("cpu_remote_percent", "%", False, "CPU use of the server host during the test (iperf3)",
               judged=False),
    MetricSpec("jitter_ms", "ms", False, "UDP: packet delay variation the receiver measured (RFC 1889); across "
               "flows, the largest"),
    MetricSpec("lost_packets", "count", False, "UDP: datagrams the receiver never got"),
    MetricSpec("packets", "count", True, "UDP: datagrams sent, as the receiver counted them (lost ones included)"),
    MetricSpec("lost_percent", "%", False, "UDP: lost_packets / packets x 100"),
)  # fmt: skip
UDP_METRICS = ("jitter_ms", "lost_packets", "packets", "lost_percent")
_UNITS = {spec.name: spec.unit for spec in METRICS}

# The helper the service and the main command run; see the module docstring. Python 3.6+, standard library only.
HELPER_SCRIPT = Path(iperf_helper.__file__).read_text()  # shipped to the hosts as HELPER


# --- parameters -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Params:
    topology: str
    reverse: bool
    bidir: bool
    parallel: int
    duration: int
    omit: int
    port: int
    connect_timeout: int
    bitrate: str | None
    window: str | None
    length: str | None
    interface_address: dict[str, str] = field(default_factory=dict)
    udp: bool = False
    seed: int = 0
    threshold: float = 0.7
    localise_pass: int = 1
    partners: tuple[tuple[str, str], ...] = ()
    reference_bps: float | None = None


def _quantity(pattern: str, expected: str, *, zero: bool) -> parameters.Check:
    shape = parameters.matching(pattern, expected)

    def check(value: Any) -> str:
        text = str(shape(value))
        if not zero and float(re.sub(r"[KMGTkmgt]$", "", text)) == 0:
            raise ValueError("must be more than 0")
        return text

    return check


def _interface_addresses(value: Any) -> dict[str, str]:
    """{host name: IP address}, or the same as text, "dgx1=10.200.10.13,dgx2=10.200.22.13" (a campaign file's fixed
    and matrix values are single values, so this is how they give it)."""
    if isinstance(value, str):
        pairs = [p.partition("=") for p in value.split(",") if p.strip()]
        if not pairs or any(not sep for _, sep, _ in pairs):
            raise ValueError(f"must be NAME=ADDRESS pairs separated by commas, e.g. dgx1=10.200.10.13; got {value!r}")
        value = {name.strip(): address.strip() for name, _, address in pairs}
    if not isinstance(value, dict):
        raise ValueError('must map host names to IP addresses, e.g. {"dgx1": "10.200.10.13"}')
    found: dict[str, str] = {}
    for name, address in value.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"host names must be non-empty strings, got {name!r}")
        try:
            found[name] = str(ipaddress.ip_address(address))
        except ValueError:
            raise ValueError(f"{name}: {address!r} is not an IP address") from None
    return found


_BITRATE = _quantity(
    r"[0-9]{1,12}(\.[0-9]{1,6})?[KMGkmg]?", "bits per second such as 10G, 500M or 0 (no limit)", zero=True
)
_SIZE = parameters.size(1, 2**40, units="kmg")

# Every parameter a campaign may set, with its check and default (None: the tool's own default).
PARAMS: dict[str, tuple[parameters.Check, Any]] = {
    "topology": (parameters.choice(*TOPOLOGIES), "pairs"),
    "reverse": (parameters.boolean, False),
    "bidir": (parameters.boolean, False),
    "parallel": (parameters.integer(1, 128), 1),
    "duration": (parameters.integer(1, 86_400), DEFAULT_DURATION),
    "omit": (parameters.integer(0, 600), 0),
    "port": (parameters.integer(1024, 65_535), None),
    "connect_timeout": (parameters.integer(1, 600), DEFAULT_CONNECT_TIMEOUT),
    "bitrate": (_BITRATE, None),  # -b: per stream, as iperf applies it
    "window": (_SIZE, None),  # -w: socket buffer size
    "length": (_SIZE, None),  # -l: read/write buffer length
    "interface_address": (_interface_addresses, {}),
    "udp": (parameters.boolean, False),  # -u: UDP at ``bitrate`` (iperf's default 1 Mbit/s without it)
    **LOCALISER.params(),  # two_pass (plugins/localise.py)
}


def _checked(key: str, value: Any) -> Any:
    return parameters.checked(key, PARAMS[key][0], value)


# --- topology and commands ------------------------------------------------------------------------------------


def _flows(topology: str, count: int) -> list[tuple[int, int]]:
    """The (sender index, receiver index) of every flow, all of them simultaneous (all_pairs: round by round)."""
    if count < 2:
        raise ParamError("topology", f"{topology} needs at least 2 hosts, the run has {count}")
    if topology == "pairs":
        if count % 2:
            raise ParamError("topology", f"pairs needs an even number of hosts, the run has {count}")
        return [(s, s + 1) for s in range(0, count, 2)]
    if topology == "to_first":
        return [(s, 0) for s in range(1, count)]
    if topology == "all_pairs":
        return [flow for pairs in pair_rounds(count) for a, b in pairs for flow in ((a, b), (b, a))]
    if topology == "ring":
        return [(s, (s + 1) % count) for s in range(count)]
    return [(s, r) for s in range(count) for r in range(count) if s != r]


_HOST_ADDRESS = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]{0,252}")  # never "-": no option lookalikes


def _address(info: HostInfo, chosen: dict[str, str]) -> str:
    """Where the host's iperf listens and sends from: interface_address[name], else the node's address."""
    if info.name in chosen:
        return chosen[info.name]
    if not _HOST_ADDRESS.fullmatch(info.address):
        raise ParamError(
            "interface_address",
            f"the address of {info.name} ({info.address!r}) is not a host name or IP address; set one for it here",
        )
    return info.address


@dataclass(frozen=True)
class _Flow:
    peer: str  # the other host's name
    address: str  # the receiver's address
    port: int
    own_address: str  # the address of the host the command runs on
    round: int | None = None  # all_pairs: the round the flow belongs to


class _Iperf(Benchmark):
    """What both iperf generations share; subclasses give the argv and read the output."""

    metrics = METRICS
    required_metrics = ("throughput_bps",)
    headline = ("throughput_bps", "retransmits", "jitter_ms", "lost_percent")
    default_port: ClassVar[int]
    # Parameters the tool cannot honour, with the reason given back.
    unsupported: ClassVar[dict[str, str]] = {}
    # UDP in the forward direction only: the receiver's report of a reverse or full-duplex UDP test is not read.
    udp_forward_only: ClassVar[bool] = False
    # The server answers "busy" to a second client while a test runs (what keeps all_pairs rounds apart).
    serves_one_at_a_time: ClassVar[bool] = False

    def server_argv(self, port: int, address: str, udp: bool) -> list[str]:
        raise NotImplementedError

    def client_argv(self, p: _Params, flow: _Flow) -> list[str]:
        raise NotImplementedError

    def read(self, text: str, stderr: str = "") -> _Result:
        """One client's results from its stdout (and stderr, where the tool writes some of its errors)."""
        raise NotImplementedError

    # -- parameters

    def params(self, params: dict[str, Any]) -> _Params:
        values: dict[str, Any] = {}
        for key, value in params.items():
            if key not in PARAMS:
                raise ParamError(str(key), f"unknown {self.kind} parameter (known: {', '.join(PARAMS)})")
            if key in self.unsupported:
                raise ParamError(key, self.unsupported[key])
            values[key] = _checked(key, value)
        merged = {key: values.get(key, default) for key, (_, default) in PARAMS.items()}
        merged["port"] = merged["port"] or self.default_port
        if merged["reverse"] and merged["bidir"]:
            raise ParamError("bidir", "reverse and bidir exclude each other: bidir already runs both directions")
        if merged["topology"] in IN_ROUNDS and (merged["reverse"] or merged["bidir"]):
            topology = merged["topology"]
            raise ParamError("topology", f"{topology} measures both directions of every pair; leave reverse/bidir off")
        LOCALISER.check(values, merged)
        if merged["omit"] >= merged["duration"]:
            raise ParamError("omit", f"must be shorter than duration ({merged['duration']} s)")
        if self.udp_forward_only and merged["udp"] and (merged["reverse"] or merged["bidir"]):
            raise ParamError("udp", f"{self.kind} UDP is read in the forward direction only; use iperf3 for reverse")
        return _Params(**merged)

    def validate(self, params: dict[str, Any]) -> None:
        self.params(params)

    # -- commands

    def build(self, params: dict[str, Any], host: HostContext) -> HostCommand | list[HostCommand] | None:
        p = self.params(params)
        hosts = host.hosts
        flows = _flows(p.topology, len(hosts))
        if not 0 <= host.index < len(hosts):
            raise ParamError("topology", f"host index {host.index} is not in the run's {len(hosts)} hosts")
        unknown = sorted(set(p.interface_address) - {h.name for h in hosts})
        if unknown:
            raise ParamError("interface_address", f"names no host of this run: {', '.join(unknown)}")
        top_port = p.port + (0 if p.topology in IN_ROUNDS else max(s for s, _ in flows))
        if top_port > 65_535:
            raise ParamError("port", f"{p.port} + sender index reaches {top_port}, past 65535; choose a lower port")
        addresses = [_address(h, p.interface_address) for h in hosts]
        me = host.index
        if p.topology in IN_ROUNDS:
            return self._in_rounds(p, hosts, addresses, me, host.env, self._rounds(p, hosts))
        serving = [_Flow(hosts[s].name, addresses[me], p.port + s, addresses[me]) for s, r in flows if r == me]
        sending = [_Flow(hosts[r].name, addresses[r], p.port + me, addresses[me]) for s, r in flows if s == me]
        commands = []
        if serving:
            commands.append(self._service(serving, addresses[me], host.env, p.udp))
        if sending:
            commands.append(self._clients(p, sending, host.env))
        if not commands:
            return None
        return commands[0] if len(commands) == 1 else commands

    def _rounds(self, p: _Params, hosts: tuple[HostInfo, ...]) -> list[list[tuple[int, int]]]:
        """The rounds of pairs: every pair (all_pairs), pass 1's random pairs or pass 2's partners (two_pass)."""
        return LOCALISER.rounds(p.topology, [h.name for h in hosts], vars(p))

    def _in_rounds(
        self,
        p: _Params,
        hosts: tuple[HostInfo, ...],
        addresses: list[str],
        me: int,
        env: dict[str, str],
        rounds: list[list[tuple[int, int]]],
    ) -> list[HostCommand] | None:
        """One server on ``port`` (so a receiver serves one flow at a time), and the host's clients in round order;
        nothing on a host no pair names (pass 2's hosts that are neither suspect nor partner)."""
        if not self.serves_one_at_a_time:
            raise ParamError(
                "topology", f"{p.topology} needs iperf3 (its server serves one test at a time); not {self.kind}"
            )
        if not any(me in pair for pairs in rounds for pair in pairs):
            return None
        sending = [
            _Flow(hosts[partner].name, addresses[partner], p.port, addresses[me], round=number)
            for number, pairs in enumerate(rounds)
            for a, b in pairs
            if me in (a, b)
            for partner in [b if me == a else a]
        ]
        service = self._service([_Flow("*", addresses[me], p.port, addresses[me])], addresses[me], env, p.udp)
        clients = self._clients(p, sending, env)
        plan = json.loads(clients.files[CLIENTS_PLAN])
        plan.update(in_turn=True, busy_wait=len(rounds) * (p.duration + p.connect_timeout + 5))
        return [service, replace(clients, files={**clients.files, CLIENTS_PLAN: json.dumps(plan, indent=1) + "\n"})]

    def _service(self, flows: list[_Flow], address: str, env: dict[str, str], udp: bool) -> HostCommand:
        plan: dict[str, Any] = {
            "address": address,
            "servers": [
                {"peer": f.peer, "port": f.port, "argv": self.server_argv(f.port, address, udp)} for f in flows
            ],
        }
        if udp:
            plan["udp"] = True  # "ready" then also accepts the port bound for UDP (an iperf 2 UDP server)
        return HostCommand(
            argv=["python3", HELPER, "serve", SERVERS_PLAN],
            files={HELPER: HELPER_SCRIPT, SERVERS_PLAN: json.dumps(plan, indent=1) + "\n"},
            env=dict(env),
            service=True,
            ready_argv=["python3", HELPER, "ready", SERVERS_PLAN],
        )

    def _clients(self, p: _Params, flows: list[_Flow], env: dict[str, str]) -> HostCommand:
        plan = {
            "clients": [
                {"peer": f.peer, "address": f.address, "port": f.port, "argv": self.client_argv(p, f)}
                | ({"round": f.round} if f.round is not None else {})
                for f in flows
            ]
        }
        return HostCommand(
            argv=["python3", HELPER, "clients", CLIENTS_PLAN],
            files={HELPER: HELPER_SCRIPT, CLIENTS_PLAN: json.dumps(plan, indent=1) + "\n"},
            env=dict(env),
        )

    # -- output

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """Metrics of every flow in one client host's output: the helper's sections, or one tool output alone
        (then the peer is the address the tool reports)."""
        metrics: list[Metric] = []
        for header, body in _sections(_unix_lines(text)):
            peer = str(header.get("peer", ""))
            stderr = _unix_lines(str(header.get("stderr", ""))).strip()
            try:
                result = self.read(body, stderr)
            except ParseError as exc:
                if not header:
                    raise
                code = header.get("exit_code")
                status = f" (client exit status {code})" if code else ""
                said = f"; its stderr ends: {stderr[-300:]!r}" if stderr and stderr not in str(exc) else ""
                raise ParseError(f"peer {peer}: {exc}{status}{said}") from None
            found = result.metrics(host, peer or result.peer)
            if isinstance(header.get("round"), int):
                found = [replace(m, labels={**m.labels, "round": header["round"]}) for m in found]
            metrics += found
        return metrics

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Sums over every flow (they all ran at once): throughput and retransmits labelled {}, and throughput per
        direction as well when both directions ran."""
        flows = [m for m in per_host if m.host and "peer" in m.labels and "direction" in m.labels]
        out: list[Metric] = []
        if any("round" in m.labels for m in flows):
            throughput = [m.value for m in flows if m.name == "throughput_bps"]
            retransmits = [m.value for m in flows if m.name == "retransmits"]
            if throughput:
                out.append(_metric("throughput_bps", statistics.median(throughput), "", {}))
            if retransmits:
                out.append(_metric("retransmits", sum(retransmits), "", {}))
            return out
        for name in ("throughput_bps", "retransmits"):
            found = [m for m in flows if m.name == name]
            if not found:
                continue
            out.append(_metric(name, sum(m.value for m in found), "", {}))
            directions = sorted({m.labels["direction"] for m in found})
            if name == "throughput_bps" and len(directions) > 1:
                for d in directions:
                    total = sum(m.value for m in found if m.labels["direction"] == d)
                    out.append(_metric(name, total, "", {"direction": d}))
        lost = sum(m.value for m in flows if m.name == "lost_packets")
        packets = sum(m.value for m in flows if m.name == "packets")
        jitter = [m.value for m in flows if m.name == "jitter_ms"]
        if jitter:  # UDP: datagram counts add up, the loss is their ratio, the jitter the worst flow's
            out += [_metric("lost_packets", lost, "", {}), _metric("packets", packets, "", {})]
            out.append(_metric("lost_percent", 100 * lost / packets if packets else 0.0, "", {}))
            out.append(_metric("jitter_ms", max(jitter), "", {}))
        return out

    def follow_up(self, params: dict[str, Any], metrics: list[Metric]) -> dict[str, Any] | None:
        """two_pass: after pass 1, the parameters of pass 2 (each suspect with a known-good partner), or None."""
        return LOCALISER.follow_up(params, vars(self.params(params)), send_flows(metrics))

    def pair_flows(self, metrics: list[Metric]) -> localise.Flows:
        return send_flows(metrics)

    def pair_metric(self, params: dict[str, Any]) -> PairMetric | None:
        return FLOW_METRIC

    def second_pass_of(self, params: dict[str, Any]) -> localise.SecondPass | None:
        return second_pass_of(params)

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        """Every host that ran clients must report the throughput of its flows."""
        reporting = {m.host for m in metrics if m.name == "throughput_bps" and "peer" in m.labels}
        return [f"{h}: no iperf throughput (throughput_bps) in its client output" for h in hosts if h not in reporting]

    def check(self, params: dict[str, Any], metrics: list[Metric], logs: dict[str, str]) -> list[str]:
        """The directions measured must be the ones asked for: an iperf that ignores -R would otherwise pass a
        send test off as a receive test."""
        p = self.params(params)
        wanted = {SEND, RECEIVE} if p.bidir else {RECEIVE} if p.reverse else {SEND}
        measured: dict[str, set[str]] = defaultdict(set)
        for m in metrics:
            if m.name == "throughput_bps" and m.host and "direction" in m.labels:
                measured[m.host].add(m.labels["direction"])
        return [
            f"{h}: {self.kind} measured the {'+'.join(sorted(got))} direction but the campaign asked for "
            f"{'+'.join(sorted(wanted))} (an iperf too old for reverse/bidir may ignore the option)"
            for h, got in sorted(measured.items())
            if got != wanted
        ]


FLOW_METRIC = PairMetric("throughput_bps", "bit/s", True, "throughput of the flow, as its receiver counted it",
                         labels={"direction": SEND})  # fmt: skip


def send_flows(metrics: list[Metric]) -> localise.Flows:
    """{(sender, receiver): bit/s} of the flows in a run's per-host metrics."""
    return {
        (m.host, str(m.labels["peer"])): m.value
        for m in metrics
        if m.name == "throughput_bps" and m.host and m.labels.get("direction") == SEND and "peer" in m.labels
    }


def second_pass_of(params: dict[str, Any]) -> localise.SecondPass | None:
    """What a run of pass 2 re-tests (from its parameters), to judge its flows with ``localise.judge``."""
    return LOCALISER.second_pass(vars(Iperf3().params(params)))


@dataclass(frozen=True)
class _Datagrams:
    """A UDP flow as its receiver counted it."""

    jitter_ms: float
    lost: float
    packets: float

    def values(self) -> dict[str, float]:
        percent = 100 * self.lost / self.packets if self.packets else 0.0
        return {
            "jitter_ms": self.jitter_ms,
            "lost_packets": self.lost,
            "packets": self.packets,
            "lost_percent": percent,
        }


@dataclass
class _Result:
    """One client's results: throughput (and retransmits, or UDP datagram counts) per direction, CPU use."""

    peer: str
    throughput: dict[str, float]
    retransmits: dict[str, float] = field(default_factory=dict)
    cpu_local: float | None = None
    cpu_remote: float | None = None
    datagrams: dict[str, _Datagrams] = field(default_factory=dict)

    def metrics(self, host: str, peer: str) -> list[Metric]:
        out: list[Metric] = []
        for direction, bps in self.throughput.items():
            labels = {"peer": peer, "direction": direction}
            out.append(_metric("throughput_bps", bps, host, labels))
            if direction in self.retransmits:
                out.append(_metric("retransmits", self.retransmits[direction], host, labels))
            if direction in self.datagrams:
                out += [_metric(k, v, host, labels) for k, v in self.datagrams[direction].values().items()]
        if self.cpu_local is not None:
            out.append(_metric("cpu_local_percent", self.cpu_local, host, {"peer": peer}))
        if self.cpu_remote is not None:
            out.append(_metric("cpu_remote_percent", self.cpu_remote, host, {"peer": peer}))
        return out


def _metric(name: str, value: float, host: str, labels: dict[str, Any]) -> Metric:
    return Metric(name=name, value=value, unit=_UNITS[name], host=host, labels=dict(labels))


def _sections(text: str) -> list[tuple[dict[str, Any], str]]:
    """(header, output) per client of the helper's output; ({}, text) for one tool output alone."""
    sections = header_sections(text, HEADER)
    if not sections and not text.strip():
        raise ParseError("the iperf client printed nothing")
    return sections or [({}, text)]


def _unix_lines(text: str) -> str:
    """Output read through a terminal (ssh -t) ends its lines with CRLF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


# --- iperf3 ---------------------------------------------------------------------------------------------------

# The top-level document starts with "start"; nested "sum" objects start with "start" too, but hold a number there.
_JSON_START = re.compile(r'\{\s*"start"\s*:')


def _iperf3_document(text: str) -> tuple[dict[str, Any], set[str]]:
    """The last complete iperf3 JSON document in text, and the keys it repeats within one object."""
    found: tuple[dict[str, Any], set[str]] | None = None
    end = 0
    for match in _JSON_START.finditer(text):
        if match.start() < end:
            continue
        repeated: set[str] = set()

        def pairs(items: list[tuple[str, Any]], repeated: set[str] = repeated) -> dict[str, Any]:
            obj: dict[str, Any] = {}
            for key, value in items:
                if key in obj:
                    repeated.add(key)
                obj[key] = value
            return obj

        try:
            doc, stop = json.JSONDecoder(object_pairs_hook=pairs).raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("start"), dict):
            found, end = (doc, repeated), stop
    if found is None:
        if _JSON_START.search(text):
            raise ParseError("iperf3's JSON output is incomplete (cut off before its end)")
        raise ParseError("no iperf3 JSON output found (was iperf3 run with -J?)")
    return found


def _received(end: dict[str, Any], received_key: str, sent_key: str) -> float:
    received = _object(end.get(received_key))
    bps = _number(received.get("bits_per_second"))
    if bps is None or bps < 0:
        raise ParseError(f"iperf3's JSON output has no end.{received_key}.bits_per_second")
    sent = _number(_object(end.get(sent_key)).get("bytes")) or 0
    if bps == 0 and sent > 0:
        raise ParseError(
            f"iperf3 reports {sent:.0f} bytes sent but none received (end.{received_key}): the receiver's results "
            "never reached the client"
        )
    return bps


def _retransmits(end: dict[str, Any], sent_key: str) -> float | None:
    count = _number(_object(end.get(sent_key)).get("retransmits"))
    return count if count is not None and count >= 0 else None


def read_iperf3(text: str) -> _Result:
    doc, repeated = _iperf3_document(text)
    error = doc.get("error")
    if error:
        raise ParseError(f"iperf3 reported an error: {error}")
    start = _object(doc.get("start"))
    test = _object(start.get("test_start"))
    protocol = test.get("protocol", "TCP")
    if protocol not in ("TCP", "UDP"):
        raise ParseError(f"iperf3 ran a {protocol} test; rackbench reads TCP and UDP results only")
    end = _object(doc.get("end"))
    if repeated & {"sum_sent", "sum_received"}:
        raise ParseError(
            "iperf3's --bidir JSON before 3.11 repeats sum_sent/sum_received for both directions (esnet/iperf#952) "
            "and cannot be read apart; use iperf3 3.11 or later, or run reverse and forward separately"
        )
    forward = RECEIVE if test.get("reverse") else SEND
    peer = str(_object(start.get("connecting_to")).get("host", ""))
    if protocol == "UDP":
        return _iperf3_udp(end, test, forward, peer)
    result = _Result(peer=peer, throughput={forward: _received(end, "sum_received", "sum_sent")})
    directions = [(forward, "sum_sent")]
    if "sum_received_bidir_reverse" in end or test.get("bidir"):
        result.throughput[RECEIVE] = _received(end, "sum_received_bidir_reverse", "sum_sent_bidir_reverse")
        directions.append((RECEIVE, "sum_sent_bidir_reverse"))
    for direction, sent_key in directions:
        count = _retransmits(end, sent_key)
        if count is not None:
            result.retransmits[direction] = count
    cpu = _object(end.get("cpu_utilization_percent"))
    result.cpu_local = _number(cpu.get("host_total"))
    result.cpu_remote = _number(cpu.get("remote_total"))
    return result


def _udp_counts(summary: dict[str, Any], where: str) -> _Datagrams:
    values = [_number(summary.get(k)) for k in ("jitter_ms", "lost_packets", "packets")]
    jitter, lost, packets = values
    if jitter is None or lost is None or packets is None:
        raise ParseError(f"iperf3's UDP JSON has no jitter_ms, lost_packets and packets in end.{where}")
    return _Datagrams(jitter_ms=jitter, lost=lost, packets=packets)


def _iperf3_udp(end: dict[str, Any], test: dict[str, Any], forward: str, peer: str) -> _Result:
    """UDP: the receiver's view. iperf3 3.12 gives it as end.sum_received (and sum_received_bidir_reverse); 3.1.3
    has only end.sum, the sender's rate with the receiver's jitter and datagram counts: its received rate is then
    the datagrams that arrived times their size (test_start.blksize) over the test's seconds."""
    result = _Result(peer=peer, throughput={})
    if "sum_received" in end:
        pairs = [(forward, "sum_received")]
        if "sum_received_bidir_reverse" in end or test.get("bidir"):
            pairs.append((RECEIVE, "sum_received_bidir_reverse"))
        for direction, key in pairs:
            result.throughput[direction] = _received(end, key, key.replace("received", "sent"))
            result.datagrams[direction] = _udp_counts(_object(end.get(key)), key)
        return result
    summary = _object(end.get("sum"))
    counts = _udp_counts(summary, "sum")
    size, seconds = _number(test.get("blksize")), _number(summary.get("seconds"))
    if not size or not seconds:
        raise ParseError("iperf3's UDP JSON gives no datagram size (test_start.blksize) or test length (end.sum)")
    result.throughput[forward] = (counts.packets - counts.lost) * size * 8 / seconds
    result.datagrams[forward] = counts
    return result


# --- iperf 2 --------------------------------------------------------------------------------------------------

# A report line: "[  3]  0.0-10.0 sec  1.10 GBytes   944 Mbits/sec" (2.0.x), "[ *1] 0.0000-1.0015 sec  2539782144 Bytes
# 20287359503 bits/sec" (2.1, "*": data the client received), "[SUM] ...". Enhanced (-e) columns may follow.
_REPORT = re.compile(
    r"^\[\s*(?P<id>\*?\s*(?:[0-9]+|SUM))\]\s+(?P<start>[0-9]+(?:\.[0-9]+)?)\s*-\s*(?P<end>[0-9]+(?:\.[0-9]+)?)\s+sec\s+"
    r"[0-9.]+\s+[KMGT]?Bytes\s+(?P<rate>[0-9]+(?:\.[0-9]+)?)\s+(?P<prefix>[KMGT]?)(?P<unit>bits|Bytes)/sec\b",
    re.MULTILINE,
)
_CONNECTING = re.compile(r"^Client connecting to (?P<host>\S+), (?P<protocol>\w+) port", re.MULTILINE)
_FAILED = re.compile(r"^(?:\w+ )?(?:connect|write|read|send|recv) failed: .*$", re.MULTILINE)
_PREFIXES = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}


def _bits_per_second(match: re.Match[str]) -> float:
    """iperf 2 scales bits by 1000 and bytes by 1024 (4.63 GBytes in 1.006 s is 39.6 Gbits/sec)."""
    power = _PREFIXES[match["prefix"]]
    rate = float(match["rate"])
    return rate * 1000**power if match["unit"] == "bits" else rate * 8 * 1024**power


# A UDP server report's last columns: "   0.000 ms 0/8919 (0%)" (2.1), "   0.020 ms    0/  893 (0%)" (2.0).
_DATAGRAMS = re.compile(r"(?P<jitter>[0-9.]+) ms\s+(?P<lost>[0-9]+)\s*/\s*(?P<total>[0-9]+)\s+\(")


def _iperf2_udp(text: str, connecting: re.Match[str] | None) -> _Result:
    """UDP: each stream's "Server Report" (what the receiver counted), summed over the streams; the client's own
    lines and its [SUM] are what it sent, not what arrived."""
    reports: dict[str, tuple[re.Match[str], re.Match[str]]] = {}
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.rstrip().endswith("Server Report:"):
            continue
        for following in lines[i + 1 : i + 3]:
            report, counts = _REPORT.match(following), _DATAGRAMS.search(following)
            if report and counts:
                reports[report["id"].strip()] = (report, counts)
                break
    if not reports:
        raise ParseError("iperf printed no UDP Server Report (the receiver's count): the server did not answer")
    bps = sum(_bits_per_second(report) for report, _ in reports.values())
    found = [c for _, c in reports.values()]
    datagrams = _Datagrams(
        jitter_ms=max(float(c["jitter"]) for c in found),
        lost=sum(float(c["lost"]) for c in found),
        packets=sum(float(c["total"]) for c in found),
    )
    return _Result(peer=connecting["host"] if connecting else "", throughput={SEND: bps}, datagrams={SEND: datagrams})


def read_iperf2(text: str, stderr: str = "") -> _Result:
    """iperf 2 prints "write failed: ..." (a test cut short) on stderr, or in its output on some systems."""
    connecting = _CONNECTING.search(text)
    if connecting and connecting["protocol"] not in ("TCP", "UDP"):
        raise ParseError(f"iperf ran a {connecting['protocol']} test; rackbench reads TCP and UDP results only")
    failures = _FAILED.findall(text) + _FAILED.findall(stderr)
    if failures:
        raise ParseError(f"iperf reported: {'; '.join(dict.fromkeys(f.strip() for f in failures))}")
    finals: dict[str, re.Match[str]] = {}  # per stream id ("3", "*3", "SUM"): its last report from 0 s on
    for match in _REPORT.finditer(text):
        if float(match["start"]) == 0:
            finals[re.sub(r"\s", "", match["id"])] = match
    if not finals:
        raise ParseError("no iperf result line found (a '[ ID]  0.0-10.0 sec ... bits/sec' report)")
    if connecting and connecting["protocol"] == "UDP":
        return _iperf2_udp(text, connecting)
    streams = {key: m for key, m in finals.items() if key.lstrip("*") != "SUM"}
    directions = {RECEIVE if key.startswith("*") else SEND for key in streams}
    total = finals.get("SUM") or finals.get("*SUM")
    if not streams and "(full-duplex)" in text:
        raise ParseError("iperf printed only the total of both directions (--sum-only?); it cannot be split")
    throughput: dict[str, float] = defaultdict(float)
    if total is not None and len(directions) <= 1:
        # A SUM line is the total of one direction, except with --full-duplex, where it adds both up: then the
        # streams of each direction are summed instead.
        direction = next(iter(directions), RECEIVE if "(reverse)" in text else SEND)
        throughput[direction] = _bits_per_second(total)
    else:
        for key, match in streams.items():
            throughput[RECEIVE if key.startswith("*") else SEND] += _bits_per_second(match)
    return _Result(peer=connecting["host"] if connecting else "", throughput=dict(throughput))


# --- the two kinds --------------------------------------------------------------------------------------------


def _tuning(p: _Params) -> list[str]:
    argv: list[str] = []
    for flag, value in (("-b", p.bitrate), ("-w", p.window), ("-l", p.length)):
        if value is not None:
            argv += [flag, value]
    return argv


@register
class Iperf3(_Iperf):
    kind = "iperf3"
    description = "iperf3: TCP throughput between hosts (pairs, many to one, all to all, all pairs), JSON output"
    version_argv = ["iperf3", "--version"]
    default_port = 5201
    serves_one_at_a_time = True

    def server_argv(self, port: int, address: str, udp: bool) -> list[str]:
        return ["iperf3", "-s", "-p", str(port), "-B", address]  # an iperf3 server takes TCP and UDP tests

    def client_argv(self, p: _Params, flow: _Flow) -> list[str]:
        argv = ["iperf3", "-c", flow.address, "-p", str(flow.port), "-B", flow.own_address, "-J"]
        argv += ["-t", str(p.duration), "-P", str(p.parallel), "--connect-timeout", str(p.connect_timeout * 1000)]
        if p.omit:
            argv += ["-O", str(p.omit)]
        if p.reverse:
            argv.append("-R")
        if p.bidir:
            argv.append("--bidir")
        if p.udp:
            argv.append("-u")
        return argv + _tuning(p)

    def read(self, text: str, stderr: str = "") -> _Result:
        return read_iperf3(text)


@register
class Iperf2(_Iperf):
    kind = "iperf2"
    description = "iperf 2: TCP throughput between hosts (pairs, many to one, all to all), text output"
    version_argv = ["iperf", "--version"]
    default_port = 5001
    unsupported = {
        "omit": "iperf 2 cannot leave out the first seconds (-O is iperf3's); use iperf3",
        "connect_timeout": "iperf 2 has no connect timeout (--connect-timeout is iperf3's); use iperf3",
    }
    udp_forward_only = True

    def server_argv(self, port: int, address: str, udp: bool) -> list[str]:
        return ["iperf", "-s", "-p", str(port), "-B", address, *(["-u"] if udp else [])]

    def client_argv(self, p: _Params, flow: _Flow) -> list[str]:
        # -f b: rates in bits/sec, unrounded (the default adaptive units keep three digits)
        argv = ["iperf", "-c", flow.address, "-p", str(flow.port), "-B", flow.own_address]
        argv += ["-t", str(p.duration), "-P", str(p.parallel), "-f", "b"]
        if p.reverse:
            argv.append("-R")
        if p.bidir:
            argv.append("--full-duplex")
        if p.udp:
            argv.append("-u")
        return argv + _tuning(p)

    def read(self, text: str, stderr: str = "") -> _Result:
        return read_iperf2(text, stderr)
