"""Seed-level statistics: each training run (seed) is one observation, summarised by its mean over
the held-out problems.

Why seed means: what a claim about *training* must beat is the spread between training runs. The
held-out problems are the same in every run, so they add no independent replication; a two-level
bootstrap over 6 seeds resamples from 6 values and gives intervals that are too narrow
(:mod:`learning_stats` keeps it as a secondary view). Here:

- :func:`permutation_test`: two independent groups of seeds (joint vs apart: separate training runs),
  exact over every relabelling of the pooled seed means when there are at most ``max_exact`` of them
  (10 vs 10: C(20, 10) = 184,756), else a seeded Monte Carlo draw.
- :func:`sign_flip_test`: contrasts paired by seed (cross-play and swap reuse joint seed s's agents:
  the per-seed difference is the observation), exact over all 2^n sign flips up to n = 20.
- :func:`welch`: Welch's t-test and the t-interval with Welch-Satterthwaite df (secondary test, primary
  interval); :func:`paired_t` for the paired contrasts.
- :func:`hedges_g`, :func:`paired_hedges_g`: standardised effect sizes; :func:`holm`: Holm's step-down
  adjustment over a family of p-values.
- :func:`compare_independent`, :func:`compare_paired`: all of the above for one contrast.

Why a t-interval and not a bootstrap over seeds: a percentile bootstrap of a mean over n seeds has the
spread of the plug-in SD (a factor sqrt((n-1)/n) too small) and normal tails; with 6-10 seeds its 95%
intervals cover noticeably less than 95%. The seed means are averages of 50 pass/fail outcomes, close
to normal, where the t-interval is exact in the equal-spread case and Welch's df keeps it honest when
the conditions spread differently (joint's seeds spread more than apart's). The interval and the
permutation test can disagree at the margin; the pre-registered decision is the permutation test's.

Pure Python and torch only (no scipy in the environment): the t distribution comes from the
regularised incomplete beta function (:func:`t_cdf`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch

Alternative = Literal["two-sided", "greater", "less"]
ALTERNATIVES = ("two-sided", "greater", "less")
"""``greater``: the alternative mean(a) > mean(b) (paired: mean(d) > 0); ``less`` the reverse."""
MAX_EXACT = 2_000_000
"""Exact enumeration up to this many relabellings (C(22, 11) = 705,432 fits; 10 vs 10: 184,756)."""
_TIE = 1e-9
"""Relabellings whose statistic equals the observed one up to float rounding count as "as extreme":
seed means are multiples of 1/50, and the same sum added in another order may differ in the last bit."""


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: Sequence[float]) -> float:
    """Sample variance (n - 1 in the denominator)."""
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _p_value(stats: torch.Tensor, observed: float, alternative: str) -> float:
    """Share of ``stats`` at least as extreme as ``observed`` (the observed labelling is among them)."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative: got {alternative!r}, allowed: {list(ALTERNATIVES)}")
    if alternative == "greater":
        hits = stats >= observed - _TIE
    elif alternative == "less":
        hits = stats <= observed + _TIE
    else:
        hits = stats.abs() >= abs(observed) - _TIE
    return float(hits.double().mean())


