"""perftest plug-in (kind "perftest"): RDMA bandwidth and latency between the run's hosts with the linux-rdma perftest
programs (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, ``ib_write_lat``, ``ib_read_lat``, ``ib_send_lat``; param
``test``).

A perftest test is one server (the program without an address: it waits for one client, runs the test, exits) and one
client (the same program and options with the server's address). Topology (param ``topology``), over the run's host
list, with the iperf3 plug-in's pairing:

- ``pairs`` (default): host 0 is the client of host 1, host 2 of host 3, ...; all pairs at once; an odd count is
  refused.
- ``all_pairs``: every pair of hosts, in the iperf3 plug-in's rounds of disjoint pairs (``localise.pair_rounds``); each
  round runs twice, once with each host of a pair as the client, so both directions of every pair are measured and
  the N x N matrix (client x server) shows a bad link as one cell and a bad node as one row and column.
- ``ring``: every host with the next, the last with the first, in rounds of disjoint pairs
  (``localise.ring_rounds``), each round run twice as all_pairs runs it.
- ``two_pass``: two-pass localisation (plugins/localise.py) with iperf3's parameters (``seed``, ``threshold``;
  the campaign adds pass 2 through ``follow_up`` with ``localise_pass: 2``, ``partners`` and pass 1's ``reference``,
  in the unit of the judged metric), each round run twice as all_pairs runs it. A pair is judged by
  ``bw_avg_bps`` at its largest message size (bandwidth tests: higher is better) or ``latency_typical_s`` at its
  smallest (latency tests: lower is better, so a pair is low when ``threshold`` x its latency exceeds the median
  pair's), and by its worse direction.

Every host runs one main command, a small helper (``rackbench_perftest.py``, Python 3.6+) that runs the host's steps
in order from a JSON plan. Step ``k`` listens on ``port + k``, so a client can never reach a server of another step;
a client whose server is not listening yet is started again for up to ``connect_timeout`` + ``timeout`` seconds (its
partner may still be in its previous test, which ``timeout`` bounds). Campaign
values reach the nodes only as argv elements inside that plan.

Metrics, per client host, peer (the server) and message size (labels ``{"peer": name, "size": bytes}``, and
``round`` for all_pairs), and the client's HCA where it is known (``hca``, the device perftest names in its banner,
else the ``device`` the campaign gave; ``port``, the campaign's ``ib_port``, else perftest's default 1 unless rdma_cm
picks it), so the fleet view judges each HCA port as a NIC (``node/mlx5_0:1``, the name telemetry's rdma series
give it): bandwidth tests give ``bw_peak_bps`` and ``bw_avg_bps`` (bit/s: perftest prints MB/sec and
MiB/sec, both 2^20 bytes, or Gb/sec, 10^9 bits, with ``--report_gbits``) and ``msg_rate`` (messages/s; printed in
Mpps); a peak perftest printed as 0.00 next to a non-zero average was not measured (duration mode, the receiving side
of send tests) and is left out; with ``bidirectional`` perftest prints both directions together, and so they are
stored. Latency tests give ``latency_min_s``, ``latency_max_s``, ``latency_typical_s`` (perftest's median),
``latency_avg_s``, ``latency_stdev_s``, ``latency_p99_s`` and ``latency_p999_s`` in seconds (printed in usec), each
one only where the version prints its column. ``aggregate`` gives per size the sum of the
average bandwidths and message rates of pairs that ran at once (the median flow's for all_pairs) and the median
latencies.

Failures are never turned into numbers: a client that printed no result table raises ParseError with perftest's own
message (``Unable to find the Infiniband/RoCE device`` ...) and its exit status.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from plugins.tools import perftest_helper

BANDWIDTH_TESTS = ("ib_write_bw", "ib_read_bw", "ib_send_bw")
LATENCY_TESTS = ("ib_write_lat", "ib_read_lat", "ib_send_lat")
TOPOLOGIES = localise.TOPOLOGIES  # pairs, all_pairs, ring, two_pass
IN_ROUNDS = ("all_pairs", "ring", "two_pass")
LOCALISER = localise.Localiser("reference", 1e15)  # bit/s (bandwidth tests) or s (latency tests)
HELPER = "rackbench_perftest.py"
PLAN = "steps.json"
HEADER = perftest_helper.HEADER
HELPER_SCRIPT = Path(perftest_helper.__file__).read_text()  # shipped to the hosts as HELPER
DEFAULT_PORT = 18515  # perftest's own
DEFAULT_IB_PORT = 1  # perftest's -i default (with rdma_cm the port is the one rdma_cm resolves the address to)

METRICS = (
    MetricSpec("bw_peak_bps", "bit/s", True, "peak bandwidth of one client, per message size (perftest's BW peak)"),
    MetricSpec("bw_avg_bps", "bit/s", True, "average bandwidth of one client, per message size; summed over pairs "
               "that ran at once"),
    MetricSpec("msg_rate", "msg/s", True, "messages per second, per message size (perftest's MsgRate)"),
    MetricSpec("latency_min_s", "s", False, "lowest latency, per message size (t_min)"),
    MetricSpec("latency_max_s", "s", False, "highest latency, per message size (t_max)"),
    MetricSpec("latency_typical_s", "s", False, "median latency, per message size (t_typical)"),
    MetricSpec("latency_avg_s", "s", False, "mean latency, per message size (t_avg)"),
    MetricSpec("latency_stdev_s", "s", False, "standard deviation of the latency, per message size (t_stdev)"),
    MetricSpec("latency_p99_s", "s", False, "99th percentile latency, per message size"),
    MetricSpec("latency_p999_s", "s", False, "99.9th percentile latency, per message size"),
)  # fmt: skip
_UNITS = {spec.name: spec.unit for spec in METRICS}
_LATENCY_COLUMNS = {
    "t_min": "latency_min_s",
    "t_max": "latency_max_s",
    "t_typical": "latency_typical_s",
    "t_avg": "latency_avg_s",
    "t_stdev": "latency_stdev_s",
    "99% percentile": "latency_p99_s",
    "99.9% percentile": "latency_p999_s",
}
_SUMMED = ("bw_avg_bps", "msg_rate")  # simultaneous pairs add up; everything else aggregates as the median


# --- parameters -----------------------------------------------------------------------------------------------

_DEVICE = parameters.matching(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}", "an RDMA device name such as mlx5_0", max_length=64)
_SIZE = parameters.size(1, 2**31, units="kmg")

# Every parameter a campaign may set: (check, default); None: perftest's own default (the option is not passed).
PARAMS: dict[str, tuple[parameters.Check, Any]] = {
    "test": (parameters.choice(*BANDWIDTH_TESTS, *LATENCY_TESTS), "ib_write_bw"),
    "topology": (parameters.choice(*TOPOLOGIES), "pairs"),
    "device": (_DEVICE, None),  # -d: the HCA (perftest's default: the first one found)
    "ib_port": (parameters.integer(1, 255), None),  # -i: port of the device
    "port": (parameters.integer(1024, 65_535), DEFAULT_PORT),  # -p: TCP port of the exchange (step k: port + k)
    "size": (_SIZE, None),  # -s: message size in bytes
    "all_sizes": (parameters.boolean, False),  # -a: every size from 2 to 2^23 bytes
    "iterations": (parameters.integer(5, 100_000_000), None),  # -n (perftest needs at least 5)
    "duration": (parameters.integer(1, 86_400), None),  # -D: seconds (bandwidth tests)
    "report_gbits": (parameters.boolean, True),  # --report_gbits: Gb/sec instead of MB/sec (stored in bit/s either way)
    "qps": (parameters.integer(1, 65_536), None),  # -q: queue pairs (bandwidth tests)
    "gid_index": (parameters.integer(0, 255), None),  # -x: GID index (RoCE)
    "ignore_cpu_freq": (parameters.boolean, True),  # -F: no failure/warning over CPU frequency scaling
    "tclass": (parameters.integer(0, 255), None),  # --tclass: GRH traffic class
    "tos": (parameters.integer(0, 255), None),  # -T: type of service (rdma_cm)
    "mtu": (parameters.choice("256", "512", "1024", "2048", "4096"), None),  # -m
    "connection": (parameters.choice("RC", "UC", "UD", "XRC", "DC"), None),  # -c
    "rdma_cm": (parameters.boolean, False),  # -R: connect the QPs with rdma_cm
    "bidirectional": (parameters.boolean, False),  # -b (bandwidth tests)
    "use_cuda": (parameters.integer(0, 1023), None),  # --use_cuda=<GPU index>: GPU memory (perftest built with CUDA)
    "use_cuda_dmabuf": (parameters.boolean, False),  # --use_cuda_dmabuf (needs use_cuda)
    "connect_timeout": (parameters.integer(1, 3600), 60),  # seconds a client waits for its server to listen
    "timeout": (parameters.integer(10, 86_400), 600),  # seconds one test may run before it is stopped
    **LOCALISER.params(),  # two_pass (plugins/localise.py)
}


@dataclass(frozen=True)
class _Params:
    values: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def latency(self) -> bool:
        return self.values["test"] in LATENCY_TESTS


def params(raw: dict[str, Any]) -> _Params:
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in PARAMS:
            raise ParamError(str(key), f"unknown perftest parameter (known: {', '.join(PARAMS)})")
        values[key] = parameters.checked(key, PARAMS[key][0], value)
    merged = {key: values.get(key, default) for key, (_, default) in PARAMS.items()}
    p = _Params(merged)
    if merged["size"] is not None and merged["all_sizes"]:
        raise ParamError("all_sizes", "size (-s) and all_sizes (-a) exclude each other")
    if merged["duration"] is not None:
        if p.latency:
            raise ParamError(
                "duration", "perftest's latency tests report only an average in duration mode "
                "(linux-rdma/perftest#80); give iterations instead",
            )  # fmt: skip
        if merged["iterations"] is not None:
            raise ParamError("duration", "duration (-D) and iterations (-n) exclude each other")
        if merged["all_sizes"]:
            raise ParamError("duration", "perftest runs all_sizes (-a) by iterations, not for a duration")
    if p.latency:
        for key in ("qps", "bidirectional"):
            if merged[key] not in (None, False):
                raise ParamError(key, f"applies to bandwidth tests ({', '.join(BANDWIDTH_TESTS)}) only")
    if merged["use_cuda_dmabuf"] and merged["use_cuda"] is None:
        raise ParamError("use_cuda_dmabuf", "needs use_cuda (the GPU whose memory is registered)")
    LOCALISER.check(values, merged)
    return p


def options(p: _Params) -> list[str]:
    """The options server and client share (perftest needs the same on both sides), after the program name."""
    argv: list[str] = []
    for key, flag in (("device", "-d"), ("ib_port", "-i"), ("iterations", "-n"), ("duration", "-D"), ("qps", "-q"),
                      ("gid_index", "-x"), ("tos", "-T"), ("mtu", "-m"), ("connection", "-c")):  # fmt: skip
        if p[key] is not None:
            argv += [flag, str(p[key])]
    if p["size"] is not None:
        argv += ["-s", str(parameters.size_bytes(p["size"]))]
    if p["tclass"] is not None:
        argv.append(f"--tclass={p['tclass']}")
    if p["use_cuda"] is not None:
        argv.append(f"--use_cuda={p['use_cuda']}")
    flags = {"all_sizes": "-a", "report_gbits": "--report_gbits", "ignore_cpu_freq": "-F", "rdma_cm": "-R",
             "bidirectional": "-b", "use_cuda_dmabuf": "--use_cuda_dmabuf"}  # fmt: skip
    return argv + [flag for key, flag in flags.items() if p[key]]


# --- plan -----------------------------------------------------------------------------------------------------


def steps(p: _Params, names: list[str]) -> list[list[tuple[int, int]]]:
    """The (client index, server index) pairs of each step, every pair of a step at once: pairs host 0 the client
    of host 1 ..., the other topologies each round of ``localise.Localiser.rounds`` twice, once each way."""
    rounds = LOCALISER.rounds(p["topology"], names, p.values)
    if p["topology"] == "pairs":
        return rounds
    found = []
    for pairs in rounds:
        found.append([(a, b) for a, b in pairs])
        found.append([(b, a) for a, b in pairs])
    return found


_HOST_ADDRESS = re.compile(r"[A-Za-z0-9_:][A-Za-z0-9_.:%-]{0,252}")  # never "-": no option lookalikes


def _address(info: HostInfo) -> str:
    if not _HOST_ADDRESS.fullmatch(info.address):
        raise ParamError("topology", f"the address of {info.name} ({info.address!r}) is not a host name or IP address")
    return info.address


# --- output ---------------------------------------------------------------------------------------------------

_BW_HEADER = re.compile(
    r"#bytes\s+#iterations\s+BW peak\[(?P<unit>MB|MiB|Gb)/sec\]\s+BW average\[(?P=unit)/sec\]\s+MsgRate\[Mpps\]"
)
_LAT_HEADER = re.compile(r"#bytes\s+#iterations\s+((?:t_\w+|99(?:\.9)?% percentile)\[usec\]\s*)+")
_LAT_COLUMN = re.compile(r"(t_\w+|99(?:\.9)?% percentile)\[usec\]")
_ROW = re.compile(r"^\s*(\d+)\s+(\d+)((?:\s+[0-9]+(?:\.[0-9]+)?)+)\s*$")
_RULE = re.compile(r"^\s*-{20,}\s*$")
_BITS_PER_UNIT = {"MB": 8 * 2**20, "MiB": 8 * 2**20, "Gb": 1e9}  # perftest's MB is 2^20 bytes (MiB since 2024)


@dataclass(frozen=True)
class Row:
    size: int
    values: dict[str, float]  # metric name -> value in its stored unit


def read_table(text: str) -> list[Row]:
    """The rows of perftest's result table in one program's output; ParseError when there is none."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if _BW_HEADER.search(line) or _LAT_HEADER.search(line)), None)
    if start is None:
        said = [line.strip() for line in lines if line.strip()][-3:]
        raise ParseError(f"perftest printed no result table{': ' + ' / '.join(said) if said else ''}")
    line = lines[start]
    bw, lat = _BW_HEADER.search(line), _LAT_HEADER.search(line)
    rows = []
    columns = _LAT_COLUMN.findall(line) if lat and not bw else []
    for row_line in lines[start + 1 :]:
        if _RULE.match(row_line):
            break
        match = _ROW.match(row_line)
        if not match:
            continue  # perftest's warnings ("Conflicting CPU frequency values detected ...") land in the table
        numbers = [float(n) for n in match.group(3).split()]
        size = int(match.group(1))
        if bw:
            if len(numbers) != 3:
                raise ParseError(f"unreadable perftest bandwidth row: {row_line.strip()!r}")
            factor = _BITS_PER_UNIT[bw["unit"]]
            peak, avg, rate = numbers
            values = {"bw_avg_bps": avg * factor, "msg_rate": rate * 1e6}
            if peak > 0 or avg == 0:  # 0.00 next to a real average: the peak was not measured
                values["bw_peak_bps"] = peak * factor
        else:
            if len(numbers) < len(columns):
                raise ParseError(f"unreadable perftest latency row: {row_line.strip()!r}")
            found = zip(columns, numbers, strict=False)  # duration mode adds a "tps average" column after t_avg
            values = {_LATENCY_COLUMNS[c]: v * 1e-6 for c, v in found if c in _LATENCY_COLUMNS}
        rows.append(Row(size=size, values=values))
    if not rows:
        raise ParseError("perftest's result table is empty (the test ended before its first result)")
    return rows


