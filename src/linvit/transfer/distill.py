"""Layer-wise, teacher-forced attention distillation.

The distillation student is the teacher with its attention swapped for the student operator:
every block of the student sees the teacher's own input to that block, so all layers learn in
parallel from one teacher forward pass, and errors do not compound through depth.

Per layer l, with x_l the teacher's block input and h_l = norm1(x_l) its attention input:
    attn_out   student.attn(h_l)         vs teacher.attn(h_l)
    attn_map   student map on h_l        vs teacher softmax map on h_l
    block_out  student.block(x_l)        vs teacher.block(x_l)
and logits compares the student's own full forward pass with the teacher's.

An end-to-end phase (distill.e2e_epochs, as RADLADS' second step) follows the layer-wise one:
for the schedule's last epochs the same groups learn from the e2e losses (logit KD by default),
the student running on its own; every evaluation keeps scoring the layer-wise losses, so the
quality numbers of both phases read alike.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from linvit.errors import ConfigError
from linvit.transfer.groups import group_of
from linvit.transfer.losses import get_loss
from linvit.transfer.quality import MAX_BATCHES, teacher_forced


class DistillObjective(nn.Module):
    def __init__(self, student: nn.Module, teacher: nn.Module, weights: dict[str, float],
                 layers: list[int] | None = None, temperature: float = 1.0):
        super().__init__()
        self.student = student
        self.teacher = teacher.requires_grad_(False).eval()
        depth = len(student.blocks)
        self.layers = list(range(depth)) if layers is None else list(layers)
        bad = [l for l in self.layers if not 0 <= l < depth]
        if bad:
            raise ConfigError(f"distill.layers: {bad} outside 0..{depth - 1}")
        self.use(weights)
        self.temperature = temperature
        self._trace: dict = {}
        self._hooks = []
        for l in self.layers:
            block = self.teacher.blocks[l]
            self._hooks += [
                block.register_forward_pre_hook(self._keep(("block_in", l), arg=True)),
                block.register_forward_hook(self._keep(("block_out", l))),
                block.attn.register_forward_hook(self._keep(("attn_in", l), arg=True)),
                block.attn.register_forward_hook(self._keep(("attn_out", l)))]

    def use(self, weights: dict[str, float]) -> None:
        """Train on these losses from now on (a phase of the distillation)."""
        self.weights = dict(weights)
        self.losses = [(get_loss(name), w) for name, w in weights.items() if w]
        self.targets = {loss.target for loss, _ in self.losses}

    @contextlib.contextmanager
    def using(self, weights: dict[str, float]):
        """These losses for the duration (an evaluation of the layer-wise losses in any phase)."""
        before = self.weights
        self.use(weights)
        try:
            yield self
        finally:
            self.use(before)

    def remove_hooks(self) -> None:
        """Leave the teacher as it was (an objective made for one measurement)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _keep(self, key, arg: bool = False):
        if arg:
            def pre(module, args, *rest):
                self._trace[key] = args[0]
            return pre

        def post(module, args, output):
            self._trace[key] = output
        return post

    def train(self, mode: bool = True):
        super().train(mode)
        self.teacher.eval()
        return self

    def flops_per_image(self) -> float:
        """Training FLOPs per image (linvit.models.flops' count): the teacher's forward, its maps
        again for a map loss, and per distilled layer the student's attention (a forward for
        the error that is logged; trained, 3 forwards, under an attention loss) and its whole
        block trained under a block loss; a logit loss trains through the student's whole
        forward. Explicit maps cost one N x N product per head, the student's trained."""
        from linvit.models import flops

        t, s = self.teacher.spec, self.student.spec
        trained = self.targets & {"attn_out", "attn_map"}
        layer = flops.attention_flops(s) * (flops.TRAIN_FACTOR if trained else 1.0)
        if "block_out" in self.targets:
            layer += flops.TRAIN_FACTOR * (flops.attention_flops(s) + flops.mlp_flops(s))
        if "attn_map" in self.targets:
            size, n = s.model_size, flops.tokens(s)
            product = 2.0 * n * n * size.width           # Q K^T over all heads
            layer += 2.0 * n * size.width * 3 * size.width + product  # the teacher's again
            layer += flops.TRAIN_FACTOR * product
        total = flops.forward_flops(t) + len(self.layers) * layer
        if "logits" in self.targets:
            total += flops.train_flops_per_image(s)
        return total

    @torch.no_grad()
    def teacher_trace(self, images: torch.Tensor, maps: bool = False) -> dict:
        """The teacher's inputs and outputs of every distilled layer, its logits, and (with a
        map loss, or `maps`) its attention maps."""
        self._trace = {}
        logits = self.teacher(images)
        trace, self._trace = self._trace, {}
        trace["logits"] = logits
        if maps or "attn_map" in self.targets:
            for l in self.layers:
                attn = self.teacher.blocks[l].attn
                q, k, _ = attn.project(trace[("attn_in", l)])
                trace[("attn_map", l)] = attn.attention_map(q, k)
        return trace

    def student_layer(self, l: int, trace: dict) -> dict:
        attn = self.student.blocks[l].attn
        h = trace[("attn_in", l)]
        out = {}
        if "attn_map" in self.targets:
            out["attn_out"], out["attn_map"] = attn.forward_with_map(h)
        else:
            out["attn_out"] = attn(h)
        if "block_out" in self.targets:
            out["block_out"] = self.student.blocks[l](trace[("block_in", l)])
        return out

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None):
        trace = self.teacher_trace(images)
        total = torch.zeros((), device=images.device)
        logs: dict[str, torch.Tensor] = {}
        per_layer = [(loss, w) for loss, w in self.losses if loss.per_layer]
        for l in self.layers:
            with torch.set_grad_enabled(torch.is_grad_enabled() and bool(per_layer)):
                s = self.student_layer(l, trace)      # without a layer loss: its error only
            for loss, w in per_layer:
                value = loss.fn(s[loss.target], trace[(loss.target, l)])
                total = total + w * value / len(self.layers)
                logs[f"{loss.name}/L{l}"] = value.detach()
            t_out = trace[("attn_out", l)].float()
            err = (s["attn_out"].detach().float() - t_out).pow(2).sum() / t_out.pow(2).sum()
            logs[f"rel_err/L{l}"] = err
        for loss, w in self.losses:
            if not loss.per_layer:
                value = loss.fn(self.student(images), trace["logits"],
                                temperature=self.temperature)
                total = total + w * value
                logs[loss.name] = value.detach()
        return total, logs


