"""Fine-tuning with logit KD from the softmax teacher: the classification objective mixed with
the registry's `logit_kd` loss."""
from __future__ import annotations

import torch
from torch import nn

from linvit.train.objectives import ClassificationObjective
from linvit.transfer.losses import get_loss


class LogitKDObjective(ClassificationObjective):
    """(1 - weight) * cross-entropy + weight * KD(teacher's logits -> student's)."""

    def __init__(self, model: nn.Module, label_smoothing: float, teacher: nn.Module,
                 weight: float, temperature: float = 1.0):
        super().__init__(model, label_smoothing)
        self.teacher = teacher.requires_grad_(False).eval()
        self.weight = weight
        self.temperature = temperature
        self.kd = get_loss("logit_kd").fn

    def train(self, mode: bool = True):
        super().train(mode)
        self.teacher.eval()                   # a teacher is never in training mode
        return self

    def forward(self, images: torch.Tensor, labels: torch.Tensor):
        logits, ce = self.classify(images, labels)
        with torch.no_grad():
            target = self.teacher(images)
        kd = self.kd(logits, target, temperature=self.temperature)
        return (1 - self.weight) * ce + self.weight * kd, {"ce": ce, "kd": kd}
