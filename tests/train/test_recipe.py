"""DeiT's recipe from timm's parts (linvit.train.recipe): each part changes the batches or the
optimizer as timm documents, is off unless set, and is refused where it cannot apply."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from linvit.config import load_config
from linvit.errors import ConfigError
from linvit.models import ModelSpec, create_vit
from linvit.train.config import PretrainConfig
from linvit.train.recipe import AugCfg, batch_augment
from linvit.train.trainer import build_optimizer


def batch(n=8, classes=10):
    torch.manual_seed(0)
    return torch.randn(n, 1, 28, 28), torch.arange(n) % classes


def test_every_part_is_off_by_default():
    assert batch_augment(AugCfg(), 0.1, 10, "cpu") is None
    cfg = load_config(PretrainConfig, None, [])
    assert cfg.aug == AugCfg() and cfg.optim.layer_decay is None


def test_mixup_mixes_each_image_with_its_mirror_and_its_target_alike():
    """timm's batch Mixup: x' = lam x + (1 - lam) x.flip(0), targets mixed with the same lam
    and smoothed by the stage's label smoothing."""
    images, labels = batch()
    np.random.seed(0)
    mixed, targets = batch_augment(AugCfg(mixup=0.8), 0.1, 10, "cpu")(images.clone(), labels)
    lam = ((mixed - images.flip(0)) / (images - images.flip(0)))[0].median().item()
    assert 0 < lam < 1
    assert torch.allclose(mixed, lam * images + (1 - lam) * images.flip(0), atol=1e-5)
    off, on = 0.1 / 10, 1 - 0.1 + 0.1 / 10
    onehot = torch.full((8, 10), off).scatter_(1, labels[:, None], on)
    assert torch.allclose(targets, lam * onehot + (1 - lam) * onehot.flip(0), atol=1e-5)


def test_cutmix_pastes_a_box_and_random_erasing_erases_one():
    images, labels = batch()
    np.random.seed(0)                                          # a box of 36% of the image
    cut, targets = batch_augment(AugCfg(cutmix=1.0), 0.0, 10, "cpu")(images.clone(), labels)
    from_mirror = (cut == images.flip(0)) & (cut != images)
    assert from_mirror.any() and (cut == images).any()          # a box from the mirror image
    assert torch.allclose(targets.sum(1), torch.ones(8))
    share = from_mirror[0].float().mean().item()                # lam: the share left as it was
    assert targets[0, labels[0]].item() == pytest.approx(1 - share, abs=0.02)
    import random
    random.seed(0)
    erased, same = batch_augment(AugCfg(reprob=1.0), 0.0, 10, "cpu")(images.clone(), labels)
    assert torch.equal(same, labels)
    changed = (erased != images).flatten(1).float().mean(1)
    assert (changed > 0).all() and (changed < 1).all()          # a region of every image


def test_soft_targets_are_smoothed_once():
    from linvit.train.objectives import ClassificationObjective
    objective = ClassificationObjective(torch.nn.Identity(), label_smoothing=0.1)  # logits = input
    logits = torch.randn(4, 10)
    soft = torch.softmax(torch.randn(4, 10), -1)
    _, ce = objective.classify(logits, soft)
    expected = -(soft * torch.log_softmax(logits, -1)).sum(-1).mean()
    assert torch.allclose(ce, expected)


def test_layer_decay_scales_the_learning_rate_by_depth():
    cfg = load_config(PretrainConfig, None, ["optim.layer_decay=0.5"]).optim
    model = create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1))
    optimizer, _ = build_optimizer(model, cfg, 10)
    scales = sorted({g["lr_scale"] for g in optimizer.param_groups})
    depth = len(model.blocks)
    assert scales[0] == pytest.approx(0.5 ** (depth + 1)) and scales[-1] == 1.0
    plain, _ = build_optimizer(model, load_config(PretrainConfig, None, []).optim, 10)
    assert {g.get("lr_scale", 1.0) for g in plain.param_groups} == {1.0}


@pytest.mark.parametrize("override, message", [
    ("aug.auto_augment=rand-m9-mstd0.5-inc1", "timm's policies work on PIL images"),
    ("aug.auto_augment=random-crop", "not a timm policy string"),
    ("aug.mixup=-1", "aug.mixup"),
    ("aug.reprob=1.5", "aug.reprob"),
    ("aug.remode=blur", "aug.remode"),
    ("optim.layer_decay=1.5", "optim.layer_decay"),
])
def test_a_recipe_that_cannot_apply_is_refused_naming_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(PretrainConfig, None, [override])


def test_an_odd_batch_cannot_be_mixed():
    with pytest.raises(ConfigError, match="data.batch_size 63 is odd"):
        load_config(PretrainConfig, None, ["aug.mixup=0.8", "data.batch_size=63"])


