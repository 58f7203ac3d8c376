"""Final-logit knowledge distillation (Hinton et al. 2015; DeiT's soft distillation)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from linvit.transfer.losses.base import DistillLoss


def logit_kd(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0,
             **_) -> torch.Tensor:
    """KL(teacher || student) on temperature-softened logits, times T^2 (Hinton et al. 2015)."""
    t = temperature
    return F.kl_div(F.log_softmax(student.float() / t, -1), F.log_softmax(teacher.float() / t, -1),
                    reduction="batchmean", log_target=True) * t * t


LOSS = DistillLoss("logit_kd", "logits", logit_kd, "final-logit KD")
