"""Training: the stored config (the config itself: test_train_config.py), LR schedule, optimizer groups, the
Trainer (pluggable loss and batches, the order of a step), the loop, checkpoints and resume, the main-job path.

Every run here is a tiny model on a tiny byte-level corpus in a temp dir, on the CPU, seeded.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpt2.cli import main as cli_main
from gpt2.config import GPTConfig
from gpt2.data import BatchLoader
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.train import (
    Trainer,
    TrainingData,
    TrainingDiverged,
    configure_optimizer,
    learning_rate_at,
    next_token_loss,
    parameter_groups,
    train,
)
from gpt2.train.checkpoint import checkpoint_dirs, latest_checkpoint, load_train_state
from gpt2.train.config import PRESETS, OptimizerConfig, TrainConfig
from gpt2.weights import load_model


def test_a_checkpoint_serializes_the_weights_once_and_copies_them_to_the_top_level(tmp_path, monkeypatch):
    import gpt2.train.checkpoint as run_checkpoint

    calls = []
    real = run_checkpoint.save_pretrained
    monkeypatch.setattr(run_checkpoint, "save_pretrained", lambda model, d: (calls.append(d), real(model, d)))
    config = tiny_config(tmp_path, max_steps=4, checkpoint_interval=4)
    result = train(config)
    out = Path(config.output.out_dir)
    assert len(calls) == len(checkpoint_dirs(out)) == 1
    for name in ("model.safetensors", "config.json", "byte_tokenizer.json"):
        assert (out / name).read_bytes() == (result.checkpoint / name).read_bytes()


def write_corpus(path: Path, words: int = 4000, seed: int = 0) -> Path:
    """A deterministic text of made-up words and lines (about 5 bytes per word)."""
    rng = random.Random(seed)
    vocab = ["def", "return", "self", "if", "else", "x", "y", "for", "in", "range", "(", ")", ":", "=", "+", "1"]
    lines, line = [], []
    for _ in range(words):
        line.append(rng.choice(vocab))
        if rng.random() < 0.15:
            lines.append(" ".join(line))
            line = []
    path.write_text("\n".join(lines) + "\n")
    return path


def tiny_config(tmp_path: Path, **overrides) -> TrainConfig:
    tmp_path.mkdir(parents=True, exist_ok=True)
    values = dict(
        data=str(write_corpus(tmp_path / "corpus.txt")), tokenizer="bytes",
        model="gpt2-tiny", n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0,
        batch_size=4, max_steps=8, learning_rate=1e-2, warmup_steps=2, min_lr_ratio=0.1,
        eval_interval=4, eval_batches=2, checkpoint_interval=4, keep_checkpoints=2,
        sample_tokens=0, device="cpu", dtype="float32", out_dir=str(tmp_path / "out"),
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig.from_dict(values)


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


def metric_lines(out_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------------------------- config
def test_a_checkpoint_with_the_flat_train_config_of_before_the_sections_resumes(tmp_path):
    config = tiny_config(tmp_path, max_steps=6, checkpoint_interval=3, eval_interval=0)
    train(config, stop_at_step=3)
    checkpoint = latest_checkpoint(config.output.out_dir)
    stored = json.loads((checkpoint / "train_config.json").read_text())
    assert stored["schedule"]["max_steps"] == 6  # written as sections
    (checkpoint / "train_config.json").write_text(json.dumps(config.to_flat(), indent=1) + "\n")  # the flat layout
    assert TrainConfig.from_dict(json.loads((checkpoint / "train_config.json").read_text())) == config
    resumed = train(config, resume=True)
    assert (resumed.start_step, resumed.step) == (3, 6)


def test_gpt2_124m_preset_is_the_published_recipe():
    config = PRESETS["gpt2-124m"]
    assert config.data.total_batch_tokens == 2**19  # ~0.5M tokens per step
    assert (
        config.optimizer.beta1,
        config.optimizer.beta2,
        config.optimizer.weight_decay,
        config.optimizer.grad_clip,
    ) == (0.9, 0.95, 0.1, 1.0)
    assert (config.optimizer.learning_rate, config.min_lr) == (6e-4, pytest.approx(6e-5))
    model = config.model_config(vocab_size=50257)
    assert (model.n_layer, model.n_head, model.n_embd, model.block_size) == (12, 12, 768, 1024)


# ------------------------------------------------------------------------------------------- schedule
def test_lr_schedule_at_every_step():
    # 3 warmup steps (step 0 already at 1/3 of the peak), cosine from step 3 down to the floor at step 10
    got = [learning_rate_at(s, max_lr=1.0, min_lr=0.1, warmup_steps=3, decay_steps=10) for s in range(12)]
    expected = [1 / 3, 2 / 3, 1.0, 1.0, 0.9157348, 0.6904104, 0.4095896, 0.1842652, 0.1, 0.1, 0.1, 0.1]
    expected[3:10] = [0.1 + 0.45 * (1 + math.cos(math.pi * (s - 3) / 7)) for s in range(3, 10)]
    assert got == pytest.approx(expected, abs=1e-12)
    assert all(a >= b for a, b in zip(got[2:], got[3:], strict=False))  # never increases after warmup


def test_lr_schedule_without_warmup_starts_at_the_peak_and_ends_at_the_floor():
    lrs = [learning_rate_at(s, max_lr=6e-4, min_lr=6e-5, warmup_steps=0, decay_steps=4) for s in range(6)]
    assert lrs == pytest.approx([6e-4, 6e-5 + 5.4e-4 * (1 + math.cos(math.pi / 4)) / 2, 3.3e-4,
                                 6e-5 + 5.4e-4 * (1 + math.cos(3 * math.pi / 4)) / 2, 6e-5, 6e-5])  # fmt: skip


def test_the_loop_uses_the_schedule_at_every_step(tmp_path):
    config = tiny_config(tmp_path, max_steps=6, warmup_steps=2, eval_interval=0)
    train(config)
    logged = [r["lr"] for r in metric_lines(Path(config.output.out_dir)) if "lr" in r]
    assert logged == [learning_rate_at(s, max_lr=1e-2, min_lr=1e-3, warmup_steps=2, decay_steps=6) for s in range(6)]


# ------------------------------------------------------------------------------------------ optimizer
def test_weight_decay_only_on_2d_parameters_and_every_parameter_in_exactly_one_group():
    model = GPT(TrainConfig().model_config(vocab_size=300))
    decay, no_decay = parameter_groups(model, weight_decay=0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    grouped = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(grouped) == len(set(grouped))
    assert set(grouped) == {id(p) for p in model.parameters()}
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in decay["params"]} >= {"transformer.wte.weight", "transformer.wpe.weight"}
    assert not any(names[id(p)].endswith("bias") or ".ln_" in names[id(p)] for p in decay["params"])


@pytest.mark.parametrize("impl", ["fused", "foreach"])
def test_fast_adamw_variants_compute_what_the_plain_loop_computes(impl):
    # a model whose every gradient is well away from 0 (Adam turns float noise in a zero gradient into +-lr)
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    fast = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
    fast.load_state_dict(reference.state_dict())
    x = torch.randn(64, 16)
    for model, name in ((reference, "for-loop"), (fast, impl)):
        optimizer = configure_optimizer(model, OptimizerConfig(impl=name), torch.device("cpu"))
        for _ in range(5):
            ((model(x) - 1.0) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    for (name, a), b in zip(reference.state_dict().items(), fast.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------------------- Trainer
CPU = torch.device("cpu")


def tiny_gpt(vocab_size: int = 64) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=vocab_size, n_layer=1, n_head=2, n_embd=32, block_size=16))


def trainer_config(tmp_path: Path, **overrides) -> TrainConfig:
    values = dict(
        model="gpt2-tiny",
        max_steps=30,
        learning_rate=1e-2,
        warmup_steps=2,
        eval_interval=0,
        checkpoint_interval=0,
        sample_tokens=0,
        device="cpu",
        dtype="float32",
        out_dir=str(tmp_path / "out"),
    )
    return TrainConfig.from_dict({**values, **overrides})


class CountingSource:
    """A custom batch source: rows that count up from a random start, so every next token is predictable."""

    def __init__(self, vocab_size: int = 64, rows: int = 4, length: int = 16) -> None:
        self.vocab_size, self.rows, self.length, self.step = vocab_size, rows, length, 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.randint(self.vocab_size, (self.rows, 1), generator=torch.Generator().manual_seed(self.step))
        self.step += 1
        tokens = (start + torch.arange(self.length + 1)) % self.vocab_size  # (rows, length + 1)
        return tokens[:, :-1], tokens[:, 1:]

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.step = state["step"]


def test_a_trainer_with_a_custom_loss_function_trains(tmp_path):
    def last_position_loss(model, batch):  # only the last position of each row counts (a classifier's loss)
        x, y = batch
        return F.cross_entropy(model(x).logits[:, -1], y[:, -1])

    model, config = tiny_gpt(vocab_size=257), trainer_config(tmp_path)
    tokens = np.frombuffer(write_corpus(tmp_path / "corpus.txt").read_bytes(), dtype=np.uint8).astype(np.uint16)
    batches = BatchLoader(tokens, batch_size=8, block_size=16, seed=0)
    trainer = Trainer(
        model,
        configure_optimizer(model, config.optimizer, CPU),
        config,
        TrainingData(batches, loss_fn=last_position_loss),
    )
    losses = [trainer.train_step().loss for _ in range(30)]
    x, y = BatchLoader(tokens, batch_size=8, block_size=16, seed=0).next_batch()
    with torch.no_grad():  # the Trainer's first loss is the custom loss of the first batch
        assert losses[0] == pytest.approx(float(last_position_loss(tiny_gpt(vocab_size=257), (x, y))), abs=1e-5)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0


def test_a_trainer_with_a_custom_batch_source_trains(tmp_path):
    model, config = tiny_gpt(), trainer_config(tmp_path)
    trainer = Trainer(model, configure_optimizer(model, config.optimizer, CPU), config, TrainingData(CountingSource()))
    losses = [trainer.train_step().loss for _ in range(30)]
    assert losses[0] == pytest.approx(math.log(64), abs=0.3)  # a fresh model guesses uniformly
    assert losses[-1] < 0.5 * losses[0]
    assert trainer.state_dict()["loader"] == {"step": 30}  # the source's position goes into checkpoints


def test_a_trainer_resumes_a_custom_batch_source_exactly(tmp_path):
    def make_trainer(out: str) -> Trainer:
        model, config = tiny_gpt(), trainer_config(tmp_path, max_steps=6, out_dir=str(tmp_path / out))
        optimizer = configure_optimizer(model, config.optimizer, CPU)
        return Trainer(model, optimizer, config, TrainingData(CountingSource()))

    straight = make_trainer("a")
    first, second = make_trainer("b"), make_trainer("b")
    expected = [straight.train_step().loss for _ in range(6)]
    got = [first.train_step().loss for _ in range(3)]
    checkpoint = first.save()
    second.resume(checkpoint)
    got += [second.train_step().loss for _ in range(3)]
    assert (checkpoint.name, second.step) == ("step_00000003", 6)
    assert got == expected


def test_train_step_sets_the_lr_first_and_zeroes_the_gradients_after_the_optimizer_step(tmp_path):
    model, config = tiny_gpt(), trainer_config(tmp_path, grad_accum_steps=2, learning_rate=1e-2, warmup_steps=4)
    optimizer = configure_optimizer(model, config.optimizer, CPU)
    events = []

    def recording_loss(model_, batch):
        events.append(("loss", optimizer.param_groups[0]["lr"]))
        return next_token_loss(model_, batch)

    optimizer_step = optimizer.step

    def recording_step(*args, **kwargs):
        events.append(("step", optimizer.param_groups[0]["lr"], all(p.grad is not None for p in model.parameters())))
        return optimizer_step(*args, **kwargs)

    optimizer.step = recording_step
    trainer = Trainer(model, optimizer, config, TrainingData(CountingSource(), loss_fn=recording_loss))
    stats = trainer.train_step()
    lr = 1e-2 / 4  # step 0 of a 4-step warmup, not the optimizer's initial lr of 1e-2
    assert events == [("loss", lr), ("loss", lr), ("step", lr, True)]  # 2 micro-steps, then one optimizer step
    assert all(p.grad is None for p in model.parameters())  # zeroed after the step
    assert (stats.step, stats.lr, stats.tokens, trainer.step) == (1, lr, 2 * 4 * 16, 1)
    assert [r["step"] for r in metric_lines(Path(config.output.out_dir))] == [1]  # logged last


# ---------------------------------------------------------------------------------------------- loop
def test_training_lowers_the_loss_and_writes_checkpoint_metrics_and_plot(tmp_path):
    config = tiny_config(tmp_path, max_steps=12, checkpoint_interval=4)
    result = train(config)
    out = Path(config.output.out_dir)
    assert result.step == 12 and len(result.losses) == 12
    assert result.val_losses[12] < result.val_losses[0] - 0.5
    assert [p.name for p in checkpoint_dirs(out)] == ["step_00000008", "step_00000012"]  # keep_checkpoints=2
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = metric_lines(out)
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 13))
    assert [r["step"] for r in lines if "val_loss" in r] == [0, 4, 8, 12]
    loaded = load_model(out)  # the top-level export is the latest checkpoint's model
    latest, exported = read_weights(result.checkpoint), read_weights(out)
    assert all(torch.equal(a, b) for a, b in zip(exported.values(), latest.values(), strict=True))
    assert loaded.config.vocab_size == 257


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path):
    # dropout on, so the RNG must be restored too
    whole = tiny_config(tmp_path / "a", dropout=0.1)
    pieces = tiny_config(tmp_path / "b", dropout=0.1)
    straight = train(whole)
    first = train(pieces, stop_at_step=4)
    second = train(pieces, resume=True)
    assert (first.step, second.start_step, second.step) == (4, 4, 8)
    assert first.losses + second.losses == straight.losses
    a, b = read_weights(Path(whole.output.out_dir)), read_weights(Path(pieces.output.out_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    def untimed(out_dir: str) -> list[dict]:
        return [{k: v for k, v in r.items() if k not in ("dt_ms", "tokens_per_s")} for r in metric_lines(Path(out_dir))]

    assert untimed(whole.output.out_dir) != [] and untimed(whole.output.out_dir) == untimed(pieces.output.out_dir)


def test_a_fresh_run_into_an_existing_run_needs_resume_or_overwrite(tmp_path):
    config = tiny_config(tmp_path, max_steps=2, eval_interval=0)
    train(config)
    with pytest.raises(FileExistsError, match="already holds a run .*step_00000002.*--resume.*--overwrite"):
        train(config)
    again = train(config.replace(max_steps=3), overwrite=True)
    assert again.start_step == 0 and [p.name for p in checkpoint_dirs(config.output.out_dir)] == ["step_00000003"]
    with pytest.raises(ValueError, match="nothing to do: .* step 3 and schedule.max_steps=3"):
        train(config.replace(max_steps=3), resume=True)


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint in .*start without --resume"):
        train(tiny_config(tmp_path), resume=True)


def test_data_shorter_than_one_block_is_a_clear_error(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("x" * 100)  # 101 tokens with the leading EOT: 90 train, 11 val
    with pytest.raises(ValueError, match=r"the train split of .* has 90 tokens, fewer than block_size \+ 1 = 129"):
        train(tiny_config(tmp_path, data=str(short), block_size=128))
    with pytest.raises(ValueError, match=r"val split .* 11 tokens.*eval_interval=0"):
        train(tiny_config(tmp_path, data=str(short), block_size=16))


def test_missing_data_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="training data .*nope.txt.* does not exist"):
        train(tiny_config(tmp_path, data=str(tmp_path / "nope.txt")))


def test_non_finite_loss_stops_with_a_clear_message_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, checkpoint_interval=2, eval_interval=0)
    calls = {"n": 0}
    forward = GPT.forward

    def poisoned(self, idx, targets=None, **kwargs):
        out = forward(self, idx, targets, **kwargs)
        calls["n"] += 1
        if calls["n"] == 5:  # the 5th training step
            return out._replace(loss=out.loss * float("nan"))
        return out

    monkeypatch.setattr(GPT, "forward", poisoned)
    with pytest.raises(TrainingDiverged, match=r"loss is nan at step 5; .*last good checkpoint is .*step_00000004"):
        train(config)
    good = latest_checkpoint(config.output.out_dir)
    assert good.name == "step_00000004" and load_train_state(good)["step"] == 4
    exported, kept = read_weights(Path(config.output.out_dir)), read_weights(good)
    assert torch.equal(exported["transformer.wte.weight"], kept["transformer.wte.weight"])
    load_model(good)


def test_an_interrupted_checkpoint_write_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    import gpt2.train.checkpoint as checkpoint_module

    config = tiny_config(tmp_path, checkpoint_interval=2, eval_interval=0)
    real_save = torch.save
    calls = {"n": 0}

    def failing_save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:  # the second checkpoint dies half-way through its train_state.pt
            f.write(b"PK\x03\x04 half a file")
            raise OSError("disk full (simulated)")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save)
    with pytest.raises(OSError, match="simulated"):
        train(config)
    monkeypatch.setattr(checkpoint_module.torch, "save", real_save)
    root = Path(config.output.out_dir) / "checkpoints"
    assert [p.name for p in root.iterdir()] == ["step_00000002"]  # no half-written folder left behind
    assert load_train_state(root / "step_00000002")["step"] == 2
    load_model(root / "step_00000002")
    resumed = train(config, resume=True)
    assert (resumed.start_step, resumed.step) == (2, 8)


def test_a_checkpoint_with_a_pickle_payload_is_refused_without_running_it(tmp_path):
    config = tiny_config(tmp_path, max_steps=2, checkpoint_interval=2, eval_interval=0)
    train(config)
    marker = tmp_path / "payload-ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    checkpoint = latest_checkpoint(config.output.out_dir)
    torch.save({"format": "gpt2-train-state", "version": 1, "step": 2, "evil": Payload()},
               checkpoint / "train_state.pt")  # fmt: skip
    with pytest.raises(ValueError, match="refused"):
        load_train_state(checkpoint)
    with pytest.raises(ValueError, match="refused"):
        train(config.replace(max_steps=4), resume=True)
    assert not marker.exists()


@pytest.fixture
def sigint(request):
    """Sets SIGINT's disposition for one test (request.param), restoring the one the suite was launched with:
    a background job of a non-interactive shell starts with SIGINT ignored, a terminal with Python's default."""
    before = signal.signal(signal.SIGINT, request.param)
    yield request.param
    signal.signal(signal.SIGINT, before)


