"""The verdict engine: did a metric at one matrix point regress between a baseline and a candidate campaign?

Pure functions, no database. For one (matrix point, metric) ``judge`` receives the baseline's and the
candidate's repetition values, the metric's direction and, optionally, the per-repetition values of earlier
campaigns of the same family (the *history*). The decision rule, in order:

0. Non-finite values (nan, inf) are dropped; everything else is a float.
1. Missing side: no baseline or no candidate values (the point failed, or was not in the baseline)
   -> ``inconclusive``, test ``missing``.
2. Change: ``change_pct = (candidate - baseline) / |baseline| * 100`` of each side's statistic (the policy's: the
   mean, or the median of the repetitions), so its sign is the direction of the change even for a negative
   baseline; ``None`` for a zero baseline. Equal values, or
   ``|change_pct| < threshold_pct`` -> ``pass``, test ``threshold-only``: a change that small does not
   matter, however significant. A change away from a zero baseline counts as beyond any threshold. Whether a
   change is worse or better follows the metric's direction (higher or lower is better).
3. A change beyond the threshold must also stand out from the noise, judged by every rule that applies:

   a. Repetitions: when both sides have at least ``min_repetitions`` values, Welch's t-test
      (two-sided, unequal variances) must give ``p < alpha``. Identical repetitions on both sides make the
      difference exact: ``p = 0``.
   Welch's test is a test of the means, whichever statistic the change is measured by: it says whether the two
   sides' repetitions differ beyond their spread.
   b. History: when at least two earlier campaigns have values, the candidate's statistic must lie beyond the
      prediction interval of the next campaign mean, ``m ± t(1 - alpha/2, k - 1) · s · sqrt(1 + 1/k)``,
      where ``m`` and ``s`` are the mean and standard deviation of the ``k`` campaigns' statistics (earlier
      campaigns and the baseline), on the side the change points to. This catches what repetitions cannot see:
      campaign-to-campaign variation (reboots, placement, thermal state).
   c. Neither rule applies (too few repetitions, no history): the threshold alone decides, test
      ``threshold-only``, and the reason says that the spread could not be estimated.

   When every applicable rule finds the change significant, the outcome is ``regression`` (worse) or
   ``improvement`` (better); otherwise it is ``inconclusive``, and the reason says whether the change is
   within the noise or the two rules disagree. ``test`` is ``welch-t`` when only the repetitions were
   tested, ``history`` when the history rule was applied (alone, or with the t-test: ``p_value`` is then set).

``overall`` folds the outcomes of a campaign into one: any regression wins, then any inconclusive item, then
any improvement; otherwise it passes. Nothing to judge is inconclusive.
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from scipy import stats as scipy_stats

from common import numbers
from common.errors import FieldError

METHOD = "welch-t"
METHOD_VERSION = 1

PASS = "pass"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
INCONCLUSIVE = "inconclusive"
OUTCOMES = (PASS, REGRESSION, IMPROVEMENT, INCONCLUSIVE)

TEST_WELCH = METHOD
TEST_HISTORY = "history"
TEST_THRESHOLD = "threshold-only"
TEST_MISSING = "missing"

MIN_HISTORY_CAMPAIGNS = 2  # with the baseline, three campaign means: the fewest that give a usable spread


STATISTICS = ("mean", "median")  # campaigns.models.Statistic


class PolicyError(FieldError):
    pass


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Policy:
    """How large and how certain a change must be to count; validated on construction."""

    threshold_pct: float = 5.0
    alpha: float = 0.05
    min_repetitions: int = 2
    statistic: str = "mean"  # what each side's repetitions are summed up by (the campaign's choice)

    def __post_init__(self) -> None:
        if not _is_number(self.threshold_pct) or self.threshold_pct < 0:
            raise PolicyError("threshold_pct", "must be a number ≥ 0 (a percentage)")
        if not _is_number(self.alpha) or not 0 < self.alpha < 1:
            raise PolicyError("alpha", "must be a number between 0 and 1, both excluded")
        if not isinstance(self.min_repetitions, int) or isinstance(self.min_repetitions, bool):
            raise PolicyError("min_repetitions", "must be an integer")
        if self.min_repetitions < 2:
            raise PolicyError("min_repetitions", "must be at least 2: one value has no spread")
        if self.statistic not in STATISTICS:
            raise PolicyError("statistic", f"must be one of {', '.join(STATISTICS)}")
        # JSON and YAML give integers for round numbers; floats here make asdict() the same however it was written.
        object.__setattr__(self, "threshold_pct", float(self.threshold_pct))
        object.__setattr__(self, "alpha", float(self.alpha))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Policy:
        """A policy from user settings: missing keys take the defaults, unknown keys are refused."""
        if not isinstance(data, Mapping):
            raise PolicyError("", "the verdict policy must be a mapping")
        known = sorted(f.name for f in fields(cls))
        for key in data:
            if key not in known:
                raise PolicyError(str(key), f"unknown setting; expected one of {', '.join(known)}")
        return cls(**data)


@dataclass(frozen=True, slots=True)
class Stats:
    """One side's repetitions. ``stdev`` is the sample standard deviation (0 for a single value); ``cv`` is
    stdev / |mean|, ``None`` when it means nothing (a single value, or a zero mean)."""

    n: int
    mean: float
    stdev: float
    min: float
    max: float
    cv: float | None
    median: float | None = None

    def center(self, statistic: str) -> float:
        """The side's value by the statistic chosen: its mean, or its median."""
        return self.median if statistic == "median" and self.median is not None else self.mean


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict on one metric at one matrix point. ``change_pct`` is None when a side is missing or the
    baseline mean is 0; ``p_value`` is set only when Welch's t-test was applied; ``reason`` is one sentence
    with the numbers that decided."""

    outcome: str
    change_pct: float | None
    baseline: Stats | None
    candidate: Stats | None
    p_value: float | None
    test: str
    reason: str


@dataclass(frozen=True)
class _Band:
    """The prediction interval of the next campaign mean, from ``k`` campaign means."""

    low: float
    high: float
    k: int


def _finite(values: Iterable[float]) -> list[float]:
    return [x for x in (float(v) for v in values) if math.isfinite(x)]


def sample_stdev(values: Sequence[float]) -> float:
    """The sample standard deviation in floating point: exactly 0 when every value is the same (or there is one).

    statistics.stdev is exact, through fractions, and costs a page comparing 10,000 runs most of its time.
    """
    n = len(values)
    if n < 2 or min(values) == max(values):
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def _stats(values: Sequence[float]) -> Stats | None:
    if not values:
        return None
    mean = statistics.fmean(values)
    stdev = sample_stdev(values)
    cv = stdev / abs(mean) if len(values) > 1 and mean != 0 else None
    median = statistics.median(values)
    return Stats(n=len(values), mean=mean, stdev=stdev, min=min(values), max=max(values), cv=cv, median=median)


def stats_of(values: Iterable[float]) -> Stats | None:
    """One side's Stats from its repetitions (non-finite values dropped); None when none is left."""
    return _stats(_finite(values))


