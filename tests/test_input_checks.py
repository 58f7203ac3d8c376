"""Bad input gets one line naming the problem and exit status 2, before anything is written.

The float and operator-option cases are generated from the config dataclasses and the operator
registry, so a new field or option is covered on arrival.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
import types
import typing
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from linvit import cli
from linvit.attention import OPERATORS
from linvit.cli import stage_config
from linvit.config import load_config
from linvit.errors import ConfigError
from linvit.io import dumps, load_yaml, loads
from linvit.models import ModelSpec, create_vit, save_model
from linvit.stages import STAGES
from linvit.train.config import PretrainConfig

from conftest import one_error_line


def _strip_optional(tp):
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return inner[0] if len(inner) == 1 else tp
    return tp


def float_fields(cls, prefix: str = ""):
    """Dotted names of every float field of a config dataclass, recursively; float-valued
    mappings (loss weights) are entered with one of their keys."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _strip_optional(hints[f.name])
        if dataclasses.is_dataclass(tp):
            yield from float_fields(tp, f"{prefix}{f.name}.")
        elif tp is float:
            yield f"{prefix}{f.name}"
        elif typing.get_origin(tp) is dict and typing.get_args(tp)[1] is float:
            yield f"{prefix}{f.name}.attn_out_mse"
        elif typing.get_origin(tp) is list and typing.get_args(tp)[0] is float:
            yield f"{prefix}{f.name}"


STAGE_CONFIGS = {name: stage_config(name) for name in STAGES}
FLOAT_CASES = sorted({(stage_cls.__name__, name) for stage_cls in set(STAGE_CONFIGS.values())
                      for name in float_fields(stage_cls)})
CLASSES = {cls.__name__: cls for cls in STAGE_CONFIGS.values()}
VALID = {"DenseConfig": ["data.root=."]}


def test_the_generator_sees_every_kind_of_float_field():
    names = {name for _, name in FLOAT_CASES}
    assert {"optim.lr", "distill.temperature", "distill.losses.attn_out_mse", "kd.weight",
            "min_scale", "min_run_time", "models.min_run_time", "model.drop_path"} <= names


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf", "-1"])
@pytest.mark.parametrize("cls_name, field", FLOAT_CASES)
def test_every_float_field_must_be_finite_and_in_range(cls_name, field, value):
    with pytest.raises(ConfigError) as e:            # fields validated before it must be valid
        load_config(CLASSES[cls_name], None, [*VALID.get(cls_name, []), f"{field}={value}"])
    leaf = field.rsplit(".", 1)[-1]
    assert leaf in str(e.value)


@pytest.mark.parametrize("argv", [
    ["pretrain", "optim.lr=nan"], ["pretrain", "optim.weight_decay=.inf"],
    ["bench", "min_run_time=nan"], ["bench", "models.min_run_time=.nan"],
    ["make-scenes", "min_scale=nan"]])
