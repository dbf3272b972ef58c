"""Parse what a storage system's statistics command printed during a run into series.

rackbench runs the command in a loop on the storage system's admin endpoint (runners.samplers.storage_script),
each output preceded by a line ``@@rackbench-sample <seconds since the epoch>``. The one format read is OneFS'
``isi statistics system --nodes all --format top``, as the real sample in tests/data/isi_statistics_system_top.txt
(from seed 000/001) shows it::

    Node   CPU   SMB FTP HTTP    NFS HDFS  Total   NetIn NetOut DiskIn DiskOut
     All 72.7%   0.0 0.0  0.0  10.0G  0.0  10.0G  304.4M  10.4G 315.4M   10.8G
       1 79.2%   0.0 0.0  0.0   2.9G  0.0   2.9G  295.0M   2.9G  70.5M    2.3G

CPU is a percentage; every other column is bytes per second (per the seed: "units are in bytes/sec"), with a
K/M/G/T suffix. The sample does not say whether the suffixes are powers of 1000 or 1024: they are read as powers
of 1000 (10.4G = 10.4e9 B/s). No other ``isi statistics`` format (pstat, protocol, client, csv) is parsed: no
real sample of one was at hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MARKER = "@@rackbench-sample"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # "top" formats may redraw the screen with escape sequences
NUMBER = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)B?(/s)?$")
SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
COLUMNS = {
    "CPU": ("cpu", "%"),
    "SMB": ("smb", "B/s"),
    "FTP": ("ftp", "B/s"),
    "HTTP": ("http", "B/s"),
    "NFS": ("nfs", "B/s"),
    "HDFS": ("hdfs", "B/s"),
    "Total": ("protocol_total", "B/s"),
    "NetIn": ("net_in", "B/s"),
    "NetOut": ("net_out", "B/s"),
    "DiskIn": ("disk_in", "B/s"),
    "DiskOut": ("disk_out", "B/s"),
}
PREFIX = "storage."


class StatsParseError(ValueError):
    """The output is not in a format rackbench reads."""


@dataclass
class StatsSeries:
    name: str
    unit: str
    labels: dict[str, str]
    timestamps_ns: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def number(text: str) -> float:
    """``72.7%`` -> 72.7, ``10.4G`` -> 10.4e9, ``0.0`` -> 0.0."""
    match = NUMBER.match(text.rstrip("%"))
    if not match:
        raise StatsParseError(f"not a number: {text!r}")
    return float(match.group(1)) * SCALE[match.group(2)]


def parse_system_top(text: str) -> dict[tuple[str, str], float]:
    """One table of ``isi statistics system --nodes all --format top``: {(column, node): value}."""
    header: list[str] | None = None
    table: dict[tuple[str, str], float] = {}
    for line in ANSI.sub("", text).splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "Node" and "CPU" in words:
            header = words
            continue
        if header is None:
            continue
        if len(words) != len(header):
            raise StatsParseError(f"a row of {len(words)} values under a header of {len(header)}: {line.strip()!r}")
        node = words[0]
        for column, text_value in zip(header[1:], words[1:], strict=True):
            if column in COLUMNS:
                table[(column, node)] = number(text_value)
    if header is None:
        raise StatsParseError("no 'Node CPU ...' header: is this `isi statistics system --nodes all --format top`?")
    return table


def parse_stream(text: str) -> list[StatsSeries]:
    """Every timestamped table of a run's output, as one series per column and node (``{"node": "All"}`` is the
    cluster's total). A table that cannot be read (a command cut off when it was stopped) is skipped when others
    can; when none can, the reason is raised."""
    series: dict[tuple[str, str], StatsSeries] = {}
    errors: list[str] = []
    blocks = text.split(MARKER)[1:]
    if not blocks:
        raise StatsParseError(f"no {MARKER} line: the output does not come from rackbench's loop")
    for block in blocks:
        stamp, _, body = block.partition("\n")
        try:
            t_ns = round(float(stamp.strip()) * 1e9)
            table = parse_system_top(body)
        except (ValueError, StatsParseError) as exc:
            errors.append(str(exc))
            continue
        for (column, node), value in sorted(table.items()):
            one = series.get((column, node))
            if one is None:
                name, unit = COLUMNS[column]
                one = series[(column, node)] = StatsSeries(f"{PREFIX}{name}", unit, {"node": node})
            if one.timestamps_ns and t_ns <= one.timestamps_ns[-1]:
                continue  # a clock stepped back: the later table goes
            one.timestamps_ns.append(t_ns)
            one.values.append(value)
    if not series and errors:
        raise StatsParseError(errors[0])
    return list(series.values())
