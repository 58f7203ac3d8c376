"""The classification objective: cross-entropy with label smoothing, plus optional logit KD."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def logit_kd(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0,
             **_) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened logits, times T^2 (Hinton et al. 2015)."""
    t = temperature
    return F.kl_div(F.log_softmax(student.float() / t, -1), F.log_softmax(teacher.float() / t, -1),
                    reduction="batchmean", log_target=True) * t * t


class ClassificationObjective(nn.Module):
    def __init__(self, model: nn.Module, label_smoothing: float = 0.0,
                 teacher: nn.Module | None = None, kd_weight: float = 0.0,
                 kd_temperature: float = 1.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing
        self.kd_weight = kd_weight if teacher is not None else 0.0
        self.kd_temperature = kd_temperature
        self.teacher = teacher.requires_grad_(False).eval() if teacher is not None else None

    def train(self, mode: bool = True):
        super().train(mode)
        if self.teacher is not None:
            self.teacher.eval()               # a teacher is never in training mode
        return self

    def forward(self, images: torch.Tensor, labels: torch.Tensor):
        logits = self.model(images)
        ce = F.cross_entropy(logits.float(), labels, label_smoothing=self.label_smoothing)
        if not self.kd_weight:
            return ce, {"ce": ce}
        with torch.no_grad():
            target = self.teacher(images)
        kd = logit_kd(logits, target, self.kd_temperature)
        return (1 - self.kd_weight) * ce + self.kd_weight * kd, {"ce": ce, "kd": kd}
