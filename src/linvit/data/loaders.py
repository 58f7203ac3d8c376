"""Batch iterators with one contract: `batches(epoch)` yields (images float32, labels int64), and
the order of an epoch is a pure function of (seed, epoch).

Under data parallelism every rank draws the same global batch and keeps its own contiguous slice,
so N processes with batch B/N see exactly the samples one process with batch B would see (the
test of the distributed loop relies on it).
"""
from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def rank_slice(n: int, rank: int, world: int) -> slice:
    per = -(-n // world)
    return slice(min(rank * per, n), min((rank + 1) * per, n))


class TensorLoader:
    """In-memory uint8 images (N, C, H, W): shuffling, crop/flip augmentation and normalisation
    done on whole batches, which on a 2-core machine is much faster than per-sample transforms."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, *,
                 mean: tuple, std: tuple, shuffle: bool, augment: bool, seed: int = 0,
                 rank: int = 0, world: int = 1, drop_last: bool | None = None, pad: int = 2,
                 flip: bool = True, repeats: int = 1):
        if images.dtype != torch.uint8 or images.ndim != 4:
            raise ValueError(f"expected uint8 images (N, C, H, W), got {images.dtype} "
                             f"{tuple(images.shape)}")
        if batch_size % world:
            raise ValueError(f"batch size {batch_size} is not divisible by {world} processes")
        self.images, self.labels = images, labels
        self.batch_size, self.shuffle, self.augment = batch_size, shuffle, augment
        self.seed, self.rank, self.world, self.pad, self.flip = seed, rank, world, pad, flip
        self.repeats = repeats
        self.drop_last = shuffle if drop_last is None else drop_last
        c = images.shape[1]
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1) * 255
        self.std = torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1) * 255

    def __len__(self) -> int:
        n = len(self.labels)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    @property
    def num_samples(self) -> int:
        return len(self) * self.batch_size if self.drop_last else len(self.labels)

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        g = epoch_generator(self.seed, epoch)
        n = len(self.labels)
        order = torch.randperm(n, generator=g) if self.shuffle else torch.arange(n)
        if self.repeats > 1:     # repeated augmentation: each image r times, differently augmented
            order = order.repeat_interleave(self.repeats)[:n]       # the epoch keeps its length
        for b in range(len(self)):
            idx = order[b * self.batch_size:(b + 1) * self.batch_size]
            # Augmentation parameters are drawn for the global batch, then sliced, so that every
            # rank consumes the generator identically.
            params = self._draw_augment(len(idx), g) if self.augment else None
            part = rank_slice(len(idx), self.rank, self.world)
            x = self.images[idx[part]]
            if params is not None:
                x = self._apply_augment(x, *(p[part] for p in params))
            yield (x.float() - self.mean) / self.std, self.labels[idx[part]]

    def _draw_augment(self, n: int, g: torch.Generator):
        shifts = torch.randint(0, 2 * self.pad + 1, (n, 2), generator=g)
        flips = torch.rand(n, generator=g) < 0.5 if self.flip else torch.zeros(n, dtype=torch.bool)
        return shifts, flips

    def _apply_augment(self, x, shifts, flips):
        """Random crop after zero padding (a shift by up to `pad` pixels) and horizontal flip."""
        B, C, H, W = x.shape
        padded = torch.nn.functional.pad(x, (self.pad,) * 4)
        rows = shifts[:, 0:1] + torch.arange(H)                        # (B, H)
        cols = shifts[:, 1:2] + torch.arange(W)                        # (B, W)
        cols = torch.where(flips[:, None], cols.flip(1), cols)
        b = torch.arange(B)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]
        return out.permute(0, 3, 1, 2)


class TorchLoader:
    """A torch Dataset (e.g. ImageFolder with timm transforms) behind the same contract."""

    def __init__(self, dataset: Dataset, batch_size: int, *, shuffle: bool, seed: int = 0,
                 rank: int = 0, world: int = 1, workers: int = 4, repeats: int = 1,
                 prefetch: tuple | None = None):
        """`prefetch`: (device, mean, std) for a dataset that yields uint8 images (timm's
        transforms with use_prefetcher=True): timm's PrefetchLoader copies the next batch to the
        device on a side stream while the current one is used, and normalises it there (a GPU
        then receives a quarter of the bytes, and the workers skip the float conversion)."""
        if batch_size % world:
            raise ValueError(f"batch size {batch_size} is not divisible by {world} processes")
        if repeats > 1 and shuffle:        # timm's repeated-augmentation sampler (DeiT)
            from timm.data.distributed_sampler import RepeatAugSampler

            self.sampler = RepeatAugSampler(dataset, num_replicas=world, rank=rank,
                                            num_repeats=repeats, selected_round=0)
            # timm's sampler seeds its shuffle with the epoch alone: offset it by the run's
            # seed, so that seeds differ in data order here as they do without repeats
            self.epoch_offset = seed * 1_000_003
        else:
            self.sampler = DistributedSampler(dataset, num_replicas=world, rank=rank,
                                              shuffle=shuffle, seed=seed, drop_last=shuffle)
        self.loader = DataLoader(dataset, batch_size=batch_size // world, sampler=self.sampler,
                                 num_workers=workers, drop_last=shuffle,
                                 persistent_workers=workers > 0,
                                 pin_memory=torch.cuda.is_available())
        self.batch_size = batch_size
        self.batches_of = self.loader
        if prefetch is not None:
            from timm.data.loader import PrefetchLoader

            device, mean, std = prefetch
            self.batches_of = PrefetchLoader(self.loader, mean, std, channels=len(mean),
                                             device=device)

    epoch_offset = 0

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def num_samples(self) -> int:
        """Samples an epoch draws over all processes (training drops the partial batch)."""
        if self.loader.drop_last:
            return len(self.loader) * self.batch_size
        return len(self.sampler) * self.sampler.num_replicas

    def batches(self, epoch: int):
        self.sampler.set_epoch(self.epoch_offset + epoch)
        yield from self.batches_of
