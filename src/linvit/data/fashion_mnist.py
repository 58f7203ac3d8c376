"""Fashion-MNIST (Xiao et al. 2017, MIT licence): 60k/10k 28x28 grey images, 10 classes.

Looked for, in order: data.root if given (IDX files, gzipped or not, directly or in torchvision's
ROOT/FashionMNIST/raw layout), then Debian's `dataset-fashion-mnist` under
/usr/share/datasets/fashion-mnist.
"""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import torch

from linvit.data.base import DataInfo, InMemoryDataset
from linvit.errors import DataError, DatasetNotFound

DEBIAN_ROOT = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
           "Bag", "Ankle boot")


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST format): magic 0x0000 0x08 ndim, big-endian dims, uint8 data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:             # a truncated or corrupted gzip stream
        raise DataError(f"{path}: cannot be read ({e}); reinstall the dataset") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise DataError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(int)
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DataError(f"{path}: {body.size} bytes of data for dims {tuple(dims)}")
    return body.reshape(dims)


def candidate_dirs(root: str | None) -> list[Path]:
    if root is None:
        return [DEBIAN_ROOT]
    root = Path(root)
    return [root, root / "FashionMNIST" / "raw"]


def find_file(root: str | None, stem: str, hint: str) -> Path:
    looked = []
    for d in candidate_dirs(root):
        for name in (stem + ".gz", stem):
            looked.append(d / name)
            if looked[-1].is_file():
                return looked[-1]
    raise DatasetNotFound(f"Fashion-MNIST file {stem} not found; looked at: "
                          + ", ".join(map(str, looked)) + f". {hint}")


class FashionMNIST(InMemoryDataset):
    info_ = DataInfo(10, 1, 28, (0.2860,), (0.3530,), CLASSES)
    split_sizes = {"train": 60000, "test": 10000}
    install_hint = ("Install it with `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or "
                    "set data.root to a folder holding the IDX files or a torchvision "
                    "FashionMNIST root.")

    def arrays(self, root, split):
        images_file, labels_file = (find_file(root, s, self.install_hint) for s in FILES[split])
        images = read_idx(images_file)
        labels = read_idx(labels_file)
        if images.ndim != 3 or len(images) != len(labels):
            raise DataError(f"{images_file}: {images.shape} images for {len(labels)} labels")
        return (torch.from_numpy(images.copy()).unsqueeze(1),
                torch.from_numpy(labels.astype(np.int64)))
