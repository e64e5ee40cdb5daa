"""The memory planner: the estimate matches what training really takes on a CPU; a run that cannot fit is refused
with the fix; auto_batch_size picks the largest micro-batch that fits and keeps the global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from gpt2.config import GPTConfig
from gpt2.finetune.memory import (
    GIB,
    RUNTIME_OVERHEAD_BYTES,
    auto_batch_size,
    check_fits,
    estimate_memory,
    parameter_count,
)
from gpt2.model import GPT

MIB = 2**20
GPT2 = GPTConfig.from_name("gpt2")

# Peak resident memory of a few AdamW training steps, above the process's resident memory after the imports, in a
# fresh interpreter. Read from /proc/self/status (VmHWM: the peak of this process's own memory map), not from
# getrusage's ru_maxrss, which Linux carries over from the parent across fork and exec: under a pytest process
# that has grown larger than the run, ru_maxrss would report pytest's size. glibc's malloc would keep freed
# multi-MB tensors in its heap (its mmap threshold grows with every large free), so RSS would count memory the run
# no longer holds; a fixed threshold returns every freed large tensor to the system and RSS follows what training
# actually holds.
MEASURE = textwrap.dedent(
    """
    import json, sys
    import torch
    from gpt2.config import GPTConfig
    from gpt2.model import GPT

    def status_bytes(field):  # /proc/self/status reports kB
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

    args = json.loads(sys.argv[1])
    config = GPTConfig(**args["config"])
    x = torch.randint(0, config.vocab_size, (args["batch_size"], args["block_size"]))
    y = torch.randint(0, config.vocab_size, (args["batch_size"], args["block_size"]))
    baseline = status_bytes("VmRSS")
    model = GPT(config).train()
    model.activation_checkpointing = args["activation_checkpointing"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)  # the Trainer's CPU AdamW
    for _ in range(3):
        model(x, y).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    print(status_bytes("VmHWM") - baseline)
    """
)


def measured_peak_bytes(config: GPTConfig, batch_size: int, block_size: int, activation_checkpointing: bool) -> int:
    args = {"config": config.to_dict(), "batch_size": batch_size, "block_size": block_size,
            "activation_checkpointing": activation_checkpointing}  # fmt: skip
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    result = subprocess.run([sys.executable, "-c", MEASURE, json.dumps(args)], capture_output=True, text=True,
                            env=env, check=True, timeout=300)  # fmt: skip
    return int(result.stdout.strip().splitlines()[-1])


SMALL = GPTConfig(n_layer=4, n_head=4, n_embd=256, vocab_size=8192, block_size=256)  # 5.3M parameters
LARGER = GPTConfig(n_layer=6, n_head=6, n_embd=384, vocab_size=16384, block_size=256)  # 17M parameters


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize(
    ("config", "activation_checkpointing"),
    [(SMALL, False), (LARGER, False), (SMALL, True)],
    ids=["small", "larger", "small-checkpointed"],
)
def test_the_estimate_is_within_20_percent_of_measured_peak_rss(config, activation_checkpointing):
    estimate = estimate_memory(config, 8, 256, dtype=torch.float32, activation_checkpointing=activation_checkpointing)
    measured = measured_peak_bytes(config, 8, 256, activation_checkpointing)
    assert measured == pytest.approx(estimate.total, rel=0.2), (measured / MIB, estimate.describe())


# ---------------------------------------------------------------------------------------------- the estimate
@pytest.mark.slow
def test_parameter_count_is_the_models():
    for config in (GPT2, SMALL, GPTConfig.from_name("gpt2-tiny", bias=False)):
        assert parameter_count(config) == GPT(config).num_parameters()


def test_adamw_keeps_two_fp32_moments_and_sgd_one():
    adamw = estimate_memory(SMALL, 1, 64, optimizer="adamw")
    sgd = estimate_memory(SMALL, 1, 64, optimizer="sgd")
    assert adamw.optimizer_state == 2 * adamw.gradients == 2 * 4 * parameter_count(SMALL)
    assert sgd.optimizer_state == sgd.gradients


def test_lora_trains_only_the_adapters():
    lora = estimate_memory(GPT2, 1, 1024, lora_params=1_000_000)
    assert lora.gradients == 4_000_000 and lora.optimizer_state == 8_000_000
    assert lora.weights == 4 * (parameter_count(GPT2) + 1_000_000)


def test_activations_grow_linearly_with_the_batch_and_checkpointing_shrinks_them():
    one, four = estimate_memory(GPT2, 1, 1024), estimate_memory(GPT2, 4, 1024)
    assert four.activations == 4 * one.activations
    assert four.weights == one.weights and four.optimizer_state == one.optimizer_state
    checkpointed = estimate_memory(GPT2, 4, 1024, activation_checkpointing=True)
    assert checkpointed.activations == four.activations_with_checkpointing < four.activations
    assert checkpointed.total == four.total - (four.activations - checkpointed.activations)


def test_total_is_the_sum_of_the_parts():
    e = estimate_memory(SMALL, 2, 128, dtype=torch.bfloat16)
    assert e.total == e.weights + e.gradients + e.optimizer_state + e.activations + RUNTIME_OVERHEAD_BYTES


def test_a_run_that_does_not_fit_is_refused_naming_estimate_budget_and_fix():
    estimate = estimate_memory(GPT2, 32, 1024)
    with pytest.raises(ValueError) as error:
        check_fits(estimate, 8 * GIB)
    message = str(error.value)
    assert f"{estimate.total / GIB:.2f} GiB" in message and "budget is 8.00 GiB" in message
    assert "lower batch_size" in message and "activation_checkpointing=True" in message
    check_fits(estimate, estimate.total)  # exactly enough is enough


def test_a_block_size_beyond_the_models_positions_is_refused():
    with pytest.raises(ValueError, match="exceeds the model's 1024 positions"):
        estimate_memory(GPT2, 1, 2048)


# ------------------------------------------------------------------------------------------ auto_batch_size
def test_auto_batch_size_picks_the_largest_micro_batch_that_fits():
    budget = estimate_memory(GPT2, 8, 1024).total  # exactly 8 sequences fit
    plan = auto_batch_size(GPT2, 1024, budget, global_batch_size=64)
    assert (plan.batch_size, plan.grad_accum_steps) == (8, 8)
    assert plan.estimate.total <= budget
    assert auto_batch_size(GPT2, 1024, budget - 1, global_batch_size=64).batch_size == 4


def test_auto_batch_size_keeps_the_global_batch_over_processes():
    budget = estimate_memory(GPT2, 6, 1024).total
    plan = auto_batch_size(GPT2, 1024, budget, global_batch_size=48, world_size=2)
    assert (plan.batch_size, plan.grad_accum_steps) == (6, 4)  # 6 * 4 * 2 == 48
    plan = auto_batch_size(GPT2, 1024, budget, global_batch_size=20, world_size=2)
    assert (plan.batch_size, plan.grad_accum_steps) == (5, 2)  # the largest divisor of 10 that fits


def test_auto_batch_size_takes_the_whole_batch_when_it_fits():
    plan = auto_batch_size(SMALL, 256, 100 * GIB, global_batch_size=12)
    assert (plan.batch_size, plan.grad_accum_steps) == (12, 1)


def test_auto_batch_size_uses_checkpointing_when_asked():
    deep = GPT2.replace(vocab_size=1024)  # the blocks, not the LM head, hold most activations
    budget = estimate_memory(deep, 4, 1024).total
    plain = auto_batch_size(deep, 1024, budget, global_batch_size=64)
    checkpointed = auto_batch_size(deep, 1024, budget, global_batch_size=64, activation_checkpointing=True)
    assert (plain.batch_size, checkpointed.batch_size) == (4, 16)


def test_auto_batch_size_refuses_when_one_sequence_does_not_fit():
    with pytest.raises(ValueError, match=r"batch_size 1 x block_size 1024.*budget is 1\.00 GiB"):
        auto_batch_size(GPT2, 1024, GIB, global_batch_size=8)


def test_auto_batch_size_refuses_a_global_batch_that_processes_cannot_share():
    with pytest.raises(ValueError, match="must be a positive multiple of world_size"):
        auto_batch_size(GPT2, 1024, 100 * GIB, global_batch_size=9, world_size=2)
