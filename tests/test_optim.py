"""The optimizer setting: `adamw` is the recipe as it was, bit for bit; `muon` is Muon (checked against the
algorithm's definition and torch.optim.Muon) on the transformer blocks' matrices with AdamW for the rest, and
trains wherever AdamW trains (grad accumulation, bf16 autocast, activation checkpointing, exact resume after
SIGKILL; DDP and FSDP in test_train_ddp.py). Also the LR schedules (cosine, warmup-stable-decay)."""

from __future__ import annotations

import hashlib
import math
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gpt2.train.optimizer as optimizer_module
import gpt2.train.pretrain as pretrain
import gpt2.train.trainer as trainer
from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.train import train
from gpt2.train.config import OptimizerConfig, TrainConfig
from gpt2.train.muon import NS_COEFFICIENTS, MuonAdamW
from gpt2.train.optimizer import apply_schedule, configure_optimizer, muon_parameter_groups
from gpt2.train.schedule import learning_rate_at, wsd_learning_rate_at
from test_train import read_weights, tiny_config

CPU = torch.device("cpu")


# ------------------------------------------------------------------------------------- adamw unchanged
# The per-step losses (float hex) and a SHA-256 over the final weights (sorted names + raw float32 bytes) of the
# run below, computed by the code before `optimizer` existed (commit 9f0c897), on one torch thread, on a CPU whose
# ATen kernels run at this capability: the last bits of float sums depend on the vector width, so these are
# compared on such a CPU only (elsewhere the comparison with the code of that commit, below, still runs).
PINNED_CAPABILITY = "AVX2"
PINNED_LOSSES = ["0x1.62b1840000000p+2", "0x1.51d3a00000000p+2", "0x1.3d4b5e0000000p+2",
                 "0x1.1b71b60000000p+2", "0x1.0854320000000p+2", "0x1.f091c00000000p+1"]  # fmt: skip
PINNED_WEIGHTS = "bcee4a3b64d5436939583416563ff17aa959660cfdbc16006ae4f66b813c9d17"


