"""The paper's claims, as the paper states them, decided from paired contrasts over seeds.

Each claim is a contrast between init strategies of one student (a teacher model, the varying
config axes and an operator), the stem held fixed: `copy_embed` (stem only) is the control of
`copy_attn`, `copy_embed+distill` and the MLP strategies, `copy_mlp` the control of `copy_all`
and of the recipe `copy_mlp+distill`. The same seed gives every strategy the same data order and
head initialisation, so a contrast is taken seed by seed (paired). Statistics: estimates.py.

    F1  copying attention barely helps, sometimes hurts:
          copy_attn - copy_embed < +m_barely,  copy_all - copy_mlp < +m_barely  ("hurts" below 0)
    F2  the MLPs carry most of the benefit of pretraining, where there is one to carry:
          (copy_mlp - copy_embed) - 0.5 (copy_all - copy_embed) > 0, judged only where
          copy_all - copy_embed > 0 holds; elsewhere "no benefit to carry"
    F3  distillation recovers what copying cannot, and the recipe closes the gap:
          copy_mlp+distill - copy_mlp > 0,  copy_embed+distill - copy_embed > 0,
          copy_mlp+distill - copy_all > -m_gap,  copy_mlp+distill - softmax > -m_match,
          copy_mlp+distill - softmax > 0 (surpasses)
    F4  across variants: per claim, each student's verdict after Holm's step-down over the
        students, a random-effects pooled estimate per group (dataset, teacher, size, axes: never
        across datasets), and "holds across variants" only when every student holds.

The margins are the grid's (`claims.margins` in the workflow config, fixed before a study runs,
printed in the report). `distill - random` is kept as a labelled diagnostic, not a claim: its
distilled attention was fitted to features a new network does not have.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from linvit.errors import ResultsError
from linvit.report.estimates import HOLDS, UNDECIDED, VERDICTS, Estimate, estimate
from linvit.report.estimates import holm as holm_step
from linvit.report.estimates import pooled as pool
from linvit.report.grid import Grid

SOFTMAX = "softmax"          # the softmax reference fine-tuned like the students (copy_all)
NOT_TESTED, NO_BENEFIT, HURTS = "not tested", "no benefit to carry", "hurts"
COUNTS = tuple(v.replace(" ", "_") for v in VERDICTS)
DIAGNOSTIC = "diagnostic"
# Fixed before any study ran (top-1 points); a grid's claims.margins overrides them.
MARGINS = {"barely_helps": 1.0, "closes_gap": 1.0, "matches_softmax": 1.0}


@dataclass(frozen=True)
class Claim:
    name: str
    finding: str                          # F1, F2, F3, or DIAGNOSTIC
    text: str
    contrast: str                         # the formula, as the report prints it
    needs: tuple[str, ...]                # init strategies (and SOFTMAX) the contrast reads
    value: Callable[[dict], float]        # per-seed values -> contrast
    side: str = "above"                   # holds above the threshold, or below it
    margin: str | None = None             # the threshold: +margin (below), -margin (above), 0
    hurts: bool = False                   # also say "hurts" where the interval lies below 0
    gate: Claim | None = None             # judged only where this claim holds

    def threshold(self, margins: dict) -> float:
        if self.margin is None:
            return 0.0
        return margins[self.margin] if self.side == "below" else -margins[self.margin]

    def condition(self, margins: dict) -> str:
        return f"{self.contrast} {'<' if self.side == 'below' else '>'} " \
               f"{self.threshold(margins):+g}"


def _diff(a: str, b: str) -> Callable[[dict], float]:
    return lambda m: m[a] - m[b]


BENEFIT = Claim("pretraining_helps", "F2", "Copying everything beats the stem alone",
                "copy_all - copy_embed", ("copy_all", "copy_embed"),
                _diff("copy_all", "copy_embed"))
CLAIMS = [
    Claim("attn_copy_barely_helps", "F1", "Copying attention weights barely helps, sometimes "
          "hurts (stem held fixed)", "copy_attn - copy_embed", ("copy_attn", "copy_embed"),
          _diff("copy_attn", "copy_embed"), "below", "barely_helps", hurts=True),
    Claim("attn_copy_barely_helps_with_mlps", "F1", "Copying attention barely helps beside the "
          "copied MLPs, sometimes hurts", "copy_all - copy_mlp", ("copy_all", "copy_mlp"),
          _diff("copy_all", "copy_mlp"), "below", "barely_helps", hurts=True),
    Claim("mlp_carries_most", "F2", "The MLPs carry most of the benefit of pretraining",
          "(copy_mlp - copy_embed) - 0.5 (copy_all - copy_embed)",
          ("copy_mlp", "copy_all", "copy_embed"),
          lambda m: (m["copy_mlp"] - m["copy_embed"]) - 0.5 * (m["copy_all"] - m["copy_embed"]),
          gate=BENEFIT),
    Claim("distill_recovers_beside_mlps", "F3", "Distilled attention recovers what copying "
          "cannot, beside the copied MLPs", "copy_mlp+distill - copy_mlp",
          ("copy_mlp+distill", "copy_mlp"), _diff("copy_mlp+distill", "copy_mlp")),
    Claim("distill_recovers_without_mlps", "F3", "Distilled attention helps on the stem alone",
          "copy_embed+distill - copy_embed", ("copy_embed+distill", "copy_embed"),
          _diff("copy_embed+distill", "copy_embed")),
    Claim("recipe_closes_gap", "F3", "Copy MLP + distill attention closes the gap to copying "
          "everything", "copy_mlp+distill - copy_all", ("copy_mlp+distill", "copy_all"),
          _diff("copy_mlp+distill", "copy_all"), margin="closes_gap"),
    Claim("recipe_matches_softmax", "F3", "Copy MLP + distill attention matches the softmax ViT "
          "given the same fine-tuning", "copy_mlp+distill - softmax",
          ("copy_mlp+distill", SOFTMAX), _diff("copy_mlp+distill", SOFTMAX),
          margin="matches_softmax"),
    Claim("recipe_surpasses_softmax", "F3", "Copy MLP + distill attention surpasses the softmax "
          "ViT", "copy_mlp+distill - softmax", ("copy_mlp+distill", SOFTMAX),
          _diff("copy_mlp+distill", SOFTMAX)),
    Claim("distill_vs_random", DIAGNOSTIC, "Diagnostic, not a claim: distilled attention in an "
          "otherwise new network against random init", "distill - random",
          ("distill", "random"), _diff("distill", "random")),
]


def margins_of(grid: Grid) -> dict:
    return {**MARGINS, **grid.margins}


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


@dataclass(frozen=True)
class Verdict:
    """One row of the verdict table: a claim on one student (per_seed given), or pooled over a
    group's students (per_seed empty)."""
    claim: Claim
    where: dict                          # grid.student -> value (pooled: the group and a label)
    estimate: Estimate | None
    per_seed: dict                       # seed -> contrast; empty for a pooled row
    verdict: str                         # the student's own (pooled: the pooled estimate's)
    holm: str = ""                       # after Holm's step over the claim's students
    note: str = ""                       # "hurts", or why a gated claim is not judged
    counts: dict | None = None           # pooled rows: Holm verdict -> number of students
    across: str = ""                     # pooled rows: whether every student holds

    @property
    def is_pooled(self) -> bool:
        return self.counts is not None