@torch.no_grad()
def teacher_forced_errors(objective: DistillObjective, loader, rt,
                          max_batches: int = MAX_BATCHES) -> dict:
    """On held-out images (the first `max_batches` test batches, every process's): each
    distillation loss per layer (tf_<loss>/L<l>, averaged over batches), and the quality
    measures of linvit.transfer.quality (tf_rel_err/L<l>, tf_map_kl/L<l>)."""
    objective.eval()
    names, sums, batches = None, None, 0
    for i, (images, _) in enumerate(loader.batches(0)):
        if i == max_batches:
            break
        with rt.autocast():
            _, logs = objective(images.to(rt.device))
        names = names or sorted(k for k in logs if not k.startswith("rel_err/"))
        values = torch.stack([logs[k].float() for k in names] or [torch.zeros(())])
        sums = values if sums is None else sums + values
        batches += 1
    sums = rt.all_reduce_sum(torch.cat([sums, torch.tensor([batches], device=sums.device,
                                                           dtype=sums.dtype)]))
    losses = {f"tf_{k}": (sums[i] / sums[-1]).item() for i, k in enumerate(names)}
    quality = teacher_forced(objective, loader, rt, max_batches)
    return {**losses, **{f"tf_{k}": v for k, v in quality.items()}}


def freeze_except(model: nn.Module, groups) -> list[str]:
    """requires_grad only for parameters in `groups`; returns the trainable names."""
    trainable = []
    for name, p in model.named_parameters():
        p.requires_grad_(group_of(name) in groups)
        if p.requires_grad:
            trainable.append(name)
    if not trainable:
        raise ConfigError(f"distill.train: no parameter of the student belongs to groups "
                          f"{sorted(groups)}")
    return trainable


class GradCensus:
    """Which entries of each trainable tensor ever received a non-zero gradient.

    A loss that cannot reach a tensor (V and proj under a map-only loss) shows up as 0 here, which
    is exactly what the loss-design comparison needs to see.
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.seen = {n: torch.zeros_like(p, dtype=torch.bool)
                     for n, p in model.named_parameters() if p.requires_grad}

    def __call__(self) -> None:
        for name, p in self.model.named_parameters():
            if p.grad is not None and name in self.seen:
                self.seen[name] |= p.grad != 0

    def report(self) -> dict:
        out = {}
        for name, _ in self.model.named_parameters():
            seen = self.seen.get(name)
            out[name] = {"group": group_of(name), "trainable": seen is not None,
                         "grad_fraction": seen.float().mean().item() if seen is not None else 0.0}
        return out