def _interrupt_on_forward(monkeypatch, call: int) -> None:
    """Sends this process SIGINT during the call-th forward pass (mid-step: the step still completes)."""
    calls = {"n": 0}
    forward = GPT.forward

    def interrupting(self, idx, targets=None, **kwargs):
        calls["n"] += 1
        if calls["n"] == call:
            os.kill(os.getpid(), signal.SIGINT)
        return forward(self, idx, targets, **kwargs)

    monkeypatch.setattr(GPT, "forward", interrupting)


@pytest.mark.parametrize("sigint", [signal.default_int_handler], indirect=True)
def test_ctrl_c_saves_a_checkpoint_and_returns_cleanly(tmp_path, monkeypatch, sigint):
    config = tiny_config(tmp_path, checkpoint_interval=0, eval_interval=0)
    forward = GPT.forward
    _interrupt_on_forward(monkeypatch, call=3)  # arrives during step 3; the step still completes
    result = train(config)
    assert result.interrupted and result.step == 3
    assert latest_checkpoint(config.output.out_dir).name == "step_00000003"
    assert signal.getsignal(signal.SIGINT) is sigint  # the handler it found, restored
    monkeypatch.setattr(GPT, "forward", forward)
    assert train(config, resume=True).step == 8


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], indirect=True)
def test_an_ignored_ctrl_c_stays_ignored(tmp_path, monkeypatch, sigint):
    # `nohup gpt2 train ... &` starts with SIGINT ignored: training must not make it interruptible again.
    config = tiny_config(tmp_path, checkpoint_interval=0, eval_interval=0)
    _interrupt_on_forward(monkeypatch, call=3)
    result = train(config)
    assert not result.interrupted and result.step == config.schedule.max_steps
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_bfloat16_autocast_on_cpu_trains(tmp_path):
    result = train(tiny_config(tmp_path, dtype="bfloat16", max_steps=4, eval_interval=2))
    assert all(math.isfinite(v) for v in result.losses) and result.val_losses[4] < result.val_losses[0]
    assert read_weights(Path(result.out_dir))["transformer.wte.weight"].dtype == torch.float32  # params stay float32