def _own(claim: Claim, e: Estimate, gate: Estimate | None) -> tuple[str, str]:
    """(verdict, note) of one student."""
    if gate is not None and gate.verdict != HOLDS:
        return NO_BENEFIT, f"{claim.gate.contrast} > 0: {gate.verdict}"
    hurt = claim.hurts and e.interval is not None and e.interval[1] < 0
    return e.verdict, HURTS if hurt else ""


def claim_verdicts(claim: Claim, students: dict, grid: Grid) -> list[Verdict]:
    """The claim on every student that has its strategies, Holm's step over them, then a
    pooled row per group."""
    margins, rows = margins_of(grid), []
    for key, seeds in students.items():
        per_seed = contrasts(claim, seeds)
        if not per_seed:
            continue
        e = estimate(list(per_seed.values()), claim.threshold(margins), claim.side)
        gate = None
        if claim.gate is not None:
            gated = contrasts(claim.gate, seeds)
            gate = estimate(list(gated.values()), 0.0) if gated else None
        verdict, note = _own(claim, e, gate) if claim.gate is None or gate else (
            NO_BENEFIT, f"{claim.gate.contrast} not measured")
        rows.append(Verdict(claim, dict(zip(grid.student, key)), e, per_seed, verdict,
                            note=note))
    judged = [i for i, r in enumerate(rows) if r.verdict != NO_BENEFIT]
    for i, after in zip(judged, holm_step([rows[i].estimate for i in judged])):
        rows[i] = Verdict(**{**rows[i].__dict__, "holm": after})
    return rows + _pooled_rows(claim, rows, grid)


