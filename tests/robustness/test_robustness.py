"""Robustness: the corruption suite (library names, determinism, small and grayscale images), the
ImageNet shift sets' labels and logit subsets, and the corrupt / robustness stages end to end,
their scores held to the model's own predictions computed here."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from linvit import cli
from linvit.data import get_dataset
from linvit.data.loaders import TorchLoader
from linvit.errors import DataError, DatasetNotFound
from linvit.io import read_json
from linvit.models import save_model
from linvit.robustness import corruptions as C
from linvit.robustness.shifts import SHIFTS, ShiftDataset
from linvit.robustness.stages import _score_shift
from linvit.runs.runtime import Runtime

from conftest import make_model, perturb

imagecorruptions = pytest.importorskip("imagecorruptions")


def test_names_are_the_library_s():
    assert tuple(imagecorruptions.get_corruption_names("all")) == C.LIBRARY_CORRUPTIONS
    assert tuple(imagecorruptions.get_corruption_names("common")) == C.COMMON


def gray_images(n=6, side=28, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 1, side, side), generator=g, dtype=torch.uint8)


@pytest.mark.parametrize("name", C.COMMON)
def test_every_corruption_is_deterministic_per_image_and_keeps_the_shape(name):
    """Image i's corruption depends on (seed, name, severity, i) only, not on its batch."""
    images = gray_images()
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    whole = C.corrupt_images(images, name, 3, seed=7)
    part = C.corrupt_images(images[2:5], name, 3, seed=7, first_index=2)
    assert whole.shape == images.shape and whole.dtype == torch.uint8
    assert torch.equal(whole[2:5], part)
    assert np.array_equal(np.random.get_state()[1], before)     # callers' numpy state kept
    assert not torch.equal(whole, images)


def test_seeds_and_severities_change_the_draws_and_rgb_images_stay_rgb():
    rgb = torch.randint(0, 256, (3, 3, 40, 36), generator=torch.Generator().manual_seed(1),
                        dtype=torch.uint8)
    a = C.corrupt_images(rgb, "gaussian_noise", 2, seed=0)
    assert a.shape == rgb.shape
    assert not torch.equal(a, C.corrupt_images(rgb, "gaussian_noise", 2, seed=1))
    severe = C.corrupt_images(rgb, "gaussian_noise", 5, seed=0)
    noise = [(x.float() - rgb.float()).abs().mean() for x in (a, severe)]
    assert noise[1] > noise[0]


def test_small_grayscale_images_come_back_as_luma_at_their_size():
    """`brightness` lifts a flat gray image evenly: it must come back flat, brighter, one
    channel and 28 px (the library works on >= 32 px RGB)."""
    flat = torch.full((2, 1, 28, 28), 100, dtype=torch.uint8)
    out = C.corrupt_images(flat, "brightness", 1, seed=0)
    assert out.shape == flat.shape
    assert (out.float() - out.float().mean()).abs().max() <= 1      # still flat
    assert 100 < out.float().mean() < 160


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="uint8"):
        C.corrupt_images(torch.zeros(1, 1, 28, 28), "contrast", 1, seed=0)
    with pytest.raises(ValueError, match="unknown corruption"):
        C.corrupt_images(gray_images(1), "rain", 1, seed=0)


# --- shift sets ----------------------------------------------------------------------------------
def write_images(root, folders, per_folder=2):
    for i, name in enumerate(folders):
        (root / name).mkdir(parents=True)
        for j in range(per_folder):
            Image.new("RGB", (8, 8), (i % 256, j, 0)).save(root / name / f"{j}.png")


def test_imagenet_v2_labels_are_the_folder_numbers_not_their_string_order(tmp_path):
    write_images(tmp_path, ["0", "2", "10", "100"], per_folder=1)
    labels = [label for _, label in SHIFTS["imagenet_v2"].samples(tmp_path, partial=True)]
    assert labels == [0, 2, 10, 100]                # a string sort would label them 0, 1, 2, 3


