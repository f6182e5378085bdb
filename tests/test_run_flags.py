"""The training command line as users write it: `--config FILE` (JSON, YAML, a checkpoint's
manifest) with flags overriding it, no abbreviations, one default per `--help` line, and the
flag combinations that are refused before any rank starts."""

from __future__ import annotations

import json

import pytest

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


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"max_iter": 5}', "max_iter: not a flag of this command (did you mean max_iters?)"),
        ('{"max_iters": 2.5}', "max_iters: must be an integer, got 2.5"),
        ('{"compile": "yes"}', "compile: must be one of auto, on, off (or true/false), got 'yes'"),
        ('{"model": "gpt2",}', "not valid JSON at line 1"),
        ("[1, 2]", "must map flag names to values"),
    ],
)
def test_bad_flag_files_name_the_key_and_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        parse_args(["--config", str(path)])
    assert message in str(e.value) and str(path) in str(e.value)


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
    "argv, message",
    [
        (["--init_from", "gpt2", "--model", "gpt2-tiny"], "--init_from gpt2 and --model both"),
        (["--init_from", "gpt2", "--n_layer", "2"], "and --n_layer both given"),
        (
            ["--save_only_on_improvement", "--save_interval", "5"],
            "--save_only_on_improvement and --save_interval both given",
        ),
        (["--save_interval", "-1"], "--save_interval must be >= 0"),
        (["--peak_tflops", "0"], "--peak_tflops must be > 0"),
    ],
)
def test_refused_combinations_name_both_flags(argv, message, shakespeare_dir):
    cfg = parse_args([*argv, "--data_dir", str(shakespeare_dir)])
    with pytest.raises(ConfigError) as e:
        validate(cfg)
    assert message in str(e.value)
