"""`linvit <stage> --print-config`: every stage's whole config, each field described, as YAML that
`-c` reads back."""
from __future__ import annotations

import dataclasses
import typing

import pytest
import yaml

from linvit.cli import main, stage_config
from linvit.config import load_config
from linvit.config_docs import _section_class, description
from linvit.stages import STAGES


def fields_of(cls, prefix=""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        yield cls, f.name, f"{prefix}{f.name}"
        if (section := _section_class(hints[f.name])) is not None:
            yield from fields_of(section, f"{prefix}{f.name}.")


@pytest.mark.parametrize("stage", list(STAGES))
def test_every_field_of_every_stage_has_a_description(stage):
    missing = [path for cls, name, path in fields_of(stage_config(stage))
               if not description(cls, name)]
    assert not missing


@pytest.mark.parametrize("stage", list(STAGES))
def test_the_printed_config_is_yaml_with_every_field(stage, capsys):
    assert main([stage, "--print-config"]) == 0
    text = capsys.readouterr().out
    data = yaml.safe_load(text)
    for _, _, path in fields_of(stage_config(stage)):
        node = data
        for part in path.split("."):
            node = node[part]
    assert text.count("\n# ") >= 1


def test_pretrains_printed_config_reads_back_as_its_defaults(tmp_path, capsys):
    main(["pretrain", "--print-config", "optim.lr=0.003"])
    (tmp_path / "c.yaml").write_text(capsys.readouterr().out)
    from linvit.train.config import PretrainConfig
    back = load_config(PretrainConfig, tmp_path / "c.yaml")
    assert back == load_config(PretrainConfig, None, ["optim.lr=0.003"])
    assert back.optim.lr == 0.003
