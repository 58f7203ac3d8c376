"""Weight selection (Xu et al., arXiv 2311.18823): a smaller softmax ViT cut out of a larger one.

The student takes the teacher's first blocks and, in every tensor, the same evenly spaced indices
of each dimension, so the residual stream stays one consistent subspace from the patch embedding
to the head:
    width     arange(S) * T // S of the embedding channels, in every tensor that has them;
    heads     the evenly spaced heads and, inside each, the evenly spaced channels: qkv's rows per
              q/k/v segment and per head, proj's columns the same way, q/k norms by channel;
    mlp       the evenly spaced hidden units of fc1's rows and fc2's columns.
Floor division keeps every index in range for any sizes (the reference code's linspace fallback
indexes past the end for some; not copied). Selecting to the same size is the identity.

The result is a softmax model of the student's size: every init strategy then applies to it as
to any teacher (copy_mlp+distill from a selected teacher, ...). Its head keeps the teacher's
classes; a student with another class count gets a new head, as from any teacher.
"""
from __future__ import annotations

import re

import torch

from linvit.errors import CheckpointError
from linvit.models.sizes import ModelSize, get_size

# tensor name -> the index set of each dimension (None: the whole dimension). A tensor matching
# no rule is an error, so a new timm parameter cannot pass through unselected.
RULES = [
    (r"patch_embed\.proj\.weight", ("width", None, None, None)),
    (r"patch_embed\.proj\.bias", ("width",)),
    (r"(pos_embed|cls_token|reg_token)", (None, None, "width")),
    (r"blocks\.\d+\.attn\.qkv\.weight", ("qkv", "width")),
    (r"blocks\.\d+\.attn\.qkv\.bias", ("qkv",)),
    (r"blocks\.\d+\.attn\.proj\.weight", ("width", "attn")),
    (r"blocks\.\d+\.attn\.[qk]_norm\.(weight|bias)", ("head_dim",)),
    (r"blocks\.\d+\.mlp\.fc1\.weight", ("mlp", "width")),
    (r"blocks\.\d+\.mlp\.fc1\.bias", ("mlp",)),
    (r"blocks\.\d+\.mlp\.fc2\.weight", ("width", "mlp")),
    (r"blocks\.\d+\.(attn\.proj\.bias|mlp\.fc2\.bias|norm[12]\.(weight|bias)|ls[12]\.gamma)",
     ("width",)),
    (r"(norm|fc_norm|norm_pre)\.(weight|bias)", ("width",)),
    (r"head\.weight", (None, "width")),
    (r"head\.bias", (None,)),
]


def evenly_spaced(small: int, large: int) -> torch.Tensor:
    """small indices of range(large), evenly spaced from 0: arange(small) * large // small."""
    if not 0 < small <= large:
        raise ValueError(f"cannot select {small} of {large}")
    return torch.arange(small) * large // small


def selection(teacher: ModelSize, student: ModelSize) -> dict[str, torch.Tensor]:
    """The index set of each kind of dimension, from the two sizes: width (embedding channels),
    heads (head numbers), attn (their channels in the attention's C-wide space), qkv (the same in
    each of q, k, v), head_dim, mlp (hidden units), blocks."""
    problems = [f"{what} {s} > {t}" for what, s, t in (
        ("depth", student.depth, teacher.depth), ("width", student.width, teacher.width),
        ("heads", student.heads, teacher.heads),
        ("head width", student.width // student.heads, teacher.width // teacher.heads))
        if s > t]
    if student.patch_size != teacher.patch_size:
        problems.append(f"patch size {student.patch_size} != {teacher.patch_size}")
    if problems:
        raise CheckpointError(f"cannot select the student from this teacher: {'; '.join(problems)}"
                              " (weight selection cuts a larger model down)")
    d_t, d_s = teacher.width // teacher.heads, student.width // student.heads
    heads, head_dim = evenly_spaced(student.heads, teacher.heads), evenly_spaced(d_s, d_t)
    per_head = (heads[:, None] * d_t + head_dim[None, :]).reshape(-1)
    hidden_t, hidden_s = (int(s.width * s.mlp_ratio) for s in (teacher, student))
    return {"width": evenly_spaced(student.width, teacher.width), "heads": heads,
            "attn": per_head, "qkv": torch.cat([per_head + i * teacher.width for i in range(3)]),
            "head_dim": head_dim, "mlp": evenly_spaced(hidden_s, hidden_t),
            "blocks": torch.arange(student.depth)}


def select_state(teacher_state: dict[str, torch.Tensor], teacher_size: str | ModelSize,
                 student_names: list[str], student_size: str | ModelSize
                 ) -> dict[str, torch.Tensor]:
    """The student's tensors (named student_names) cut out of the teacher's (sizes by registry
    name, or a spec's model_size: a teacher read from timm)."""
    index = selection(*(get_size(s) if isinstance(s, str) else s
                        for s in (teacher_size, student_size)))
    out = {}
    for name in student_names:
        if name not in teacher_state:
            raise CheckpointError(f"weight selection: the teacher has no {name}")
        out[name] = select_tensor(teacher_state[name], _rule(name), index)
    return out


def select_tensor(tensor: torch.Tensor, dims: tuple, index: dict) -> torch.Tensor:
    if len(dims) != tensor.ndim:
        raise CheckpointError(f"weight selection: a tensor of shape {tuple(tensor.shape)} where "
                              f"{len(dims)} dimensions were expected")
    for d, kind in enumerate(dims):
        if kind is not None:
            tensor = tensor.index_select(d, index[kind])
    return tensor.contiguous()


def _rule(name: str) -> tuple:
    for pattern, dims in RULES:
        if re.fullmatch(pattern, name):
            return dims
    raise CheckpointError(f"weight selection: no rule for tensor {name!r}; extend "
                          "linvit.transfer.select.RULES")
