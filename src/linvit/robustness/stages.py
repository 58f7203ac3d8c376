"""`linvit corrupt`: a test split's fixed subset and its ImageNet-C-style corrupted copies, made
once per dataset and shared by every model of a grid (corrupting is slower than scoring).
`linvit robustness`: one model scored on the clean test split, on those copies, and on ImageNet
shift sets.

corrupted.safetensors holds uint8 images as the model sees them before normalisation: `clean`
(n, C, H, W), `labels` (n,) and one `<corruption>/<severity>` tensor per set.
"""
from __future__ import annotations

import json
import logging
import time
from importlib.metadata import PackageNotFoundError, version

import torch
from torch import nn

from linvit.data import get_dataset
from linvit.data.base import subset_indices
from linvit.data.loaders import TensorLoader, TorchLoader
from linvit.errors import ConfigError
from linvit.models import load_model
from linvit.models.tensor_files import load_tensors, save_tensors
from linvit.robustness.corruptions import corrupt_images
from linvit.robustness.shifts import IMAGENET_CLASSES, SHIFTS, ShiftDataset
from linvit.runs.evaluation import check_model_fits, evaluate, make_test_loader
from linvit.runs.stage import completed_metrics, start_run

log = logging.getLogger("linvit")
LIBRARY = "imagecorruptions-imaug"


def run_corrupt(cfg, out, replace: bool = False) -> dict:
    _, run = start_run(cfg, out, "corrupt", replace)
    if run.finished:
        return completed_metrics(run)
    c = cfg.corruptions
    images, labels = uint8_test_split(cfg.data, c.samples)
    run.open(f"data {cfg.data.dataset}: {len(labels)} test images, {len(c.names)} corruptions "
             f"x {len(c.severities)} severities, {LIBRARY} {_library_version()}")
    tensors = {"clean": images, "labels": labels}
    start = time.perf_counter()
    for i, name in enumerate(c.names, 1):
        for severity in c.severities:
            tensors[f"{name}/{severity}"] = corrupt_images(images, name, severity, c.seed)
        log.info("[%d/%d] %s: %d severities, %.0f s so far", i, len(c.names), name,
                 len(c.severities), time.perf_counter() - start)
    meta = {"dataset": cfg.data.dataset, "names": json.dumps(c.names),
            "severities": json.dumps(c.severities)}
    save_tensors(run.path / "corrupted.safetensors", tensors, meta)
    return run.finish({"samples": len(labels), "sets": len(tensors) - 2,
                       "corrupt_time_s": time.perf_counter() - start,
                       "library": f"{LIBRARY} {_library_version()}"})


def _library_version() -> str:
    try:
        return version(LIBRARY)
    except PackageNotFoundError:
        return "(version unknown)"


