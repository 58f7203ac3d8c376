"""Embedded dense data: scenes composed from real Fashion-MNIST sprites.

No real segmentation or detection set installs offline, so linvit composes one: each scene is a
ground with 1-4 Fashion-MNIST objects pasted at random scale, colour and position; later objects
occlude earlier ones, and every mask is the *visible* part (holes inside a garment filled). The
ground is either `textured` (a few "stuff" regions of procedural texture, three stuff classes) or
`black` (one background class: garments on black, as in the sprites' own images). Training
scenes use training-split sprites, validation scenes test-split sprites. The set is a pure
function of (sprites, seed, settings), and its validation half is hashed (MANIFEST.json) so a
changed generator cannot silently change the benchmark.

Written twice over the same PNG images:
    ADE20K layout   images/{training,validation}/*.png, annotations/{training,validation}/*.png
                    (label map: 0..S-1 ground classes, S..S+9 things; no ignore label)
    COCO layout     coco/instances_{train,val}.json with RLE masks (categories 1..10 = things)
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import numpy as np
from PIL import Image

from linvit.config import in_range
from linvit.data import fashion_mnist, get_dataset
from linvit.errors import ConfigError, DataError
from linvit.io import read_json, write_json

STUFF = ("stripes", "checker", "speckle")
THINGS = fashion_mnist.CLASSES          # the sprites' classes, in the order of their labels
CLASSES = STUFF + THINGS                # of textured scenes
# the ground's classes (label-map values 0..S-1) for each kind of ground
GROUND_CLASSES = {"textured": STUFF, "black": ("background",)}
SPRITE_THRESHOLD = 40          # sprite pixels above this (of 255) belong to the object
MIN_VISIBLE = 16               # objects with fewer visible pixels get no instance annotation


@dataclass(frozen=True)
class SceneSpec:
    """The scene settings: the one definition of their fields, defaults and ranges. The set is
    a pure function of them (and the sprites); `linvit make-scenes` takes them as its config
    (linvit.dense.config.ScenesConfig) and MANIFEST.json records them."""
    size: int = 64             # scene side in px (scenes are square)
    train: int = 800           # training scenes (of training-split sprites)
    val: int = 200             # validation scenes (of test-split sprites; hashed in MANIFEST.json)
    max_objects: int = 4       # objects per scene: drawn from 1..max_objects
    min_scale: float = 0.35    # sprite side / scene side
    max_scale: float = 0.75    # the largest sprite side / scene side (min_scale: the smallest)
    seed: int = 0              # draws the training scenes; the validation scenes use seed + 1
    # textured (three "stuff" classes of procedural texture) or black (one background class)
    background: Literal["textured", "black"] = "textured"

    def validate(self, p: str = "") -> None:
        # sprites are at least 8 px and placed at most a quarter outside the scene
        in_range("size", self.size, 16, 4096)
        in_range("train", self.train, 1, 10**7)
        in_range("val", self.val, 1, 10**7)
        in_range("max_objects", self.max_objects, 1, 64)
        in_range("seed", self.seed, 0, 2**63 - 2)          # the val split uses seed + 1
        if not 0 < self.min_scale <= self.max_scale <= 1:
            raise ConfigError("min_scale/max_scale: need 0 < min_scale <= max_scale <= 1")
        if self.background not in GROUND_CLASSES:
            raise ConfigError(f"background: {self.background!r} is not one of: "
                              f"{', '.join(GROUND_CLASSES)}")

    @property
    def classes(self) -> tuple[str, ...]:
        """The label map's classes: the ground's, then the things'."""
        return GROUND_CLASSES[self.background] + THINGS

    def scene_spec(self) -> SceneSpec:
        """Just the scene settings (of a config that extends them): what MANIFEST.json holds."""
        return SceneSpec(**{f.name: getattr(self, f.name) for f in fields(SceneSpec)})