def adamw_as_before(model: torch.nn.Module, config: OptimizerConfig, device: torch.device) -> torch.optim.Optimizer:
    """configure_optimizer as commit 9f0c897 wrote it: fused AdamW, 2-D tensors decayed, 1-D ones not."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]  # fmt: skip
    return torch.optim.AdamW(groups, lr=config.learning_rate, betas=(config.beta1, config.beta2), eps=config.eps,
                             fused=True)  # fmt: skip


def schedule_as_before(optimizer: torch.optim.Optimizer, config: TrainConfig, step: int) -> float:
    """The Trainer's LR of commit 9f0c897: warmup then cosine to min_lr, one LR for every group."""
    schedule = config.schedule
    lr = learning_rate_at(step, max_lr=config.optimizer.learning_rate, min_lr=config.min_lr,
                          warmup_steps=schedule.warmup_steps, decay_steps=schedule.max_steps)  # fmt: skip
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def weights_digest(out_dir: Path) -> str:
    weights = read_weights(out_dir)
    digest = hashlib.sha256()
    for name in sorted(weights):
        digest.update(name.encode())
        digest.update(weights[name].contiguous().numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.slow
def test_adamw_reproduces_the_recipe_from_before_the_optimizer_setting_bit_for_bit(tmp_path, monkeypatch):
    config = tiny_config(tmp_path / "now", max_steps=6, warmup_steps=2, eval_interval=0, checkpoint_interval=0)
    assert config.optimizer.name == "adamw" and config.schedule.lr_schedule == "cosine"  # the defaults
    result = train(config)
    losses, digest = [float(loss).hex() for loss in result.losses], weights_digest(Path(config.output.out_dir))
    assert isinstance(configure_optimizer(GPT(config.model_config(300)), config.optimizer, CPU), torch.optim.AdamW)
    if torch.backends.cpu.get_cpu_capability() == PINNED_CAPABILITY:
        assert (losses, digest) == (PINNED_LOSSES, PINNED_WEIGHTS)
    # On this machine: the same run with the optimizer and schedule as that commit built them
    monkeypatch.setattr(pretrain, "configure_optimizer", adamw_as_before)
    monkeypatch.setattr(trainer, "apply_schedule", schedule_as_before)
    before = train(config.replace(out_dir=str(tmp_path / "before")))
    assert [float(loss).hex() for loss in before.losses] == losses
    assert weights_digest(tmp_path / "before") == digest


# ----------------------------------------------------------------------------------- Muon's update
def reference_muon(weight, grads, *, lr, momentum, weight_decay, steps):
    """Muon from its definition, one matrix at a time, in float64: EMA momentum, Nesterov, the quintic
    Newton-Schulz on the wide orientation, the sqrt(max(1, out/in)) scale, decoupled weight decay."""
    a, b, c = NS_COEFFICIENTS
    w = weight.double().clone()
    buffer = torch.zeros_like(w)
    for g in grads:
        g = g.double()
        buffer = momentum * buffer + (1 - momentum) * g
        u = (1 - momentum) * g + momentum * buffer
        x = u / u.norm()
        tall = x.shape[0] > x.shape[1]
        if tall:
            x = x.T
        for _ in range(steps):
            A = x @ x.T
            x = a * x + b * A @ x + c * A @ A @ x
        if tall:
            x = x.T
        w = w * (1 - lr * weight_decay) - lr * math.sqrt(max(1.0, w.shape[0] / w.shape[1])) * x
    return w


@pytest.mark.parametrize("shape", [(48, 16), (16, 48), (24, 24)], ids=["tall", "wide", "square"])
def test_muon_updates_one_matrix_as_the_algorithm_defines(shape):
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(shape))
    start = weight.detach().clone()
    grads = [torch.randn(shape) for _ in range(3)]
    optimizer = MuonAdamW([{"params": [weight], "use_muon": True, "lr": 0.02, "momentum": 0.9,
                            "weight_decay": 0.1, "ns_steps": 5}])  # fmt: skip
    for g in grads:
        weight.grad = g.clone()
        optimizer.step()
    expected = reference_muon(start, grads, lr=0.02, momentum=0.9, weight_decay=0.1, steps=5)
    torch.testing.assert_close(weight.detach().double(), expected, rtol=0, atol=1e-5)


def test_muon_matches_torch_optim_muon_up_to_its_bfloat16_newton_schulz():
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(64, 32))
    theirs = torch.nn.Parameter(ours.detach().clone())
    start = ours.detach().clone()
    optimizer = MuonAdamW([{"params": [ours], "use_muon": True, "lr": 0.05, "weight_decay": 0.1}])
    reference = torch.optim.Muon([theirs], lr=0.05, weight_decay=0.1, momentum=0.95, nesterov=True)
    for _ in range(3):
        g = torch.randn(64, 32)
        ours.grad, theirs.grad = g.clone(), g.clone()
        optimizer.step()
        reference.step()
    moved = (theirs.detach() - start).abs().max()
    assert moved > 0.05  # the update is not negligible next to the tolerance
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=0.02 * float(moved))


def test_same_shaped_matrices_are_orthogonalized_together_as_each_one_alone():
    torch.manual_seed(0)
    together = [torch.nn.Parameter(torch.randn(32, 16)) for _ in range(3)]
    alone = [torch.nn.Parameter(p.detach().clone()) for p in together]
    grads = [torch.randn(32, 16) for _ in together]
    batched = MuonAdamW([{"params": together, "use_muon": True}])
    for p, g in zip(together, grads, strict=True):
        p.grad = g.clone()
    batched.step()
    for p, g in zip(alone, grads, strict=True):
        p.grad = g.clone()
        MuonAdamW([{"params": [p], "use_muon": True}]).step()
    for a, b in zip(together, alone, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-6)


def test_muon_refuses_a_non_matrix_parameter():
    with pytest.raises(ValueError, match="2-D matrices only"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(4))], "use_muon": True}])


