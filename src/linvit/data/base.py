"""What every dataset provides: its shape (classes, channels, size, normalisation) and loaders.

Datasets that fit in memory (MNIST-like, CIFAR) return uint8 tensors and get the batched
TensorLoader; folder datasets return a torch Dataset with timm transforms.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from linvit.data.loaders import TensorLoader
from linvit.errors import DataError


@dataclass(frozen=True)
class DataInfo:
    num_classes: int
    in_chans: int
    img_size: int
    mean: tuple
    std: tuple
    class_names: tuple = ()


def subset_indices(n: int, k: int | None, seed: int = 0,
                   field: str = "subset") -> torch.Tensor | None:
    """A fixed random subset of k of n samples, the same for every run that asks for k (None:
    all of them). More than n is refused, naming `field`: a count that is not the one reported."""
    if k is not None and k > n:
        raise DataError(f"{field}: {k} samples asked, the split has {n}")
    if k is None or k == n:
        return None
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].sort().values


def holdout_indices(n: int, held: int | None, seed: int, part: str,
                    field: str = "data.val_size") -> torch.Tensor | None:
    """The training split's samples `part` of a held-out validation set of `held` of its n
    samples (drawn by `seed`): "held" those, "rest" the others, in order (None: all n, no
    holdout). More than n - 1 is refused, naming `field`."""
    if held is None:
        return None
    if not 0 < held < n:
        raise DataError(f"{field}: {held} validation samples asked, the training split has {n}")
    # the offset: a draw of its own, not subset_indices' permutation under the same seed
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.randperm(n, generator=torch.Generator().manual_seed(1_000_003 + seed))[:held]] = True
    return torch.nonzero(mask if part == "held" else ~mask).flatten()


def split_indices(n: int, subset: int | None, holdout: tuple | None, field: str):
    """The samples a loader reads: a holdout part (holdout: (size, seed, part) or None), then a
    fixed subset of those (subset_indices); None: all n."""
    base = holdout_indices(n, *holdout) if holdout else None
    pool = n if base is None else len(base)
    idx = subset_indices(pool, subset, field=field)
    if base is None:
        return idx
    return base if idx is None else base[idx]


class InMemoryDataset:
    """Subclasses set `info_` and implement `arrays(root, split) -> (uint8 NCHW, int64 labels)`."""
    info_: DataInfo
    install_hint: str = ""
    flip: bool = True            # horizontal flips in training augmentation (not for digits)
    reads_root: bool = True      # whether data.root means anything (False: the data ships)
    prefetches: bool = False     # whether loader() takes prefetch_to (in-memory batches: no)
    split_sizes: dict = {}       # images per split, known without the data (what a plan costs)

    def split_size(self, root: str | None, split: str) -> int | None:
        """Images in a split, without reading it (None: not known here)."""
        return self.split_sizes.get(split)

    def info(self, root: str | None = None, img_size: int | None = None) -> DataInfo:
        if img_size not in (None, self.info_.img_size):
            raise DataError(f"this dataset's images are {self.info_.img_size} px; "
                             f"data.img_size={img_size} is not supported for it")
        return self.info_

    def image_size(self, img_size: int | None = None) -> int:
        """The side of the images this dataset delivers, known without the data on disk."""
        return self.info(None, img_size).img_size

    def normalisation(self) -> tuple[tuple, tuple]:
        """(mean, std) per channel in [0, 1] units, known without the data on disk."""
        return self.info_.mean, self.info_.std

    def arrays(self, root: str | None, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def loader(self, root, split, *, batch_size, train, subset=None, seed=0, rank=0, world=1,
               img_size=None, workers=0, repeats=1, holdout=None):
        """`holdout`: (size, seed, "held" or "rest") of the training split's validation set."""
        images, labels = self.arrays(root, split)
        idx = split_indices(len(labels), subset, holdout,
                            f"data.{'train' if train else 'test'}_subset")
        if idx is not None:
            images, labels = images[idx], labels[idx]
        info = self.info(root, img_size)
        return TensorLoader(images, labels, batch_size, mean=info.mean, std=info.std,
                            shuffle=train, augment=train, seed=seed, rank=rank, world=world,
                            flip=self.flip, repeats=repeats if train else 1)
