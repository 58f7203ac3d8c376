"""Attention transfer, copy mode (Li et al., "On the surprising effectiveness of attention transfer
for vision transformers", arXiv 2411.09702): a softmax student whose attention maps are its frozen
teacher's, in training and at test time. The student learns everything else (values, output
projections, MLPs, norms, head) from a new init, so its accuracy measures how much of the
teacher's pretraining its attention maps alone carry: a baseline row on the softmax side.

Each forward of the student first runs the teacher on the same (augmented) batch without
gradients and hands block i's (B, H, N, N) map to the student's block i (SoftmaxAttention's
`given_map`), which multiplies its own values with it. The teacher is not a submodule: it is not
trained, not saved with the student, not broadcast by DDP, and it follows the student's device.

The student's model file names its teacher (metadata MAPS_KEY); `linvit.models.load_model`
reattaches that teacher wherever the student is loaded (evaluation, robustness), so the student is
never scored without the maps it was trained with. Dense tasks refuse such a backbone.

Deliberate differences from the paper's code: maps are recomputed every step rather than cached,
attention dropout (off in DeiT) applies to a copied map as to a computed one, and the student's
own q/k projections stay in the model (unused by the output: timm's fused qkv layer keeps them).
"""
from __future__ import annotations

import torch
from torch import nn

from linvit.models.vit import attention_modules

MAPS_KEY = "linvit_maps_from"          # model-file metadata: the teacher whose maps drive it


def drive_with_teacher(student: nn.Module, teacher: nn.Module) -> nn.Module:
    """Make every forward of `student` use `teacher`'s attention maps, block for block."""
    own, theirs = attention_modules(student), attention_modules(teacher)
    if len(own) != len(theirs):
        raise ValueError(f"attention copy needs the teacher's depth: the student has {len(own)} "
                         f"blocks, the teacher {len(theirs)}")
    if not all(hasattr(m, "given_map") for m in own):
        raise ValueError("attention copy drives a softmax student; this student's operator "
                         f"({type(own[0]).__name__}) does not take a given map")
    teacher.eval().requires_grad_(False)
    maps: dict[int, torch.Tensor] = {}

    def record(i: int):
        def hook(module, args, output):
            q, k, _ = module.project(args[0])
            maps[i] = module.attention_map(q, k)
        return hook

    for i, attn in enumerate(theirs):
        attn.register_forward_hook(record(i))

    def before(module, args):
        x = args[0]
        with torch.no_grad():
            teacher.to(x.device)(x)
        for i, attn in enumerate(own):
            attn.given_map = maps.pop(i)

    def after(module, args, output):
        for attn in own:
            attn.given_map = None              # no map outlives its batch

    student.register_forward_pre_hook(before)
    student.register_forward_hook(after)
    student.maps_teacher = [teacher]           # a reference, not a submodule (see the docstring)
    return student
