"""Pairwise plans (rounds of disjoint pairs) and two-pass localisation of a bad node from pairwise tests (the idea
of Google's cluster-health-scanner), shared by the pairwise plug-ins (iperf3, perftest, torch_dist).

Pass 1 pairs the nodes at random (one round of disjoint pairs; with an odd count the node left over is paired
again with a random other one in a second round) and measures both directions of every pair. A pair is *low* when
its worse direction is below ``threshold`` x the median pair. Its two nodes are suspects; the nodes of pairs that
are not low are known good. Pass 2 tests every suspect again with a known-good partner (in rounds of disjoint
pairs: two suspects may get the same partner when good nodes are few). A suspect is bad only if it is low with a
good partner too; one that is not is cleared (its first partner was the bad one, or the dip did not repeat).

Pure: flows are ``{(sender, receiver): value}`` by node name, higher is better. Nothing here knows about iperf,
runs or the database.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any

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


def pair_values(flows: Flows) -> dict[Pair, float]:
    """Each tested pair (names sorted) and its worse direction; a pair with one direction only keeps that one."""
    pairs: dict[Pair, float] = {}
    for (sender, receiver), value in flows.items():
        key = (min(sender, receiver), max(sender, receiver))
        pairs[key] = min(value, pairs.get(key, value))
    return pairs


@dataclass(frozen=True)
class SecondPass:
    """What pass 1 found and what pass 2 must test."""

    suspects: list[str]
    good: list[str]
    partners: list[Pair]  # (suspect, known-good partner)
    reference: float  # the median good pair of pass 1: pass 2's pairs are judged against it


def plan_second_pass(flows: Flows, *, threshold: float) -> SecondPass | None:
    """The re-tests pass 1 calls for; None when no pair is low, or when every pair is (no good partner is known,
    so nothing can be told apart: the fleet itself is slow)."""
    pairs = pair_values(flows)
    if not pairs:
        return None
    median = statistics.median(pairs.values())
    low = {pair for pair, value in pairs.items() if value < threshold * median}
    if not low or len(low) == len(pairs):
        return None
    good = sorted({node for pair in pairs if pair not in low for node in pair})
    suspects = sorted({node for pair in low for node in pair} - set(good))
    partners = [(suspect, good[i % len(good)]) for i, suspect in enumerate(suspects)]
    reference = statistics.median(value for pair, value in pairs.items() if pair not in low)
    return SecondPass(suspects, good, partners, reference)


@dataclass(frozen=True)
class Localisation:
    suspects: list[str]  # low in pass 1
    bad: list[str]  # low with a known-good partner too
    cleared: list[str]  # suspects that were not
    untested: list[str]  # suspects pass 2 has no result for (its run failed, say)


def judge(second: SecondPass, flows: Flows, *, threshold: float) -> Localisation:
    """Pass 2's verdict: a suspect whose pair with its good partner is below ``threshold`` x pass 1's reference."""
    pairs = pair_values(flows)
    bad, cleared, untested = [], [], []
    for suspect, partner in second.partners:
        value = pairs.get((min(suspect, partner), max(suspect, partner)))
        if value is None:
            untested.append(suspect)
        elif value < threshold * second.reference:
            bad.append(suspect)
        else:
            cleared.append(suspect)
    return Localisation(second.suspects, bad, cleared, untested)
