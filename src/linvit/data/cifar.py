"""CIFAR-10 / CIFAR-100 from a local torchvision root (never downloaded at run time).

data.root must hold torchvision's layout (cifar-10-batches-py/ or cifar-100-python/); torchvision
reads the pickled batches itself, which hold only numpy arrays and label lists.
"""
from __future__ import annotations

from pathlib import Path

import torch

from linvit.data.base import DataInfo, DatasetNotFound, InMemoryDataset


class CIFAR(InMemoryDataset):
    def __init__(self, classes: int):
        self.classes = classes
        self.folder = "cifar-10-batches-py" if classes == 10 else "cifar-100-python"
        stats = {10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
                 100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}[classes]
        self.info_ = DataInfo(classes, 3, 32, *stats)
        self.install_hint = (f"Download CIFAR-{classes} once (e.g. torchvision.datasets.CIFAR"
                             f"{classes}(ROOT, download=True) on a machine with internet) and "
                             "set data.root=ROOT.")

    def arrays(self, root, split):
        from torchvision import datasets

        looked = Path(root or "<data.root not set>") / self.folder
        if root is None or not looked.is_dir():
            raise DatasetNotFound(f"CIFAR-{self.classes} not found at {looked}. {self.install_hint}")
        cls = datasets.CIFAR10 if self.classes == 10 else datasets.CIFAR100
        ds = cls(root, train=split == "train", download=False)
        images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
        return images, torch.tensor(ds.targets, dtype=torch.int64)