def test_a_folder_dataset_s_training_transform_takes_the_policy(tmp_path):
    from PIL import Image

    from linvit.data import get_dataset
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
        Image.new("RGB", (40, 40)).save(tmp_path / split / "a" / "0.png")
    ds = get_dataset("imagefolder")
    train = ds.loader(str(tmp_path), "train", batch_size=1, train=True, img_size=32, workers=0,
                      auto_augment="rand-m9-mstd0.5-inc1")
    assert "RandAugment" in repr(train.loader.dataset.transform)
    plain = ds.loader(str(tmp_path), "train", batch_size=1, train=True, img_size=32, workers=0)
    assert "RandAugment" not in repr(plain.loader.dataset.transform)


def test_repeated_augmentation_shows_each_image_several_times_an_epoch_of_the_same_length():
    """DeiT's repeated augmentation: r differently augmented copies of an image per epoch, the
    epoch as long as before; under two processes the global batches are the same."""
    from linvit.data.loaders import TensorLoader

    images = (torch.arange(24 * 9) % 255).to(torch.uint8).view(24, 1, 3, 3).repeat(1, 1, 3, 3)
    labels = torch.arange(24)

    def epoch(repeats, rank=0, world=1):
        loader = TensorLoader(images, labels, 6, mean=(0.5,), std=(0.5,), shuffle=True,
                              augment=True, seed=3, rank=rank, world=world, repeats=repeats)
        return list(loader.batches(0))

    plain, repeated = epoch(1), epoch(3)
    assert len(plain) == len(repeated) == 4
    seen = torch.cat([y for _, y in repeated])
    assert len(seen) == 24 and len(set(seen.tolist())) == 8        # 8 images, 3 times each
    assert all(seen[i] == seen[i + 1] == seen[i + 2] for i in range(0, 24, 3))
    first = repeated[0][0][:3]
    assert not (torch.equal(first[0], first[1]) and torch.equal(first[1], first[2]))
    two = [epoch(3, rank, 2) for rank in (0, 1)]
    for b, (x, y) in enumerate(repeated):
        assert torch.equal(torch.cat([two[0][b][1], two[1][b][1]]), y)
        assert torch.equal(torch.cat([two[0][b][0], two[1][b][0]]), x)


def test_a_folder_dataset_repeats_through_timm_s_sampler(tmp_path):
    from PIL import Image
    from timm.data.distributed_sampler import RepeatAugSampler

    from linvit.data import get_dataset
    for split in ("train", "val"):
        for c in "ab":
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (40, 40)).save(tmp_path / split / c / f"{i}.png")
    loader = get_dataset("imagefolder").loader(str(tmp_path), "train", batch_size=2, train=True,
                                               img_size=32, workers=0, repeats=3)
    assert isinstance(loader.sampler, RepeatAugSampler) and len(list(loader.sampler)) == 6


def test_two_processes_draw_one_process_s_samples_under_repeated_augmentation(tmp_path):
    """DeiT's sampler under 2 ranks: together they draw the images one process draws in an
    epoch, each image 3 times; another seed, another order (timm seeds by epoch alone)."""
    from collections import Counter

    from PIL import Image

    from linvit.data import get_dataset
    for split in ("train", "val"):
        for c in "abc":
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (8, 8)).save(tmp_path / split / c / f"{i}.png")

    def drawn(seed, epoch, rank=0, world=1):
        loader = get_dataset("imagefolder").loader(
            str(tmp_path), "train", batch_size=4, train=True, img_size=8, workers=0, repeats=3,
            seed=seed, rank=rank, world=world)
        loader.sampler.set_epoch(loader.epoch_offset + epoch)
        return list(loader.sampler)

    for epoch in (0, 1):
        one = drawn(0, epoch)
        two = drawn(0, epoch, 0, 2) + drawn(0, epoch, 1, 2)
        assert len(one) == 12 and Counter(one) == Counter(two)
        assert set(Counter(one).values()) <= {3}, Counter(one)        # whole groups of 3
    assert drawn(0, 0) != drawn(1, 0) and drawn(0, 0) != drawn(0, 1)


def test_randaugment_at_full_magnitude_posterizes_to_black_instead_of_raising():
    """DeiT's policy draws magnitude 10 now and then; timm then asks Pillow for 0 bits, which
    Pillow 13 refuses inside a loader worker. linvit installs a posterize that keeps 0 bits."""
    from PIL import Image
    from timm.data.auto_augment import AugmentOp

    from linvit.data.imagefolder import pillow_safe_posterize

    pillow_safe_posterize()
    image = Image.new("RGB", (8, 8), (200, 100, 50))
    out = AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=10)(image)
    assert out.getextrema() == ((0, 0), (0, 0), (0, 0))
    assert AugmentOp("PosterizeIncreasing", prob=1.0, magnitude=5)(image).getextrema() != \
        out.getextrema()
