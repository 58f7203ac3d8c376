"""The statistics of the claims: paired contrasts over seeds against a threshold, a Holm step
across the students of a claim, and a random-effects pooled estimate over students.

One student's contrast is summarised by its mean and 95% Student-t interval over seeds (n - 1
degrees of freedom). A claim holds on one side of its threshold ("above": the contrast exceeds
it; "below": it stays under it); the verdict is

    holds           the interval lies wholly on the claim's side
    does not hold   it lies wholly on the other side
    undecided       it spans the threshold, or rests on one seed

which is two one-sided t tests at 2.5% each. Across the students of a claim the same two tests
are corrected by Holm's step-down (family-wise 2.5% per side), so that "holds" for every student
of a grid is a statement about them all; with one student it is the student's own verdict.

The pooled estimate of a group of students (the operators of one dataset, teacher and size) is a
random-effects mean (DerSimonian-Laird) whose interval carries each student's own seed variance
and the spread between students: Hartung-Knapp's t interval with k - 1 degrees of freedom, its
variance never below the fixed-effect one (the modified form: equal means do not make it zero).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats

HOLDS, NOT_HOLD, UNDECIDED = "holds", "does not hold", "undecided"
VERDICTS = (HOLDS, NOT_HOLD, UNDECIDED)
LEVEL = 0.95                 # two-sided: each one-sided test at (1 - LEVEL) / 2
ALPHA = (1 - LEVEL) / 2
MAX_SEEDS = 100              # beyond this an estimate says "more than"


def t_quantile(dof: int) -> float:
    """The two-sided LEVEL quantile of Student's t."""
    return float(stats.t.ppf(1 - ALPHA, dof))


@dataclass(frozen=True)
class Estimate:
    values: tuple[float, ...]            # the per-seed contrasts (per-student means: pooled)
    mean: float
    se: float | None                     # None: its spread is unknown (one value)
    dof: int
    threshold: float
    side: str                            # "above" or "below"
    unit: str = "seeds"

    @property
    def half_width(self) -> float | None:
        return None if self.se is None else t_quantile(self.dof) * self.se

    @property
    def interval(self) -> tuple[float, float] | None:
        h = self.half_width
        return None if h is None else (self.mean - h, self.mean + h)

    def p_values(self) -> tuple[float, float]:
        """One-sided p of "holds" and of "does not hold" (1.0 each when the spread is unknown)."""
        if self.se is None:
            return 1.0, 1.0
        if self.se == 0:
            gap = self.mean - self.threshold
            on_side = gap > 0 if self.side == "above" else gap < 0
            return (0.0, 1.0) if on_side else (1.0, 0.0) if gap else (1.0, 1.0)
        t = (self.mean - self.threshold) / self.se
        t = t if self.side == "above" else -t
        return float(stats.t.sf(t, self.dof)), float(stats.t.cdf(t, self.dof))

    @property
    def verdict(self) -> str:
        p_hold, p_not = self.p_values()
        return HOLDS if p_hold < ALPHA else NOT_HOLD if p_not < ALPHA else UNDECIDED

    @property
    def seeds_needed(self) -> str:
        """For an undecided estimate, the smallest count whose interval at this mean and
        spread would exclude the threshold ("" when decided)."""
        if self.verdict != UNDECIDED:
            return ""
        if self.se is None:
            return f"1 {self.unit[:-1]} cannot decide: its spread is unknown"
        gap, n = abs(self.mean - self.threshold), len(self.values)
        if gap == 0:
            return f"more than {MAX_SEEDS} {self.unit}: the mean sits on the threshold"
        sd = self.se * math.sqrt(n)
        for k in range(max(n, 2), MAX_SEEDS + 1):
            if t_quantile(k - 1) * sd / math.sqrt(k) < gap:
                return f"{k} {self.unit}"
        return f"more than {MAX_SEEDS} {self.unit}"


def estimate(values: list[float], threshold: float, side: str = "above") -> Estimate:
    """Mean and t interval of paired per-seed contrasts."""
    n = len(values)
    mean = sum(values) / n
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else None
    return Estimate(tuple(values), mean, se, n - 1, threshold, side)


def holm(estimates: list[Estimate], alpha: float = ALPHA) -> list[str]:
    """Each estimate's verdict after Holm's step-down across them all, per side."""
    out = [UNDECIDED] * len(estimates)
    for side, verdict in ((0, HOLDS), (1, NOT_HOLD)):
        ranked = sorted(range(len(estimates)), key=lambda i: estimates[i].p_values()[side])
        for step, i in enumerate(ranked):
            if estimates[i].p_values()[side] > alpha / (len(estimates) - step):
                break
            out[i] = verdict
    return out


def pooled(estimates: list[Estimate]) -> Estimate | None:
    """The random-effects mean of students' estimates (module docstring); one student: its own;
    None when fewer than one has a known spread."""
    known = [e for e in estimates if e.se is not None]
    if not known:
        return None
    if len(known) == 1:
        return known[0]
    first, k = known[0], len(known)
    means, var = [e.mean for e in known], [max(e.se ** 2, 1e-12) for e in known]
    w = [1 / v for v in var]
    fixed = sum(wi * m for wi, m in zip(w, means)) / sum(w)
    q = sum(wi * (m - fixed) ** 2 for wi, m in zip(w, means))
    tau2 = max(0.0, (q - (k - 1)) / (sum(w) - sum(wi ** 2 for wi in w) / sum(w)))
    w_star = [1 / (v + tau2) for v in var]
    mean = sum(wi * m for wi, m in zip(w_star, means)) / sum(w_star)
    spread = sum(wi * (m - mean) ** 2 for wi, m in zip(w_star, means)) / (k - 1)
    se = math.sqrt(max(1.0, spread) / sum(w_star))
    return Estimate(tuple(means), mean, se, k - 1, first.threshold, first.side, "students")
