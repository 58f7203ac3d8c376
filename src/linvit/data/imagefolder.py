"""Any ImageFolder tree in ImageNet layout: ROOT/train/<class>/*.jpg and ROOT/val/<class>/*.jpg.

The classes are train/'s folders, sorted; every split is labelled by class name against them (a
val/ that lacks a class must not shift the labels of the classes after it). A split that lacks a
class, or has one train/ does not, is refused: a score on part of the classes is not the split's.

Transforms are timm's (RandAugment-free defaults: random resized crop + flip for training, resize
and centre crop for evaluation) at data.img_size, with ImageNet normalisation.
"""
from __future__ import annotations

from pathlib import Path

from linvit.data.base import DataInfo
from linvit.data.loaders import TorchLoader
from linvit.errors import DataError, DatasetNotFound

SPLIT_DIRS = {"train": "train", "test": "val"}
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
DEFAULT_IMG_SIZE = 224


class ImageFolderDataset:
    install_hint = ("Point data.root at a folder with train/ and val/ subfolders, one folder per "
                    "class.")
    prefetches = True            # loader() takes prefetch_to (uint8 batches normalised there)

    def _split_dir(self, root, split) -> Path:
        if root is None:
            raise DatasetNotFound(f"imagefolder needs data.root. {self.install_hint}")
        d = Path(root) / SPLIT_DIRS[split]
        if not d.is_dir():
            raise DatasetNotFound(f"imagefolder split {split!r} not found at {d}. "
                                  f"{self.install_hint}")
        return d

    def split_size(self, root, split) -> int | None:
        """Images in a split's class folders, counted without decoding (None: no folder here)."""
        where = Path(root) / SPLIT_DIRS[split] if root else None
        if where is None or not where.is_dir():
            return None
        return sum(1 for d in where.iterdir() if d.is_dir() for f in d.iterdir()
                   if f.suffix.lower() in IMAGE_SUFFIXES)

    def image_size(self, img_size: int | None = None) -> int:
        return img_size or DEFAULT_IMG_SIZE

    def normalisation(self) -> tuple[tuple, tuple]:
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        return tuple(IMAGENET_DEFAULT_MEAN), tuple(IMAGENET_DEFAULT_STD)

    def info(self, root=None, img_size=None) -> DataInfo:
        from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

        classes = sorted(p.name for p in self._split_dir(root, "train").iterdir() if p.is_dir())
        return DataInfo(len(classes), 3, self.image_size(img_size), tuple(IMAGENET_DEFAULT_MEAN),
                        tuple(IMAGENET_DEFAULT_STD), tuple(classes))

    def loader(self, root, split, *, batch_size, train, subset=None, seed=0, rank=0, world=1,
               img_size=None, workers=4, auto_augment=None, repeats=1, prefetch_to=None,
               holdout=None):
        """`prefetch_to`: a device to which batches go as uint8 and are normalised there, each
        copied while the one before is used (timm's prefetcher; for a GPU)."""
        import torch
        from timm.data import create_transform

        info = self.info(root, img_size)
        if auto_augment and train:
            pillow_safe_posterize()
        transform = create_transform(info.img_size, is_training=train, mean=info.mean,
                                     std=info.std, auto_augment=auto_augment if train else None,
                                     use_prefetcher=prefetch_to is not None)
        ds = self.folder(root, split, transform)
        from linvit.data.base import split_indices

        idx = split_indices(len(ds), subset, holdout,
                            f"data.{'train' if train else 'test'}_subset")
        paths = [path for path, _ in ds.samples]
        if idx is not None:
            ds = torch.utils.data.Subset(ds, idx.tolist())
            paths = [paths[i] for i in idx.tolist()]
        check_images(paths)
        prefetch = None if prefetch_to is None else (prefetch_to, info.mean, info.std)
        return TorchLoader(ds, batch_size, shuffle=train, seed=seed, rank=rank, world=world,
                           workers=workers, repeats=repeats if train else 1, prefetch=prefetch)

    def folder(self, root, split, transform):
        """The split as a torchvision ImageFolder whose labels are the training classes' indices,
        by class name (torchvision would number the split's own folders)."""
        from torchvision.datasets import ImageFolder

        classes = list(self.info(root).class_names)
        where = self._split_dir(root, split)
        found = sorted(p.name for p in where.iterdir() if p.is_dir())
        unknown = [c for c in found if c not in classes]
        if unknown:
            raise DatasetNotFound(f"{where}: {len(unknown)} class folders are not classes of "
                                  f"train/, e.g. {unknown[0]!r} (the model knows only train/'s)")
        missing = [c for c in classes if c not in found]
        if missing:
            raise DatasetNotFound(f"{where}: has no folder for {len(missing)} of the "
                                  f"{len(classes)} classes of train/, e.g. {missing[0]!r}; a "
                                  "score on part of the classes would pass for the split's")
        index = {c: i for i, c in enumerate(classes)}

        class ByTrainClasses(ImageFolder):
            def find_classes(self, directory):
                return classes, index

        try:
            return ByTrainClasses(str(where), transform=transform, loader=open_image)
        except FileNotFoundError as e:       # a class folder without an image
            raise DatasetNotFound(f"{where}: {e}") from None


def open_image(path):
    """An image file as RGB; one that does not decode is a DataError naming it (one line, exit
    status 2), not a traceback from a loader worker."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise DataError(f"{path}: not a readable image ({type(e).__name__}: {e})") from None


def check_images(paths, threads: int = 16) -> None:
    """Every image a run will read opens as an image, checked before the run writes anything: a
    file that is not an image, or whose header or (PNG) chunks are damaged, is a DataError naming
    it and how many of the files are bad. Headers only, read by threads (the work is file reads):
    a file whose header reads but whose pixel data is cut short still fails in the run, with the
    same one-line error from `open_image`."""
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image, UnidentifiedImageError

    def problem(path) -> str | None:
        try:
            with Image.open(path) as image:
                image.verify()
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
            return f"{path}: not a readable image ({type(e).__name__}: {e})"
        return None

    with ThreadPoolExecutor(max_workers=threads) as pool:
        bad = [p for p in pool.map(problem, paths, chunksize=256) if p]
    if bad:
        more = f" ({len(bad)} of the {len(paths)} images are unreadable)" if len(bad) > 1 else ""
        raise DataError(bad[0] + more)


def pillow_safe_posterize() -> None:
    """timm's RandAugment asks Pillow to posterize to 0 bits at full magnitude ("inc1" policies,
    e.g. DeiT's rand-m9-mstd0.5-inc1, whenever the magnitude noise reaches 10), which Pillow 13
    refuses with a ValueError in a loader worker. 0 bits keep nothing: the black image older
    Pillow returned. Installed in timm's table of operations, idempotently."""
    from PIL import ImageOps
    from timm.data import auto_augment

    def posterize(img, bits_to_keep, **__):
        if bits_to_keep >= 8:
            return img
        if bits_to_keep <= 0:
            return img.point([0] * 256 * len(img.getbands()))
        return ImageOps.posterize(img, bits_to_keep)

    for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
        if name in auto_augment.NAME_TO_OP:
            auto_augment.NAME_TO_OP[name] = posterize
