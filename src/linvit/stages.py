"""The one table of stages: what each `linvit <stage>` does, where its code and config live, and the
files its run folder holds. The CLI's parser, `stage_config`, the run folders' markers
(linvit.runs.rundir) and the workflow's code-dependency map (linvit.workflow.deps) all read it.
Only names here: nothing is imported until a stage runs."""
from __future__ import annotations

from typing import NamedTuple


class Stage(NamedTuple):
    help: str
    entry: str          # "module:function", called as function(cfg, out, replace=...)
    config: str         # "module:Class", the stage's config dataclass
    outputs: tuple = ()  # what a finished run leaves in its folder (checksummed in metrics.json)
    scratch: tuple = ()  # what it may write there on the way (resume state, work folders)
    optional: tuple = ()  # outputs written when the config asks for them (checksummed then)
    positional: str | None = None  # the config field a first argument without "=" sets


# The folders run.loggers write a training run's live curves to (linvit.runs.loggers: a test holds
# the two lists together): the run's own, replaced with it.
CURVES = ("tensorboard", "wandb", "mlruns")

STAGES = {
    "pretrain": Stage(
        "train a model from scratch (the softmax teacher, or any operator)",
        "linvit.train.stages:run_pretrain", "linvit.train.config:PretrainConfig",
        outputs=("model.safetensors", "train.jsonl"),
        scratch=("checkpoint.safetensors", *CURVES),
        optional=("model_ema.safetensors",)
    ),
    "import-teacher": Stage(
        "turn timm ViT weights (local file or timm cache) into a linvit teacher",
        "linvit.train.stages:run_import", "linvit.train.config:ImportConfig",
        outputs=("model.safetensors",)
    ),
    "distill": Stage(
        "layer-wise attention distillation from a softmax teacher",
        "linvit.transfer.stages:run_distill", "linvit.transfer.config:DistillConfig",
        outputs=("model.safetensors", "train.jsonl", "student_init.json", "trained.json"),
        scratch=("checkpoint.safetensors", "init_metrics.json", "init_quality.json", *CURVES),
        optional=("model_ema.safetensors",)
    ),
    "init": Stage(
        "build a student with an init strategy and write it with its copied.json",
        "linvit.transfer.stages:run_init", "linvit.transfer.config:FinetuneConfig",
        outputs=("model.safetensors", "copied.json"),
        scratch=("init_metrics.json",)
    ),
    "finetune": Stage(
        "initialise a student with an init strategy, then fine-tune it",
        "linvit.transfer.stages:run_finetune", "linvit.transfer.config:FinetuneConfig",
        outputs=("model.safetensors", "train.jsonl", "copied.json"),
        scratch=("checkpoint.safetensors", "init_metrics.json", *CURVES),
        optional=("model_ema.safetensors",)
    ),
    "probe": Stage(
        "train a head for an imported teacher without one (self-supervised): linear probe or "
        "fine-tune",
        "linvit.train.stages:run_probe", "linvit.train.config:ProbeConfig",
        outputs=("model.safetensors", "train.jsonl"),
        scratch=("checkpoint.safetensors", *CURVES),
        optional=("model_ema.safetensors",)
    ),
    "select": Stage(
        "cut a smaller softmax teacher out of a larger one (weight selection: first blocks, "
        "evenly spaced channels and heads)",
        "linvit.transfer.stages:run_select", "linvit.transfer.config:SelectConfig",
        outputs=("model.safetensors", "selected.json")
    ),
    "evaluate": Stage(
        "evaluate a checkpoint on a dataset's test split",
        "linvit.train.stages:run_evaluate", "linvit.train.config:EvaluateConfig"
    ),
    "corrupt": Stage(
        "a test split's fixed subset and its ImageNet-C-style corrupted copies "
        "(imagecorruptions), shared by a grid's robustness runs",
        "linvit.robustness.stages:run_corrupt", "linvit.robustness.config:CorruptConfig",
        outputs=("corrupted.safetensors",)
    ),
    "robustness": Stage(
        "score a checkpoint on the clean test split, its corrupted copies and ImageNet shift "
        "sets (A, R, Sketch, V2)",
        "linvit.robustness.stages:run_robustness", "linvit.robustness.config:RobustnessConfig"
    ),
    "make-scenes": Stage(
        "compose the embedded dense dataset from Fashion-MNIST sprites",
        "linvit.dense.scenes:run_make_scenes", "linvit.dense.config:ScenesConfig",
        outputs=("MANIFEST.json", "images", "annotations", "coco")
    ),
    "segment": Stage(
        "UperNet semantic segmentation (mmseg) on a linvit backbone",
        "linvit.dense.stages:run_segment", "linvit.dense.config:DenseConfig",
        scratch=("work", *CURVES)
    ),
    "detect": Stage(
        "Mask R-CNN instance segmentation (mmdet) on a linvit backbone",
        "linvit.dense.stages:run_detect", "linvit.dense.config:DenseConfig",
        scratch=("work", *CURVES)
    ),
    "attention-maps": Stage(
        "head-mean attention maps of a model on its softmax teacher's tokens, stored for the "
        "report's figure",
        "linvit.transfer.maps:run_attention_maps", "linvit.transfer.config:MapsConfig",
        outputs=("maps.safetensors",)
    ),
    "export": Stage(
        "a finished run's model as a Hugging Face Hub-style folder that timm loads "
        "(model.safetensors, config.json, model card); push_to_hub=ORG/NAME uploads it",
        "linvit.export.stage:run_export", "linvit.export.config:ExportConfig",
        outputs=("model.safetensors", "config.json", "README.md"), positional="source"
    ),
    "bench": Stage(
        "time and peak memory of every operator against tokens, and of whole models against "
        "resolution; prints the ratio table",
        "linvit.bench.stage:run_bench", "linvit.bench.config:BenchConfig",
        outputs=("ops.csv", "ratios.md", "ops_scaling.png", "ops_scaling.pdf", "ops_share.png",
                 "ops_share.pdf"),
        scratch=("models.csv", "models_throughput.png", "models_throughput.pdf")
    ),
}
