"""The model card (README.md) of an exported model, written from its run records
(linvit.export.records.gather): what it is, how it was made, what it scores, what it cost."""
from __future__ import annotations

import yaml

from linvit import __version__
from linvit.models.sizes import get_size

CITATION = """@misc{copy_same_distill_difference_2026,
  title  = {Copy the Same, Distill the Difference},
  year   = {2026},
  eprint = {2609.35745},
  archivePrefix = {arXiv}
}"""


def _front_matter(rec: dict, license: str) -> str:
    dataset = rec["config"].get("data", {}).get("dataset")
    meta = {"library_name": "timm", "license": license, "pipeline_tag": "image-classification",
            "tags": ["image-classification", "timm", "linvit",
                     f"linvit-{rec['metrics']['spec']['operator']}"]}
    if dataset:
        meta["datasets"] = [dataset]
    return "---\n" + yaml.safe_dump(meta, sort_keys=False) + "---\n"


def _what(rec: dict) -> list[str]:
    spec, metrics = rec["metrics"]["spec"], rec["metrics"]
    size = get_size(spec["size"])
    options = ", ".join(f"{k}={v}" for k, v in spec["operator_options"].items()) or "defaults"
    return ["## Model", "",
            "| | |", "|---|---|",
            f"| attention | `{spec['operator']}` ({options}) |",
            f"| architecture | timm VisionTransformer, size `{spec['size']}`: width "
            f"{size.width}, depth {size.depth}, {size.heads} heads, patch {size.patch_size} |",
            f"| parameters | {metrics['params']:,} |",
            f"| input | {spec['in_chans']} x {spec['img_size']} x {spec['img_size']} |",
            f"| classes | {spec['num_classes']} |",
            f"| made by | linvit's `{metrics['stage']}` stage; exported by linvit {__version__} |",
            ""]


def _teacher_line(rec: dict) -> str:
    teacher, origin = rec["teacher"], rec["origin"]
    if teacher is None:
        where = rec["config"].get("teacher")
        return f"- Teacher: `{where}` (its run folder is not here to describe it)" if where \
            else "- Teacher: none (this model is itself trained from scratch or imported)"
    m = teacher["metrics"]
    made = {"pretrain": "trained from scratch by linvit", "import-teacher": "imported",
            "probe": "imported, head trained", "select": "cut from a larger teacher"}
    text = (f"- Teacher: softmax `{m['spec']['size']}`, {made.get(m['stage'], m['stage'])}; "
            f"top-1 {m['top1']:.2f} on its test split")
    if origin:
        text += (f"; its weights descend from `{origin.get('source')}` "
                 f"(sha256 `{str(origin.get('sha256', '?'))[:16]}`)")
    return text


def _how(rec: dict) -> list[str]:
    lines = ["## How it was made", "", _teacher_line(rec)]
    copied, metrics, config = rec["copied"], rec["metrics"], rec["config"]
    if copied:
        s = copied["summary"]
        lines.append(f"- Initialisation: strategy `{copied['strategy']}`; tensors copied from "
                     f"the teacher: {s.get('teacher', 0)}, from the distilled student: "
                     f"{s.get('distilled', 0)}, new: {s.get('new', 0)} (groups copied: "
                     f"{', '.join(copied['copy_groups']) or 'none'}; distilled: "
                     f"{', '.join(copied['distilled_groups']) or 'none'}; every tensor with its "
                     "source in the run's copied.json)")
    if rec["distilled"]:
        d = rec["distilled"]
        losses = d["config"]["distill"]["losses"]
        lines.append(f"- Distillation: {d['metrics']['epochs']} epochs, losses "
                     f"{', '.join(f'{k} x {v}' for k, v in losses.items())}, groups trained: "
                     f"{', '.join(d['metrics'].get('trained_groups', []))}")
    optim = config.get("optim", {})
    if "epochs" in metrics:
        lines.append(f"- Training (`{metrics['stage']}`): {metrics['epochs']} epochs, "
                     f"{optim.get('opt')} at lr {optim.get('lr')}, on "
                     f"`{config.get('data', {}).get('dataset')}` "
                     f"({metrics.get('train_images', 0):,} training images seen)")
    return lines + [""]


