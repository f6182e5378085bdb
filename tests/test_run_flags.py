"""The training command line as users write it: `--config FILE` (JSON, YAML, a checkpoint's
manifest) with flags overriding it, no abbreviations, one default per `--help` line, and the
flag combinations that are refused before any rank starts."""

from __future__ import annotations

import json

import pytest
from helpers.messages import assert_names, names

from gpt_ds.base.errors import ConfigError
from gpt_ds.run.config import RunConfig, build_parser, parse_args, validate


def test_flag_file_json_and_yaml_with_the_command_line_winning(tmp_path):
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps({"model": "gpt2-mini", "lr": 3e-4, "max_iters": 50}))
    as_yaml = tmp_path / "run.yaml"
    as_yaml.write_text("model: gpt2-mini\nlr: 3e-4\nmax_iters: 50\ncompile: true\n")
    for path in (as_json, as_yaml):
        cfg = parse_args(["--config", str(path), "--max_iters", "7"])
        assert (cfg.model, cfg.lr, cfg.max_iters) == ("gpt2-mini", 3e-4, 7)
        assert isinstance(cfg.lr, float)
    assert parse_args(["--config", str(as_yaml)]).compile == "on"  # true: a boolean once


def test_a_checkpoint_manifest_replays_its_run_config(tmp_path):
    saved = RunConfig(model="gpt2-mini", max_iters=123, lr=1e-3, out_dir="old", local_rank=1)
    manifest = tmp_path / "gpt_ds.json"
    manifest.write_text(json.dumps({"tag": "final", "iteration": 123, "config": saved.to_dict()}))
    cfg = parse_args(["--config", str(manifest), "--out_dir", "new"])
    assert (cfg.model, cfg.max_iters, cfg.lr, cfg.out_dir) == ("gpt2-mini", 123, 1e-3, "new")
    assert cfg.local_rank == -1  # the launcher's, not the saved one


def problem(excinfo: pytest.ExceptionInfo, subject: str) -> str:
    """The one problem of the raised ConfigError that names `subject` (a flag, key or file)."""
    found = [p for p in excinfo.value.problems if names(p, subject)]
    assert len(found) == 1, f"{len(found)} problems name {subject!r}:\n{excinfo.value}"
    return found[0]


@pytest.mark.parametrize(
    "content, subject, facts",
    [
        ('{"max_iter": 5}', "max_iter", ["max_iters"]),  # the key, the flag it may mean
        ('{"max_iters": 2.5}', "max_iters", ["2.5", "integer"]),
        ('{"compile": "yes"}', "compile", ["'yes'", "auto", "on", "off", "true/false"]),
        ('{"model": "gpt2",}', "JSON", ["line 1"]),
        ("[1, 2]", "flag", []),  # not a mapping of flags
    ],
)
def test_bad_flag_files_name_the_key_and_the_file(tmp_path, content, subject, facts):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", str(path)])
    assert_names(problem(e, subject), *facts)
    assert_names(str(e.value), str(path))


def test_abbreviated_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--max_iter", "5"])
    assert "unrecognized arguments: --max_iter" in capsys.readouterr().err


def test_help_shows_each_default_once_and_hides_local_rank():
    text = build_parser().format_help()
    assert "--local_rank" not in text and "--local-rank" not in text
    assert "(default: None)" not in text
    for line in text.split("\n  -"):
        assert line.count("default:") + line.count("(default") <= 2, line
        assert line.count("(default: ") <= 1, line


@pytest.mark.parametrize(
    "argv, subject, facts",
    [
        (["--init_from", "gpt2", "--model", "gpt2-tiny"], "--init_from", ["gpt2", "--model"]),
        (["--init_from", "gpt2", "--n_layer", "2"], "--init_from", ["gpt2", "--n_layer"]),
        (
            ["--save_only_on_improvement", "--save_interval", "5"],
            "--save_only_on_improvement",
            ["--save_interval"],
        ),
        (["--save_interval", "-1"], "--save_interval", [">= 0", "-1"]),  # the bound, the value
        (["--peak_tflops", "0"], "--peak_tflops", ["> 0", "0.0"]),
    ],
)
def test_refused_combinations_name_both_flags(argv, subject, facts, shakespeare_dir):
    cfg = parse_args([*argv, "--data_dir", str(shakespeare_dir)])
    with pytest.raises(ConfigError) as e:
        validate(cfg, world_size=1)
    assert_names(problem(e, subject), *facts)