def test_total_batch_tokens_must_divide_into_micro_steps(tmp_path):
    with pytest.raises(ValueError, match="total_batch_tokens=100 is not a multiple of .* = 64"):
        train(tiny_config(tmp_path, total_batch_tokens=100))


# ----------------------------------------------------------------------------------------- main job
@pytest.mark.slow
def test_main_job_runs_end_to_end_at_a_tiny_size(tmp_path, capsys):
    out = tmp_path / "stdlib"
    status = cli_main([
        "train", "stdlib", "--no-progress", "--out", str(out),
        "--set", "data.max_corpus_bytes=120000", "--set", "data.vocab_size=320", "--set", "schedule.max_steps=6",
        "--set", "model.n_layer=1", "--set", "model.n_embd=32", "--set", "model.block_size=32",
        "--set", "data.batch_size=4", "--set", "evaluation.eval_interval=3", "--set", "evaluation.eval_batches=1",
        "--set", "evaluation.sample_tokens=12", "--set", "runtime.device=cpu",
    ])  # fmt: skip
    printed = capsys.readouterr().out
    assert status == 0
    assert "val loss" in printed and "sample (12 tokens after 'def')" in printed
    for name in ("model.safetensors", "config.json", "vocab.json", "merges.txt", "metrics.jsonl", "loss.png"):
        assert (out / name).is_file(), name
    assert latest_checkpoint(out).name == "step_00000006"

    tokenizer = load_tokenizer(out)
    model = load_model(out)
    assert tokenizer.vocab_size == model.config.vocab_size == 320