def _results(rec: dict) -> list[str]:
    from linvit.render.tables import mean_ci

    m, config = rec["metrics"], rec["config"]
    data = config.get("data", {})
    split = data.get("evaluate_on", "test")
    lines = ["## Results", "", "| | top-1 | top-5 |", "|---|---:|---:|",
             f"| this model (seed {config.get('run', {}).get('seed')}), {m['eval_samples']:,} "
             f"{split} images of `{data.get('dataset')}` | {m['top1']:.2f} | {m['top5']:.2f} |"]
    seeds = [r for r in rec["seeds"] if r["top1"] is not None]
    if len(seeds) > 1:
        names = ", ".join(str(r["seed"]) for r in seeds)
        lines.append(f"| {len(seeds)} seeds of this cell ({names}), mean ± 95% CI | "
                     f"{mean_ci([r['top1'] for r in seeds])} | |")
    if rec["teacher"]:
        t = rec["teacher"]["metrics"]
        lines.append(f"| its softmax teacher | {t['top1']:.2f} | {t['top5']:.2f} |")
    return lines + [""]


def _cost(rec: dict) -> list[str]:
    rows = [("distillation", rec["distilled"]["metrics"])] if rec["distilled"] else []
    rows.append((rec["metrics"]["stage"], rec["metrics"]))
    lines = ["## Training cost", "", "| stage | images | training FLOPs | time (s) |",
             "|---|---:|---:|---:|"]
    total_images = total_flops = 0.0
    for name, m in rows:
        images, flops = m.get("train_images", 0), m.get("train_images", 0) * m.get(
            "train_flops_per_image", 0.0)
        total_images, total_flops = total_images + images, total_flops + flops
        lines.append(f"| {name} | {images:,} | {flops:.3g} | {m.get('train_time_s', 0):.0f} |")
    lines.append(f"| total | {int(total_images):,} | {total_flops:.3g} | |")
    if rec["teacher"] and rec["teacher"]["metrics"].get("train_images"):
        t = rec["teacher"]["metrics"]
        lines.append(f"| (the teacher's own {t['stage']}, not counted) | "
                     f"{t['train_images']:,} | "
                     f"{t['train_images'] * t.get('train_flops_per_image', 0.0):.3g} | "
                     f"{t.get('train_time_s', 0):.0f} |")
    env = rec["metrics"].get("env", {})
    return lines + ["", f"Measured on {env.get('cpu') or env.get('cuda_devices')} with torch "
                        f"{env.get('torch')} ({rec['metrics'].get('precision')}).", ""]


def _use(repo: str | None) -> list[str]:
    name = f"hf-hub:{repo}" if repo else "local-dir:PATH/TO/THIS/FOLDER"
    return ["## Use", "", "```python", "import linvit  # registers linvit's model with timm",
            "import timm", "", f'model = timm.create_model("{name}", pretrained=True).eval()',
            "config = timm.data.resolve_data_config({}, model=model)",
            "transform = timm.data.create_transform(**config)", "```", ""]


def model_card(rec: dict, license: str, repo: str | None = None) -> str:
    spec = rec["metrics"]["spec"]
    title = (f"# linvit {spec['operator']} ViT ({spec['size']}) on "
             f"{rec['config'].get('data', {}).get('dataset')}")
    body = [title, "", "A linear-attention Vision Transformer converted from a softmax ViT by "
            "linvit (copy the MLPs, distill the attention).",
            "", *_what(rec), *_how(rec), *_results(rec), *_cost(rec), *_use(repo),
            "## License", "", f"`{license}`; the teacher's weights keep their own license.", "",
            "## Citation", "", "```bibtex", CITATION, "```", ""]
    return _front_matter(rec, license) + "\n".join(body)
