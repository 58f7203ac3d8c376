"""The paper's claims decided from paired contrasts over seeds.

A claim is a contrast between init strategies of one student (dataset, teacher, size, operator)
with a threshold: for example `distill - random > 0`. The same seed gives every strategy the same
data order and head initialisation, so the contrast is computed per seed (paired) and then
summarised: its mean and 95% Student-t confidence interval over seeds. The verdict is

    holds           the interval lies on the claim's side of the threshold
    does not hold   it lies on the other side
    undecided       it spans the threshold, or there are fewer than 2 seeds

and an undecided claim says how many seeds would decide it if the mean and spread stayed as
observed. The pooled row treats the grid's students (operators, datasets, teachers, sizes) as the
sample: the mean of their mean contrasts with a t interval over students, which is the paper's
own claim "across linear ViT variants"; it also counts the students' verdicts.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from linvit.errors import ResultsError
from linvit.render.tables import t95
from linvit.report.grid import Grid

SOFTMAX = "softmax"          # the softmax reference fine-tuned like the students (copy_all)
MAX_SEEDS = 100              # beyond this an estimate says "more than"
# The verdicts, and the count columns of a pooled row (a verdict with "_" for its spaces)
HOLDS, NOT_HOLD, UNDECIDED, NOT_TESTED = "holds", "does not hold", "undecided", "not tested"
VERDICTS = (HOLDS, NOT_HOLD, UNDECIDED)
COUNTS = tuple(v.replace(" ", "_") for v in VERDICTS)
# "Closes the gap" and "matches" are non-inferiority claims: they hold when the recipe is no
# more than MARGIN top-1 points below the reference (a test of "better than" could never confirm
# an exact match). Fixed before any study ran; stated in the report.
MARGIN = 1.0


@dataclass(frozen=True)
class Claim:
    name: str
    text: str
    contrast: str                        # the formula, as the report prints it
    needs: tuple[str, ...]               # init strategies (and SOFTMAX) the contrast reads
    value: Callable[[dict], float]       # per-seed values -> contrast
    threshold: float = 0.0               # holds when the contrast is above it


CLAIMS = [
    Claim("attn_copy_barely_helps",
          "Copying attention weights barely helps: copy_attn gains less over copy_embed than "
          "copy_mlp does", "copy_mlp - copy_attn", ("copy_attn", "copy_mlp"),
          lambda m: m["copy_mlp"] - m["copy_attn"]),
    Claim("mlp_carries_most",
          "MLPs carry most of the benefit of pretraining: (copy_mlp - random) beyond half of "
          "(copy_all - random)", "(copy_mlp - random) - 0.5 (copy_all - random)",
          ("random", "copy_mlp", "copy_all"),
          lambda m: (m["copy_mlp"] - m["random"]) - 0.5 * (m["copy_all"] - m["random"])),
    Claim("distill_beats_random", "Distilled attention beats random attention",
          "distill - random", ("random", "distill"), lambda m: m["distill"] - m["random"]),
    Claim("recipe_closes_gap",
          "Copy MLP + distill attention closes the rest of the gap to copying everything "
          f"(within {MARGIN:g} point)", "copy_mlp+distill - copy_all",
          ("copy_all", "copy_mlp+distill"), lambda m: m["copy_mlp+distill"] - m["copy_all"],
          -MARGIN),
    Claim("recipe_matches_softmax",
          "Copy MLP + distill attention matches the softmax ViT given the same fine-tuning "
          f"(within {MARGIN:g} point)", "copy_mlp+distill - softmax (copy_all)",
          ("copy_mlp+distill", SOFTMAX), lambda m: m["copy_mlp+distill"] - m[SOFTMAX], -MARGIN),
]

METHOD = (
    "**How the verdicts are reached.** Each claim is a contrast between init strategies of the "
    "same student (dataset, teacher, size, operator), in test top-1 points; `softmax` is the "
    "softmax reference fine-tuned like the students from `copy_all`. A seed fixes the data order "
    "and the head's initialisation for every strategy, so the contrast is computed seed by seed "
    "(paired) and summarised by its mean and 95% Student-t confidence interval over seeds. A "
    "claim *holds* when the interval lies above its threshold, *does not hold* when it lies "
    "below, and is *undecided* when it spans the threshold or rests on "
    "one seed; for an undecided claim, \"seeds to decide\" is the smallest number of seeds "
    "whose interval would exclude the threshold if the mean and spread stayed as measured (a "
    "rough guide, not a promise). The pooled row takes the grid's "
    "students as the sample: the mean of their mean contrasts with a t interval over students "
    "(with one student, its own row), and counts how many students hold, do not hold or are "
    "undecided. n is the number of seeds (of students in the pooled row).\n")


@dataclass(frozen=True)
class Estimate:
    values: tuple[float, ...]
    mean: float
    half_width: float | None             # None: fewer than 2 values
    verdict: str
    seeds_needed: str                    # "" when decided

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.half_width is None:
            return None
        return self.mean - self.half_width, self.mean + self.half_width


def seeds_to_decide(mean: float, sd: float, threshold: float, n: int,
                    unit: str = "seeds") -> str:
    """The smallest count whose t interval at this mean and spread excludes the threshold."""
    gap = abs(mean - threshold)
    if gap == 0:
        return f"more than {MAX_SEEDS} {unit}: the mean sits on the threshold"
    for k in range(max(n, 2), MAX_SEEDS + 1):
        if t95(k - 1) * sd / math.sqrt(k) < gap:
            return f"{k} {unit}"
    return f"more than {MAX_SEEDS} {unit}"


def estimate(values: list[float], threshold: float, unit: str = "seeds") -> Estimate:
    """Mean, 95% t interval and verdict of paired contrasts (`unit`: what a value is)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Estimate(tuple(values), mean, None, UNDECIDED,
                        f"1 {unit[:-1]} cannot decide: its spread is unknown")
    sd = statistics.stdev(values)
    half = t95(n - 1) * sd / math.sqrt(n)
    if mean - half > threshold:
        return Estimate(tuple(values), mean, half, HOLDS, "")
    if mean + half < threshold:
        return Estimate(tuple(values), mean, half, NOT_HOLD, "")
    return Estimate(tuple(values), mean, half, UNDECIDED,
                    seeds_to_decide(mean, sd, threshold, n, unit))