@pytest.mark.slow
def test_compiled_model_trains_like_the_eager_one(tmp_path):
    compiled = train(tiny_config(tmp_path / "compiled", compile=True, max_steps=4, eval_interval=2))
    eager = train(tiny_config(tmp_path / "eager", max_steps=4, eval_interval=2))
    assert compiled.losses == pytest.approx(eager.losses, abs=1e-5)
    ours, reference = read_weights(Path(compiled.out_dir)), read_weights(Path(eager.out_dir))
    assert ours.keys() == reference.keys()  # no _orig_mod. prefix in the file
    for name in ours:
        torch.testing.assert_close(ours[name], reference[name], rtol=0, atol=1e-4, msg=name)


# ------------------------------------------------------------------------------------ HellaSwag in the loop
def write_hellaswag(path: Path) -> Path:
    records = [
        {"ind": i, "activity_label": "Talk", "ctx_a": ctx, "ctx_b": "", "ctx": ctx, "split": "val",
         "split_type": "indomain", "source_id": f"t{i}", "label": label, "endings": endings}
        for i, (ctx, endings, label) in enumerate([
            ("the cat", ["sat on it", "zq xj", "ran off", "ate"], 0),
            ("a dog", ["barks", "sleeps", "qq", "eats a lot"], 1),
            ("we go", ["home", "out", "far away", "up"], 3),
        ])
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_training_can_measure_hellaswag_at_every_evaluation(tmp_path):
    from gpt2.eval import evaluate_hellaswag
    from gpt2.tokenizer import ByteTokenizer

    hellaswag = write_hellaswag(tmp_path / "hellaswag.jsonl")
    config = tiny_config(tmp_path, block_size=32, hellaswag_file=str(hellaswag), hellaswag_limit=None)
    train(config)
    records = [r for r in metric_lines(Path(config.output.out_dir)) if "hellaswag_acc_norm" in r]
    assert [r["step"] for r in records] == [0, 4, 8]
    assert all(0.0 <= r["hellaswag_acc"] <= 1.0 and 0.0 <= r["hellaswag_acc_norm"] <= 1.0 for r in records)
    final = evaluate_hellaswag(load_model(config.output.out_dir), ByteTokenizer(), hellaswag)
    assert (records[-1]["hellaswag_acc"], records[-1]["hellaswag_acc_norm"]) == (final["acc"], final["acc_norm"])


def test_a_missing_hellaswag_file_is_a_clear_error(tmp_path):
    config = tiny_config(tmp_path, hellaswag_file=str(tmp_path / "nope.jsonl"))
    with pytest.raises(FileNotFoundError, match="hellaswag_file .*nope.jsonl' does not exist"):
        train(config)


def test_init_from_starts_from_pretrained_weights_and_their_tokenizer(tmp_path):
    from gpt2.tokenizer import ByteTokenizer
    from gpt2.weights import save_pretrained

    torch.manual_seed(0)
    pretrained = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=257, block_size=32))
    save_pretrained(pretrained, tmp_path / "pretrained")
    ByteTokenizer().save(tmp_path / "pretrained")
    config = tiny_config(tmp_path, init_from=str(tmp_path / "pretrained"), tokenizer="bpe", model="gpt2-mini",
                         n_layer=None, n_head=None, n_embd=None, block_size=16, dropout=0.1,
                         max_steps=1, learning_rate=1e-12, warmup_steps=0, eval_interval=0)  # fmt: skip
    result = train(config)
    trained = load_model(Path(config.output.out_dir))
    assert trained.config.block_size == 16 and trained.config.n_embd == 32
    assert json.loads((Path(config.output.out_dir) / "config.json").read_text())["resid_pdrop"] == 0.1  # dropout set
    assert isinstance(load_tokenizer(Path(config.output.out_dir)), ByteTokenizer)  # its tokenizer, not a new BPE
    start = pretrained.state_dict()
    for name, tensor in trained.state_dict().items():  # one step at lr 1e-12: the pretrained weights
        expected = start[name][:16] if name == "transformer.wpe.weight" else start[name]
        assert torch.allclose(tensor, expected, rtol=0, atol=1e-9), name
    assert result.step == 1