# ------------------------------------------------------------------------------- parameter groups
def test_muon_gets_exactly_the_blocks_matrices_and_adamw_everything_else():
    config = TrainConfig.from_dict(dict(optimizer="muon", n_layer=2, n_head=2, n_embd=32, block_size=16))
    model = GPT(config.model_config(vocab_size=300))
    names = {id(p): name for name, p in model.named_parameters()}
    muon, decay, no_decay = muon_parameter_groups(model, config.optimizer)
    assert muon["use_muon"] and not decay["use_muon"] and not no_decay["use_muon"]
    assert {names[id(p)] for p in muon["params"]} == {
        f"transformer.h.{i}.{name}.weight" for i in range(2)
        for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    }  # fmt: skip
    assert {names[id(p)] for p in decay["params"]} == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert model.lm_head.weight is model.transformer.wte.weight  # the tied head: in AdamW's group, once
    assert all(p.dim() == 1 for p in no_decay["params"])  # biases and LayerNorm gains
    grouped = [id(p) for group in (muon, decay, no_decay) for p in group["params"]]
    assert sorted(grouped) == sorted(id(p) for p in model.parameters())
    assert (muon["max_lr"], muon["weight_decay"], decay["max_lr"], decay["weight_decay"], no_decay["weight_decay"]) == (
        config.optimizer.muon_lr,
        config.optimizer.muon_weight_decay,
        config.optimizer.learning_rate,
        config.optimizer.weight_decay,
        0.0,
    )


def test_bad_optimizer_settings_name_the_field():
    for key, value, message in [
        ("optimizer.name", "sgd", "optimizer.name = 'sgd': must be one of"),
        ("schedule.lr_schedule", "linear", "lr_schedule = 'linear': must be one of"),
        ("optimizer.muon_momentum", 1.0, r"muon_momentum = 1.0: must be a number in \["),
        ("optimizer.muon_ns_steps", 0, r"muon_ns_steps = 0: must be an integer in \[1, 20\]"),
        ("schedule.decay_fraction", 0.0, r"decay_fraction = 0.0: must be a number in \("),
        ("optimizer.muon_ns_dtype", "float16", "muon_ns_dtype = 'float16': must be one of"),
    ]:
        with pytest.raises(ValueError, match=message):
            TrainConfig.from_name("stdlib", **{key: value})


# -------------------------------------------------------------------------------------- schedules
def test_wsd_warms_up_holds_the_peak_then_decays_linearly_to_the_floor():
    lrs = [wsd_learning_rate_at(s, max_lr=1.0, min_lr=0.1, warmup_steps=2, decay_steps=10, decay_fraction=0.3)
           for s in range(12)]  # fmt: skip
    expected = [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.7, 0.4, 0.1, 0.1]  # decay over steps 7..10
    assert lrs == pytest.approx(expected, abs=1e-12)


def test_each_group_follows_the_schedule_from_its_own_peak_and_muon_momentum_warms_up():
    config = TrainConfig.from_dict(dict(optimizer="muon", n_layer=1, n_head=2, n_embd=32, block_size=16, max_steps=10,
                         warmup_steps=2, learning_rate=1e-3, muon_lr=0.05, lr_schedule="wsd", decay_fraction=0.5,
                         muon_momentum_warmup_steps=4))  # fmt: skip
    optimizer = configure_optimizer(GPT(config.model_config(300)), config.optimizer, CPU)
    for step in range(10):
        logged = apply_schedule(optimizer, config, step)
        settings = dict(min_lr=0.0, warmup_steps=2, decay_steps=10, decay_fraction=0.5)
        assert logged == wsd_learning_rate_at(step, max_lr=1e-3, **{**settings, "min_lr": 1e-4})
        muon, *adamw = optimizer.param_groups
        assert muon["lr"] == pytest.approx(wsd_learning_rate_at(step, max_lr=0.05, **{**settings, "min_lr": 5e-3}))
        assert all(group["lr"] == logged for group in adamw)
        assert muon["momentum"] == pytest.approx(0.85 + 0.1 * min(step, 4) / 4)


