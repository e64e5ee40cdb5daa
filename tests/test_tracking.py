"""Experiment tracking (log_to): the scalars of metrics.jsonl, the config and the sample, read back with each
tracker's own reader (TensorBoard's EventAccumulator, wandb's reader of an offline run's transaction log); a
missing extra is one line naming it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpt2.cli import main as cli_main
from gpt2.train import TrainConfig, train
from gpt2.train.config import parse_overrides

CORPUS = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(300))


def tiny_config(tmp_path: Path, **overrides: object) -> TrainConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    values = dict(
        data=str(corpus), tokenizer="bytes", model="gpt2-tiny", n_layer=1, n_head=2, n_embd=32, block_size=16,
        dropout=0.0, batch_size=4, max_steps=6, learning_rate=1e-2, warmup_steps=2, eval_interval=3, eval_batches=2,
        checkpoint_interval=0, sample_tokens=8, sample_prompt="def", device="cpu", dtype="float32",
        out_dir=str(tmp_path / "out"),
    )  # fmt: skip
    return TrainConfig.from_dict({**values, **overrides})


def metric_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def expected_scalars(out: Path) -> dict[str, dict[int, float]]:
    """{name: {step: value}} of every number in metrics.jsonl."""
    scalars: dict[str, dict[int, float]] = {}
    for record in metric_lines(out):
        for key, value in record.items():
            if key != "step":
                scalars.setdefault(key, {})[record["step"]] = value
    return scalars


def test_log_to_reads_as_a_list_and_refuses_unknown_trackers() -> None:
    assert parse_overrides(TrainConfig, ["log_to=tensorboard,wandb"])["log_to"] == ("tensorboard", "wandb")
    assert parse_overrides(TrainConfig, ['log_to=["wandb"]'])["log_to"] == ("wandb",)
    assert TrainConfig().output.log_to == ()
    with pytest.raises(ValueError, match=r"output.log_to\[0\] = 'mlflow': must be one of 'tensorboard', 'wandb'"):
        TrainConfig.from_dict(dict(log_to=("mlflow",)))
    assert 'log_to = ["tensorboard"]' in TrainConfig.from_dict(dict(log_to=("tensorboard",))).to_toml()


def test_tensorboard_gets_every_scalar_of_metrics_jsonl_the_config_and_the_sample(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_config(tmp_path, log_to=("tensorboard",))
    result = train(config)
    out = Path(config.output.out_dir)
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    expected = expected_scalars(out)
    assert {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "dt_ms"} <= set(expected)
    assert set(events.Tags()["scalars"]) == set(expected)
    for name, by_step in expected.items():
        logged = {event.step: event.value for event in events.Scalars(name)}
        assert logged == pytest.approx(by_step, rel=1e-6), name  # event files keep float32
    texts = {tag: events.Tensors(tag) for tag in events.Tags()["tensors"]}
    config_text = texts["config/text_summary"][0].tensor_proto.string_val[0].decode()
    assert "max_steps = 6" in config_text and 'log_to = ["tensorboard"]' in config_text
    assert texts["sample/text_summary"][0].tensor_proto.string_val[0].decode() == result.sample


def read_wandb_run(out: Path) -> tuple[dict[int, dict], dict, dict]:
    """(history by step, summary, config) of the offline run in out/wandb, read by wandb's own reader of the
    transaction log (`wandb leet inspect --json`)."""
    (log,) = (out / "wandb").glob("wandb/offline-run-*/run-*.wandb")
    printed = subprocess.run([shutil.which("wandb") or "wandb", "leet", "inspect", "--json", str(log)],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    history: dict[int, dict] = {}
    summary: dict = {}
    config: dict = {}
    for line in printed.splitlines():
        record = json.loads(line)
        if record.get("type") == "history":
            history[int(record["history"]["step"].get("num", 0))] = record["history"]["item"]
        elif record.get("type") == "summary":
            summary.update(record["summary"].get("update", {}))
        elif record.get("type") == "run":
            config = record["run"]["config"]["update"]
    return history, summary, config


@pytest.mark.slow
def test_wandb_offline_run_gets_every_scalar_of_metrics_jsonl_the_config_and_the_sample(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    config = tiny_config(tmp_path, log_to=("wandb",))
    result = train(config)
    out = Path(config.output.out_dir)
    history, summary, logged_config = read_wandb_run(out)
    for name, by_step in expected_scalars(out).items():
        assert {step: row[name] for step, row in history.items() if name in row} == pytest.approx(by_step), name
    assert logged_config["max_steps"] == 6 and logged_config["log_to"] == ["wandb"]
    assert summary["sample"] == result.sample


@pytest.mark.slow
def test_both_trackers_at_once_and_a_finetune_too(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpt2.finetune import FinetuneConfig, finetune

    pretrained = train(tiny_config(tmp_path / "base", sample_tokens=0)).out_dir  # a model + tokenizer folder
    (tmp_path / "notes.txt").write_text(CORPUS[:4000])
    config = FinetuneConfig.from_settings(["max_steps=4", "eval_interval=2", "block_size=16", "batch_size=4",
                                           "device=cpu", "sample_tokens=4", "log_to=tensorboard,wandb"],
                                          model=str(pretrained), data=str(tmp_path / "notes.txt"),
                                          out_dir=str(tmp_path / "ft"))  # fmt: skip
    result = finetune(config)
    out = tmp_path / "ft"
    val_losses = {r["step"]: r["val_loss"] for r in metric_lines(out) if "val_loss" in r}
    assert sorted(val_losses) == [0, 2, 4]
    events = EventAccumulator(str(out / "tensorboard")).Reload()
    assert {e.step: e.value for e in events.Scalars("val_loss")} == pytest.approx(val_losses, rel=1e-6)
    history, summary, _ = read_wandb_run(out)
    assert {s: row["val_loss"] for s, row in history.items() if "val_loss" in row} == pytest.approx(val_losses)
    assert summary["sample"] == result.sample


def test_a_missing_extra_is_one_line_naming_it_and_nothing_is_written(tmp_path: Path, monkeypatch, capsys) -> None:
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else find_spec(name, *a))
    out = tmp_path / "out"
    status = cli_main(["train", "--no-progress", "--out", str(out), "--set", "output.log_to=wandb", "--set",
                       "schedule.max_steps=1"])  # fmt: skip
    error = capsys.readouterr().err.strip()
    assert status == 2 and len(error.splitlines()) == 1
    assert "pip install 'gpt2-faithful[wandb]'" in error
    assert not out.exists()