def uint8_test_split(data, samples: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split's fixed subset of `samples` images (data.base.subset_indices), uint8
    (n, C, H, W) as the model sees them before normalisation, and their labels."""
    ds = get_dataset(data.dataset)
    if not hasattr(ds, "arrays"):                        # folders: the evaluation transform
        return _folder_split(ds, data, samples)
    images, labels = ds.arrays(data.root, "test")        # in-memory datasets
    idx = subset_indices(len(labels), samples, field="corruptions.samples")
    return (images, labels) if idx is None else (images[idx], labels[idx])


def _folder_split(ds, data, samples) -> tuple[torch.Tensor, torch.Tensor]:
    """Only the subset's images are read (an ImageNet val split does not fit in memory)."""
    from timm.data import create_transform

    info = ds.info(data.root, data.img_size)
    folder = ds.folder(data.root, "test", create_transform(info.img_size, normalize=False))
    idx = subset_indices(len(folder), samples, field="corruptions.samples")
    pairs = [folder[i] for i in (range(len(folder)) if idx is None else idx.tolist())]
    return torch.stack([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])


def run_robustness(cfg, out, replace: bool = False) -> dict:
    rt, run = start_run(cfg, out, "robustness", replace)
    if run.finished:
        return completed_metrics(run)
    info = get_dataset(cfg.data.dataset).info(cfg.data.root, cfg.data.img_size)
    model = load_model(cfg.checkpoint).to(rt.device)
    check_model_fits(model.spec, info, cfg.data.dataset)
    corrupted = _read_corrupted(cfg, model.spec) if cfg.corrupted else None
    if cfg.shifts and model.spec.num_classes != IMAGENET_CLASSES:
        raise ConfigError(f"shifts: ImageNet shift sets score a {IMAGENET_CLASSES}-class "
                          f"ImageNet model; {cfg.checkpoint} has {model.spec.num_classes} classes")
    shift_loaders = {name: _shift_loader(name, root, model.spec, info, cfg, rt)
                     for name, root in cfg.shifts.items()}      # name -> (loader, counts)
    test = make_test_loader(cfg.data, rt)
    run.open(test.summary)
    metrics = {"top1": evaluate(model, test, rt, info.num_classes)["top1"]}
    if corrupted is not None:
        metrics["corruptions"] = _score_corruptions(model, corrupted, info, cfg.data, rt)
    if shift_loaders:
        metrics["shifts"] = {name: _score_shift(model, name, loader, rt)
                             for name, (loader, _) in shift_loaders.items()}
        metrics["shift_counts"] = {name: counts for name, (_, counts) in shift_loaders.items()}
        # the report reads files only: each set's title travels with its score
        metrics["shift_titles"] = {name: _shift_title(name, counts)
                                   for name, (_, counts) in shift_loaders.items()}
    return run.finish({**metrics, "checkpoint": cfg.checkpoint, "spec": model.spec.as_dict()})


def _read_corrupted(cfg, spec) -> dict:
    """The corrupted copy, checked whole before anything is scored: its dataset, metadata, and
    every set its metadata names, each the clean images' shape."""
    tensors, meta = load_tensors(cfg.corrupted)
    if meta.get("dataset") != cfg.data.dataset or "clean" not in tensors:
        raise ConfigError(f"corrupted: {cfg.corrupted} is not a corrupted copy of "
                          f"{cfg.data.dataset!r} (made from {meta.get('dataset')!r})")
    shape = (spec.in_chans, spec.img_size, spec.img_size)
    if tuple(tensors["clean"].shape[1:]) != shape:
        raise ConfigError(f"corrupted: its images are {tuple(tensors['clean'].shape[1:])}, the "
                          f"model takes {shape}")
    try:
        names, severities = json.loads(meta["names"]), json.loads(meta["severities"])
    except (KeyError, ValueError):
        names = severities = None
    if not (isinstance(names, list) and isinstance(severities, list) and names and severities):
        raise ConfigError(f"corrupted: {cfg.corrupted}'s metadata does not list its corruption "
                          "names and severities; make it again with `linvit corrupt`")
    wanted = ["labels", *(f"{n}/{s}" for n in names for s in severities)]
    missing = [k for k in wanted if k not in tensors]
    wrong = [k for k in wanted[1:] if k not in missing
             and tensors[k].shape != tensors["clean"].shape]
    if missing or wrong or tensors["labels"].shape[:1] != tensors["clean"].shape[:1]:
        raise ConfigError(f"corrupted: {cfg.corrupted} lacks or misshapes the sets its metadata "
                          f"names ({(missing + wrong + ['labels'])[0]!r}...); make it again with "
                          "`linvit corrupt`")
    return {"tensors": tensors, "names": names, "severities": severities}


def _score_corruptions(model, corrupted, info, data, rt) -> dict:
    """top-1 on the clean subset and on every set; means per corruption and over all sets."""
    tensors, labels = corrupted["tensors"], corrupted["tensors"]["labels"]

    def top1(images):
        loader = TensorLoader(images, labels, data.eval_batch_size, mean=info.mean, std=info.std,
                              shuffle=False, augment=False, rank=rt.rank, world=rt.world)
        return evaluate(model, loader, rt, info.num_classes)["top1"]

    sets = {name: {str(s): top1(tensors[f"{name}/{s}"]) for s in corrupted["severities"]}
            for name in corrupted["names"]}
    per_name = {name: sum(v.values()) / len(v) for name, v in sets.items()}
    return {"clean": top1(tensors["clean"]), "mean": sum(per_name.values()) / len(per_name),
            "per_corruption": per_name, "sets": sets, "samples": len(labels)}


class _Subset(nn.Module):
    """A 1000-class model scored on a class subset's logits (ImageNet-A/R)."""

    def __init__(self, model: nn.Module, indices: list[int]):
        super().__init__()
        self.model = model
        self.register_buffer("indices", torch.tensor(indices), persistent=False)

    def forward(self, x):
        return self.model(x)[:, self.indices]


def _shift_loader(name, root, spec, info, cfg, rt) -> tuple[TorchLoader, dict]:
    """The set's loader, and how much of the set it scores: images, classes with an image,
    classes of the set."""
    from timm.data import create_transform

    from linvit.data.imagefolder import check_images

    transform = create_transform(spec.img_size, mean=info.mean, std=info.std)
    samples = SHIFTS[name].samples(root, partial=cfg.partial_shifts)
    have, of = SHIFTS[name].coverage(samples)
    check_images([path for path, _ in samples])
    loader = TorchLoader(ShiftDataset(samples, transform), cfg.data.eval_batch_size,
                         shuffle=False, rank=rt.rank, world=rt.world, workers=cfg.data.workers)
    return loader, {"images": len(samples), "classes": have, "of": of}


def _shift_title(name, counts) -> str:
    title = SHIFTS[name].title
    return title if counts["classes"] == counts["of"] else (
        f"{title} (partial: {counts['classes']}/{counts['of']} classes)")


def _score_shift(model, name, loader, rt) -> float:
    indices = SHIFTS[name].class_indices()
    scored = model if indices is None else _Subset(model, indices).to(rt.device)
    return evaluate(scored, loader, rt, len(indices) if indices else IMAGENET_CLASSES)["top1"]