def test_the_loop_logs_the_wsd_schedule(tmp_path):
    config = tiny_config(tmp_path, max_steps=6, warmup_steps=1, eval_interval=0, lr_schedule="wsd",
                         decay_fraction=0.5, optimizer="muon")  # fmt: skip
    train(config)
    from test_train import metric_lines

    logged = [r["lr"] for r in metric_lines(Path(config.output.out_dir)) if "lr" in r]
    assert logged == [wsd_learning_rate_at(s, max_lr=1e-2, min_lr=1e-3, warmup_steps=1, decay_steps=6,
                                           decay_fraction=0.5) for s in range(6)]  # fmt: skip
    assert logged != [learning_rate_at(s, max_lr=1e-2, min_lr=1e-3, warmup_steps=1, decay_steps=6) for s in range(6)]


# ------------------------------------------------------------------------- Muon in the training loop
@pytest.mark.slow
def test_muon_trains_and_beats_adamw_on_the_same_steps(tmp_path):
    settings = dict(max_steps=30, warmup_steps=3, eval_interval=0, checkpoint_interval=0)
    adamw = train(tiny_config(tmp_path / "adamw", **settings))
    muon = train(tiny_config(tmp_path / "muon", optimizer="muon", muon_lr=0.05, **settings))
    assert muon.losses[-1] < muon.losses[0] - 1.0
    assert sum(muon.losses[-5:]) < sum(adamw.losses[-5:])


def test_muon_with_grad_accumulation_steps_on_the_mean_gradient_of_the_micro_batches():
    # the same 4 rows as one batch, or as 2 micro-batches of 2 accumulated: the same Muon step (float32
    # Newton-Schulz, which auto picks on most CPUs: the comparison is at float32's tolerance)
    torch.manual_seed(0)
    config = TrainConfig.from_dict(dict(optimizer="muon", n_layer=1, n_head=2, n_embd=32, block_size=16,
                                        weight_decay=0.1, muon_ns_dtype="float32"))  # fmt: skip
    one = GPT(config.model_config(vocab_size=64))
    two = GPT(config.model_config(vocab_size=64))
    two.load_state_dict(one.state_dict())
    x = torch.randint(0, 64, (4, 17))
    optimizers = [configure_optimizer(model, config.optimizer, CPU) for model in (one, two)]
    for _ in range(2):
        one(x[:, :-1], x[:, 1:]).loss.backward()
        for half in (x[:2], x[2:]):
            (two(half[:, :-1], half[:, 1:]).loss / 2).backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad()
    # the Muon matrices (AdamW's biases are left out: Adam turns float noise in a zero gradient, such as the
    # key bias's, into +-lr)
    muon = [name for name, p in one.named_parameters() if p.dim() == 2 and ".h." in name]
    assert len(muon) == 4
    for name in muon:
        torch.testing.assert_close(one.get_parameter(name), two.get_parameter(name), rtol=0, atol=1e-5, msg=name)
    torch.manual_seed(0)
    start = GPT(config.model_config(vocab_size=64))
    assert not torch.equal(one.transformer.h[0].mlp.c_fc.weight, start.transformer.h[0].mlp.c_fc.weight)  # it moved


@pytest.mark.parametrize(
    "settings",
    [dict(dtype="bfloat16"), dict(activation_checkpointing=True), dict(muon_ns_dtype="bfloat16")],
    ids=["bf16-autocast", "activation-checkpointing", "bf16-newton-schulz"],
)
def test_muon_trains_under_each_training_setting(tmp_path, settings):
    result = train(tiny_config(tmp_path, optimizer="muon", max_steps=8, eval_interval=0, **settings))
    assert all(math.isfinite(loss) for loss in result.losses) and result.losses[-1] < result.losses[0]


@pytest.mark.parametrize("fast_bfloat16", [True, False])
def test_newton_schulz_runs_in_bfloat16_on_cpus_that_multiply_it_fast(fast_bfloat16, monkeypatch):
    monkeypatch.setattr(optimizer_module, "cpu_prefers_bf16", lambda: fast_bfloat16)
    config = TrainConfig.from_dict(dict(optimizer="muon"))
    optimizer = configure_optimizer(GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16)),
                                    config.optimizer, CPU)  # fmt: skip
    assert isinstance(optimizer, MuonAdamW)
    assert optimizer.ns_dtype == (torch.bfloat16 if fast_bfloat16 else torch.float32)