def test_a_shift_set_with_part_of_its_classes_is_refused_unless_asked_then_counted(tmp_path):
    shift = SHIFTS["imagenet_r"]
    write_images(tmp_path, list(shift.label_of())[:2])
    with pytest.raises(DatasetNotFound, match="images of 2 of its 200 classes"):
        shift.samples(tmp_path)
    samples = shift.samples(tmp_path, partial=True)
    assert len(samples) == 4 and shift.coverage(samples) == (2, 200)


def test_a_and_r_use_timm_s_200_class_subsets(tmp_path):
    for name in ("imagenet_a", "imagenet_r"):
        shift = SHIFTS[name]
        indices, synsets = shift.class_indices(), list(shift.label_of())
        assert len(indices) == len(synsets) == 200 and len(set(indices)) == 200
    with pytest.raises(Exception, match="not classes of the set"):
        write_images(tmp_path, ["n99999999"])
        SHIFTS["imagenet_a"].samples(tmp_path)


class OneHotOfTheImage(torch.nn.Module):
    """1000-class logits with a 1 at the ImageNet index a test image encodes in its value."""

    def forward(self, x):
        logits = torch.zeros(len(x), 1000)
        logits[torch.arange(len(x)), x.long()] = 1.0
        return logits


def test_a_subset_model_is_scored_on_the_subset_s_logits(tmp_path):
    """Images of ImageNet-A's folder k encode the 1000-class index timm maps k to: scoring through
    the subset's logits is then 100% right, and anything else misses."""
    shift = SHIFTS["imagenet_a"]
    wnids = list(shift.label_of())[:5]
    write_images(tmp_path, wnids)
    samples = shift.samples(tmp_path, partial=True)
    index_of = shift.class_indices()

    def encode(label):                   # the image of class `label`: its ImageNet index
        return lambda image: torch.tensor(index_of[label])

    class Encoded(ShiftDataset):
        def __getitem__(self, i):
            return encode(self.items[i][1])(None), self.items[i][1]

    loader = TorchLoader(Encoded(samples, transform=None), 4, shuffle=False, workers=0)
    rt = Runtime(torch.device("cpu"), progress=False)
    assert _score_shift(OneHotOfTheImage(), "imagenet_a", loader, rt) == 100.0
    assert _score_shift(OneHotOfTheImage(), "imagenet_sketch", loader, rt) < 100.0


# --- the stages ----------------------------------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path, tiny_spec):
    path = tmp_path / "model.safetensors"
    save_model(perturb(make_model(tiny_spec)), path)
    return path


def test_corrupt_then_robustness_scores_the_model_s_own_predictions(tmp_path, mnist_root,
                                                                     checkpoint):
    corrupted = tmp_path / "corrupted"
    data = [f"data.root={mnist_root}"]
    assert cli.main(["corrupt", "-o", str(corrupted), *data, "corruptions.samples=40",
                     "corruptions.names=[contrast, gaussian_noise]",
                     "corruptions.severities=[1, 5]"]) == 0
    out = tmp_path / "robust"
    assert cli.main(["robustness", "-o", str(out), *data, f"checkpoint={checkpoint}",
                     f"corrupted={corrupted}/corrupted.safetensors"]) == 0
    metrics = read_json(out / "metrics.json")["corruptions"]
    assert set(metrics["sets"]) == {"contrast", "gaussian_noise"}
    assert set(metrics["sets"]["contrast"]) == {"1", "5"}

    # the same numbers from the model's predictions on images corrupted here
    from linvit.models import load_model
    model = load_model(checkpoint).eval()
    ds = get_dataset("fashion_mnist")
    info = ds.info(str(mnist_root))
    images, labels = ds.arrays(str(mnist_root), "test")
    idx = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))[:40].sort()
    images, labels = images[idx.values], labels[idx.values]
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) * 255 for v in (info.mean, info.std))

    def top1(x):
        with torch.no_grad():
            return 100 * (model((x.float() - mean) / std).argmax(-1) == labels).float().mean()
    assert metrics["clean"] == pytest.approx(top1(images).item())
    severe = C.corrupt_images(images, "gaussian_noise", 5, seed=0)
    assert metrics["sets"]["gaussian_noise"]["5"] == pytest.approx(top1(severe).item())
    assert metrics["mean"] == pytest.approx(
        np.mean([v for s in metrics["sets"].values() for v in s.values()]))
    saved = json.loads(json.dumps(metrics))
    assert saved["samples"] == 40


