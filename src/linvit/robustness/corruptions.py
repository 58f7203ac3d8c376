"""ImageNet-C-style corruptions, made on the fly by a maintained library.

The corruption functions are Hendrycks & Dietterich's (ImageNet-C, arXiv 1903.12261) as packaged by
`imagecorruptions`, installed from its `imagecorruptions-imaug` fork (Apache-2.0, same module
name): the 1.1.2 release breaks on NumPy 2 and current scikit-image.

How this differs from the official ImageNet-C files, which is why tables call it "ImageNet-C-style":
- ImageNet-C is a fixed set of JPEG files made once from the resized ImageNet validation images;
  here the same functions run on the test split of whatever dataset a cell uses, at the size the
  model sees, with their random draws (noise, frost crop, motion angle, ...) seeded here.
- Accuracies are comparable between the cells of a grid, not with published ImageNet-C numbers
  (and there is no AlexNet-normalised mCE: "relative to the teacher" plays that part).

Two adaptations to small images, both outside the corruption functions:
- the library refuses sides under 32 px: smaller images are upscaled (bicubic) to 32 px,
  corrupted and scaled back (Fashion-MNIST's 28 px);
- grayscale images go through the library as RGB (its own conversion) and come back as their
  ITU-R 601 luma.

Deterministic: image i of a set draws from numpy's global generator seeded by (seed, corruption,
severity, i), and the two functions that take their own seed (glass_blur, impulse_noise) get one
from the same sequence, so a corrupted image does not depend on batch, order or process.
"""
from __future__ import annotations

import numpy as np
import torch

# The library's functions ("all"), held equal to imagecorruptions.get_corruption_names("all") by a
# test. Listed here so that configs are checked without importing the library (numba, skimage).
LIBRARY_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
    "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform",
    "pixelate", "jpeg_compression", "speckle_noise", "gaussian_blur", "spatter", "saturate")
COMMON = LIBRARY_CORRUPTIONS[:15]          # ImageNet-C's 15 (the other 4 are its "validation" set)
SEVERITIES = (1, 2, 3, 4, 5)
MIN_SIDE = 32                              # the library's minimum image side
SEEDED_BY_ARGUMENT = ("glass_blur", "impulse_noise")   # they ignore numpy's global generator
LUMA = (0.299, 0.587, 0.114)


def corrupt_images(images: torch.Tensor, name: str, severity: int, seed: int,
                   first_index: int = 0) -> torch.Tensor:
    """uint8 images (N, C, H, W), C in {1, 3} -> the same images corrupted, uint8, same shape.
    Image j is image number first_index + j of its set (it picks the random draws)."""
    from imagecorruptions import corrupt

    if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
        raise ValueError(f"expected uint8 images (N, 1 or 3, H, W), got {images.dtype} "
                         f"{tuple(images.shape)}")
    if name not in LIBRARY_CORRUPTIONS or severity not in SEVERITIES:
        raise ValueError(f"unknown corruption {name!r} or severity {severity}")
    out = np.empty(tuple(images.shape), dtype=np.uint8)
    state = np.random.get_state()                  # restored: callers' numpy draws are untouched
    try:
        for j, image in enumerate(images.numpy()):
            draws = np.random.SeedSequence(
                [seed, LIBRARY_CORRUPTIONS.index(name), severity, first_index + j])
            own, global_seed = draws.generate_state(2)
            np.random.seed(int(global_seed))
            kwargs = {"seed": int(own)} if name in SEEDED_BY_ARGUMENT else {}
            hwc = _enlarge(image.transpose(1, 2, 0))
            corrupted = corrupt(hwc, severity=severity, corruption_name=name, **kwargs)
            out[j] = _restore(corrupted, image.shape).transpose(2, 0, 1)
    finally:
        np.random.set_state(state)
    return torch.from_numpy(out)


def _enlarge(hwc: np.ndarray) -> np.ndarray:
    """(H, W, C) uint8 with both sides >= MIN_SIDE, as the library asks; grayscale as (H, W)."""
    from PIL import Image

    h, w, c = hwc.shape
    image = hwc[..., 0] if c == 1 else hwc
    if min(h, w) >= MIN_SIDE:
        return np.ascontiguousarray(image)
    scale = MIN_SIDE / min(h, w)
    size = (max(MIN_SIDE, round(w * scale)), max(MIN_SIDE, round(h * scale)))
    return np.asarray(Image.fromarray(image).resize(size, Image.BICUBIC))


def _restore(corrupted: np.ndarray, chw: tuple) -> np.ndarray:
    """The library's (h, w, 3) output back to the input's (H, W, C): luma for one channel, and
    the original size (bicubic) where it was enlarged."""
    from PIL import Image

    c, h, w = chw
    rgb = np.asarray(corrupted, dtype=np.float32)
    if c == 1:
        rgb = (rgb @ np.asarray(LUMA, dtype=np.float32))[..., None]
    if rgb.shape[:2] != (h, w):
        planes = [np.asarray(Image.fromarray(rgb[..., i]).resize((w, h), Image.BICUBIC))
                  for i in range(rgb.shape[-1])]
        rgb = np.stack(planes, axis=-1)
    return np.clip(np.rint(rgb), 0, 255).astype(np.uint8)
