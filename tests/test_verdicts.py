"""The verdict engine: noise-aware, direction-aware, explained; pure functions, no database."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

import pytest

from campaigns.verdicts import Judgement, Policy, PolicyError, judge, overall

POLICY = Policy()

# Three campaign means 102, 98 (history) and 100 (baseline): mean 100, standard deviation 2. The df = 2 quantile
# of Student's t has a closed form, t = (2q - 1) / sqrt(2q(1 - q)), so the band is computed here by hand.
HISTORY = [[101.0, 103.0], [97.0, 99.0]]
T_975_DF2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
BAND_LOW = 100 - T_975_DF2 * 2 * math.sqrt(1 + 1 / 3)  # 90.06


def bandwidth(baseline: list[float], candidate: list[float], **kwargs: Any) -> Judgement:
    kwargs.setdefault("policy", POLICY)
    return judge(baseline=baseline, candidate=candidate, higher_is_better=True, metric="bw_mbps", unit="MB/s", **kwargs)


def latency(baseline: list[float], candidate: list[float]) -> Judgement:
    return judge(
        baseline=baseline, candidate=candidate, higher_is_better=False, policy=POLICY, metric="lat_us", unit="us"
    )


def test_it_calls_a_clear_bandwidth_drop_a_regression_and_says_why_with_the_numbers() -> None:
    verdict = bandwidth([100, 101, 99], [80, 81, 79])

    assert verdict.outcome == "regression"
    assert verdict.test == "welch-t"
    assert verdict.change_pct == pytest.approx(-20.0)
    assert verdict.reason == (
        "bw_mbps is 20.0% worse: it fell from 100 MB/s to 80.0 MB/s, beyond the 5% threshold; "
        "Welch's t-test p=1.6e-05 < 0.05"
    )


def test_it_calls_a_clear_latency_rise_a_regression() -> None:
    verdict = latency([10.0, 10.1, 9.9], [12.0, 12.1, 11.9])

    assert verdict.outcome == "regression"
    assert verdict.change_pct == pytest.approx(20.0)
    assert "20.0% worse: it rose from 10.0 µs to 12.0 µs" in verdict.reason


@pytest.mark.parametrize(
    ("higher_is_better", "candidate", "words"),
    [(True, [120, 121, 119], "20.0% better: it rose"), (False, [80, 81, 79], "20.0% better: it fell")],
)
def test_it_calls_a_clear_change_in_the_good_direction_an_improvement(
    higher_is_better: bool, candidate: list[float], words: str
) -> None:
    verdict = judge(baseline=[100, 101, 99], candidate=candidate, higher_is_better=higher_is_better, policy=POLICY)

    assert verdict.outcome == "improvement"
    assert words in verdict.reason


def test_it_matches_welchs_p_value_computed_by_hand() -> None:
    # Two values a side with equal variances (2): se = sqrt(2/2 + 2/2), Welch's df is exactly 2, and the
    # two-sided p of Student's t with 2 degrees of freedom is 1 - |t| / sqrt(2 + t²).
    t = 10 / math.sqrt(2)

    verdict = bandwidth([99, 101], [89, 91])

    assert verdict.p_value == pytest.approx(1 - t / math.sqrt(2 + t**2), rel=1e-9)
    assert verdict.outcome == "regression"
    assert "p=0.019 < 0.05" in verdict.reason


def test_it_matches_the_hand_formula_with_three_repetitions_a_side() -> None:
    # Variances 1 and 1: t = 20 / sqrt(2/3), df = 4, where Student's t has the closed-form
    # F(t) = 1/2 + 3/8 · x · (1 - t²/(12(1 + t²/4))), x = t / sqrt(1 + t²/4).
    t = 20 / math.sqrt(2 / 3)
    cdf = 0.5 + 3 / 8 * t / math.sqrt(1 + t**2 / 4) * (1 - t**2 / (12 * (1 + t**2 / 4)))

    verdict = bandwidth([100, 101, 99], [80, 81, 79])

    assert verdict.p_value == pytest.approx(2 * (1 - cdf), rel=1e-6)
    assert type(verdict.p_value) is float


@pytest.mark.filterwarnings("error")
def test_it_tests_against_a_side_of_identical_repeats_without_warnings() -> None:
    # Baseline variance 0, candidate variance 2: se = 1, t = 19, df = 1 (Cauchy): p = 1 - 2/π · atan(19).
    verdict = bandwidth([100, 100], [80, 82])

    assert verdict.p_value == pytest.approx(1 - 2 / math.pi * math.atan(19), rel=1e-9)
    assert verdict.outcome == "regression"


def test_it_finds_a_big_change_inside_huge_noise_inconclusive() -> None:
    verdict = bandwidth([100, 160, 40], [80, 140, 20])

    assert verdict.outcome == "inconclusive"
    assert verdict.p_value is not None and verdict.p_value > 0.05
    assert "20.0% worse" in verdict.reason
    assert "within the spread of the repetitions" in verdict.reason


def test_it_passes_a_change_below_the_threshold_however_significant() -> None:
    baseline, candidate = [100, 100.1, 99.9], [98, 98.1, 97.9]
    assert bandwidth(baseline, candidate, policy=Policy(threshold_pct=1)).outcome == "regression"

    verdict = bandwidth(baseline, candidate)

    assert verdict.outcome == "pass"
    assert verdict.test == "threshold-only"
    assert verdict.reason == (
        "bw_mbps is 2.0% worse: it fell from 100 MB/s to 98.0 MB/s, within the 5% threshold: no significant change"
    )


def test_it_counts_a_change_exactly_at_the_threshold() -> None:
    assert bandwidth([100, 100], [95, 95]).outcome == "regression"


def test_it_decides_on_the_threshold_alone_with_one_repetition_a_side_and_asks_for_more() -> None:
    verdict = bandwidth([100], [80])

    assert verdict.outcome == "regression"
    assert verdict.test == "threshold-only"
    assert verdict.p_value is None
    assert "the spread could not be estimated (baseline has 1 repetition, candidate 1 repetition" in verdict.reason
    assert verdict.reason.endswith("run more repetitions")
    assert bandwidth([100], [98]).outcome == "pass"


def test_it_honours_a_higher_minimum_of_repetitions() -> None:
    verdict = bandwidth([100, 101, 99], [80, 81, 79], policy=Policy(min_repetitions=4))

    assert verdict.test == "threshold-only"
    assert "at least 4 per side needed" in verdict.reason


@pytest.mark.parametrize(
    ("baseline", "candidate", "words"),
    [
        ([], [80.0], "no baseline values for bw_mbps (the point was not in the baseline"),
        ([100.0], [], "no candidate values for bw_mbps (the point failed"),
        ([100.0], [math.nan, math.inf], "no candidate values for bw_mbps"),
        ([], [], "no values for bw_mbps on either side"),
    ],
)
def test_it_is_inconclusive_when_a_side_has_no_values(
    baseline: list[float], candidate: list[float], words: str
) -> None:
    verdict = bandwidth(baseline, candidate)

    assert (verdict.outcome, verdict.test, verdict.change_pct) == ("inconclusive", "missing", None)
    assert words in verdict.reason


@pytest.mark.filterwarnings("error")
def test_it_treats_identical_repeats_on_both_sides_as_an_exact_difference() -> None:
    verdict = bandwidth([100, 100, 100], [90, 90, 90])

    assert (verdict.outcome, verdict.p_value) == ("regression", 0.0)
    assert "the repetitions are identical on both sides, so the difference is exact" in verdict.reason
    assert bandwidth([100, 100, 100], [100, 100, 100]).outcome == "pass"


def test_it_drops_non_finite_values() -> None:
    verdict = bandwidth([100, math.nan, 101, 99, math.inf], [80, 81, -math.inf, 79])

    assert verdict.baseline is not None and verdict.candidate is not None
    assert (verdict.baseline.n, verdict.candidate.n) == (3, 3)
    assert verdict.outcome == "regression"


def test_it_summarises_each_side() -> None:
    verdict = bandwidth([100, 102, 98], [80])

    assert verdict.baseline is not None and verdict.candidate is not None
    assert asdict(verdict.baseline) == {
        "n": 3,
        "mean": 100.0,
        "stdev": pytest.approx(2.0),
        "min": 98.0,
        "max": 102.0,
        "cv": pytest.approx(0.02),
        "median": 100.0,
    }
    assert (verdict.candidate.stdev, verdict.candidate.cv) == (0.0, None)


def test_it_measures_the_change_between_medians_when_the_policy_says_median() -> None:
    skewed = [80.0, 81.0, 200.0]  # its mean rose 20% above the baseline's, its median fell 19%

    by_mean = bandwidth([100, 101, 99], skewed)
    by_median = bandwidth([100, 101, 99], skewed, policy=Policy(statistic="median"))

    assert by_mean.change_pct == pytest.approx(20.333, abs=1e-3)
    assert by_median.change_pct == pytest.approx(-19.0)
    assert by_median.reason.startswith("the median of bw_mbps is 19.0% worse: it fell from 100 MB/s to 81.0 MB/s")


def test_it_judges_the_same_from_statistics_as_from_the_repetitions() -> None:
    from campaigns.verdicts import judge_stats, stats_of

    base, cand = [100.0, 104.0, 98.0, 101.0], [90.0, 93.0, 91.0, 95.0]
    for statistic in ("mean", "median"):
        policy = Policy(statistic=statistic)
        from_values = judge(baseline=base, candidate=cand, higher_is_better=True, policy=policy, metric="bw")
        from_stats = judge_stats(baseline=stats_of(base), candidate=stats_of(cand), higher_is_better=True,
                                 policy=policy, metric="bw")  # fmt: skip
        assert from_stats == from_values


def test_it_judges_a_change_away_from_a_zero_baseline_without_a_percentage() -> None:
    verdict = judge(
        baseline=[0, 0, 0], candidate=[5, 5, 5], higher_is_better=False, policy=POLICY, metric="retransmits"
    )

    assert (verdict.outcome, verdict.change_pct) == ("regression", None)
    assert "it rose from 0 to 5 (no percentage against a zero baseline), beyond any threshold" in verdict.reason


def test_it_calls_a_drop_inside_the_usual_campaign_to_campaign_range_inconclusive() -> None:
    verdict = bandwidth([100, 100.5, 99.5], [BAND_LOW + 0.2, BAND_LOW + 0.3, BAND_LOW + 0.1], history=HISTORY)

    assert verdict.p_value is not None and verdict.p_value < 0.05  # the repetitions alone would call it
    assert (verdict.outcome, verdict.test) == ("inconclusive", "history")
    assert "inside the usual campaign-to-campaign range 90.1 MB/s – 110 MB/s" in verdict.reason
    assert "(95% prediction interval over 3 campaigns)" in verdict.reason
    assert verdict.reason.endswith("the repetitions and the campaign history disagree")


def test_it_confirms_a_regression_beyond_the_usual_campaign_to_campaign_range() -> None:
    verdict = bandwidth([100, 100.5, 99.5], [BAND_LOW - 0.2, BAND_LOW - 0.3, BAND_LOW - 0.1], history=HISTORY)

    assert (verdict.outcome, verdict.test) == ("regression", "history")
    assert "< 0.05 and the candidate mean is outside the usual campaign-to-campaign range" in verdict.reason


def test_it_is_inconclusive_when_noisy_repetitions_disagree_with_the_history() -> None:
    verdict = bandwidth([100, 130, 70], [BAND_LOW - 30.1, BAND_LOW - 0.1, BAND_LOW + 29.9], history=HISTORY)

    assert (verdict.outcome, verdict.test) == ("inconclusive", "history")
    assert "within the spread of the repetitions but the candidate mean is outside" in verdict.reason


@pytest.mark.parametrize(("offset", "outcome"), [(-0.01, "regression"), (0.01, "inconclusive")])
def test_it_lets_the_history_decide_alone_when_repetitions_are_too_few(offset: float, outcome: str) -> None:
    verdict = bandwidth([100], [BAND_LOW + offset], history=HISTORY)

    assert (verdict.outcome, verdict.test, verdict.p_value) == (outcome, "history", None)
    assert "too few repetitions for a t-test" in verdict.reason


def test_it_ignores_a_history_of_fewer_than_two_campaigns_with_values() -> None:
    verdict = bandwidth([100, 101, 99], [80, 81, 79], history=[[100.0], [], [math.nan]])

    assert (verdict.outcome, verdict.test) == ("regression", "welch-t")


def test_it_returns_plain_data_that_serializes_to_json() -> None:
    verdict = bandwidth([100, 101, 99], [80, 81, 79], history=HISTORY)

    data = json.loads(json.dumps(asdict(verdict)))

    assert data["outcome"] == "regression"
    assert data["baseline"]["n"] == 3


def test_it_builds_a_policy_from_settings_with_defaults_for_missing_keys() -> None:
    policy = Policy.from_mapping({"threshold_pct": 3, "alpha": 0.01})

    assert policy == Policy(threshold_pct=3.0, alpha=0.01, min_repetitions=2)
    assert isinstance(policy.threshold_pct, float)
    assert Policy.from_mapping({}) == Policy()


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"threshold_pct": -1}, "threshold_pct"),
        ({"threshold_pct": "5"}, "threshold_pct"),
        ({"threshold_pct": math.nan}, "threshold_pct"),
        ({"threshold_pct": True}, "threshold_pct"),
        ({"alpha": 0}, "alpha"),
        ({"alpha": 1}, "alpha"),
        ({"alpha": None}, "alpha"),
        ({"min_repetitions": 1}, "min_repetitions"),
        ({"min_repetitions": 2.5}, "min_repetitions"),
        ({"treshold_pct": 5}, "treshold_pct"),
    ],
)
def test_it_refuses_a_bad_policy_naming_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(PolicyError) as raised:
        Policy.from_mapping(data)

    assert raised.value.field == field
    assert raised.value.message
    assert str(raised.value).startswith(f"{field}: ")


def test_it_refuses_a_bad_policy_built_directly() -> None:
    with pytest.raises(PolicyError, match="alpha"):
        Policy(alpha=2)


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        (["pass", "improvement", "regression", "inconclusive"], "regression"),
        (["pass", "inconclusive", "improvement"], "inconclusive"),
        (["pass", "improvement"], "improvement"),
        (["pass", "pass"], "pass"),
        ([], "inconclusive"),
    ],
)
def test_it_folds_outcomes_into_one(outcomes: list[str], expected: str) -> None:
    assert overall(iter(outcomes)) == expected


def test_it_refuses_an_unknown_outcome() -> None:
    with pytest.raises(ValueError, match="unknown outcome 'regresion'"):
        overall(["pass", "regresion"])