@pytest.mark.slow
def test_compiled_newton_schulz_computes_what_the_eager_one_computes():
    torch.manual_seed(0)
    eager = [torch.nn.Parameter(torch.randn(32, 16)) for _ in range(2)]
    compiled = [torch.nn.Parameter(p.detach().clone()) for p in eager]
    for params, compile in ((eager, False), (compiled, True)):
        optimizer = MuonAdamW([{"params": params, "use_muon": True}], compile=compile)
        for step in range(2):
            for i, p in enumerate(params):
                p.grad = torch.full_like(p, 0.1) + torch.linspace(-1, 1, p.numel()).view_as(p) * (i + step + 1)
            optimizer.step()
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=0, atol=1e-5)


@pytest.mark.slow
def test_muon_resumes_exactly_after_sigkill(tmp_path):
    # dropout on, so the RNG state matters too; the process dies (no cleanup) in step 6, after the step-4 checkpoint
    settings = dict(optimizer="muon", dropout=0.1, max_steps=8, checkpoint_interval=4, eval_interval=4,
                    muon_momentum_warmup_steps=3)  # fmt: skip
    whole = tiny_config(tmp_path / "a", **settings)
    killed = tiny_config(tmp_path / "b", **settings)
    straight = train(whole)
    script = textwrap.dedent(f"""
        import os, signal
        import torch
        from gpt2.train import train
        from gpt2.train.config import OptimizerConfig, TrainConfig
        from gpt2.train.trainer import Trainer

        step = Trainer.train_step
        def dying_step(self):
            if self.step == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            return step(self)
        Trainer.train_step = dying_step
        torch.set_num_threads(1)  # as the straight run in this test: the same float reduction order
        train(TrainConfig.from_dict({killed.to_dict()!r}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    resumed = train(killed, resume=True)
    assert (resumed.start_step, resumed.step) == (4, 8)
    assert resumed.losses == straight.losses[4:]
    a, b = read_weights(Path(whole.output.out_dir)), read_weights(Path(killed.output.out_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_frozen_block_matrices_leave_no_muon_group():
    model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=64, n_layer=1, n_head=2, n_embd=32, block_size=16))
    config = TrainConfig.from_dict(dict(optimizer="muon", n_layer=1, n_head=2, n_embd=32, block_size=16))
    for p in model.transformer.h.parameters():  # only the embeddings and final LayerNorm trainable
        p.requires_grad_(False)
    optimizer = configure_optimizer(model, config.optimizer, CPU)
    assert not any(group["use_muon"] for group in optimizer.param_groups)


@pytest.mark.slow
def test_gpt2_finetune_trains_with_muon(tmp_path: Path) -> None:
    import json

    from gpt2.cli import main
    from gpt2.tokenizer import ByteTokenizer
    from gpt2.weights import save_pretrained

    torch.manual_seed(0)
    save_pretrained(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, vocab_size=257, block_size=64)), tmp_path / "model")
    ByteTokenizer().save(tmp_path / "model")
    (tmp_path / "data.txt").write_text("a small text to fine-tune on, said twice. " * 100)
    status = main(["finetune", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "data.txt"),
                   "--out", str(tmp_path / "out"), "--set", "optimizer=muon", "--set", "max_steps=6",
                   "--set", "batch_size=4", "--set", "block_size=32"])  # fmt: skip
    assert status == 0
    (checkpoint,) = (tmp_path / "out" / "checkpoints").glob("step_*")
    assert json.loads((checkpoint / "train_config.json").read_text())["optimizer"]["name"] == "muon"
    losses = [json.loads(line)["loss"] for line in (tmp_path / "out" / "metrics.jsonl").open() if '"loss"' in line]
    assert losses and all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
