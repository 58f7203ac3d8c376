"""CIFAR-10 / CIFAR-100 from a local folder in the official "python version" layout
(cifar-10-batches-py/ or cifar-100-python/ under data.root); never downloaded at run time.

The batches are pickles. They are read with an unpickler that admits only what numpy arrays,
dicts, lists and strings need, so a tampered file cannot run code.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from linvit.data.base import DataInfo, InMemoryDataset
from linvit.errors import DataError, DatasetNotFound

LAYOUT = {10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
               b"labels"),
          100: ("cifar-100-python", ["train"], ["test"], b"fine_labels")}
STATS = {10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
         100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}
ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
           ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        return super().find_class(module, name)


def read_batch(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            batch = _ArrayUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise DataError(f"{path}: not a CIFAR batch linvit can read safely ({e})") from None
    if not isinstance(batch, dict) or b"data" not in batch:
        raise DataError(f"{path}: not a CIFAR batch (no data array)")
    return batch


class CIFAR(InMemoryDataset):
    def __init__(self, classes: int):
        self.classes = classes
        self.folder, self.train_files, self.test_files, self.label_key = LAYOUT[classes]
        self.info_ = DataInfo(classes, 3, 32, *STATS[classes])
        self.split_sizes = {"train": 50000, "test": 10000}
        self.install_hint = (f"Download CIFAR-{classes} (python version) once on a machine with "
                             "internet, e.g. torchvision.datasets.CIFAR"
                             f"{classes}(ROOT, download=True), and set data.root=ROOT.")

    def arrays(self, root, split):
        folder = Path(root or "<data.root not set>") / self.folder
        files = [folder / f for f in (self.train_files if split == "train" else self.test_files)]
        missing = [str(f) for f in files if not f.is_file()]
        if root is None or missing:
            raise DatasetNotFound(f"CIFAR-{self.classes} not found: missing "
                                  f"{', '.join(missing) or folder}. {self.install_hint}")
        batches = [read_batch(f) for f in files]
        data = np.concatenate([b[b"data"] for b in batches]).reshape(-1, 3, 32, 32)
        labels = np.concatenate([np.asarray(b[self.label_key]) for b in batches])
        return torch.from_numpy(data.astype(np.uint8)), torch.from_numpy(labels.astype(np.int64))