def _welch_p(baseline: Stats, candidate: Stats) -> float:
    """Two-sided p-value of Welch's t-test from each side's n, mean and sample stdev (what SQL aggregates give); each
    side has at least two values, one side has some spread."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = scipy_stats.ttest_ind_from_stats(
            baseline.mean, baseline.stdev, baseline.n, candidate.mean, candidate.stdev, candidate.n, equal_var=False
        )
        return float(result.pvalue)


def _band(campaign_means: Sequence[float], alpha: float) -> _Band:
    """Where the next campaign mean falls with probability 1 - alpha if nothing changed: the prediction
    interval mean ± t(1 - alpha/2, k - 1) · stdev · sqrt(1 + 1/k) over k >= 3 campaign means."""
    k = len(campaign_means)
    center = statistics.fmean(campaign_means)
    half = float(scipy_stats.t.ppf(1 - alpha / 2, k - 1)) * statistics.stdev(campaign_means) * math.sqrt(1 + 1 / k)
    return _Band(low=center - half, high=center + half, k=k)


def _fmt(x: float, unit: str) -> str:
    """A value as every page shows it (common.numbers): "2.14 GB/s", "7.71 ms"."""
    return numbers.quantity(x, unit)


def _repetitions(n: int) -> str:
    return f"{n} repetition" if n == 1 else f"{n} repetitions"


def _movement(name: str, unit: str, before: float, after: float, change: float | None, worse: bool) -> str:
    """The first half of every reason: which way the metric moved, by how much, and whether that is worse."""
    if before == after:
        return f"{name} is unchanged at {_fmt(before, unit)}"
    verb = "rose" if after > before else "fell"
    moved = f"{verb} from {_fmt(before, unit)} to {_fmt(after, unit)}"
    quality = "worse" if worse else "better"
    if change is None:
        return f"{name} is {quality}: it {moved} (no percentage against a zero baseline)"
    return f"{name} is {abs(change):.1f}% {quality}: it {moved}"


def _missing(name: str, baseline: Stats | None, candidate: Stats | None) -> Judgement:
    if baseline is None and candidate is None:
        reason = f"no values for {name} on either side"
    elif baseline is None:
        reason = f"no baseline values for {name} (the point was not in the baseline, or its runs failed)"
    else:
        reason = f"no candidate values for {name} (the point failed, or did not report this metric)"
    return Judgement(INCONCLUSIVE, None, baseline, candidate, None, TEST_MISSING, reason)


def _welch_clause(p: float, alpha: float, exact: bool) -> str:
    if exact:
        return "the repetitions are identical on both sides, so the difference is exact"
    if p < alpha:
        return f"Welch's t-test p={p:.2g} < {alpha:g}"
    return f"Welch's t-test p={p:.2g} ≥ {alpha:g}: the change is within the spread of the repetitions"


def _history_clause(band: _Band, alpha: float, unit: str, beyond: bool, statistic: str = "mean") -> str:
    where = "outside" if beyond else "inside"
    interval = f"{_fmt(band.low, unit)} – {_fmt(band.high, unit)}"
    level = f"{(1 - alpha) * 100:g}%"
    return (
        f"the candidate {statistic} is {where} the usual campaign-to-campaign range {interval} "
        f"({level} prediction interval over {band.k} campaigns)"
    )


def _weigh_noise(
    baseline: Stats, candidate: Stats, earlier: Sequence[float], policy: Policy, unit: str
) -> tuple[bool | None, float | None, str, str]:
    """Whether a change beyond the threshold stands out from the noise (rule 3 of the module docstring).

    Answers (found, p-value, test, evidence): found is None when no rule could be applied, True when every
    applicable rule finds the change significant, False otherwise.
    """
    b, c = baseline.center(policy.statistic), candidate.center(policy.statistic)
    enough = min(baseline.n, candidate.n) >= policy.min_repetitions
    with_history = len(earlier) >= MIN_HISTORY_CAMPAIGNS
    counts = (
        f"baseline has {_repetitions(baseline.n)}, candidate {_repetitions(candidate.n)}; "
        f"at least {policy.min_repetitions} per side needed"
    )
    if not enough and not with_history:
        return None, None, TEST_THRESHOLD, f"the spread could not be estimated ({counts}): run more repetitions"

    p: float | None = None
    findings: list[tuple[bool, str]] = []  # (finds the change significant, what it found)
    if enough:
        # each side's repetitions all alike: scipy would answer nan, or 0 with a warning
        exact = baseline.min == baseline.max and candidate.min == candidate.max
        p = 0.0 if exact else _welch_p(baseline, candidate)
        findings.append((p < policy.alpha, _welch_clause(p, policy.alpha, exact)))
    if with_history:
        band = _band([*earlier, b], policy.alpha)
        beyond = c > band.high if c > b else c < band.low
        findings.append((beyond, _history_clause(band, policy.alpha, unit, beyond, policy.statistic)))

    test = TEST_HISTORY if with_history else TEST_WELCH
    texts = [text for _, text in findings]
    verdicts = {found for found, _ in findings}
    if len(verdicts) > 1:
        return False, p, test, f"{' but '.join(texts)}: the repetitions and the campaign history disagree"
    evidence = " and ".join(texts)
    if not enough:
        evidence = f"too few repetitions for a t-test ({counts}); {evidence}"
    return verdicts == {True}, p, test, evidence


def judge(
    *,
    baseline: Sequence[float],
    candidate: Sequence[float],
    higher_is_better: bool,
    policy: Policy,
    history: Sequence[Sequence[float]] = (),
    metric: str = "",
    unit: str = "",
) -> Judgement:
    """Judge one metric at one matrix point from each side's repetitions; the rule is the module docstring's."""
    earlier = [s.center(policy.statistic) for s in map(stats_of, history) if s is not None]
    return judge_stats(baseline=stats_of(baseline), candidate=stats_of(candidate), higher_is_better=higher_is_better,
                       policy=policy, history=earlier, metric=metric, unit=unit)  # fmt: skip


def judge_stats(
    *,
    baseline: Stats | None,
    candidate: Stats | None,
    higher_is_better: bool,
    policy: Policy,
    history: Sequence[float] = (),
    metric: str = "",
    unit: str = "",
) -> Judgement:
    """``judge`` from each side's statistics (n, mean, median, sample stdev, min, max: what SQL aggregates give) and
    the earlier campaigns' statistics (their means or medians, as the policy's), not from the repetitions."""
    name = metric or "the metric"
    if policy.statistic != "mean":
        name = f"the {policy.statistic} of {name}"
    b, c = baseline, candidate
    if b is None or c is None:
        return _missing(name, b, c)

    before, after = b.center(policy.statistic), c.center(policy.statistic)
    change = (after - before) / abs(before) * 100 if before != 0 else None
    worse = after < before if higher_is_better else after > before
    movement = _movement(name, unit, before, after, change, worse)
    if after == before or (change is not None and abs(change) < policy.threshold_pct):
        reason = f"{movement}, within the {policy.threshold_pct:g}% threshold: no significant change"
        return Judgement(PASS, change, b, c, None, TEST_THRESHOLD, reason)

    limit = "any threshold" if change is None else f"the {policy.threshold_pct:g}% threshold"
    movement = f"{movement}, beyond {limit}"
    found, p, test, evidence = _weigh_noise(b, c, list(history), policy, unit)
    outcome = INCONCLUSIVE if found is False else REGRESSION if worse else IMPROVEMENT  # None: threshold alone
    return Judgement(outcome, change, b, c, p, test, f"{movement}; {evidence}")


def overall(outcomes: Iterable[str]) -> str:
    """One outcome for a campaign: a regression anywhere fails it, an unanswered item keeps it open."""
    seen = set()
    for outcome in outcomes:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}")
        seen.add(outcome)
    if not seen:
        return INCONCLUSIVE
    for outcome in (REGRESSION, INCONCLUSIVE, IMPROVEMENT):
        if outcome in seen:
            return outcome
    return PASS
