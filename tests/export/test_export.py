"""`linvit export`: a converted model leaves linvit as a timm model (local-dir), with a config.json
in timm's conventions and a model card whose numbers are the run's own."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from hub_standin import HubStandIn
from safetensors.torch import load_file, save_file

from linvit import cli
from linvit.data.fashion_mnist import CLASSES
from linvit.io import read_json
from linvit.models.checkpoint import load_model
from linvit.render.tables import mean_ci

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chain(mnist_root, tmp_path_factory):
    """teacher -> distill -> finetune at seeds 0 and 1 (cells/seed0, cells/seed1), tiny."""
    root = tmp_path_factory.mktemp("chain")
    common = [f"data.root={mnist_root}", "data.batch_size=64", "data.train_subset=128",
              "optim.warmup_epochs=0",
              "data.test_subset=64", "run.progress=false", "model.size=cpu64"]
    teacher = root / "teacher"
    assert cli.main(["pretrain", "-o", str(teacher), "optim.epochs=1", *common]) == 0
    student = common[:-1] + [f"teacher={teacher}/model.safetensors", "model.operator=linear"]
    assert cli.main(["distill", "-o", str(root / "distill"), *student]) == 0
    for seed in (0, 1):
        assert cli.main(["finetune", "-o", str(root / "cells" / f"seed{seed}"), *student,
                         f"distilled={root}/distill/model.safetensors", "optim.epochs=1",
                         "init.strategy=copy_mlp+distill", f"run.seed={seed}"]) == 0
    out = root / "export"
    assert cli.main(["export", str(root / "cells" / "seed0"), "-o", str(out)]) == 0
    return root, out


def timm_in_a_fresh_process(name: str, x: torch.Tensor, folder, env: dict | None = None):
    """`timm.create_model(name, pretrained=True)` after `import linvit` in a new interpreter: its
    logits on `x`, and what it printed (the model's class and timm's data config)."""
    save_file({"x": x}, folder / "x.safetensors")
    script = (
        "import sys, torch, linvit, timm\n"
        "from safetensors.torch import load_file, save_file\n"
        "torch.set_num_threads(1)\n"
        f"model = timm.create_model('{name}', pretrained=True).eval()\n"
        f"x = load_file('{folder}/x.safetensors')['x']\n"
        "with torch.no_grad():\n"
        f"    save_file({{'y': model(x)}}, '{folder}/y.safetensors')\n"
        "print(type(model).__name__, timm.data.resolve_data_config({}, model=model))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return load_file(folder / "y.safetensors")["y"], run.stdout


def test_timm_rebuilds_the_export_in_a_fresh_process_with_the_same_logits(chain, tmp_path):
    root, out = chain
    torch.manual_seed(0)
    x = torch.randn(4, 1, 28, 28)
    got, printed = timm_in_a_fresh_process(f"local-dir:{out}", x, tmp_path)
    assert "LinvitViT" in printed and "'input_size': (1, 28, 28)" in printed
    with torch.no_grad():
        want = load_model(root / "cells" / "seed0" / "model.safetensors").eval()(x)
    assert torch.allclose(got, want, atol=1e-6)


def test_config_json_is_timms_with_the_linvit_spec_and_the_label_names(chain):
    root, out = chain
    config = json.loads((out / "config.json").read_text())
    metrics = read_json(root / "cells" / "seed0" / "metrics.json")
    assert config["architecture"] == "linvit_vit" and config["num_classes"] == 10
    assert config["model_args"]["linvit_spec"] == metrics["spec"]
    assert config["label_names"] == list(CLASSES)
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [1, 28, 28] and cfg["mean"] == [0.2860] and cfg["std"] == [0.3530]
    # the same tensors for linvit's own loader, the spec in their metadata
    assert load_model(out / "model.safetensors").spec.as_dict() == metrics["spec"]


def test_the_model_card_names_its_numbers_from_the_runs_files(chain):
    root, out = chain
    card = (out / "README.md").read_text()
    runs = {name: read_json(root / name / "metrics.json")
            for name in ("teacher", "distill", "cells/seed0", "cells/seed1")}
    cell, distill = runs["cells/seed0"], runs["distill"]
    assert card.startswith("---\nlibrary_name: timm\nlicense: mit\n")
    assert f"| {cell['top1']:.2f} | {cell['top5']:.2f} |" in card
    seeds = mean_ci([runs["cells/seed0"]["top1"], runs["cells/seed1"]["top1"]])
    assert f"2 seeds of this cell (0, 1), mean ± 95% CI | {seeds} |" in card
    assert f"its softmax teacher | {runs['teacher']['top1']:.2f}" in card
    copied = read_json(root / "cells" / "seed0" / "copied.json")["summary"]
    assert (f"tensors copied from the teacher: {copied['teacher']}, from the distilled student: "
            f"{copied['distilled']}") in card
    for name, m in (("distillation", distill), ("finetune", cell)):
        flops = m["train_images"] * m["train_flops_per_image"]
        assert f"| {name} | {m['train_images']:,} | {flops:.3g} |" in card
    total = cell["train_images"] + distill["train_images"]
    flops = sum(m["train_images"] * m["train_flops_per_image"] for m in (cell, distill))
    assert f"| total | {total:,} | {flops:.3g} |" in card
    assert "arXiv" in card and 'timm.create_model("local-dir:' in card


def test_an_unfinished_or_changed_run_is_refused_before_anything_is_written(chain, tmp_path,
                                                                           capsys):
    root, _ = chain
    seed1 = root / "cells" / "seed1"
    (seed1 / "copied.json").write_text((seed1 / "copied.json").read_text() + " ")
    out = tmp_path / "never"
    assert cli.main(["export", str(seed1), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("linvit export: error: source:") and "copied.json has changed" in err
    assert not out.exists()
    assert cli.main(["export", str(tmp_path), "-o", str(out)]) == 2
    assert "holds no finished linvit run" in capsys.readouterr().err


def test_push_to_hub_uploads_the_folder_and_timm_loads_it_back_by_hf_hub(chain, tmp_path,
                                                                          monkeypatch):
    """Through a local stand-in for the Hub's HTTP API: the pushed files are the export's, byte
    for byte; timm's `hf-hub:` loader, pointed at the stand-in, rebuilds the same model."""
    from linvit.export.stage import HF_FILES

    root, _ = chain
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with HubStandIn() as hub:
        out = tmp_path / "pushed"
        assert cli.main(["export", str(root / "cells" / "seed0"), "--push-to-hub",
                         "lab/linear-vit", "-o", str(out), f"hub_endpoint={hub.endpoint}"]) == 0
        pushed = hub.repos["lab/linear-vit"]
        assert sorted(pushed) == sorted(HF_FILES)
        assert all(pushed[name] == (out / name).read_bytes() for name in HF_FILES)
        hub_record = read_json(out / "metrics.json")["hub"]
        assert hub_record["commit"] == hub.commits["lab/linear-vit"]
        assert "hf-hub:lab/linear-vit" in (out / "README.md").read_text()
        torch.manual_seed(0)
        x = torch.randn(2, 1, 28, 28)
        env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(tmp_path / "hf"),
               "HF_HUB_DISABLE_TELEMETRY": "1"}
        got, _ = timm_in_a_fresh_process("hf-hub:lab/linear-vit", x, tmp_path, env)
    with torch.no_grad():
        want = load_model(root / "cells" / "seed0" / "model.safetensors").eval()(x)
    assert torch.allclose(got, want, atol=1e-6)


def test_a_refused_push_fails_the_export_and_leaves_no_result(chain, tmp_path, monkeypatch):
    root, _ = chain
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    with HubStandIn() as hub:
        hub.refuse_commits = True
        out = tmp_path / "refused"
        assert cli.main(["export", str(root / "cells" / "seed0"), "-o", str(out),
                         "push_to_hub=lab/linear-vit", f"hub_endpoint={hub.endpoint}"]) != 0
    assert hub.repos.get("lab/linear-vit", {}) == {}
    assert not (out / "metrics.json").exists()