def seed_values(results: pd.DataFrame, grid: Grid) -> dict[tuple, dict[int, dict]]:
    """Each student (grid.student: dataset, teacher, size, the varying config axes, operator)
    -> seed -> init strategy -> top-1 of the main grid's jobs with status ok; SOFTMAX holds the
    softmax reference's copy_all of the same seed. One value per student, seed and strategy: a
    second is an error naming both jobs, never a replacement."""
    student = grid.student
    ok = grid.main(grid.complete(results))
    ok = ok[ok["status"] == "ok"]
    out: dict[tuple, dict[int, dict]] = {}
    where: dict[tuple, str] = {}
    for row in ok.to_dict("records"):
        if not math.isfinite(float(row["top1"])):         # no score: not a value to pair
            continue
        key, seed, init = tuple(row[k] for k in student), int(row["seed"]), row["init"]
        if (key, seed, init) in where:
            raise ResultsError(f"two results for {dict(zip(student, key))}, {init}, seed "
                               f"{seed}: {where[key, seed, init]} and {row['run_dir']}")
        where[key, seed, init] = row.get("run_dir")
        out.setdefault(key, {}).setdefault(seed, {})[init] = float(row["top1"])
    for key, seeds in list(out.items()):
        if key[-1] == SOFTMAX:
            continue
        ref = out.get((*key[:-1], SOFTMAX), {})
        for seed, row in seeds.items():
            if "copy_all" in ref.get(seed, {}):
                row[SOFTMAX] = ref[seed]["copy_all"]
    return {k: v for k, v in out.items() if k[-1] != SOFTMAX}


def contrasts(claim: Claim, seeds: dict[int, dict]) -> dict[int, float]:
    return {s: claim.value(m) for s, m in sorted(seeds.items()) if all(k in m for k in claim.needs)}


def pooled(claim: Claim, estimates: list[Estimate]) -> Estimate:
    """Students as the sample: a t interval over their mean contrasts (one student: its own)."""
    if len(estimates) == 1:
        return estimates[0]
    return estimate([e.mean for e in estimates], claim.threshold, "students")


@dataclass(frozen=True)
class Verdict:
    """One row of the verdict table: a claim on one student (per_seed given) or pooled."""
    claim: Claim
    where: dict                          # grid.student -> value; pooled rows only "operator"
    estimate: Estimate
    per_seed: dict                       # seed -> contrast; empty for a pooled row
    counts: dict                         # pooled rows: verdict -> number of students

    @property
    def is_pooled(self) -> bool:
        return not self.per_seed


