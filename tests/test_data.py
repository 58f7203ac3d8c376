"""Datasets and loaders: IDX reading, clear errors, deterministic and shardable batches."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from linvit.data import DATASETS, DatasetNotFound, get_dataset
from linvit.data.fashion_mnist import DEBIAN_ROOT
from linvit.data.loaders import TensorLoader

from conftest import synthetic_mnist


def test_idx_files_load_from_a_root_folder(mnist_root):
    images, labels = get_dataset("fashion_mnist").arrays(str(mnist_root), "train")
    expected_images, expected_labels = synthetic_mnist(512, 0)
    assert images.shape == (512, 1, 28, 28) and images.dtype == torch.uint8
    assert torch.equal(images[:, 0], torch.from_numpy(expected_images))
    assert torch.equal(labels, torch.from_numpy(expected_labels).long())


def test_torchvision_layout_is_found(mnist_root, tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for f in mnist_root.iterdir():
        (raw / f.name).symlink_to(f)
    images, _ = get_dataset("fashion_mnist").arrays(str(tmp_path), "test")
    assert len(images) == 256


@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10", "imagefolder"])
def test_missing_data_says_where_it_looked_and_how_to_install(name, tmp_path):
    ds = get_dataset(name)
    with pytest.raises(DatasetNotFound) as err:
        ds.loader(str(tmp_path / "nothing"), "train", batch_size=8, train=True)
    assert str(tmp_path / "nothing") in str(err.value)
    assert ds.install_hint.split()[0] in str(err.value)


def make_loader(**kw):
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 255, (100, 1, 8, 8), dtype=torch.uint8, generator=g)
    args = dict(mean=(0.5,), std=(0.25,), shuffle=True, augment=True, seed=3)
    return TensorLoader(images, torch.arange(100), 20, **{**args, **kw})


def test_epochs_are_deterministic_and_differ_from_each_other():
    loader = make_loader()
    a = [y for _, y in loader.batches(0)]
    b = [y for _, y in loader.batches(0)]
    c = [y for _, y in loader.batches(1)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_ranks_split_each_global_batch_exactly():
    whole = list(make_loader().batches(2))
    parts = [list(make_loader(rank=r, world=2).batches(2)) for r in range(2)]
    for i, (x, y) in enumerate(whole):
        torch.testing.assert_close(torch.cat([parts[0][i][0], parts[1][i][0]]), x)
        assert torch.equal(torch.cat([parts[0][i][1], parts[1][i][1]]), y)


def test_augmentation_shifts_and_flips_within_the_padding():
    images = torch.zeros(1, 1, 8, 8, dtype=torch.uint8)
    images[0, 0, 3, 3] = 255
    loader = TensorLoader(images.repeat(64, 1, 1, 1), torch.zeros(64, dtype=torch.long), 64,
                          mean=(0.0,), std=(1 / 255,), shuffle=True, augment=True, pad=2)
    x, _ = next(loader.batches(0))
    rows, cols = (x[:, 0] > 0).nonzero()[:, 1:].T
    assert rows.min() >= 1 and rows.max() <= 5 and len(rows) == 64    # every pixel survives
    assert cols.max() >= 4                                            # some flipped (7-3=4)


def test_every_dataset_has_an_install_hint():
    for name, ds in DATASETS.items():
        assert ds.install_hint, name


@pytest.mark.skipif(not Path(DEBIAN_ROOT).is_dir(), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_from_debian():
    info = get_dataset("fashion_mnist").info()
    images, labels = get_dataset("fashion_mnist").arrays(None, "test")
    assert images.shape == (10_000, 1, 28, 28) and info.num_classes == 10
    assert torch.bincount(labels).tolist() == [1000] * 10