@pytest.mark.parametrize("damage, message", [
    (lambda t, m: t.pop("contrast/5"), "lacks or misshapes the sets its metadata names "
                                       "('contrast/5'"),
    (lambda t, m: t.update({"contrast/1": t["clean"][:1].clone()}), "misshapes the sets"),
    (lambda t, m: m.update(names="contrast"), "metadata does not list its corruption names"),
    (lambda t, m: m.pop("severities"), "metadata does not list"),
])
def test_a_damaged_corrupted_copy_is_refused_in_one_line_before_scoring(
        tmp_path, mnist_root, checkpoint, capsys, damage, message):
    from linvit.models.tensor_files import save_tensors
    tensors = {"clean": torch.zeros(4, 1, 28, 28, dtype=torch.uint8),
               "labels": torch.zeros(4, dtype=torch.long)}
    tensors.update({f"contrast/{s}": tensors["clean"].clone() for s in (1, 5)})
    meta = {"dataset": "fashion_mnist", "names": '["contrast"]', "severities": "[1, 5]"}
    damage(tensors, meta)
    save_tensors(tmp_path / "c.safetensors", tensors, meta)
    out = tmp_path / "robust"
    assert cli.main(["robustness", "-o", str(out), f"data.root={mnist_root}",
                     f"checkpoint={checkpoint}", f"corrupted={tmp_path}/c.safetensors"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (out / "metrics.json").exists()


def test_robustness_refuses_a_corrupted_copy_of_another_dataset(tmp_path, mnist_root, checkpoint):
    from linvit.models.tensor_files import save_tensors
    other = tmp_path / "other.safetensors"
    save_tensors(other, {"clean": torch.zeros(1, 1, 28, 28, dtype=torch.uint8),
                         "labels": torch.zeros(1, dtype=torch.long)},
                 {"dataset": "mnist5k", "names": "[]", "severities": "[]"})
    out = tmp_path / "robust"
    assert cli.main(["robustness", "-o", str(out), f"data.root={mnist_root}",
                     f"checkpoint={checkpoint}", f"corrupted={other}"]) == 2
    assert not (out / "metrics.json").exists()


@pytest.mark.parametrize("override, message", [
    ("corruptions.names=[rain]", "rain"),
    ("corruptions.severities=[0]", "severities"),
    ("corruptions.names=[]", "empty"),
])
def test_corrupt_config_errors_name_the_field(tmp_path, override, message, capsys):
    assert cli.main(["corrupt", "-o", str(tmp_path / "c"), override]) == 2
    assert message in capsys.readouterr().err


def test_shift_names_folders_and_model_classes_are_checked_before_compute(tmp_path, mnist_root,
                                                                    checkpoint, capsys):
    args = ["robustness", "-o", str(tmp_path / "r"), f"data.root={mnist_root}",
            f"checkpoint={checkpoint}"]
    assert cli.main([*args, f"shifts={{imagenet_v2: {tmp_path}}}"]) == 2
    assert "1000-class" in capsys.readouterr().err
    assert cli.main([*args, f"shifts={{imagenet_c: {tmp_path}}}"]) == 2
    assert "imagenet_c" in capsys.readouterr().err
    assert not (tmp_path / "r" / "metrics.json").exists()
    with pytest.raises(DatasetNotFound, match="folder not found"):
        SHIFTS["imagenet_a"].samples(tmp_path / "missing")


# --- the report step -----------------------------------------------------------------------------
def robustness_record(key, status="ok", clean=80.0, subset=82.0, sets=None, shifts=None):
    sets = sets or {"contrast": {"1": 70.0, "5": 40.0}, "gaussian_noise": {"1": 60.0, "5": 30.0}}
    metrics = {"top1": clean, "corruptions": {"clean": subset, "sets": sets, "samples": 40,
                                              "mean": float(np.mean([v for s in sets.values()
                                                                     for v in s.values()]))}}
    if shifts:                              # as the stage records them: scores and titles
        metrics.update(shifts=shifts, shift_titles={k: SHIFTS[k].title for k in shifts})
    return {"kind": "robustness", "key": key, "status": status,
            "metrics": metrics if status == "ok" else None}


def test_report_table_has_the_teacher_first_differences_to_it_and_missing_cells(tmp_path):
    from linvit.report.grid import Grid
    from linvit.report.robustness import write_robustness
    cell = {"dataset": "d", "size": "s", "operator": "linear", "init": "random", "loss": "none"}
    cells = [{**cell, "seed": 0}, {**cell, "seed": 1}, {**cell, "init": "copy_mlp", "seed": 0}]
    records = [
        robustness_record({"dataset": "d", "size": "s", "operator": "softmax",
                           "init": "teacher", "loss": "none", "seed": None},
                          shifts={"imagenet_a": 5.0}),
        robustness_record(cells[0], sets={"contrast": {"1": 50.0, "5": 20.0},
                                          "gaussian_noise": {"1": 40.0, "5": 10.0}}),
        robustness_record(cells[1], sets={"contrast": {"1": 52.0, "5": 22.0},
                                          "gaussian_noise": {"1": 42.0, "5": 12.0}})]
    grid = Grid(cells, "out", {"init": ["random", "copy_mlp"], "operator": ["linear", "softmax"],
                               "loss": ["none", "out"]}, [])
    table = write_robustness(records, grid, tmp_path, tmp_path, tmp_path / "robustness.md")
    rows = {idx[-1]: row for idx, row in zip(table.index, table.to_dict("records"))}
    assert list(rows) == ["softmax teacher", "linear random", "linear copy_mlp"]
    teacher, student = rows["softmax teacher"], rows["linear random"]
    assert teacher["corruptions"] == "50.00" and teacher["vs teacher"] == "0.00"
    assert student["corruptions"].startswith("31.00 ± ")            # two seeds: 30 and 32
    assert student["vs teacher"].startswith("-19.00 ± ")
    kept = 100 * 30.0 / 82.0, 100 * 32.0 / 82.0
    assert student["kept %"].startswith(f"{np.mean(kept):.2f}")
    assert rows["linear copy_mlp"]["clean"] == "missing"
    assert teacher["ImageNet-A"] == "5.00" and student["ImageNet-A"] == "missing"
    section = (tmp_path / "robustness.md").read_text()
    assert "ImageNet-C-style" in section and "2 types x 2 severities" in section
    assert (tmp_path / "robustness.png").stat().st_size > 0
    for ext in ("csv", "md", "tex"):
        assert (tmp_path / f"robustness.{ext}").is_file()


def test_a_partial_shift_set_s_counts_and_title_say_how_much_was_scored(tmp_path, tiny_spec):
    from types import SimpleNamespace

    from linvit.config import DataCfg
    from linvit.robustness.stages import _shift_loader, _shift_title

    write_images(tmp_path, list(SHIFTS["imagenet_a"].label_of())[:3])
    info = get_dataset("fashion_mnist").info()
    rt = Runtime(torch.device("cpu"), progress=False)
    cfg = SimpleNamespace(partial_shifts=False, data=DataCfg(workers=0))
    with pytest.raises(DatasetNotFound, match="images of 3 of its 200 classes"):
        _shift_loader("imagenet_a", tmp_path, tiny_spec, info, cfg, rt)
    cfg.partial_shifts = True
    _, counts = _shift_loader("imagenet_a", tmp_path, tiny_spec, info, cfg, rt)
    assert counts == {"images": 6, "classes": 3, "of": 200}
    assert _shift_title("imagenet_a", counts) == "ImageNet-A (partial: 3/200 classes)"
    assert _shift_title("imagenet_a", {**counts, "classes": 200}) == "ImageNet-A"
    bad = next(tmp_path.rglob("*.png"))
    bad.write_text("not an image")
    with pytest.raises(DataError, match=f"{bad}: not a readable image"):   # before the loader
        _shift_loader("imagenet_a", tmp_path, tiny_spec, info, cfg, rt)