def permutation_test(
    a: Sequence[float],
    b: Sequence[float],
    alternative: Alternative = "two-sided",
    max_exact: int = MAX_EXACT,
    reps: int = 200_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Permutation test of mean(a) - mean(b) for two independent groups (Fisher's randomisation test).

    Under the null hypothesis the group labels are exchangeable: every way of choosing ``len(a)`` of the
    pooled values as group a is equally likely. The p-value is the share of those relabellings whose
    difference of means is at least as extreme as the observed one (the observed labelling counts).
    Example: ``a = [4, 5, 6]``, ``b = [1, 2, 3]``: 20 relabellings, only the observed one reaches +3, so
    ``greater`` gives 1/20 and ``two-sided`` 2/20.

    Returns:
        ``{"difference", "p", "relabellings", "exact"}``; ``exact`` False: ``reps`` random relabellings
        drawn with ``seed`` and p = (1 + hits) / (1 + reps) (Phipson & Smyth 2010, never 0).

    Raises:
        ValueError: an empty group or a bad ``alternative``.
    """
    if not a or not b:
        raise ValueError(f"permutation_test: groups of {len(a)} and {len(b)} values; each needs at least one")
    z = torch.tensor([*a, *b], dtype=torch.float64)
    na, n = len(a), len(a) + len(b)
    total, observed = float(z.sum()), _mean(a) - _mean(b)
    count = math.comb(n, na)
    if count <= max_exact:
        # itertools, not torch.combinations: the latter builds the n^r grid first (terabytes at 10 of 20)
        idx = torch.tensor(list(itertools.combinations(range(n), na)), dtype=torch.long).reshape(count, na)
        sums = z[idx].sum(dim=1)
        stats = sums / na - (total - sums) / (n - na)
        return {
            "difference": observed,
            "p": _p_value(stats, observed, alternative),
            "relabellings": count,
            "exact": True,
        }
    gen = torch.Generator().manual_seed(seed)
    hits = 0
    for start in range(0, reps, 10_000):
        m = min(10_000, reps - start)
        idx = torch.rand(m, n, generator=gen).argsort(dim=1)[:, :na]
        sums = z[idx].sum(dim=1)
        stats = sums / na - (total - sums) / (n - na)
        hits += round(_p_value(stats, observed, alternative) * m)
    return {"difference": observed, "p": (1 + hits) / (1 + reps), "relabellings": reps, "exact": False}


def sign_flip_test(
    d: Sequence[float],
    alternative: Alternative = "two-sided",
    max_exact_n: int = 20,
    reps: int = 200_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Sign-flip (paired permutation) test of mean(d) for per-seed differences ``d``.

    Under the null hypothesis each seed's two measurements are exchangeable, so each difference is as
    likely negative as positive: the p-value is the share of the 2^n sign patterns whose mean is at least
    as extreme as the observed one. Example: ``d = [1, 2, 3]``: 8 patterns, only all-positive reaches
    mean 2, so ``greater`` gives 1/8 and ``two-sided`` 2/8.

    Returns:
        ``{"difference", "p", "relabellings", "exact"}``; beyond ``max_exact_n`` differences, ``reps``
        random sign patterns drawn with ``seed``, p = (1 + hits) / (1 + reps).

    Raises:
        ValueError: no differences or a bad ``alternative``.
    """
    if not d:
        raise ValueError("sign_flip_test: no paired differences")
    x = torch.tensor(list(d), dtype=torch.float64)
    n, observed = len(d), _mean(d)
    if n <= max_exact_n:
        bits = torch.arange(n)
        hits, count = 0.0, 2**n
        for start in range(0, count, 1 << 16):  # chunks: 2^20 patterns x 20 values at once is 160 MB
            codes = torch.arange(start, min(start + (1 << 16), count))
            signs = 1.0 - 2.0 * ((codes[:, None] >> bits) & 1).double()
            stats = (signs * x).sum(dim=1) / n
            hits += _p_value(stats, observed, alternative) * len(codes)
        return {"difference": observed, "p": round(hits) / count, "relabellings": count, "exact": True}
    gen = torch.Generator().manual_seed(seed)
    signs = 1.0 - 2.0 * torch.randint(0, 2, (reps, n), generator=gen).double()
    hits = round(_p_value((signs * x).sum(dim=1) / n, observed, alternative) * reps)
    return {"difference": observed, "p": (1 + hits) / (1 + reps), "relabellings": reps, "exact": False}


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz;
    Numerical Recipes 3rd ed., 6.4), using I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction converges slowly.

    Raises:
        ValueError: ``x`` outside [0, 1].
    """
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x = {x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 1000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * f / a


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (> 0, not necessarily whole) degrees of freedom:
    the tail P(T > |t|) = I_x(df/2, 1/2) / 2 with x = df / (df + t^2)."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = ``p`` (bisection on :func:`t_cdf` to 1e-12).

    Raises:
        ValueError: ``p`` outside (0, 1).
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p = {p} outside (0, 1)")
    lo, hi = -1.0, 1.0
    while t_cdf(lo, df) > p:
        lo *= 2
    while t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return (lo + hi) / 2


def _t_result(diff: float, se: float, df: float, alternative: str, level: float) -> dict[str, Any]:
    if se == 0.0:  # every seed gave the same value in both groups: no spread to test against
        p = 1.0 if diff == 0 else 0.0
        return {"difference": diff, "t": math.copysign(math.inf, diff) if diff else 0.0, "df": df, "p": p,
                "interval": (diff, diff)}  # fmt: skip
    t = diff / se
    p = {
        "two-sided": 2 * min(t_cdf(t, df), 1 - t_cdf(t, df)),
        "greater": 1 - t_cdf(t, df),
        "less": t_cdf(t, df),
    }[alternative]
    half = t_quantile(0.5 + level / 2, df) * se
    return {"difference": diff, "t": t, "df": df, "p": p, "interval": (diff - half, diff + half)}


def welch(
    a: Sequence[float], b: Sequence[float], alternative: Alternative = "two-sided", level: float = 0.95
) -> dict[str, Any] | None:
    """Welch's t-test of mean(a) - mean(b) (unequal variances) and its ``level`` t-interval.

    df = (va/na + vb/nb)^2 / ((va/na)^2/(na-1) + (vb/nb)^2/(nb-1)) (Welch-Satterthwaite).

    Returns:
        ``{"difference", "t", "df", "p", "interval"}``, or None when a group has fewer than 2 values.
    """
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = _var(a) / len(a), _var(b) / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se else len(a) + len(b) - 2.0
    return _t_result(_mean(a) - _mean(b), se, df, alternative, level)


def paired_t(
    d: Sequence[float], alternative: Alternative = "two-sided", level: float = 0.95
) -> dict[str, Any] | None:
    """The one-sample t-test of mean(d) = 0 over per-seed differences (df = n - 1) and its t-interval;
    None with fewer than 2 differences."""
    if len(d) < 2:
        return None
    return _t_result(_mean(d), math.sqrt(_var(d) / len(d)), len(d) - 1.0, alternative, level)


def _small_sample_factor(df: float) -> float:
    """Hedges' exact bias correction J(df) = Gamma(df/2) / (sqrt(df/2) Gamma((df-1)/2)) (Hedges 1981)."""
    return math.exp(math.lgamma(df / 2) - math.lgamma((df - 1) / 2)) / math.sqrt(df / 2)


def hedges_g(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Hedges' g of mean(a) - mean(b): Cohen's d over the pooled SD, times J(na + nb - 2).

    None when a group has fewer than 2 values or both have no spread."""
    if len(a) < 2 or len(b) < 2:
        return None
    df = len(a) + len(b) - 2
    pooled = math.sqrt(((len(a) - 1) * _var(a) + (len(b) - 1) * _var(b)) / df)
    return None if pooled == 0 else _small_sample_factor(df) * (_mean(a) - _mean(b)) / pooled


def paired_hedges_g(d: Sequence[float]) -> float | None:
    """g_z of per-seed differences: mean(d) / sd(d), times J(n - 1); None below 2 values or no spread."""
    if len(d) < 2 or _var(d) == 0:
        return None
    return _small_sample_factor(len(d) - 1) * _mean(d) / math.sqrt(_var(d))


def holm(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values (Holm 1979): sort ascending, the i-th (from 1) of m becomes
    max over j <= i of min(1, (m - j + 1) p_(j)); reject where the adjusted p < alpha. Controls the
    family-wise error rate at alpha for any dependence between the tests.
    Example: {x: 0.01, y: 0.04, z: 0.03} -> {x: 0.03, y: 0.06, z: 0.06}."""
    m, running, out = len(pvalues), 0.0, {}
    for j, (name, p) in enumerate(sorted(pvalues.items(), key=lambda kv: kv[1])):
        running = max(running, min(1.0, (m - j) * p))
        out[name] = running
    return out


def compare_independent(
    a: Sequence[float], b: Sequence[float], alternative: Alternative = "two-sided"
) -> dict[str, Any]:
    """One contrast of two independent groups of seed means: difference of means, Hedges' g, the exact
    permutation test (the primary test), Welch's test (the secondary check) and the 95% Welch t-interval."""
    w = welch(a, b, alternative)
    return {
        "n": (len(a), len(b)),
        "difference": _mean(a) - _mean(b),
        "hedges_g": hedges_g(a, b),
        "permutation": permutation_test(a, b, alternative),
        "welch": w,
        "interval": None if w is None else w["interval"],
        "interval_method": "Welch t",
        "alternative": alternative,
    }


def compare_paired(d: Sequence[float], alternative: Alternative = "two-sided") -> dict[str, Any]:
    """One contrast of per-seed differences: mean, g_z, the exact sign-flip test (primary), the paired
    t-test (secondary) and its 95% t-interval (df = n - 1)."""
    t = paired_t(d, alternative)
    return {
        "n": (len(d),),
        "difference": _mean(d),
        "hedges_g": paired_hedges_g(d),
        "permutation": sign_flip_test(d, alternative),
        "welch": t,
        "interval": None if t is None else t["interval"],
        "interval_method": "paired t",
        "alternative": alternative,
    }
