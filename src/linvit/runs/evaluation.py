"""What every stage that trains or scores a model shares: loaders from a DataCfg, the check that a
model fits a dataset, progress bars and the evaluation pass (top-1/top-5, loss, per-class)."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from linvit.data import get_dataset
from linvit.errors import ConfigError
from linvit.runs.runtime import Runtime


def make_loaders(data_cfg, rt: Runtime, auto_augment: str | None = None, repeats: int = 1):
    """The training and test loaders; `auto_augment`: a timm policy for the training images
    (folder datasets), `repeats`: repeated augmentation (linvit.train.recipe)."""
    info = get_dataset(data_cfg.dataset).info(data_cfg.root, data_cfg.img_size)
    train = _loader(data_cfg, rt, "train", auto_augment, repeats)
    test = _loader(data_cfg, rt, "test")
    if len(train) == 0 or len(test) == 0:
        raise ConfigError(f"data: {data_cfg.dataset} gives {len(train)} training batches of "
                          f"{data_cfg.batch_size} and {len(test)} test batches; use a smaller "
                          "batch size or more data")
    train.summary = test.summary = (f"data {data_cfg.dataset}: {train.num_samples} train / "
                                    f"{test.num_samples} test samples, {info.num_classes} classes")
    return info, train, test


def make_test_loader(data_cfg, rt: Runtime):
    """The test split's loader alone (evaluation stages)."""
    test = _loader(data_cfg, rt, "test")
    test.summary = f"data {data_cfg.dataset}: {test.num_samples} test samples"
    return test


def _loader(data_cfg, rt: Runtime, split: str, auto_augment: str | None = None,
            repeats: int = 1):
    """The training loader (without the validation set, where one is held out), or the one that
    scores: the test split, or with evaluate_on: val the held-out validation set."""
    train = split == "train"
    policy = {"auto_augment": auto_augment} if auto_augment else {}
    if data_cfg.val_size is not None and (train or data_cfg.evaluate_on == "val"):
        policy["holdout"] = (data_cfg.val_size, data_cfg.val_seed, "rest" if train else "held")
        split = "train"
    if repeats > 1:
        policy["repeats"] = repeats
    if rt.device.type == "cuda" and get_dataset(data_cfg.dataset).prefetches:
        policy["prefetch_to"] = rt.device          # uint8 to the GPU, normalised there
    return get_dataset(data_cfg.dataset).loader(
        data_cfg.root, split, train=train, seed=rt.seed, rank=rt.rank, world=rt.world,
        img_size=data_cfg.img_size, workers=data_cfg.workers,
        batch_size=data_cfg.batch_size if train else data_cfg.eval_batch_size,
        subset=data_cfg.train_subset if train else data_cfg.test_subset, **policy)


def check_model_fits(spec, info, dataset: str) -> None:
    """A loaded model takes this dataset's images and classes, checked before any compute."""
    if (spec.num_classes, spec.img_size) != (info.num_classes, info.img_size):
        raise ConfigError(f"checkpoint: its model takes {spec.img_size} px images of "
                          f"{spec.num_classes} classes, dataset {dataset!r} has "
                          f"{info.img_size} px images of {info.num_classes} classes")


def progress(iterable, rt: Runtime, total: int, desc: str):
    return tqdm(iterable, total=total, desc=desc, disable=not (rt.progress and rt.is_main),
                mininterval=2.0, dynamic_ncols=True, leave=False)


@torch.no_grad()
def evaluate(model: nn.Module, loader, rt: Runtime, num_classes: int) -> dict:
    """Top-1/top-5 accuracy (%), cross-entropy, per-class accuracy, throughput, and how many
    images and classes were scored."""
    model.eval()
    k = min(5, num_classes)
    hits = torch.zeros(3, device=rt.device)                    # top1, topk, loss sum
    per_class = torch.zeros(2, num_classes, device=rt.device)  # correct, seen
    start = time.perf_counter()
    for images, labels in progress(loader.batches(0), rt, len(loader), "eval"):
        images, labels = images.to(rt.device), labels.to(rt.device)
        with rt.autocast():
            logits = model(images)
        logits = logits.float()
        topk = logits.topk(k, dim=-1).indices
        correct1 = topk[:, 0] == labels
        hits[0] += correct1.sum()
        hits[1] += (topk == labels[:, None]).any(-1).sum()
        hits[2] += F.cross_entropy(logits, labels, reduction="sum")
        per_class[0].index_add_(0, labels, correct1.float())
        per_class[1].index_add_(0, labels, torch.ones_like(labels, dtype=torch.float))
    elapsed = time.perf_counter() - start
    hits, per_class = rt.all_reduce_sum(hits), rt.all_reduce_sum(per_class)
    n = per_class[1].sum().item()
    return {
        "top1": 100 * hits[0].item() / n,
        f"top{k}" if k != 5 else "top5": 100 * hits[1].item() / n,
        "loss": hits[2].item() / n,
        "per_class_acc": (100 * per_class[0] / per_class[1].clamp_min(1)).tolist(),
        "eval_img_per_s": n / elapsed,
        "eval_samples": int(n),
        "eval_classes": int((per_class[1] > 0).sum().item()),     # classes with an image
    }
