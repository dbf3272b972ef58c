"""Pairwise plans (rounds of disjoint pairs) and two-pass localisation of a bad node from pairwise tests (the idea
of Google's cluster-health-scanner), shared by the pairwise plug-ins (iperf3, perftest, torch_dist, nccl-tests).

Pass 1 pairs the nodes at random (one round of disjoint pairs; with an odd count the node left over is paired
again with a random other one in a second round) and measures both directions of every pair. A pair is *low* when
its worse direction is below ``threshold`` x the median pair. Its two nodes are suspects; the nodes of pairs that
are not low are known good. Pass 2 tests every suspect again with a known-good partner (in rounds of disjoint
pairs: two suspects may get the same partner when good nodes are few). A suspect is bad only if it is low with a
good partner too; one that is not is cleared (its first partner was the bad one, or the dip did not repeat).

Flows are ``{(sender, receiver): value}`` by node name; higher is better unless ``higher_is_better`` is False (a
latency), and then *low* means above the median by the same share: a pair is low when ``threshold`` x its value
exceeds the median (its worse direction is then its higher one). Nothing here knows about iperf, runs or the
database.

``Localiser`` is what the plug-ins share around it: the pairwise topologies' rounds (``pairs``, ``all_pairs``,
``ring``, ``two_pass``), the localisation parameters (``seed``, ``threshold``, ``localise_pass``, ``partners`` and
pass 1's reference, whose name says its unit: iperf3's ``reference_bps``, torch_dist's ``reference_gbps``), checked
once with ``common.parameters``, pass 2's parameters after pass 1 (``Benchmark.follow_up``) and what a run of pass 2
re-tests (``Benchmark.second_pass_of``).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common import parameters
from common.errors import ParamError

Flows = dict[tuple[str, str], float]
Pair = tuple[str, str]


def pair_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair of ``count`` hosts once (the circle method): host 0 stays put,
    the others rotate; with an odd count a bye takes the missing place and its partner sits the round out."""
    slots: list[int | None] = list(range(count)) + ([None] if count % 2 else [])
    rounds = []
    for _ in range(len(slots) - 1):
        half = len(slots) // 2
        pairs = [(slots[i], slots[-1 - i]) for i in range(half)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def random_pair_rounds(count: int, seed: int) -> list[list[tuple[int, int]]]:
    """Pass 1's pairs of host indexes ``0..count-1``: one round of disjoint pairs in a seeded random order, and with
    an odd count a second round pairing the one left over with a random other host."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    rounds = [[(min(a, b), max(a, b)) for a, b in zip(order[0::2], order[1::2], strict=False)]]
    if count % 2 and count > 1:
        left, partner = order[-1], random.Random(seed + 1).choice(order[:-1])
        rounds.append([(min(left, partner), max(left, partner))])
    return rounds


def ring_rounds(count: int) -> list[list[tuple[int, int]]]:
    """Every host with the next one, the last with the first, in rounds of disjoint pairs (2 for an even count, 3
    for an odd one; 2 hosts are one pair)."""
    ring = [(i, (i + 1) % count) for i in range(count)] if count > 2 else [(0, 1)]
    return rounds_of([(min(a, b), max(a, b)) for a, b in ring])


def partners(value: Any) -> tuple[Pair, ...]:
    """Pass 2's pairs as text, "SUSPECT:PARTNER,..." (a run's parameters are single values): a parameter check."""
    pairs = [p.strip().partition(":") for p in str(value).split(",") if p.strip()]
    if any(not sep or not a or not b or a == b for a, sep, b in pairs):
        raise ValueError(f"must be NODE:NODE pairs of two hosts separated by commas, got {value!r}")
    return tuple((a.strip(), b.strip()) for a, _, b in pairs)


def rounds_of(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """Pairs grouped, in order, into rounds in which no host appears twice (first round with room)."""
    rounds: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for a, b in pairs:
        for number, members in enumerate(busy):
            if a not in members and b not in members:
                rounds[number].append((a, b))
                members.update((a, b))
                break
        else:
            rounds.append([(a, b)])
            busy.append({a, b})
    return rounds


def pair_values(flows: Flows, *, higher_is_better: bool = True) -> dict[Pair, float]:
    """Each tested pair (names sorted) and its worse direction (the lower one, or the higher where lower is
    better); a pair with one direction only keeps that one."""
    worse = min if higher_is_better else max
    pairs: dict[Pair, float] = {}
    for (sender, receiver), value in flows.items():
        key = (min(sender, receiver), max(sender, receiver))
        pairs[key] = worse(value, pairs.get(key, value))
    return pairs


def is_low(value: float, reference: float, *, threshold: float, higher_is_better: bool = True) -> bool:
    """Whether ``value`` is worse than ``threshold`` x ``reference`` allows: below that share of it, or (lower is
    better) so high that the reference is below that share of the value."""
    return value < threshold * reference if higher_is_better else threshold * value > reference


@dataclass(frozen=True)
class SecondPass:
    """What pass 1 found and what pass 2 must test."""

    suspects: list[str]
    good: list[str]
    partners: list[Pair]  # (suspect, known-good partner)
    reference: float  # the median good pair of pass 1: pass 2's pairs are judged against it
    higher_is_better: bool = True  # False: the pairs' values are latencies


def plan_second_pass(flows: Flows, *, threshold: float, higher_is_better: bool = True) -> SecondPass | None:
    """The re-tests pass 1 calls for; None when no pair is low, or when every pair is (no good partner is known,
    so nothing can be told apart: the fleet itself is slow)."""
    pairs = pair_values(flows, higher_is_better=higher_is_better)
    if not pairs:
        return None
    median = statistics.median(pairs.values())
    low = {p for p, v in pairs.items() if is_low(v, median, threshold=threshold, higher_is_better=higher_is_better)}
    if not low or len(low) == len(pairs):
        return None
    good = sorted({node for pair in pairs if pair not in low for node in pair})
    suspects = sorted({node for pair in low for node in pair} - set(good))
    partners = [(suspect, good[i % len(good)]) for i, suspect in enumerate(suspects)]
    reference = statistics.median(value for pair, value in pairs.items() if pair not in low)
    return SecondPass(suspects, good, partners, reference, higher_is_better)


@dataclass(frozen=True)
class Localisation:
    suspects: list[str]  # low in pass 1
    bad: list[str]  # low with a known-good partner too
    cleared: list[str]  # suspects that were not
    untested: list[str]  # suspects pass 2 has no result for (its run failed, say)


def judge(second: SecondPass, flows: Flows, *, threshold: float) -> Localisation:
    """Pass 2's verdict: a suspect whose pair with its good partner is low against pass 1's reference (below
    ``threshold`` x it; where lower is better, above it by as much)."""
    higher = second.higher_is_better
    pairs = pair_values(flows, higher_is_better=higher)
    bad, cleared, untested = [], [], []
    for suspect, partner in second.partners:
        value = pairs.get((min(suspect, partner), max(suspect, partner)))
        if value is None:
            untested.append(suspect)
        elif is_low(value, second.reference, threshold=threshold, higher_is_better=higher):
            bad.append(suspect)
        else:
            cleared.append(suspect)
    return Localisation(second.suspects, bad, cleared, untested)


# --- what the pairwise plug-ins share -------------------------------------------------------------------------

TOPOLOGIES = ("pairs", "all_pairs", "ring", "two_pass")


@dataclass(frozen=True)
class Localiser:
    """A pairwise plug-in's topologies and two-pass localisation; ``reference`` names its parameter for pass 1's
    reference (``reference_bps``, ``reference_gbps``: the unit of the pairs' values), up to ``reference_max``."""

    reference: str
    reference_max: float

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters that apply to topology two_pass only."""
        return ("seed", "threshold", "localise_pass", "partners", self.reference)

    def params(self) -> dict[str, tuple[parameters.Check, Any]]:
        """The localisation parameters, (check, default), for the plug-in's own parameter table."""
        return {
            # pass 1's random pairing, and what makes a pair low (a share of the median pair)
            "seed": (parameters.integer(0, 2**31), 0),
            "threshold": (parameters.number(0.01, 1), 0.7),
            # set on the run of pass 2, which the campaign adds after pass 1 (follow_up): its pairs, pass 1's reference
            "localise_pass": (parameters.integer(1, 2), 1),
            "partners": (partners, ()),
            self.reference: (parameters.number(0, self.reference_max), None),
        }

    def check(self, given: Collection[str], merged: Mapping[str, Any]) -> None:
        """The rules between the parameters (``given``: those the campaign set; ``merged``: with the defaults, each
        checked); ParamError names the field."""
        localising = sorted(set(given) & set(self.names))
        if localising and merged["topology"] != "two_pass":
            raise ParamError(localising[0], "applies to topology two_pass only")
        second_only = sorted(set(given) & {"partners", self.reference})
        if second_only and merged["localise_pass"] == 1:
            raise ParamError(second_only[0], "is set by the campaign on the run of pass 2 (localise_pass: 2)")
        if merged["localise_pass"] == 2 and (not merged["partners"] or merged[self.reference] is None):
            raise ParamError("partners", f"pass 2 needs its partners and pass 1's {self.reference}")

    def rounds(self, topology: str, names: Sequence[str], merged: Mapping[str, Any]) -> list[list[tuple[int, int]]]:
        """The rounds of disjoint pairs (host indexes) ``topology`` runs on these hosts: ``pairs`` host 0 with 1, 2
        with 3 ... (an even count), ``all_pairs`` every pair, ``ring`` each host with the next, ``two_pass`` pass 1's
        random pairs or pass 2's partners."""
        count = len(names)
        if count < 2:
            raise ParamError("topology", f"{topology} needs at least 2 hosts, the run has {count}")
        if topology == "pairs":
            if count % 2:
                raise ParamError("topology", f"pairs needs an even number of hosts, the run has {count}")
            return [[(i, i + 1) for i in range(0, count, 2)]]
        if topology == "all_pairs":
            return pair_rounds(count)
        if topology == "ring":
            return ring_rounds(count)
        if topology != "two_pass":
            raise ParamError("topology", f"{topology} is not a pairwise topology ({', '.join(TOPOLOGIES)})")
        if merged["localise_pass"] == 1:
            return random_pair_rounds(count, merged["seed"])
        index = {name: i for i, name in enumerate(names)}
        unknown = sorted({name for pair in merged["partners"] for name in pair} - set(index))
        if unknown:
            raise ParamError("partners", f"names no host of this run: {', '.join(unknown)}")
        return rounds_of([(index[a], index[b]) for a, b in merged["partners"]])

    def follow_up(
        self, params: dict[str, Any], merged: Mapping[str, Any], flows: Flows, *, higher_is_better: bool = True
    ) -> dict[str, Any] | None:
        """After a run of pass 1 with these ``flows``: the parameters of pass 2 (each suspect with a known-good
        partner), or None (another topology, pass 2 itself, or nothing to re-test)."""
        if merged["topology"] != "two_pass" or merged["localise_pass"] != 1:
            return None
        second = plan_second_pass(flows, threshold=merged["threshold"], higher_is_better=higher_is_better)
        if second is None:
            return None
        found = ",".join(f"{suspect}:{partner}" for suspect, partner in second.partners)
        return {**params, "localise_pass": 2, "partners": found, self.reference: second.reference}

    def second_pass(self, merged: Mapping[str, Any], *, higher_is_better: bool = True) -> SecondPass | None:
        """What a run of pass 2 re-tests (from its checked parameters), to judge with ``judge``; None for any other
        run."""
        if merged["topology"] != "two_pass" or merged["localise_pass"] != 2 or merged[self.reference] is None:
            return None
        pairs = list(merged["partners"])
        good = sorted({partner for _, partner in pairs})
        return SecondPass([s for s, _ in pairs], good, pairs, merged[self.reference], higher_is_better)
