"""The commands a storage system's admin endpoint may be asked to run: known programs with validated arguments.

A storage system's ``flush_command`` and ``stats_command`` run over SSH on infrastructure that every team using it
shares, so they are not free text: each is one of the programs below, its arguments checked one by one. The stored
value is the normalised command line (``shlex.join`` of the checked words), which the runners split again and never
paste into a shell. Who may change them is ``inventory.selectors.storage_can_set_commands``; every change is recorded
in ``StorageCommandChange``.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.core.exceptions import ValidationError

from plugins.benchmarks import command as command_step

NODES = re.compile(r"^(all|[0-9]{1,4}([,-][0-9]{1,4}){0,63})$")
ISI_FLUSH_OPTION = re.compile(r"^-[123k]{1,4}$")  # isi_flush -1, -2, -3, -k and their combinations (-123k)
LUSTRE_LRU = re.compile(r"^ldlm\.namespaces\.[A-Za-z0-9_*.-]{1,100}\.lru_size=clear$")


@dataclass(frozen=True)
class Program:
    """One allowed program: its fixed leading words and a check of the rest (an error message, or '' when fine)."""

    words: tuple[str, ...]
    check: Callable[[list[str]], str]
    example: str


def _none(args: list[str]) -> str:
    return "takes no arguments" if args else ""


def _isi_flush(args: list[str]) -> str:
    if len(args) > 1 or not all(ISI_FLUSH_OPTION.match(a) for a in args):
        return "takes at most one option made of -1, -2, -3, -k (e.g. -123k)"
    return ""


def _drop_caches(args: list[str]) -> str:
    return "" if args in (["vm.drop_caches=1"], ["vm.drop_caches=2"], ["vm.drop_caches=3"]) else (
        "takes vm.drop_caches=1, 2 or 3"
    )  # fmt: skip


def _lustre(args: list[str]) -> str:
    if len(args) != 1 or not LUSTRE_LRU.match(args[0]):
        return "takes one ldlm.namespaces.<namespace>.lru_size=clear"
    return ""


def _options(allowed: dict[str, re.Pattern[str] | None]) -> Callable[[list[str]], str]:
    """Options from ``allowed``, each at most once; a pattern: the option takes one value matching it."""

    def check(args: list[str]) -> str:
        seen: set[str] = set()
        rest = list(args)
        while rest:
            option = rest.pop(0)
            if option not in allowed or option in seen:
                return f"{option!r} is not one of its options ({', '.join(sorted(allowed))}), each at most once"
            seen.add(option)
            pattern = allowed[option]
            if pattern is not None:
                if not rest or not pattern.match(rest[0]):
                    return f"{option} takes a value matching {pattern.pattern}"
                rest.pop(0)
        return ""

    return check


ISI_STATS_OPTIONS = _options({"--nodes": NODES, "--format": re.compile(r"^(top|table|csv)$"), "--degraded": None})

FLUSH_PROGRAMS: Sequence[Program] = (
    Program(("sync",), _none, "sync"),
    Program(("sysctl", "-w"), _drop_caches, "sysctl -w vm.drop_caches=3"),
    Program(("isi_for_array", "isi_flush"), _isi_flush, "isi_for_array isi_flush -123k"),
    Program(("lctl", "set_param"), _lustre, "lctl set_param ldlm.namespaces.*.lru_size=clear"),
)
STATS_PROGRAMS: Sequence[Program] = (
    Program(("isi", "statistics", "system"), ISI_STATS_OPTIONS, "isi statistics system --nodes all --format top"),
)
PROGRAMS = {"flush_command": FLUSH_PROGRAMS, "stats_command": STATS_PROGRAMS}


class CommandError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def command_normalise(field: str, text: str) -> str:
    """The command as stored (``''`` for none), or CommandError naming ``field`` when it is not an allowed one."""
    programs = PROGRAMS[field]
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise CommandError(field, f"cannot be split into words ({exc})") from None
    if not words:
        return ""
    examples = "; ".join(p.example for p in programs)
    for program in programs:
        if tuple(words[: len(program.words)]) == program.words:
            problem = program.check(words[len(program.words) :])
            if problem:
                raise CommandError(field, f"{' '.join(program.words)} {problem}")
            return shlex.join(words)
    raise CommandError(field, f"{words[0]!r} is not an allowed program; allowed: {examples}")


def validate_flush_command(value: str) -> None:
    _validate("flush_command", value)


def validate_stats_command(value: str) -> None:
    _validate("stats_command", value)


def _validate(field: str, value: str) -> None:
    try:
        command_normalise(field, value)
    except CommandError as exc:
        raise ValidationError(exc.message) from None


# --- what reaches mount and SSH: addresses and paths of storage systems -----------------------------------------

HOST_NAME = re.compile(r"^(?=.{1,253}$)(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?$")
EXPORT_PATH = re.compile(r"^/[A-Za-z0-9_./+-]*$")
MOUNT_OPTIONS = re.compile(r"^[A-Za-z0-9_=,.:+/-]*$")


def validate_host(value: str) -> None:
    """A host name or an IP address: never an option (``-o...``), a path or shell text."""
    if not value:
        return
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if not HOST_NAME.match(value):
            raise ValidationError(f"{value!r} is not a host name or IP address") from None


def validate_addresses(value: object) -> None:
    if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
        raise ValidationError("must be a list of host names or IP addresses")
    for address in value:
        validate_host(address)


def validate_export_path(value: str) -> None:
    if value and (not EXPORT_PATH.match(value) or ".." in value.split("/")):
        raise ValidationError("must be an absolute path of letters, digits and _ . / + - (no '..'), e.g. /ifs/data")


def validate_mount_options(value: str) -> None:
    if value and not MOUNT_OPTIONS.match(value):
        raise ValidationError("must be mount options such as rsize=1048576,nolock,nconnect=8")


# --- the generic command step's allow-list (inventory.models.AllowedCommand) --------------------------------------


def _field(check: Callable[[object], object], value: object) -> None:
    try:
        check(value)
    except ValueError as exc:
        raise ValidationError(str(exc)) from None


def _words(value: object) -> list[str]:
    if not isinstance(value, list):
        raise ValueError('must be a list of arguments, e.g. ["diag", "-r", "1"]')
    return [command_step.check_word(v) for v in value]


def validate_step_program(value: str) -> None:
    _field(command_step.check_program, value)


def validate_step_words(value: object) -> None:
    _field(_words, value)


def validate_step_pattern(value: str) -> None:
    _field(command_step.check_pattern, value)