def test_non_finite_values_are_refused_before_any_write(argv, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main([argv[0], "-o", str(out), *argv[1:]]) == 2
    assert "finite" in one_error_line(capsys, argv[0])
    assert not out.exists()


def test_strict_json_refuses_nan_both_ways():
    with pytest.raises(ValueError):
        dumps({"top1": float("nan")})
    with pytest.raises(ValueError):
        loads('{"top1": NaN}')


OPTION_CASES = [(op, name, default) for op, cls in OPERATORS.items()
                for name, default in cls.options.items()]


def _other_value(default):
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2                           # kernel sizes stay odd
    return default * 1.5


@pytest.mark.parametrize("operator, name, default", OPTION_CASES)
def test_every_declared_option_of_every_operator_reaches_the_built_module(operator, name,
                                                                          default):
    for value in (default, _other_value(default)):
        cfg = load_config(PretrainConfig, None, [f"model.operator={operator}",
                                                 f"model.operator_options.{name}={value}"])
        option = cfg.model.operator_options[name]
        assert type(option) is type(default) and option == value
        spec = ModelSpec("cpu96", operator, 10, 28, 1, cfg.model.operator_options)
        attn = create_vit(spec).blocks[0].attn
        assert getattr(attn, name) == value and type(getattr(attn, name)) is type(default)


@pytest.mark.parametrize("operator, name, default", OPTION_CASES)
def test_operator_options_of_the_wrong_type_or_range_are_refused(operator, name, default):
    bad = ["nan", "-1", "0", "[1]"] + (["2.5"] if isinstance(default, int) else [])
    for value in bad:
        with pytest.raises(ConfigError, match=f"model.operator_options: option {name}"):
            load_config(PretrainConfig, None, [f"model.operator={operator}",
                                               f"model.operator_options.{name}={value}"])


def test_a_patch_grid_that_does_not_tile_the_image_is_refused():
    with pytest.raises(ConfigError, match="not a multiple of deit_t's patch size 16"):
        load_config(PretrainConfig, None, ["model.size=deit_t"])           # 28 px images
    with pytest.raises(ValueError, match="pixel rows and columns would be dropped"):
        create_vit(ModelSpec("deit_t", "softmax", 10, 28, 1))


# --- every bad input: one line, exit status 2, no output folder -------------------------------
@pytest.fixture(scope="module")
def files(tmp_path_factory, mnist_root) -> dict:
    d = tmp_path_factory.mktemp("inputs")
    torch.manual_seed(0)
    save_model(create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1)), d / "teacher.safetensors")
    save_model(create_vit(ModelSpec("cpu96", "softmax", 5, 28, 1)), d / "teacher5.safetensors")
    nan = create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1))
    with torch.no_grad():
        nan.blocks[0].mlp.fc1.weight[0, 0] = float("nan")
    save_model(nan, d / "nan_teacher.safetensors")
    tensors = {"w": torch.zeros(2)}
    save_file(tensors, str(d / "foreign_meta.safetensors"), metadata={"linvit_spec": "{oops"})
    spec = json.dumps({"size": "huge", "operator": "softmax", "num_classes": 10, "img_size": 28,
                       "in_chans": 1})
    save_file(tensors, str(d / "bad_spec.safetensors"), metadata={"linvit_spec": spec})
    (d / "binary.yaml").write_bytes(b"\xff\xfe\x00\x81 binary")
    (d / "broken.yaml").write_text("optim: [1,\n")
    # were the duplicate taken, the last value would fail on its own: the test stays fast
    (d / "dupes.yaml").write_text("optim:\n  lr: 0.1\noptim:\n  lr: -1\n")

    class Evil:
        def __reduce__(self):
            return (Path.touch, (d / "PWNED",))
    (d / "evil.pth").write_bytes(pickle.dumps({"x": Evil()}, protocol=2))
    corrupt = d / "corrupt"
    corrupt.mkdir()
    for f in mnist_root.iterdir():
        (corrupt / f.name).write_bytes(f.read_bytes())
    (corrupt / "t10k-images-idx3-ubyte.gz").write_bytes(
        gzip.compress(b"\x00" * 64)[:20])                       # truncated gzip stream
    cifar = d / "cifar" / "cifar-10-batches-py"
    cifar.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        (cifar / name).write_bytes(pickle.dumps({b"data": Evil()}))
    _image_folder_with_a_bad_image(d / "images")
    return {"dir": d, "mnist": mnist_root}


def _image_folder_with_a_bad_image(root: Path) -> None:
    """train/ and val/ of 2 classes; val/b/2.png is text, val/b/3.png a PNG cut short."""
    from PIL import Image

    for split in ("train", "val"):
        for c in ("a", "b"):
            (root / split / c).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (20, 20), (60 * i, 0, 0)).save(root / split / c / f"{i}.png")
    (root / "val" / "b" / "2.png").write_text("not a png")
    cut = root / "val" / "b" / "3.png"
    cut.write_bytes(cut.read_bytes()[:40])


