"""linvit's ImageFolder training loader against timm's own `create_loader`, side by side in one
run: images per second decoded and augmented (RandomResizedCrop, flip, a RandAugment policy,
normalisation) on a JPEG folder this script writes, at 224 px, medians of interleaved repeats.

    .venv/bin/python scripts/bench_loader.py [--images 512] [--workers 2] [--repeats 5]
                                             [--device cuda]

With --device cuda both loaders deliver to the GPU as they would in training: timm's with its
prefetcher (uint8 to the device, normalised there), linvit's through the same path
(`prefetch_to`); the timing then includes the copy to the device.

Prints each loader's median images/s (and per worker) and the ratio linvit / timm; the goal of
issue 34 is a ratio of at least 0.95 with the same augmentation. Measurements go to a dated page
under docs/, not here.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def write_folder(root: Path, images: int, classes: int = 8, side: int = 320) -> Path:
    """train/ and val/ of random JPEGs (ImageNet-like sizes, so decoding costs what it does)."""
    rng = np.random.default_rng(0)
    for split, n in (("train", images), ("val", classes)):
        for i in range(n):
            folder = root / split / f"class{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, (side, side + 40, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


def rate(batches) -> float:
    """Images per second over one pass of `batches`."""
    start, seen = time.perf_counter(), 0
    for images, _ in batches:
        seen += len(images)
    if torch.cuda.is_available():
        torch.cuda.synchronize()                  # the last copy to the device has landed
    return seen / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--policy", default="rand-m9-mstd0.5-inc1")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: batches go to the GPU")
    args = p.parse_args()
    from timm.data import ImageDataset, create_loader

    from linvit.data import get_dataset

    torch.set_num_threads(1)
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        root = write_folder(Path(tmp), args.images)
        ours = get_dataset("imagefolder").loader(
            str(root), "train", batch_size=args.batch, train=True, img_size=224,
            workers=args.workers, auto_augment=args.policy, prefetch_to=device if gpu else None)
        theirs = create_loader(
            ImageDataset(str(root / "train")), (3, 224, 224), args.batch, is_training=True,
            auto_augment=args.policy, num_workers=args.workers, use_prefetcher=gpu,
            device=device, persistent_workers=True)
        rate(ours.batches(0)), rate(theirs)                       # warm-up: workers start
        runs = {"linvit": [], "timm": []}
        for r in range(args.repeats):                            # interleaved
            runs["linvit"].append(rate(ours.batches(r + 1)))
            runs["timm"].append(rate(theirs))
    for name, values in runs.items():
        med = statistics.median(values)
        print(f"{name:7s} {med:8.1f} img/s ({med / max(args.workers, 1):.1f} per worker; "
              f"repeats {', '.join(f'{v:.0f}' for v in values)})")
    ratio = statistics.median(runs["linvit"]) / statistics.median(runs["timm"])
    print(f"ratio linvit / timm: {ratio:.3f} (goal >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
