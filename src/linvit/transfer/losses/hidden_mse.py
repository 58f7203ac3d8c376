"""Block-output (hidden-state) MSE per layer, each student block fed the teacher's block input."""
from linvit.transfer.losses.base import DistillLoss, mse

LOSS = DistillLoss("hidden_mse", "block_out", mse, "block-output (hidden-state) MSE per layer")