CASES = {
    "image that does not decode": (["pretrain", "data.dataset=imagefolder",
                                    "data.root={dir}/images", "data.img_size=16",
                                    "data.batch_size=2", "data.workers=0"],
                                   "val/b/2.png: not a readable image"),
    "layers out of range": (["distill", "teacher={dir}/teacher.safetensors", "data.root={mnist}",
                             "distill.layers=[0,99]"], "distill.layers: [99] outside 0..5"),
    "logit KD, other classes": (["finetune", "teacher={dir}/teacher5.safetensors",
                                 "init.strategy=copy_all", "kd.weight=0.5", "data.root={mnist}"],
                                "logit KD needs the same classes"),
    "distill logit KD, other classes": (
        ["distill", "teacher={dir}/teacher5.safetensors", "data.root={mnist}",
         "distill.losses={{logit_kd: 1.0}}"], "logit KD needs the same classes"),
    "end-to-end logit KD, other classes": (
        ["distill", "teacher={dir}/teacher5.safetensors", "data.root={mnist}",
         "distill.e2e_epochs=1"], "distill.e2e_losses.logit_kd: the teacher has"),
    "teacher holding NaN": (["init", "teacher={dir}/nan_teacher.safetensors",
                             "init.strategy=copy_mlp", "data.root={mnist}"],
                            "non-finite weights (NaN or inf) in 1 tensor(s): blocks.0.mlp.fc1"),
    "distilling from a teacher holding NaN": (
        ["distill", "teacher={dir}/nan_teacher.safetensors", "data.root={mnist}"],
        "non-finite weights (NaN or inf)"),
    "subset under one batch": (["pretrain", "data.root={mnist}", "data.train_subset=10",
                                "data.batch_size=64"], "make no batch"),
    "data under one batch": (["pretrain", "data.root={mnist}", "data.batch_size=1024"],
                             "0 training batches"),
    "scenes too small": (["make-scenes", "size=4"], "size: must be in [16, 4096]"),
    "scenes seed": (["make-scenes", "seed=-1"], "seed: must be in"),
    "run seed": (["pretrain", "run.seed=-3"], "run.seed: must be in"),
    "compile backend": (["pretrain", "data.root={mnist}", "run.compile=inductr"],
                        "unknown torch.compile backend 'inductr'"),
    "foreign metadata": (["evaluate", "checkpoint={dir}/foreign_meta.safetensors",
                          "data.root={mnist}"], "linvit model spec is not valid"),
    "bad model spec": (["evaluate", "checkpoint={dir}/bad_spec.safetensors", "data.root={mnist}"],
                       "unknown model size 'huge'"),
    "binary yaml": (["pretrain", "-c", "{dir}/binary.yaml"], "not a text file"),
    "malformed yaml": (["pretrain", "-c", "{dir}/broken.yaml"], "not valid YAML"),
    "duplicate keys": (["pretrain", "-c", "{dir}/dupes.yaml"], "duplicate key 'optim'"),
    "malformed override": (["pretrain", "optim.lr=[1,"], "not valid YAML"),
    "refused unpickling": (["import-teacher", "size=cpu96", "file={dir}/evil.pth",
                            "data.dataset=fashion_mnist"], "Unsupported global"),
    "corrupted dataset": (["pretrain", "data.root={dir}/corrupt"], "cannot be read"),
    "refused data pickle": (["pretrain", "data.dataset=cifar10", "data.root={dir}/cifar"],
                            "refusing to load"),
    "dense patch": (["segment", "checkpoint={dir}/teacher.safetensors", "data.root={dir}",
                     "data.img_size=48"], "not a multiple of 32"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_line_and_exit_2_before_any_write(case, files, tmp_path, capsys):
    argv, message = CASES[case]
    out = tmp_path / "out"
    argv = [a.format(**files) for a in argv]
    assert cli.main([argv[0], "-o", str(out), *argv[1:]]) == 2
    assert message in one_error_line(capsys, argv[0])
    assert not out.exists()
    assert not (files["dir"] / "PWNED").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_one_line(tmp_path, capsys):
    for stage in ("pretrain", "bench"):
        assert cli.main([stage, "-o", str(tmp_path / stage), "run.device=cuda"]) == 2
        assert "cuda" in one_error_line(capsys, stage)


def test_an_offline_timm_download_is_one_line(tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants as hub

    # no network (as here and on CI) and an empty cache; the hub reads its settings at import
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    root = tmp_path / "images"
    for split in ("train", "val"):
        (root / split / "a").mkdir(parents=True)
    out = tmp_path / "out"
    assert cli.main(["import-teacher", "-o", str(out), "size=deit_t", "data.img_size=32",
                     f"data.root={root}"]) == 2
    assert "pass file=" in one_error_line(capsys, "import-teacher")
    assert not out.exists()


def test_duplicate_yaml_keys_are_refused_at_any_depth():
    with pytest.raises(Exception, match="duplicate key 'lr'"):
        load_yaml("optim:\n  lr: 1\n  lr: 2\n")
    assert load_yaml("a: {b: 1}\nc: 2\n") == {"a": {"b": 1}, "c": 2}


def test_a_partial_nested_override_keeps_the_fields_own_defaults(files):
    """DistillConfig's optim defaults to 1 epoch without warm-up; `optim.lr=...` must not turn
    it into OptimCfg's 10 epochs."""
    from linvit.train.config import ImportConfig
    from linvit.transfer.config import DistillConfig

    cfg = load_config(DistillConfig, None, [f"teacher={files['dir']}/teacher.safetensors",
                                            "optim.lr=0.01"])
    assert (cfg.optim.lr, cfg.optim.epochs, cfg.optim.warmup_epochs) == (0.01, 1, 0)
    cfg = load_config(DistillConfig, None, [f"teacher={files['dir']}/teacher.safetensors",
                                            "distill.losses={attn_map_ce: 1.0}"])
    assert cfg.distill.losses == {"attn_map_ce": 1.0}       # replaces the default, not joins it
    assert load_config(ImportConfig, None, ["data.img_size=32"]).data.dataset == "imagefolder"


def test_a_subset_larger_than_its_split_and_a_negative_process_count_are_refused(
        tmp_path, mnist_root, capsys):
    """Neither is silently taken for something else (the whole split; one process)."""
    from linvit.models import ModelSpec, create_vit, save_model

    model = tmp_path / "m.safetensors"
    save_model(create_vit(ModelSpec("cpu96", "softmax", 10, 28, 1)), model)
    args = ["evaluate", "-o", str(tmp_path / "e"), f"checkpoint={model}", f"data.root={mnist_root}"]
    assert cli.main([*args, "data.test_subset=100000"]) == 2
    assert "data.test_subset: 100000 samples asked, the split has 256" in \
        one_error_line(capsys, "evaluate")
    assert not (tmp_path / "e").exists()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--nproc", "-3", *args])
    assert exit_.value.code == 2 and "not a count of processes" in capsys.readouterr().err


@pytest.mark.parametrize("operator, name, default",
                         [c for c in OPTION_CASES if type(c[2]) is int])
def test_an_absurd_int_option_is_refused_before_anything_is_allocated(operator, name, default):
    """A gate rank of 10^12 asks for hundreds of terabytes: refused by the config check (its
    layer's parameters counted on the meta device), not by an allocation failure mid-run."""
    from linvit.models.sizes import get_size
    from linvit.models.spec import MAX_LAYER_PARAMETERS, layer_parameters

    value = 10**12 + 1                                   # odd: a kernel size stays odd
    try:
        cfg = load_config(PretrainConfig, None, [f"model.operator={operator}",
                                                 f"model.operator_options.{name}={value}"])
    except ConfigError as e:
        assert "model" in str(e)
        return
    spec = ModelSpec("cpu96", operator, 10, 28, 1, cfg.model.operator_options)
    assert layer_parameters(spec, get_size("cpu96")) <= MAX_LAYER_PARAMETERS
