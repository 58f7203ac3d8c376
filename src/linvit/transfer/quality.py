"""How well a distillation did, measured on held-out images for every distillation (the distill
stage) and after fine-tuning (the finetune stage).

Teacher-forced, per distilled layer l (each student layer reads the teacher's own input to it):
    rel_err/L<l>   ||a_s(h) - a_t(h)||^2 / ||a_t(h)||^2 of the attention outputs, summed over
                   the images scored (comparable across operators and loss designs)
    map_kl/L<l>    KL(teacher row || student row) of the attention maps, mean over rows, heads
                   and images, for operators whose map rows are distributions (map_kind
                   "stochastic"; the others' maps are signed or only effective)
before the first step, after every evaluated epoch and at the end; and the same numbers for two
references in the student's operator, at the start: its attention new ("random", the seed's
init) and the teacher's softmax Q/K/V/proj copied into it ("copied"). Free-running (the whole
distilled model on its own forward, as fine-tuning starts from it): the KL of its predictions to
the teacher's, how often their top-1 agree, and its accuracy. After fine-tuning, how far each
layer's attention output moved from the distilled one it started from (attn_moved/L<l>, the
relative squared change, teacher-forced).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

MAX_BATCHES = 4              # held-out batches the teacher-forced numbers average over


def map_kl(teacher_map: torch.Tensor, student_map: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row of two (B, H, N, N) row-stochastic maps, summed over rows."""
    p, q = teacher_map.float(), student_map.float().clamp_min(1e-12)
    return (p * (p.clamp_min(1e-12).log() - q.log())).sum(-1).sum()


@torch.no_grad()
def layer_quality(objective, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per distilled layer: sums (numerator, denominator) of rel_err and map_kl for one batch,
    as 2-element tensors (summed over batches and processes, then divided)."""
    trace = objective.teacher_trace(images, maps=True)
    out = {}
    for l in objective.layers:
        attn = objective.student.blocks[l].attn
        h, target = trace[("attn_in", l)], trace[("attn_out", l)].float()
        stochastic = attn.map_kind == "stochastic"
        own, maps = attn.forward_with_map(h) if stochastic else (attn(h), None)
        out[f"rel_err/L{l}"] = torch.stack([(own.float() - target).pow(2).sum(),
                                            target.pow(2).sum()])
        if maps is not None:
            rows = maps.shape[0] * maps.shape[1] * maps.shape[2]
            out[f"map_kl/L{l}"] = torch.stack([map_kl(trace[("attn_map", l)], maps),
                                               torch.tensor(float(rows), device=maps.device)])
    return out


@torch.no_grad()
def ratios_over_batches(parts, loader, rt, max_batches: int) -> dict[str, float]:
    """Each name's summed numerator over its summed denominator: `parts(images)` gives
    (numerator, denominator) tensors per name for one batch, summed over the first held-out
    batches and every process's images."""
    sums: dict[str, torch.Tensor] = {}
    for i, (images, _) in enumerate(loader.batches(0)):
        if i == max_batches:
            break
        with rt.autocast():
            for name, part in parts(images.to(rt.device)).items():
                sums[name] = sums[name] + part if name in sums else part
    return {name: (s := rt.all_reduce_sum(v))[0].item() / s[1].item()
            for name, v in sorted(sums.items())}


def teacher_forced(objective, loader, rt, max_batches: int = MAX_BATCHES) -> dict[str, float]:
    """layer_quality over the first held-out batches, every process's images together."""
    objective.eval()
    return ratios_over_batches(lambda images: layer_quality(objective, images), loader, rt,
                               max_batches)


@contextlib.contextmanager
def scoring(objective, student: nn.Module):
    """The objective with another student in it for a block (a reference)."""
    own = objective.student
    objective.student = student.to(next(own.parameters()).device)
    try:
        yield objective
    finally:
        objective.student = own


@torch.no_grad()
def free_running(student: nn.Module, teacher: nn.Module, loader, rt) -> dict[str, float]:
    """The student's own forward against the teacher's on the whole held-out split."""
    student.eval(), teacher.eval()
    sums = torch.zeros(4, device=rt.device)                 # kl, agree, correct, images
    for images, labels in loader.batches(0):
        images, labels = images.to(rt.device), labels.to(rt.device)
        with rt.autocast():
            s, t = student(images).float(), teacher(images).float()
        sums[0] += F.kl_div(s.log_softmax(-1), t.log_softmax(-1), log_target=True,
                            reduction="sum")
        sums[1] += (s.argmax(-1) == t.argmax(-1)).sum()
        sums[2] += (s.argmax(-1) == labels).sum()
        sums[3] += len(labels)
    kl, agree, correct, n = rt.all_reduce_sum(sums).tolist()
    return {"logit_kl": kl / n, "agreement": 100 * agree / n, "top1": 100 * correct / n}


@torch.no_grad()
def attention_moved(objective, distilled: nn.Module, loader, rt,
                    max_batches: int = MAX_BATCHES) -> dict[str, float]:
    """attn_moved/L<l>: the fine-tuned attention's output (objective.student, a
    DistillObjective's) against the distilled one it started from, on the teacher's own inputs
    to each layer."""
    model = objective.student
    distilled = distilled.to(rt.device).eval()
    objective.eval()

    def moved(images: torch.Tensor) -> dict[str, torch.Tensor]:
        trace, out = objective.teacher_trace(images), {}
        for l in objective.layers:
            h = trace[("attn_in", l)]
            now, start = model.blocks[l].attn(h).float(), distilled.blocks[l].attn(h).float()
            out[f"attn_moved/L{l}"] = torch.stack([(now - start).pow(2).sum(),
                                                   start.pow(2).sum()])
        return out

    return ratios_over_batches(moved, loader, rt, max_batches)
