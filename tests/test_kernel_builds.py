"""The builds of the native kernels: inference runs on the best one this CPU executes (or the one GPT2_CPU_ISA
names), and every vector build computes what the portable reference computes (NEON's under qemu:
tests/test_kernel_harness.py)."""

from __future__ import annotations

import copy
import os
import platform

import pytest
import torch

import gpt2.cpu.kernels as kernels
from gpt2.cpu import Int8Linear, prepare_for_inference
from gpt2.cpu.decoder import native_decoder
from gpt2.cpu.kernels import (
    ISA_VARIABLE,
    ISAS,
    KIND,
    SWITCH_VARIABLE,
    NativeLinear,
    active_isa,
    kernels_available,
    native_linear,
    runnable_isas,
    selected_isa,
    use_native_kernels,
)
from test_kernels import PRECISIONS, SEED, prefilled, random_gpt, step_inputs, stored


@pytest.fixture(autouse=True)
def built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each build this CPU runs, built (under CI, which has a C++ compiler, not building is a failure)."""
    monkeypatch.delenv(ISA_VARIABLE, raising=False)
    monkeypatch.delenv(SWITCH_VARIABLE, raising=False)
    for isa in runnable_isas():
        if not kernels_available(isa):
            message = f"the {isa} build of the native CPU kernels did not build here (see the log line)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)


AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"}
AVX2 = {"avx", "avx2", "fma", "f16c"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("switch", "flags", "expected"),
    [
        (None, AVX512, "avx512"),  # the best build this CPU runs
        (None, AVX2, "avx2"),
        (None, {"sse2", "avx"}, "pytorch"),  # no vector build: the PyTorch layouts beat the portable loops
        ("1", {"sse2", "avx"}, "portable"),  # asked for
        ("0", AVX512, "pytorch"),  # switched off
    ],
)
def test_inference_runs_on_the_best_kernel_build_the_cpu_has(
    switch: str | None, flags: set[str], expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not kernels.cpu_flags().issuperset(flags & (AVX512 | AVX2)) or platform.machine() != "x86_64":
        pytest.skip("this CPU cannot run that build")
    monkeypatch.delenv(ISA_VARIABLE, raising=False)
    if switch is None:
        monkeypatch.delenv(SWITCH_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(SWITCH_VARIABLE, switch)
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset(flags))
    assert active_isa() == expected
    assert use_native_kernels() is (expected != "pytorch")
    model = prepare_for_inference(random_gpt(), "int8")
    assert isinstance(model.transformer.h[0].mlp.c_fc, NativeLinear if expected != "pytorch" else Int8Linear)
    decoder = native_decoder(model)
    assert (decoder.isa if decoder else "pytorch") == expected


def test_gpt2_cpu_isa_picks_the_build_and_names_the_choices_when_the_cpu_cannot_run_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ISA_VARIABLE, "portable")
    assert active_isa() == "portable"
    assert native_decoder(random_gpt()).isa == "portable"  # type: ignore[union-attr]
    unrunnable = next(isa for isa in ISAS if isa not in runnable_isas())  # NEON on x86, an x86 set on ARM
    monkeypatch.setenv(ISA_VARIABLE, unrunnable)
    with pytest.raises(ValueError, match=f"{ISA_VARIABLE}='{unrunnable}'.*choose one of .*portable"):
        use_native_kernels()


def test_an_arm_cpu_selects_the_neon_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ISA_VARIABLE, raising=False)
    monkeypatch.setattr(kernels.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"fp", "asimd", "asimddp"}))
    assert runnable_isas() == ("neon", "portable")
    assert selected_isa() == "neon"


@pytest.mark.parametrize("isa", [isa for isa in runnable_isas() if isa != "portable"])
def test_each_vector_build_computes_what_the_portable_reference_computes(isa: str) -> None:
    """Integer products exactly, float sums up to their order; the decode step and a span likewise."""
    torch.manual_seed(SEED)
    layer = torch.nn.Linear(128, 301)
    for rows in (1, 2, 5):  # one row, few rows, blocks of 4 and a rest
        x = torch.randn(rows, 128)
        for precision in PRECISIONS:
            weight, scale = stored(layer, precision)
            arguments = (weight, scale, layer.bias.detach(), KIND[precision], 301)
            torch.testing.assert_close(
                native_linear(x, *arguments, isa=isa),
                native_linear(x, *arguments, isa="portable"),
                atol=1e-5,
                rtol=1e-5,
            )
            if precision in ("int8", "int4") and rows == 1:
                dequantized = (weight, scale, KIND[precision], 128, 301, torch.float32)
                assert torch.equal(
                    kernels.native_ops(isa).dequantize(*dequantized),
                    kernels.native_ops("portable").dequantize(*dequantized),
                )
    model = random_gpt()
    tokens, key_mask, cache, positions = step_inputs(model, [7, 3])
    theirs = copy.deepcopy(cache)
    logits = native_decoder(model, isa=isa).step(tokens, cache, positions=positions, key_mask=key_mask)  # type: ignore[union-attr]
    expected = native_decoder(model, isa="portable").step(  # type: ignore[union-attr]
        tokens, theirs, positions=positions, key_mask=key_mask
    )
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    span, cache = torch.tensor([3, 1, 4, 1, 5, 9]), prefilled(model, 7)
    logits = native_decoder(model, isa=isa).extend(span, copy.deepcopy(cache))  # type: ignore[union-attr]
    torch.testing.assert_close(logits, native_decoder(model, isa="portable").extend(span, cache), atol=1e-5, rtol=1e-5)  # type: ignore[union-attr]
