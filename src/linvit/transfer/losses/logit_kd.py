"""Final-logit knowledge distillation (Hinton et al. 2015; DeiT's soft distillation)."""
from linvit.train.objectives import logit_kd
from linvit.transfer.losses.base import DistillLoss

LOSS = DistillLoss("logit_kd", "logits", logit_kd, "final-logit KD")