def _pooled_rows(claim: Claim, rows: list[Verdict], grid: Grid) -> list[Verdict]:
    out = []
    groups = dict.fromkeys(tuple(r.where[k] for k in grid.group) for r in rows)
    for group in groups:
        part = [r for r in rows if tuple(r.where[k] for k in grid.group) == group]
        judged = [r for r in part if r.verdict != NO_BENEFIT]
        e = pool([r.estimate for r in judged])
        counts = {v: sum(r.holm == v for r in judged) for v in VERDICTS}
        counts[NO_BENEFIT] = len(part) - len(judged)
        across = HOLDS if judged and len(judged) == len(part) and all(
            r.holm == HOLDS for r in judged) else "no"
        label = f"pooled ({len(part)} student{'s' * (len(part) > 1)})"
        out.append(Verdict(claim, {**dict(zip(grid.group, group)), "operator": label}, e, {},
                           e.verdict if e is not None else UNDECIDED, counts=counts,
                           across=across))
    return out


def verdicts(results: pd.DataFrame, grid: Grid) -> list[Verdict]:
    """Every claim (then the diagnostic) on every student that has its strategies."""
    students = seed_values(results, grid)
    return [v for claim in CLAIMS for v in claim_verdicts(claim, students, grid)]


def untested(found: list[Verdict]) -> list[Claim]:
    """Claims that no student of the grid could be tested on (strategies missing or failed)."""
    return [c for c in CLAIMS if not any(v.claim is c for v in found)]


def _row(v: Verdict, grid: Grid) -> dict:
    e, margins = v.estimate, margins_of(grid)
    low, high = (e.interval if e is not None else None) or (None, None)
    return {"claim": v.claim.name, "finding": v.claim.finding,
            "contrast": v.claim.condition(margins),
            **{k: v.where.get(k, "") for k in grid.student},
            "n": len(e.values) if e is not None else 0,
            "per_seed": ", ".join(f"{s}: {x:+.2f}" for s, x in v.per_seed.items()),
            "mean": None if e is None else round(e.mean, 4),
            "ci_low": None if low is None else round(low, 4),
            "ci_high": None if high is None else round(high, 4),
            "verdict": v.verdict, "holm": v.holm, "note": v.note,
            "to_decide": e.seeds_needed if e is not None and not v.note else "",
            **{c: (v.counts or {}).get(k) for k, c in zip(VERDICTS, COUNTS)},
            "no_benefit": (v.counts or {}).get(NO_BENEFIT), "across_variants": v.across}


COLUMNS = ["claim", "finding", "contrast", "n", "per_seed", "mean", "ci_low", "ci_high",
           "verdict", "holm", "note", "to_decide", *COUNTS, "no_benefit", "across_variants"]