def _sections(text: str) -> list[tuple[dict[str, Any], str]]:
    return header_sections(text, HEADER) or [({"role": "client"}, text)]


def _hca(p: _Params) -> dict[str, Any]:
    """What the plan can say of a step's HCA: the device the campaign names (perftest's banner names it in any case)
    and the port, the campaign's or perftest's default; with rdma_cm and no ib_port, rdma_cm picks it."""
    found: dict[str, Any] = {}
    if p["device"] is not None:
        found["hca"] = p["device"]
    if p["ib_port"] is not None:
        found["ib_port"] = p["ib_port"]
    elif not p["rdma_cm"]:
        found["ib_port"] = DEFAULT_IB_PORT
    return found


# " Dual-port       : OFF		Device         : mlx5_0": the HCA perftest opened (every version the fixtures hold)
_BANNER_DEVICE = re.compile(r"^\s*Dual-port\s*:\s*\S+\s+Device\s*:\s*(\S+)\s*$", re.MULTILINE)
_HCA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


def device_labels(header: dict[str, Any], body: str) -> dict[str, Any]:
    """The labels naming a client step's HCA port (``hca``, ``port``): the device perftest's banner names, else the
    plan's; none when neither is a device name (a documentation placeholder such as ``<RDMA-NIC-2>``)."""
    found = _BANNER_DEVICE.search(body)
    name = found.group(1) if found else str(header.get("hca", ""))
    if not _HCA_NAME.fullmatch(name):
        return {}
    port = header.get("ib_port")
    return {"hca": name, "port": port} if isinstance(port, int) and not isinstance(port, bool) else {"hca": name}


