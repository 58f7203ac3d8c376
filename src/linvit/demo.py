"""`linvit demo`: the README's end-to-end transfer on real Fashion-MNIST, in one process.

softmax teacher (pretrain) -> layer-wise attention distillation into a linear-attention student
-> fine-tune two students (init `random` and the paper's `copy_mlp+distill`) -> comparison table.
Configs live in config/demo/; every stage leaves its usual run folder under the output folder, so
a second call reuses finished stages and an interrupted one resumes.
"""
from __future__ import annotations

import time
from pathlib import Path

from linvit.config import load_config
from linvit.io import write_text
from linvit.train.config import PretrainConfig
from linvit.train.stages import run_pretrain
from linvit.transfer.config import DistillConfig, FinetuneConfig
from linvit.transfer.stages import run_distill, run_finetune

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config" / "demo"
STUDENTS = ("random", "copy_mlp+distill")


def _config(cls, name: str, overrides: list[str]):
    path = CONFIG_DIR / f"{name}.yaml"
    return load_config(cls, path if path.is_file() else None, overrides)


def run_demo(out: str | Path, operator: str = "linear", extra: list[str] = ()) -> str:
    out = Path(out)
    start = time.perf_counter()
    rows = []
    teacher = run_pretrain(_config(PretrainConfig, "teacher", list(extra)), out / "teacher")
    rows.append(("teacher", "softmax", "pretrained", teacher))
    teacher_file = str(out / "teacher" / "model.safetensors")
    distill_out = out / f"distill-{operator}"
    distilled = run_distill(_config(DistillConfig, "distill",
                                    [f"teacher={teacher_file}", f"model.operator={operator}",
                                     *extra]), distill_out)
    rows.append(("distilled, not fine-tuned", operator, "teacher + distilled attn", distilled))
    for strategy in STUDENTS:
        cfg = _config(FinetuneConfig, "finetune",
                      [f"teacher={teacher_file}", f"distilled={distill_out / 'model.safetensors'}",
                       f"init.strategy={strategy}", f"model.operator={operator}", *extra])
        rows.append(("student", operator, strategy, run_finetune(cfg, out / f"student-{strategy}")))
    table = format_table(rows, time.perf_counter() - start)
    write_text(out / "table.md", table)
    print(table)
    return table


def format_table(rows, wall_s: float) -> str:
    lines = ["| model | operator | init | top-1 at init | test top-1 | test top-5 | train s |",
             "|---|---|---|---:|---:|---:|---:|"]
    for model, operator, init, m in rows:
        at_init = (m.get("init") or {}).get("top1")
        lines.append(f"| {model} | {operator} | {init} | "
                     f"{'' if at_init is None else f'{at_init:.2f}'} | {m['top1']:.2f} | "
                     f"{m['top5']:.2f} | {m['train_time_s']:.0f} |")
    lines.append("")
    lines.append(f"Fashion-MNIST test split ({rows[0][3]['eval_samples']} images); wall time of "
                 f"this call {wall_s:.0f} s (finished stages are reused, not rerun).")
    return "\n".join(lines)
