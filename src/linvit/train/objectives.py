"""The classification objective: cross-entropy with label smoothing. (Logit KD from a teacher is
a transfer objective: linvit.transfer.kd.LogitKDObjective.)"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ClassificationObjective(nn.Module):
    def __init__(self, model: nn.Module, label_smoothing: float = 0.0):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def classify(self, images: torch.Tensor, labels: torch.Tensor):
        """The model's logits and their label-smoothed cross-entropy. Labels may be soft
        targets (B, classes) from Mixup/CutMix, which has smoothed them already."""
        logits = self.model(images)
        smoothing = 0.0 if labels.dim() == 2 else self.label_smoothing
        return logits, F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)

    def forward(self, images: torch.Tensor, labels: torch.Tensor):
        _, ce = self.classify(images, labels)
        return ce, {"ce": ce}