def _metric(name: str, value: float, host: str, labels: dict[str, Any]) -> Metric:
    return Metric(name=name, value=value, unit=_UNITS[name], host=host, labels=dict(labels))


@register
class Perftest(Benchmark):
    kind = "perftest"
    description = "perftest: RDMA bandwidth and latency (ib_write_bw, ib_read_bw, ib_send_lat ...) between host pairs"
    metrics = METRICS
    headline = ("bw_avg_bps", "msg_rate", "latency_typical_s", "latency_p99_s")
    version_argv = ["ib_write_bw", "--version"]

    def validate(self, params_: dict[str, Any]) -> None:
        params(params_)

    def build(self, params_: dict[str, Any], host: HostContext) -> HostCommand | list[HostCommand] | None:
        p = params(params_)
        hosts = host.hosts
        if not 0 <= host.index < len(hosts):
            raise ParamError("topology", f"host index {host.index} is not in the run's {len(hosts)} hosts")
        plan = steps(p, [h.name for h in hosts])
        top = p["port"] + len(plan) - 1
        if top > 65_535:
            raise ParamError("port", f"{p['port']} + {len(plan) - 1} steps reaches {top}, past 65535")
        me, shared, found = host.index, options(p), []
        hca = _hca(p)
        for number, pairs in enumerate(plan):
            for client, server in pairs:
                if me not in (client, server):
                    continue
                port = ["-p", str(p["port"] + number)]
                step: dict[str, Any] = {"step": number, **hca}
                if p["topology"] in IN_ROUNDS:
                    step["round"] = number // 2
                if me == server:
                    step.update(role="server", peer=hosts[client].name, argv=[p["test"], *shared, *port])
                else:
                    address = _address(hosts[server])
                    step.update(role="client", peer=hosts[server].name, argv=[p["test"], *shared, *port, address])
                found.append(step)
        if not found:
            return None
        document = {"wait": p["connect_timeout"], "timeout": p["timeout"], "steps": found}
        return HostCommand(
            argv=["python3", HELPER, PLAN],
            files={HELPER: HELPER_SCRIPT, PLAN: json.dumps(document, indent=1) + "\n"},
            env=dict(host.env),
        )

    def parse(self, text: str, *, host: str = "") -> list[Metric]:
        """Metrics of every client step in one host's output (server steps print their side's view: left out)."""
        metrics: list[Metric] = []
        for header, body in _sections(text):
            if header.get("role") != "client":
                continue
            peer = str(header.get("peer", ""))
            try:
                rows = read_table(body + "\n" + str(header.get("stderr", "")))
            except ParseError as exc:
                code = header.get("exit_code")
                status = f" (exit status {code})" if code else ""
                where = f"peer {peer}: " if peer else ""
                raise ParseError(f"{where}{exc}{status}") from None
            labels: dict[str, Any] = {"peer": peer} if peer else {}
            if isinstance(header.get("round"), int):
                labels["round"] = header["round"]
            labels.update(device_labels(header, body))
            for row in rows:
                metrics += [_metric(n, v, host, {**labels, "size": row.size}) for n, v in row.values.items()]
        return metrics

    def aggregate(self, per_host: list[Metric]) -> list[Metric]:
        """Per message size: summed average bandwidth and message rate of the pairs that ran at once (all_pairs:
        the median flow's, as its flows did not), the median of everything else."""
        rounds = any("round" in m.labels for m in per_host)
        groups: dict[tuple[str, int], list[float]] = {}
        for m in per_host:
            if m.host and "size" in m.labels:
                groups.setdefault((m.name, m.labels["size"]), []).append(m.value)
        out = []
        for (name, size), values in sorted(groups.items()):
            value = sum(values) if name in _SUMMED and not rounds else statistics.median(values)
            out.append(_metric(name, value, "", {"size": size}))
        return out

    def follow_up(self, params_: dict[str, Any], metrics: list[Metric]) -> dict[str, Any] | None:
        """two_pass: after pass 1, the parameters of pass 2 (each suspect with a known-good partner), or None."""
        p = params(params_)
        return LOCALISER.follow_up(params_, p.values, pair_flows(metrics), higher_is_better=not p.latency)

    def pair_flows(self, metrics: list[Metric]) -> localise.Flows:
        return pair_flows(metrics)

    def pair_metric(self, params_: dict[str, Any]) -> PairMetric | None:
        p = params(params_)
        if p.latency:
            return PairMetric("latency_typical_s", "s", False, f"{p['test']} typical (median) latency at the smallest "
                              "message size", rows="client", columns="server")  # fmt: skip
        return PairMetric("bw_avg_bps", "bit/s", True, f"{p['test']} average bandwidth at the largest message size",
                          rows="client", columns="server")  # fmt: skip

    def second_pass_of(self, params_: dict[str, Any]) -> localise.SecondPass | None:
        p = params(params_)
        return LOCALISER.second_pass(p.values, higher_is_better=not p.latency)

    def missing(self, metrics: list[Metric], hosts: list[str]) -> list[str]:
        """Servers report nothing, and a client without a result raises in parse: some client must have reported."""
        if any(m.host and m.name in ("bw_avg_bps", "latency_avg_s", "latency_typical_s") for m in metrics):
            return []
        return ["no perftest result (bandwidth or latency) in any client's output"]


PAIR_METRICS = ("bw_avg_bps", "latency_typical_s")  # what a pair is judged by: bandwidth tests, latency tests


def pair_flows(metrics: list[Metric]) -> localise.Flows:
    """{(client, server): value} of every client step in a run's per-host metrics: the average bandwidth at the
    largest message size (link-bound), or the typical latency at the smallest; a client's repeated steps with one
    server (a ring of two) give their worse result."""
    found: dict[tuple[str, str], tuple[int, float]] = {}
    for m in metrics:
        if m.name not in PAIR_METRICS or not m.host or "peer" not in m.labels or "size" not in m.labels:
            continue
        key, size, latency = (m.host, str(m.labels["peer"])), int(m.labels["size"]), m.name != "bw_avg_bps"
        seen = found.get(key)
        if seen is None or ((size < seen[0]) if latency else (size > seen[0])):
            found[key] = (size, m.value)
        elif size == seen[0]:
            found[key] = (size, max(seen[1], m.value) if latency else min(seen[1], m.value))
    return {key: value for key, (_, value) in found.items()}