def fill_holes(mask: np.ndarray) -> np.ndarray:
    """Background pixels not connected to the border (dark parts inside a garment) become
    object: a 4-connected flood fill from the border, by repeated dilation."""
    outside = np.zeros_like(mask)
    outside[[0, -1], :] = ~mask[[0, -1], :]
    outside[:, [0, -1]] |= ~mask[:, [0, -1]]
    while True:
        grown = outside.copy()
        grown[1:] |= outside[:-1]
        grown[:-1] |= outside[1:]
        grown[:, 1:] |= outside[:, :-1]
        grown[:, :-1] |= outside[:, 1:]
        grown &= ~mask
        if (grown == outside).all():
            return ~outside
        outside = grown


def texture(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """(size, size, 3) uint8 texture of stuff class `kind`, random colours and frequency."""
    yy, xx = np.mgrid[:size, :size]
    a, b = rng.integers(30, 226, (2, 3))
    period = int(rng.integers(3, 9))
    if kind == 0:
        pattern = ((xx * np.cos(rng.uniform(0, np.pi)) + yy * np.sin(rng.uniform(0, np.pi)))
                   // period % 2).astype(bool)
    elif kind == 1:
        pattern = ((xx // period + yy // period) % 2).astype(bool)
    else:
        pattern = rng.random((size, size)) < rng.uniform(0.2, 0.5)
    return np.where(pattern[..., None], a, b).astype(np.uint8)


def background(size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Two to three stuff regions split by random lines; returns image and stuff label map."""
    yy, xx = np.mgrid[:size, :size]
    labels = np.full((size, size), int(rng.integers(len(STUFF))), np.uint8)
    for _ in range(int(rng.integers(1, 3))):
        angle, offset = rng.uniform(0, 2 * np.pi), rng.uniform(-0.3, 0.3) * size
        side = (xx - size / 2) * np.cos(angle) + (yy - size / 2) * np.sin(angle) > offset
        labels[side] = int(rng.integers(len(STUFF)))
    image = np.zeros((size, size, 3), np.uint8)
    for kind in np.unique(labels):
        region = labels == kind
        image[region] = texture(int(kind), size, rng)[region]
    return image, labels


def compose(sprites: np.ndarray, sprite_labels: np.ndarray, spec: SceneSpec,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """One scene: image (H, W, 3), semantic map (H, W), visible instances [{category, mask}]."""
    size = spec.size
    if spec.background == "textured":
        image, semantic = background(size, rng)
    else:                                                  # black, all of label 0
        image, semantic = np.zeros((size, size, 3), np.uint8), np.zeros((size, size), np.uint8)
    grounds = len(GROUND_CLASSES[spec.background])
    owner = np.full((size, size), -1, np.int32)            # which object a pixel shows
    placed = []
    for k in range(int(rng.integers(1, spec.max_objects + 1))):
        i = int(rng.integers(len(sprites)))
        side = max(8, int(size * rng.uniform(spec.min_scale, spec.max_scale)))
        sprite = np.asarray(Image.fromarray(sprites[i]).resize((side, side), Image.BILINEAR))
        y, x = (int(v) for v in rng.integers(-side // 4, size - 3 * side // 4, 2))
        ys, xs = slice(max(y, 0), min(y + side, size)), slice(max(x, 0), min(x + side, size))
        crop = sprite[ys.start - y:ys.stop - y, xs.start - x:xs.stop - x]
        alpha = fill_holes(sprite > SPRITE_THRESHOLD)[ys.start - y:ys.stop - y,
                                                       xs.start - x:xs.stop - x]
        colour = rng.integers(60, 256, 3)
        shaded = (crop[..., None].astype(np.float32) / 255 * colour).astype(np.uint8)
        image[ys, xs][alpha] = shaded[alpha]
        owner[ys, xs][alpha] = k
        semantic[ys, xs][alpha] = grounds + int(sprite_labels[i])
        placed.append(int(sprite_labels[i]))
    instances = [{"category": c, "mask": owner == k} for k, c in enumerate(placed)]
    return image, semantic, [o for o in instances if o["mask"].sum() >= MIN_VISIBLE]


def coco_annotation(mask: np.ndarray, category: int, image_id: int, ann_id: int) -> dict:
    from pycocotools import mask as mask_utils

    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    x, y, w, h = mask_utils.toBbox(rle).tolist()
    return {"id": ann_id, "image_id": image_id, "category_id": category + 1, "iscrowd": 0,
            "segmentation": {"size": rle["size"], "counts": rle["counts"].decode()},
            "area": float(mask_utils.area(rle)), "bbox": [x, y, w, h]}


def write_split(root: Path, split: str, sprites, sprite_labels, n: int, spec: SceneSpec,
                seed: int) -> None:
    ade = {"train": "training", "val": "validation"}[split]
    img_dir, ann_dir = root / "images" / ade, root / "annotations" / ade
    img_dir.mkdir(parents=True, exist_ok=True)
    ann_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    coco = {"images": [], "annotations": [],
            "categories": [{"id": i + 1, "name": n_} for i, n_ in enumerate(THINGS)]}
    for idx in range(n):
        image, semantic, instances = compose(sprites, sprite_labels, spec, rng)
        name = f"{split}_{idx:05d}.png"
        Image.fromarray(image).save(img_dir / name)
        Image.fromarray(semantic).save(ann_dir / name)
        coco["images"].append({"id": idx + 1, "file_name": f"images/{ade}/{name}",
                               "width": spec.size, "height": spec.size})
        for obj in instances:
            coco["annotations"].append(coco_annotation(obj["mask"], obj["category"], idx + 1,
                                                       len(coco["annotations"]) + 1))
    write_json(root / "coco" / f"instances_{split}.json", coco)


def split_digest(root: Path, split: str) -> str:
    ade = {"train": "training", "val": "validation"}[split]
    h = hashlib.sha256()
    for folder in (root / "images" / ade, root / "annotations" / ade):
        for f in sorted(folder.iterdir()):
            h.update(f.name.encode() + f.read_bytes())
    h.update((root / "coco" / f"instances_{split}.json").read_bytes())
    return h.hexdigest()


def make_scenes(out: str | Path, train_sprites, val_sprites, spec: SceneSpec) -> dict:
    """Write the whole set; `*_sprites` are (uint8 images (N, 28, 28), labels (N,))."""
    root = Path(out)
    write_split(root, "train", *train_sprites, spec.train, spec, spec.seed)
    write_split(root, "val", *val_sprites, spec.val, spec, spec.seed + 1)
    manifest = {"spec": asdict(spec), "classes": list(spec.classes),
                "stuff": list(GROUND_CLASSES[spec.background]), "things": list(THINGS),
                "val_sha256": split_digest(root, "val")}
    write_json(root / "MANIFEST.json", manifest)
    return manifest


def verify_scenes(root: str | Path) -> dict:
    """The manifest, after checking the validation half still hashes to what was written."""
    root = Path(root)
    manifest_path = root / "MANIFEST.json"
    if not manifest_path.is_file():
        raise DataError(f"{root}: no MANIFEST.json; generate scenes with `linvit make-scenes`")
    try:
        manifest = read_json(manifest_path)
        actual = split_digest(root, "val")
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"{root}: not a complete scenes folder ({e}); regenerate it") from None
    if actual != manifest.get("val_sha256"):
        raise DataError(f"{root}: validation scenes changed (sha256 {actual[:12]} != "
                         f"{str(manifest.get('val_sha256'))[:12]}); regenerate them")
    return manifest


def run_make_scenes(cfg, out, replace: bool = False) -> dict:
    """`linvit make-scenes`: sprites from Fashion-MNIST's train and test splits."""
    from linvit.runs.stage import completed_metrics, prepare_run

    run = prepare_run(cfg, out, "make-scenes", replace)
    if run.finished:
        return completed_metrics(run)
    ds = get_dataset("fashion_mnist")
    sprites = {s: tuple(t.numpy() for t in ds.arrays(cfg.sprites_root, s))
               for s in ("train", "test")}
    run.open()
    spec = cfg.scene_spec()
    manifest = make_scenes(out, (sprites["train"][0][:, 0], sprites["train"][1]),
                           (sprites["test"][0][:, 0], sprites["test"][1]), spec)
    return run.finish({"val_sha256": manifest["val_sha256"], "train": spec.train,
                       "val": spec.val, "classes": manifest["classes"]})
