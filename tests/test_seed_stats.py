"""benchmarks/lib/seed_stats.py: the seed-level tests on hand-counted values (each would differ were the
enumeration, the tie rule, the df or the correction wrong)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "lib"))
import bench_paths  # noqa: E402,F401 - every benchmarks/<concern>/ on sys.path
import seed_stats as S  # noqa: E402


def test_exact_permutation_test_counts_every_relabelling():
    # 20 relabellings of [1..6] into 3 + 3; only the observed one reaches a difference of +3
    r = S.permutation_test([4, 5, 6], [1, 2, 3], "greater")
    assert r == {"difference": 3.0, "p": 1 / 20, "relabellings": 20, "exact": True}
    assert S.permutation_test([4, 5, 6], [1, 2, 3])["p"] == 2 / 20  # two-sided: +3 and -3
    assert S.permutation_test([4, 5, 6], [1, 2, 3], "less")["p"] == 1.0
    # [3, 5] vs [1, 2, 4]: group-a sums of the 10 pairs are 8 9 4 5 7 6 7 3 5 6; observed 8, the
    # difference (5 s - 30) / 6: >= +10/6 for s in {8, 9}, as extreme below for s in {3, 4}
    assert S.permutation_test([3, 5], [1, 2, 4], "greater")["p"] == 2 / 10
    assert S.permutation_test([3, 5], [1, 2, 4])["p"] == 4 / 10


def test_permutation_ties_count_as_extreme():
    # [0, 2] vs [1]: relabelling differences 0, -1.5, +1.5; the observed 0 ties with itself only on one side
    assert S.permutation_test([0.0, 2.0], [1.0], "greater")["p"] == 2 / 3
    assert S.permutation_test([0.0, 2.0], [1.0])["p"] == 1.0
    # seed means of 50 problems summed in another order: equal up to rounding, still a tie
    assert S.permutation_test([0.1, 0.2, 0.3], [0.3, 0.2, 0.1])["p"] == 1.0


def test_ten_against_ten_is_enumerated_exactly():
    a, b = [1.0 + i / 100 for i in range(10)], [float(i) / 100 for i in range(10)]
    r = S.permutation_test(a, b, "greater")
    assert r["relabellings"] == 184756 and r["exact"] and r["p"] == 1 / 184756


def test_beyond_max_exact_a_seeded_draw_never_gives_zero():
    r = S.permutation_test([4, 5, 6], [1, 2, 3], "greater", max_exact=10, reps=20000)
    assert not r["exact"] and abs(r["p"] - 1 / 20) < 0.01 and r["p"] > 0


def test_sign_flip_test_counts_every_sign_pattern():
    assert S.sign_flip_test([1, 2, 3], "greater") == {
        "difference": 2.0,
        "p": 1 / 8,
        "relabellings": 8,
        "exact": True,
    }
    assert S.sign_flip_test([1, 2, 3])["p"] == 2 / 8
    # d = [1, -2, 3], sum 2; the 8 sums are 6 0 2 -4 4 -2 0 -6: >= 2 three times, |.| >= 2 six times
    assert S.sign_flip_test([1, -2, 3], "greater")["p"] == 3 / 8
    assert S.sign_flip_test([1, -2, 3])["p"] == 6 / 8


def test_t_distribution_matches_its_closed_forms():
    assert S.t_cdf(1.0, 1) == pytest.approx(0.5 + math.atan(1.0) / math.pi, abs=1e-12)  # Cauchy: 0.75
    assert S.t_cdf(2.0, 2) == pytest.approx(0.5 + 2.0 / (2 * math.sqrt(6.0)), abs=1e-12)
    t = -3.0  # df = 4: F(t) = 1/2 + (3/8) u (1 - u^2/12 ... ) with u = t / sqrt(1 + t^2/4)
    u = t / math.sqrt(1 + t * t / 4)
    assert S.t_cdf(t, 4) == pytest.approx(0.5 + 3 / 8 * u * (1 - t * t / (12 * (1 + t * t / 4))), abs=1e-12)
    assert S.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-9)  # 12.706
    p = 0.975  # df = 2: t = (2p - 1) sqrt(2 / (4 p (1 - p)))
    assert S.t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), abs=1e-9)


def test_welch_on_hand_values():
    r = S.welch([1, 2, 3], [4, 5, 6])
    # variances 1 and 1, se = sqrt(2/3), t = -3 / se, df = (2/3)^2 / (2 (1/3)^2 / 2) = 4
    assert r["t"] == pytest.approx(-3 / math.sqrt(2 / 3)) and r["df"] == pytest.approx(4.0)
    t = abs(r["t"])
    u = t / math.sqrt(1 + t * t / 4)
    upper = 0.5 - 3 / 8 * u * (1 - t * t / (12 * (1 + t * t / 4)))  # P(T > |t|), df 4, closed form
    assert r["p"] == pytest.approx(2 * upper, rel=1e-9)  # 0.0213
    half = 2.7764451051977987 * math.sqrt(2 / 3)  # t_{0.975, 4} from the tables
    assert r["interval"] == pytest.approx((-3 - half, -3 + half), abs=1e-9)
    # unequal spreads: variances 1 and 4, df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = 50/17
    assert S.welch([1, 2, 3], [2, 4, 6])["df"] == pytest.approx(50 / 17)
    assert S.welch([1], [2, 3]) is None


def test_paired_t_and_effect_sizes_on_hand_values():
    r = S.paired_t([1, 2, 3])  # mean 2, sd 1, se 1/sqrt(3), df 2
    assert r["t"] == pytest.approx(2 * math.sqrt(3)) and r["df"] == 2
    # Hedges' J(4) = Gamma(2) / (sqrt(2) Gamma(3/2)) = 1 / (sqrt(2) sqrt(pi) / 2) = 0.7979
    assert S.hedges_g([1, 2, 3], [4, 5, 6]) == pytest.approx(-3 * 2 / (math.sqrt(2) * math.sqrt(math.pi)))
    # g_z of [1, 2, 3]: mean 2 / sd 1, J(2) = Gamma(1) / (1 * Gamma(1/2)) = 1 / sqrt(pi)
    assert S.paired_hedges_g([1, 2, 3]) == pytest.approx(2 / math.sqrt(math.pi))
    assert S.hedges_g([1, 1], [1, 1]) is None


def test_holm_adjusts_step_down_and_keeps_the_order():
    assert S.holm({"x": 0.01, "y": 0.04, "z": 0.03}) == pytest.approx({"x": 0.03, "y": 0.06, "z": 0.06})
    assert S.holm({"x": 0.3, "y": 0.6}) == pytest.approx({"x": 0.6, "y": 0.6})
    assert S.holm({"only": 0.02}) == {"only": 0.02}


def test_compare_bundles_the_primary_test_and_the_secondary_check():
    c = S.compare_independent([4, 5, 6], [1, 2, 3])
    assert c["n"] == (3, 3) and c["difference"] == 3.0 and c["permutation"]["p"] == 0.1
    assert (
        c["welch"]["p"] == pytest.approx(S.welch([4, 5, 6], [1, 2, 3])["p"])
        and c["interval_method"] == "Welch t"
    )
    p = S.compare_paired([1, 2, 3])
    assert p["permutation"]["p"] == 0.25 and p["interval"] == S.paired_t([1, 2, 3])["interval"]
    with pytest.raises(ValueError, match="alternative: got 'bigger'"):
        S.permutation_test([1], [2], "bigger")