def verdicts(results: pd.DataFrame, grid: Grid) -> list[Verdict]:
    """Each claim on each student that has its strategies, then the claim pooled."""
    out = []
    students = seed_values(results, grid)
    for claim in CLAIMS:
        found = []
        for key, seeds in students.items():
            per_seed = contrasts(claim, seeds)
            if per_seed:
                found.append(estimate(list(per_seed.values()), claim.threshold))
                out.append(Verdict(claim, dict(zip(grid.student, key)), found[-1], per_seed, {}))
        if found:
            counts = {v: sum(x.verdict == v for x in found)
                      for v in VERDICTS}
            label = f"pooled ({len(found)} student{'s' * (len(found) > 1)})"
            out.append(Verdict(claim, {"operator": label}, pooled(claim, found), {}, counts))
    return out


def untested(found: list[Verdict]) -> list[Claim]:
    """Claims that no student of the grid could be tested on (strategies missing or failed)."""
    return [c for c in CLAIMS if not any(v.claim is c for v in found)]


def claims_frame(results: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    """The verdicts as a table (tables/claims.*), then a row per claim that was not tested."""
    rows, student = [], grid.student
    found = verdicts(results, grid)
    for v in found:
        low, high = v.estimate.interval or (None, None)
        rows.append({"claim": v.claim.name,
                     "contrast": f"{v.claim.contrast} > {v.claim.threshold:g}",
                     **{k: v.where.get(k, "") for k in student}, "n": len(v.estimate.values),
                     "per_seed": ", ".join(f"{s}: {x:+.2f}" for s, x in v.per_seed.items()),
                     "mean": round(v.estimate.mean, 4),
                     "ci_low": None if low is None else round(low, 4),
                     "ci_high": None if high is None else round(high, 4),
                     "verdict": v.estimate.verdict, "to_decide": v.estimate.seeds_needed,
                     **{c: v.counts.get(k) for k, c in zip(VERDICTS, COUNTS)}})
    for claim in untested(found):
        rows.append({"claim": claim.name, "contrast": f"{claim.contrast} > {claim.threshold:g}",
                     **{k: "" for k in student}, "n": 0, "per_seed": "", "mean": None,
                     "ci_low": None, "ci_high": None, "verdict": NOT_TESTED,
                     "to_decide": "needs " + ", ".join(claim.needs) + " on one student: not "
                                  "in this grid, or failed"})
    frame = pd.DataFrame(rows, columns=["claim", "contrast", *student, "n", "per_seed", "mean",
                                        "ci_low", "ci_high", "verdict", "to_decide",
                                        *COUNTS])
    for col in COUNTS:
        frame[col] = frame[col].astype("Int64")
    return frame


def _where(row, grid: Grid) -> str:
    return " / ".join(str(row[k]) for k in grid.group if row[k] != "")


def claims_markdown(frame: pd.DataFrame, grid: Grid) -> str:
    """The report's verdict table: a block of rows per claim, its pooled row last."""
    texts = {c.name: c.text for c in CLAIMS}
    lines = [f"| claim | contrast | {' / '.join(grid.group)} | operator | n | "
             "mean ± 95% CI (per seed) | verdict | seeds to decide |",
             "|---|---|---|---|---:|---|---|---|"]
    for row in frame.to_dict("records"):
        ci = "" if pd.isna(row["ci_low"]) else f" ± {(row['ci_high'] - row['ci_low']) / 2:.2f}"
        verdict = _bold(row["verdict"])
        value = "" if pd.isna(row["mean"]) else f"{row['mean']:+.2f}{ci}"
        if row["per_seed"]:
            value += f" ({row['per_seed']})"
        elif row["operator"]:
            verdict += (f"; students: {int(row['holds'])} hold, "
                        f"{int(row['does_not_hold'])} do not, {int(row['undecided'])} undecided")
        lines.append(f"| {texts[row['claim']]} | {row['contrast']} | {_where(row, grid)} | "
                     f"{row['operator']} | {row['n']} | {value} | {verdict} | "
                     f"{row['to_decide']} |")
    return "\n".join(lines) + "\n"


def _bold(verdict: str) -> str:
    return verdict if verdict == HOLDS else f"**{verdict}**"
