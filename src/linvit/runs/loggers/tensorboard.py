"""TensorBoard event files in the run folder's tensorboard/ (`tensorboard --logdir results`)."""
from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class TensorBoardLogger:
    def __init__(self, folder: Path, start_step: int):
        # purge_step: a resumed run hides what the interrupted one wrote after the update its
        # checkpoint holds (that update's own epoch record was written before the checkpoint)
        self.writer = SummaryWriter(str(folder), purge_step=start_step + 1 if start_step else None)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_logger(folder: Path, run_name: str, config: dict, start_step: int) -> TensorBoardLogger:
    return TensorBoardLogger(folder, start_step)