def test_init_from_refuses_a_block_size_beyond_the_model_context(tmp_path):
    from gpt2.tokenizer import ByteTokenizer
    from gpt2.weights import save_pretrained

    save_pretrained(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=257, block_size=8)), tmp_path / "p")
    ByteTokenizer().save(tmp_path / "p")
    config = tiny_config(tmp_path, init_from=str(tmp_path / "p"), block_size=16)
    with pytest.raises(ValueError, match=r"block_size=16 exceeds the context of init_from .* \(8 positions\)"):
        train(config)


@pytest.mark.parametrize(
    ("vendor", "amx", "avx512_bf16", "expected"),
    [
        ("GenuineIntel", True, True, torch.bfloat16),  # AMX tiles: bf16 matmuls several times fp32's speed
        ("AuthenticAMD", False, True, torch.bfloat16),  # AVX512-BF16 on AMD: 2.8x at 124M (gpt2 bench train)
        ("GenuineIntel", False, True, torch.float32),  # AVX512-BF16 without AMX on Intel: bf16 runs at 0.6x
        ("AuthenticAMD", False, False, torch.float32),
    ],
)
def test_auto_dtype_on_cpu_is_bf16_only_where_it_trains_faster(
    vendor: str, amx: bool, avx512_bf16: bool, expected: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpt2.runtime.device as device

    monkeypatch.setattr(device, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    assert device.resolve_dtype("auto", torch.device("cpu")) == expected
    assert device.resolve_dtype("float32", torch.device("cpu")) == torch.float32  # an explicit choice stands