def claims_frame(results: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    """The verdicts as a table (tables/claims.*), then a row per claim that was not tested."""
    found = verdicts(results, grid)
    rows = [_row(v, grid) for v in found]
    for claim in untested(found):
        rows.append({"claim": claim.name, "finding": claim.finding,
                     "contrast": claim.condition(margins_of(grid)),
                     **{k: "" for k in grid.student}, "n": 0, "verdict": NOT_TESTED,
                     "to_decide": "needs " + ", ".join(claim.needs) + " on one student: not "
                                  "in this grid, or failed"})
    columns = COLUMNS[:3] + grid.student + COLUMNS[3:]
    frame = pd.DataFrame(rows, columns=columns)
    for col in (*COUNTS, "no_benefit"):
        frame[col] = frame[col].astype("Int64")
    return frame.fillna({"per_seed": "", "holm": "", "note": "", "across_variants": ""})


def claims_markdown(frame: pd.DataFrame, grid: Grid) -> str:
    """The report's verdict table: a block of rows per claim, its pooled rows last."""
    texts = {c.name: c.text for c in CLAIMS}
    lines = [f"| finding | claim | condition | {' / '.join(grid.group)} | operator | n | "
             "mean ± 95% CI (per seed) | verdict | after Holm | seeds to decide |",
             "|---|---|---|---|---|---:|---|---|---|---|"]
    for row in frame.to_dict("records"):
        ci = "" if pd.isna(row["ci_low"]) else f" ± {(row['ci_high'] - row['ci_low']) / 2:.2f}"
        value = "" if pd.isna(row["mean"]) else f"{row['mean']:+.2f}{ci}"
        verdict = _bold(row["verdict"]) + (f" ({row['note']})" if row["note"] else "")
        if row["per_seed"]:
            value += f" ({row['per_seed']})"
        elif str(row["operator"]).startswith("pooled"):
            verdict += (f"; students: {int(row['holds'])} hold, {int(row['does_not_hold'])} do "
                        f"not, {int(row['undecided'])} undecided"
                        + (f", {int(row['no_benefit'])} no benefit to carry"
                           if row["no_benefit"] else "")
                        + f"; across variants: {row['across_variants']}")
        where = " / ".join(str(row[k]) for k in grid.group if row[k] != "")
        lines.append(f"| {row['finding']} | {texts[row['claim']]} | {row['contrast']} | "
                     f"{where} | {row['operator']} | {row['n']} | {value} | {verdict} | "
                     f"{row['holm']} | {row['to_decide']} |")
    return "\n".join(lines) + "\n"


def _bold(verdict: str) -> str:
    return verdict if verdict == HOLDS else f"**{verdict}**"


def method(grid: Grid) -> str:
    """How the verdicts are reached, with this grid's margins (the report's claims section)."""
    m = margins_of(grid)
    return (
        "**How the verdicts are reached.** Each claim is a contrast between init strategies of "
        "the same student (dataset, teacher, size, varying config axes, operator) in test top-1 "
        "points, the stem held fixed (`copy_embed` is the control); `softmax` is the softmax "
        "reference fine-tuned like the students from `copy_all`. A seed fixes the data order "
        "and the head's initialisation for every strategy, so the contrast is taken seed by "
        "seed (paired) and summarised by its mean and 95% Student-t interval over seeds. A "
        "claim *holds* when the interval lies wholly on its side of the threshold, *does not "
        "hold* when it lies wholly on the other, and is *undecided* otherwise or on one seed "
        "(\"seeds to decide\": the seeds whose interval would decide at the measured mean and "
        "spread, a rough guide). \"After Holm\": the same tests corrected over the students of "
        "the claim (Holm's step-down, 2.5% per side). A pooled row is a random-effects mean "
        "over the students of one group (Hartung-Knapp interval: each student's seed variance "
        "and the spread between students), never across datasets; \"across variants\" holds "
        "only when every student holds after Holm. Margins, fixed before the grid ran "
        f"(`claims.margins`): barely helps +{m['barely_helps']:g}, closes the gap "
        f"-{m['closes_gap']:g}, matches softmax -{m['matches_softmax']:g} points. F2 is judged "
        "only where copying everything beats the stem alone (copy_all - copy_embed > 0 holds). "
        "`distill - random` is a diagnostic, not a claim.\n")
