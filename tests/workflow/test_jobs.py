"""The job model: one plan of jobs (linvit.workflow.plan), each kind's templates the one place its
files are named, and rules that take everything from their job."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from linvit.errors import ConfigError
from linvit.report.kinds import KINDS as RECORD_KINDS
from linvit.workflow import grid
from linvit.workflow.jobs import KINDS
from linvit.workflow.plan import plan

from grid_configs import ROOT, default_config, teacher_axis_config

# The rule of each job kind (rule names are what Snakemake users see; kinds are what code reads).
RULE_OF = {"teacher": "teacher", "import": "import_teacher", "distill": "distill",
           "cell": "finetune", "select_cell": "select_cell", "choose": "choose",
           "maps": "attention_maps", "corrupt": "corrupt",
           "robustness_teacher": "robustness_teacher", "robustness_cell": "robustness_cell",
           "scenes": "scenes", "dense": "dense_job", "bench": "bench", "export": "export_cell"}

# Loads the workflow (no DAG, no job) in its own process (Snakemake changes the working
# directory) and prints each rule's output, log and benchmark patterns.
RULE_PATTERNS = r"""
import json, re, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    wf = api.workflow(resource_settings=ResourceSettings(cores=1),
                      config_settings=ConfigSettings(configfiles=[Path(sys.argv[2])]),
                      snakefile=Path(sys.argv[1]) / "Snakefile", workdir=Path(sys.argv[3]))
    bare = lambda p: re.sub(r"\{(\w+),[^{}]*\}", r"{\1}", str(p))   # constraints dropped
    rules = {r.name: {"output": [bare(o) for o in r.output], "log": [bare(p) for p in r.log],
                      "benchmark": bare(r.benchmark) if r.benchmark else None}
             for r in wf._workflow.rules}
print(json.dumps(rules))
"""


def test_every_job_rule_writes_where_its_kind_says(tmp_path):
    config = {**default_config(), "results": str(tmp_path / "res")}
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    run = subprocess.run([sys.executable, "-c", RULE_PATTERNS, str(ROOT),
                          str(tmp_path / "grid.yaml"), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    rules = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(RULE_OF) == set(KINDS)
    for kind, rule in RULE_OF.items():
        results = config["results"]
        expected = {"output": [KINDS[kind].pattern(results)],
                    "log": [KINDS[kind].pattern(results, "log")],
                    "benchmark": KINDS[kind].benchmark and KINDS[kind].pattern(results,
                                                                               "benchmark")}
        assert rules[rule] == expected, kind


def test_the_rules_hold_no_path_templates_or_key_dicts():
    """Wildcard patterns ({{...}} in an f-string) and record keys (json.dumps of a dict) are
    written once, in linvit.workflow.jobs and .plan, and the aggregate files' paths once, in
    linvit.report.paths: none in the rules."""
    for smk in [*sorted((ROOT / "workflow" / "rules").glob("*.smk")), ROOT / "Snakefile"]:
        text = smk.read_text()
        assert not re.search(r"\{\{\w+\}\}", text), smk.name
        assert "json.dumps({" not in text and '{"dataset"' not in text, smk.name
        assert "{RESULTS}" not in text, smk.name
        paths = re.findall(r"[\"'][^\"'\s]*\.(?:csv|md|tex|png|pdf|log|json|tsv)[\"']", text)
        assert set(paths) <= {'"report.md"'}, (smk.name, paths)     # (a label, not a path)


@pytest.mark.parametrize("config", ["default", "paper", "teachers"])
def test_each_job_is_found_by_its_wildcards_and_names_its_own_files(config, tmp_path):
    config = {"default": default_config,
              "paper": lambda: yaml.safe_load((ROOT / "config" / "paper.yaml").read_text()),
              "teachers": lambda: teacher_axis_config(tmp_path)}[config]()
    jobs = plan(config)
    outputs = [j.output for j in jobs.jobs]
    assert len(set(outputs)) == len(outputs)
    for job in jobs.jobs:
        assert jobs.find(job.kind.name, job.wildcards) is job
        assert job.kind.record_kind in (*RECORD_KINDS, None)
        assert job.output.startswith(job.folder) and job.run_dir.startswith(job.folder)
        assert set(job.inputs) <= set(outputs), job.folder      # every input is a job's output
        words = shlex.split(job.command())
        assert words[:4] == [job.stage, "-o", job.run_dir, "--rerun"]
        assert words[4:] == job.words()


def test_a_job_outside_the_grid_is_refused_by_name():
    jobs = plan(default_config())
    with pytest.raises(ConfigError, match="no cell job .*'operator': 'mamba2'.* in this grid"):
        jobs.find("cell", {"dataset": "fashion_mnist", "teacher": "pretrain", "size": "cpu96",
                           "operator": "mamba2", "init": "random", "loss": "none", "seed": 0})


def test_the_record_key_is_the_jobs_key_and_a_cell_s_key_is_its_cell():
    config = default_config()
    jobs = plan(config)
    cells = jobs.of("cell")
    assert [grid.Cell.of(j.key) for j in cells] == grid.expand_grid(config)
    scored = jobs.of("robustness_teacher", "robustness_cell")
    assert [j.key for j in scored if j.kind.name == "robustness_cell"] == [j.key for j in cells]
    assert all(set(j.key) == set(cells[0].key) for j in scored)       # teachers: complete keys
    assert [j.key["model"] for j in jobs.of("maps")] == ["teacher", "distilled", "distilled"]


def test_jobs_read_the_files_of_the_jobs_they_follow():
    jobs = plan(default_config())
    cell = next(j for j in jobs.of("cell") if j.key["init"] == "copy_mlp+distill")
    teacher, = jobs.of("teacher")
    distill = jobs.find("distill", {**cell.wildcards})
    assert cell.inputs == [teacher.output, distill.output]
    assert cell.overrides["teacher"] == teacher.model == cell.reads["teacher"]
    assert cell.overrides["distilled"] == distill.model
    standing = dict(w.split("=", 1) for w in cell.words("/x/e.safetensors"))
    assert standing["teacher"] == standing["distilled"] == '"/x/e.safetensors"'


def test_dense_backbones_of_dotted_loss_names_are_found_without_parsing(tmp_path):
    config = {**default_config(), "losses": {"out": {"attn_out_mse": 1.0},
                                             "map.v2": {"attn_map_ce": 1.0}},
              "main_loss": "map.v2", "loss_grid": None, "seeds": [1]}
    config["dense"] = {**config["dense"], "seeds": [1]}
    jobs = plan(config)
    dense = [j for j in jobs.of("dense") if j.key["init"] == "copy_mlp+distill"][0]
    assert dense.wildcards["backbone"] == "linear.copy_mlp+distill.map.v2.seed1"
    assert dense.key["loss"] == "map.v2" and dense.key["seed"] == 1
    assert jobs.find("dense", dense.wildcards) is dense
    backbone = jobs.find("cell", {**dense.key})
    assert dense.inputs[0] == backbone.output
