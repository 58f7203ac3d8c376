"""Attention-output MSE per layer (LoLCATs; RADLADS step 1; CLEAR)."""
from linvit.transfer.losses.base import DistillLoss, mse

LOSS = DistillLoss("attn_out_mse", "attn_out", mse, "attention-output MSE per layer")
