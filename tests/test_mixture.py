"""Dataset mixtures (`--data_dir a:0.3 --data_dir b:0.7`): the flag, the training windows' draw
against the weights over many batches, and a real 2-rank run reporting each source's val loss
(log, metrics.jsonl, CSV monitor) and their weighted mean, resumed exactly."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
from harness.launch import run_deepspeed, run_python, train_fails
from helpers.logged import train_losses
from helpers.messages import assert_names
from support.launch import REPO, tiny_run_args

from gpt_ds.base.errors import ConfigError
from gpt_ds.data.mixture import DataMix, DataSpec, MixtureWindows, data_specs
from gpt_ds.data.tokens import GlobalSplit, TokenData, TrainWindows
from gpt_ds.observe.metrics_file import read_metrics

BLOCK = 16
ONE = GlobalSplit(1, 1)  # one rank, no accumulation


def source(low: int, n: int = 50_000) -> TokenData:
    """Tokens low .. low + 999 only: a window's first token tells its source."""
    rng = np.random.default_rng(low)
    tokens = rng.integers(low, low + 1000, size=n).astype(np.uint16)
    return TokenData(train=tokens, val=tokens[:1000], meta={})


MIX = DataMix(names=["a", "b"], sources=[source(0), source(5000)], weights=[0.3, 0.7])


def test_the_flag_takes_weights_for_all_sources_or_none(tmp_path):
    assert DataSpec.parse("web:0.7") == DataSpec("web", 0.7)
    assert DataSpec.parse("web") == DataSpec("web", None)
    odd = tmp_path / "v1:2"  # an existing folder whose name holds a ':'
    odd.mkdir()
    assert DataSpec.parse(str(odd)) == DataSpec(str(odd), None)
    with pytest.raises(ConfigError) as e:
        data_specs(["a:0.3", "b"])
    assert_names(str(e.value), "--data_dir", "DIR:WEIGHT", "a:0.3", "b")  # the form, the values
    with pytest.raises(ConfigError) as e:
        data_specs(["x/data", "y/data"])
    assert_names(str(e.value), "--data_dir", "x/data", "y/data")  # the two with one name
    with pytest.raises(ConfigError) as e:
        data_specs(["a:0"])
    assert_names(str(e.value), "--data_dir a:0", "> 0", "0")  # the source, the bound, the weight


def test_each_source_is_drawn_in_proportion_to_its_weight():
    train_windows = MixtureWindows(MIX, BLOCK, batch_size=8, seed=3, rank=1, split=ONE)
    firsts = np.concatenate([train_windows.next_batch()[0][:, 0].numpy() for _ in range(1000)])
    share_b = float(np.mean(firsts >= 5000))
    assert share_b == pytest.approx(0.7, abs=0.02)  # 8000 draws: sd 0.005
    # every window lies inside one source
    x, _ = MixtureWindows(MIX, BLOCK, batch_size=64, seed=3, rank=1, split=ONE).next_batch()
    assert all(len({int(t) // 5000 for t in row}) == 1 for row in x)


def test_a_split_batch_draws_the_same_sequences_and_one_source_is_the_plain_stream():
    whole = MixtureWindows(MIX, BLOCK, batch_size=8, seed=5, rank=0, split=ONE).next_batch()[0]
    split = MixtureWindows(MIX, BLOCK, batch_size=2, seed=5, rank=0, split=ONE)
    assert np.array_equal(np.concatenate([split.next_batch()[0] for _ in range(4)]), whole)
    alone = DataMix(names=["a"], sources=[MIX.sources[0]], weights=[1.0])
    plain = TrainWindows(alone.sources[0].train, BLOCK, 8, 5, 0, ONE).next_batch()[0]
    alone_windows = MixtureWindows(alone, BLOCK, 8, seed=5, rank=0, split=ONE)
    assert np.array_equal(alone_windows.next_batch()[0], plain)


@pytest.fixture(scope="module")
def second_source(tmp_path_factory):
    """A prepared folder of other text: numbered lines, unlike Shakespeare."""
    root = tmp_path_factory.mktemp("other")
    text = root / "lines.txt"
    text.write_text("".join(f"entry {i}: the value is {i * 7 % 1000}.\n" for i in range(6000)))
    out = root / "lines"
    run_python([str(REPO / "tools" / "prepare_data.py"), "--input", str(text), "--out_dir",
                str(out), "--block_size", "64"], timeout=120)  # fmt: skip
    return out


@pytest.mark.slow
def test_a_mixture_on_the_global_stream_draws_the_same_sources_and_windows_at_any_split():
    def step(world: int, micro: int, accum: int) -> tuple[list[int], str]:
        split = GlobalSplit(world, accum)
        ranks = [MixtureWindows(MIX, BLOCK, micro, 5, rank=r, split=split) for r in range(world)]
        firsts = [w.next_batch()[0][:, 0].tolist() for w in ranks for _ in range(accum)]
        return sum(firsts, []), ranks[0].last_step_hash()

    two_ranks = step(2, 4, 1)
    assert step(1, 4, 2) == two_ranks and step(4, 2, 1) == two_ranks
    assert {t // 5000 for t in two_ranks[0]} == {0, 1}  # both sources drawn


def test_a_mixture_run_reports_each_source_and_resumes_exactly(
    shakespeare_dir, second_source, tmp_path
):
    out = tmp_path / "run"
    mix = {"max_iters": 6, "eval_interval": 3, "eval_iters": 2, "csv_dir": str(tmp_path / "csv")}
    args = tiny_run_args(shakespeare_dir, out, **mix)
    args = [*args, "--data_dir", f"{second_source}:0.25"]  # after shakespeare's, as a pair
    args[args.index(str(shakespeare_dir))] = f"{shakespeare_dir}:0.75"
    stdout = run_deepspeed(args, num_gpus=2).stdout
    assert "data mixture: shakespeare 75% (" in stdout and "lines 25% (" in stdout
    evals = [r for r in read_metrics(out) if r.get("kind") == "eval"]
    assert [r["iter"] for r in evals] == [3, 6]
    for r in evals:
        each = r["val_loss/shakespeare"], r["val_loss/lines"]
        assert r["val_loss"] == pytest.approx(0.75 * each[0] + 0.25 * each[1], rel=1e-9)
        assert each[0] != pytest.approx(each[1], rel=1e-3)  # two different val sets
    assert f"| shakespeare {evals[-1]['val_loss/shakespeare']:.4f} | lines" in stdout
    with (tmp_path / "csv" / "run" / "val_loss_lines.csv").open() as f:
        assert [int(row[0]) for row in list(csv.reader(f))[1:]] == [3, 6]
    manifest = json.loads((out / "final" / "gpt_ds.json").read_text())
    assert [s["name"] for s in manifest["data"]["mixture"]] == ["shakespeare", "lines"]

    again = tmp_path / "again"
    shutil.copytree(out, again)
    resumed = [a if a != str(out) else str(again) for a in args] + ["--resume", "iter_3"]
    run_deepspeed(resumed, num_gpus=2)
    assert {i: train_losses(again)[i] for i in (4, 5, 6)} == {
        i: train_losses(out)[i] for i in (4, 5, 6)
    }
    # other weights are other data: a resume is refused, naming --init_from
    reweighted = [a.replace(":0.25", ":0.5").replace(":0.75", ":0.5") for a in resumed]
    reweighted.append("--allow_batch_change")  # one process here, two ranks saved it
    assert_names(train_fails(reweighted), f"{again}/iter_3", "--init_from")
