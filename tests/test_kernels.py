"""Native CPU kernels: every weight format's product is the linear layer of the weights it stands for; the native
decode step computes what the model's forward computes; generation, the server's batch and `prepare_for_inference`
use them, and fall back to the PyTorch layouts where they cannot."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import gpt2.cpu.kernels as kernels
import gpt2.cpu.layouts as layouts
from gpt2.config import GPTConfig
from gpt2.cpu import Int4Linear, Int8Linear, SplitLinear, prepare_for_inference
from gpt2.cpu.decoder import FLOAT32_MAX_ROWS, native_decoder
from gpt2.cpu.kernels import (
    ISA_VARIABLE,
    KIND,
    MANY_ROWS,
    SWITCH_VARIABLE,
    NativeLinear,
    kernels_available,
    native_linear,
    pack_int4,
    pack_int8,
    runnable_isas,
    unpack_int4,
    unpack_int8,
)
from gpt2.inference import stream
from gpt2.inference.generation import DecodeOptions, left_pad
from gpt2.inference.sampling import SamplingParams
from gpt2.model import GPT, KVCache
from gpt2.serve.batch import DecodeBatch

SEED = 1234
GREEDY_40 = SamplingParams(max_tokens=40, temperature=0)


def window(native: bool) -> DecodeOptions:
    return DecodeOptions(slide_by=8, native=native)


PRECISIONS = ["float32", "bfloat16", "int8", "int4"]


@pytest.fixture(scope="module", autouse=True, params=runnable_isas())
def native_kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test of this module runs on each build of the kernels this CPU executes (GPT2_CPU_ISA: AVX-512, AVX2,
    the portable reference; NEON under qemu in tests/test_kernel_harness.py). Under CI (which has a C++ compiler) a
    build that does not build is a failure."""
    isa = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ISA_VARIABLE, isa)
        patch.delenv(SWITCH_VARIABLE, raising=False)
        if not kernels_available(isa):
            message = f"the {isa} build of the native CPU kernels did not build here (see the log line)"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(message)
            pytest.skip(message)
        yield isa


def random_gpt(*, n_embd: int = 64, block_size: int = 64, vocab_size: int = 300) -> GPT:
    """A tiny GPT with weights large enough (std 0.1) that near-ties in argmax are rare."""
    torch.manual_seed(SEED)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=n_embd, vocab_size=vocab_size, block_size=block_size))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.1)
    return model.eval()


def reference_weight(layer: torch.nn.Linear, precision: str) -> torch.Tensor:
    """The float32 weight a layer packed at `precision` stands for, computed in Python."""
    if precision == "float32":
        return layer.weight.detach()
    if precision == "bfloat16":
        return layer.weight.detach().bfloat16().float()
    if precision == "int8":
        return unpack_int8(*pack_int8(layer.weight), layer.out_features)
    return unpack_int4(*pack_int4(layer.weight), layer.out_features)


def stored(layer: torch.nn.Linear, precision: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    if precision == "float32":
        return layer.weight.detach(), None
    if precision == "bfloat16":
        return layer.weight.detach().bfloat16(), None
    return (pack_int8 if precision == "int8" else pack_int4)(layer.weight)


# ------------------------------------------------------------------------------------------ products
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 17, 40])  # decode steps; groups of PROMPT_ROWS and the rest
@pytest.mark.parametrize("shape", [(96, 64), (301, 128)])  # (out, in): 301 rows leave a partial tile
def test_each_format_computes_the_linear_layer_of_its_weights(precision: str, rows: int, shape: tuple) -> None:
    torch.manual_seed(SEED)
    layer = torch.nn.Linear(shape[1], shape[0])
    x = torch.randn(rows, shape[1])
    weight, scale = stored(layer, precision)
    y = native_linear(x, weight, scale, layer.bias.detach(), KIND[precision], shape[0])
    # bfloat16 multiplies activations rounded to bfloat16; int8 / int4 quantize them to int16 in blocks of 32
    inputs = x.bfloat16().float() if precision == "bfloat16" else x
    expected = F.linear(inputs, reference_weight(layer, precision), layer.bias)
    tolerance = 1e-5 if precision in ("float32", "bfloat16") else 2e-4  # int16 activations: <= 1/65534 a block
    torch.testing.assert_close(y, expected, atol=tolerance * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("many_rows_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("precision", ["bfloat16", "int8", "int4"])
def test_many_rows_multiply_by_the_dequantized_weight(
    precision: str, many_rows_dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In float32, or in bfloat16 where the CPU multiplies it fast (many_rows_dtype): both paths on every CPU."""
    monkeypatch.setattr(kernels, "many_rows_dtype", lambda: many_rows_dtype)
    monkeypatch.setattr(kernels, "native_prompts", lambda precision: False)
    torch.manual_seed(SEED)
    layer = NativeLinear.from_linear(torch.nn.Linear(64, 96), precision)
    x = torch.randn(2, MANY_ROWS[precision] // 2 + 1, 64)  # (B, T, in) with B * T >= MANY_ROWS
    y, expected = layer(x), layer.reference_forward(x)
    assert y.dtype == x.dtype
    # bfloat16 rounds the activations and the products' inputs to 8 bits of mantissa: ~1% of the output's scale
    tolerance = 1e-5 if many_rows_dtype == torch.float32 else 2e-2 * expected.abs().max().item()
    torch.testing.assert_close(y, expected, atol=tolerance, rtol=0 if many_rows_dtype == torch.bfloat16 else 1e-5)
    few = x[:1, :5]
    inputs = few.bfloat16().float() if precision == "bfloat16" else few
    torch.testing.assert_close(layer(few), layer.reference_forward(inputs), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_many_int_rows_stay_native_where_the_cpu_has_pair_products(
    precision: str, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """native_prompts: the native product of many rows (its activations quantized to int16 in blocks of 32) or the
    float32 product over the dequantized weight, each the layer's linear map."""
    monkeypatch.setattr(kernels, "native_prompts", lambda precision: native)
    torch.manual_seed(SEED)
    layer = NativeLinear.from_linear(torch.nn.Linear(128, 301), precision)
    x = torch.randn(3, MANY_ROWS[precision], 128)
    y, expected = layer(x), layer.reference_forward(x)
    native_y = native_linear(x, layer.weight_packed, layer.scale, layer.bias, layer.kind, layer.out_features)
    assert torch.equal(y, native_y) == native
    torch.testing.assert_close(y, expected, atol=2e-4 * expected.abs().max().item(), rtol=0)


def test_native_prompts_need_one_instruction_pair_products(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "active_isa", lambda: "avx512")
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx512f", "avx512_vnni"}))
    assert kernels.native_prompts("int8") and kernels.native_prompts("int4")
    assert not kernels.native_prompts("bfloat16")
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx512f"}))
    assert not kernels.native_prompts("int8")
    monkeypatch.setattr(kernels, "active_isa", lambda: "avx2")
    monkeypatch.setattr(kernels, "cpu_flags", lambda: frozenset({"avx2", "avx_vnni"}))
    assert not kernels.native_prompts("int8")


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8", "int4"])
def test_no_rows_give_no_rows(precision: str) -> None:
    layer = torch.nn.Linear(64, 48)
    weight, scale = stored(layer, precision)
    y = native_linear(torch.randn(0, 64), weight, scale, layer.bias.detach(), KIND[precision], 48)
    assert y.shape == (0, 48)


def test_a_layer_keeps_its_inputs_dtype() -> None:
    layer = NativeLinear.from_linear(torch.nn.Linear(64, 32), "int8")
    assert layer(torch.randn(3, 64, dtype=torch.bfloat16)).dtype == torch.bfloat16
    assert layer(torch.randn(3, 64)).shape == (3, 32)


def test_int8_packing_gives_each_weight_back_within_half_a_step() -> None:
    torch.manual_seed(SEED)
    weight = torch.randn(40, 64)
    tiles, scale = pack_int8(weight)
    assert tiles.shape == (3, 32, 16, 2) and tiles.dtype == torch.int8  # 40 rows padded to 3 tiles of 16
    error = (unpack_int8(tiles, scale, 40) - weight).abs()
    assert (error <= scale[:40, None] / 2 + 1e-7).all()


def test_int4_packing_gives_each_weight_back_within_half_a_step() -> None:
    torch.manual_seed(SEED)
    weight = torch.randn(40, 64)
    codes, params = pack_int4(weight)
    assert codes.shape == (3, 2, 8, 16, 2) and codes.dtype == torch.uint8 and params.dtype == torch.float16
    scale = params[:, :, 0].float().permute(0, 2, 1).reshape(48, 2)[:40]  # (rows, groups)
    step = scale.repeat_interleave(32, dim=1)  # (rows, in)
    error = (unpack_int4(codes, params, 40) - weight).abs()
    # half a step, plus what rounding the scale and minimum to float16 moves the range by
    assert (error <= step / 2 + 2**-10 * (weight.abs().amax() + 15 * step)).all()


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_the_kernels_read_the_layout_the_packer_writes(precision: str) -> None:
    torch.manual_seed(SEED)
    layer = NativeLinear.from_linear(torch.nn.Linear(96, 301), precision)
    unpack = unpack_int8 if precision == "int8" else unpack_int4
    assert torch.equal(layer.dequantized_weight(), unpack(layer.weight_packed, layer.scale, 301))


def test_two_threads_compute_what_one_thread_computes() -> None:
    torch.manual_seed(SEED)
    layer = torch.nn.Linear(128, 301)
    x = torch.randn(3, 128)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results.append([native_linear(x, *stored(layer, p), layer.bias.detach(), KIND[p], 301) for p in PRECISIONS])
    for one, two in zip(*results, strict=True):
        assert torch.equal(one, two)  # each output is one thread's sum, in the same order


@pytest.mark.parametrize("precision", PRECISIONS)
def test_weights_that_do_not_hold_the_layer_are_refused(precision: str) -> None:
    weight, scale = stored(torch.nn.Linear(64, 40), precision)
    with pytest.raises(RuntimeError, match="does not hold 56 x 64"):  # claims 56 outputs, holds 40 (48 padded)
        native_linear(torch.randn(2, 64), weight, scale, None, KIND[precision], 56)
    with pytest.raises(RuntimeError, match="bias must hold 40"):
        native_linear(torch.randn(2, 64), weight, scale, torch.zeros(39), KIND[precision], 40)


def test_inputs_in_blocks_of_32_are_required() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        NativeLinear.from_linear(torch.nn.Linear(48, 8), "int8")


# ------------------------------------------------------------------------------------------ the decode step
def step_inputs(model: GPT, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, KVCache, torch.Tensor]:
    """Left-padded prompts prefilled into a cache; the next token of each row, its position and the key mask."""
    generator = torch.Generator().manual_seed(SEED)
    rows = [torch.randint(0, 300, (n,), generator=generator).tolist() for n in lengths]
    idx, mask = left_pad(rows, pad_token_id=0)
    cache = model.new_kv_cache(len(rows), max_len=idx.shape[1] + 1)
    with torch.no_grad():
        model.hidden_states(idx, attention_mask=mask, kv_cache=cache, validate=False)
    tokens = torch.randint(0, 300, (len(rows),), generator=generator)
    key_mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
    return tokens, key_mask, cache, mask.sum(dim=1)


def test_native_step_equals_the_model_forward_on_a_left_padded_batch() -> None:
    model = random_gpt()
    tokens, key_mask, cache, positions = step_inputs(model, [7, 3, 12])
    theirs = copy.deepcopy(cache)
    with torch.no_grad():
        expected = model(
            tokens.view(3, 1), attention_mask=key_mask, position_ids=positions.view(3, 1), kv_cache=theirs
        ).logits[:, -1]
    decoder = native_decoder(model)
    assert decoder is not None
    logits = decoder.step(tokens, cache, positions=positions, key_mask=key_mask)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert cache.length == theirs.length == 13
    torch.testing.assert_close(cache.k, theirs.k, atol=1e-6, rtol=1e-6)  # the new column written the same
    torch.testing.assert_close(cache.v, theirs.v, atol=1e-6, rtol=1e-6)


def test_native_step_at_position_1000_equals_the_model_forward() -> None:
    model = random_gpt(block_size=1024)
    tokens, _, cache, _ = step_inputs(model, [1000])
    theirs = copy.deepcopy(cache)
    with torch.no_grad():
        expected = model(tokens.view(1, 1), kv_cache=theirs).logits[:, -1]
    logits = native_decoder(model).step(tokens, cache)  # type: ignore[union-attr]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def prefilled(model: GPT, length: int) -> KVCache:
    """A cache of room 32 holding a random prompt of `length` tokens."""
    cache = model.new_kv_cache(1, max_len=32)
    with torch.no_grad():
        model.hidden_states(
            torch.randint(0, 300, (1, length), generator=torch.Generator().manual_seed(SEED)), kv_cache=cache
        )
    return cache


@pytest.mark.parametrize("count", [1, 2, 5, 9])  # the products take activation rows 4 at a time
def test_native_extend_feeds_a_span_of_one_sequence_as_the_model_forward_does(count: int) -> None:
    """T consecutive tokens in one call (a speculative verification): each attends to the cache and the span's
    tokens before it; the logits after each and the keys and values written are the forward's."""
    model = random_gpt()
    cache = prefilled(model, 11)
    theirs = copy.deepcopy(cache)
    span = torch.randint(0, 300, (count,), generator=torch.Generator().manual_seed(count))
    with torch.no_grad():
        expected = model(span.view(1, -1), kv_cache=theirs).logits[0]  # (T, V)
    logits = native_decoder(model).extend(span, cache)  # type: ignore[union-attr]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
    assert cache.length == theirs.length == 11 + count
    torch.testing.assert_close(cache.k, theirs.k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cache.v, theirs.v, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("precision", ["bfloat16", "int8", "int4"])
def test_native_extend_of_each_precision_is_its_steps_one_token_at_a_time(precision: str) -> None:
    model = prepare_for_inference(random_gpt(), precision)
    decoder = native_decoder(model)
    assert decoder is not None
    cache = prefilled(random_gpt(), 6)
    cache = KVCache(cache.k.bfloat16(), cache.v.bfloat16(), length=cache.length)
    stepped = copy.deepcopy(cache)
    span = torch.tensor([5, 17, 250, 3, 99, 41])
    logits = decoder.extend(span, cache)
    expected = torch.cat([decoder.step(span[t : t + 1], stepped) for t in range(len(span))])
    torch.testing.assert_close(logits, expected, atol=2e-3 * expected.abs().max().item(), rtol=0)
    assert cache.length == stepped.length == 12


@pytest.mark.parametrize("precision", ["bfloat16", "int8", "int4"])
def test_native_step_of_each_precision_is_the_float32_model_of_its_weights(precision: str) -> None:
    """What the step computes at a precision: the float32 model holding the weights that precision stores (and
    the same cached keys and values), up to rounding the step's activations (bfloat16 at products' inputs and
    in the cache, or int16 blocks)."""
    model = prepare_for_inference(random_gpt(), precision)
    reference = random_gpt()  # float32, every weight replaced by what the prepared model stores
    with torch.no_grad():
        for (name, ours), (_, theirs) in zip(model.named_modules(), reference.named_modules(), strict=True):
            if isinstance(ours, NativeLinear):
                theirs.weight = torch.nn.Parameter(ours.dequantized_weight().contiguous())
            elif hasattr(ours, "weight") and not name.endswith("lm_head"):
                theirs.weight.copy_(ours.weight.float())
            if getattr(ours, "bias", None) is not None:
                theirs.bias.copy_(ours.bias.float())
    tokens, key_mask, cache, positions = step_inputs(reference, [9, 4])
    cache.k, cache.v = cache.k.bfloat16().float(), cache.v.bfloat16().float()  # what a bfloat16 cache holds
    ours_cache = KVCache(cache.k.bfloat16(), cache.v.bfloat16(), length=cache.length)
    with torch.no_grad():
        expected = reference(
            tokens.view(2, 1), attention_mask=key_mask, position_ids=positions.view(2, 1), kv_cache=cache
        ).logits[:, -1]
    logits = native_decoder(model).step(tokens, ours_cache, positions=positions, key_mask=key_mask)  # type: ignore[union-attr]
    tolerance = 2e-2 if precision == "bfloat16" else 5e-3
    torch.testing.assert_close(logits, expected, atol=tolerance * expected.abs().max().item(), rtol=0)


def test_greedy_generation_is_the_same_with_and_without_native_steps() -> None:
    """A left-padded batch decoding past the context, so the window slides and re-prefills too."""
    model = random_gpt(block_size=32)
    idx, mask = left_pad([[5, 6, 7, 8, 9], [10, 11], [3] * 20], pad_token_id=0)
    runs = [
        torch.stack(
            list(stream(model, idx, GREEDY_40, attention_mask=mask, options=DecodeOptions(slide_by=8, native=native)))
        )
        for native in (True, False)
    ]
    assert torch.equal(runs[0], runs[1])


def test_native_true_refuses_a_model_it_cannot_run() -> None:
    model = random_gpt().train()
    with pytest.raises(ValueError, match="native decoding cannot run this model"):
        next(stream(model, torch.tensor([[1, 2]]), SamplingParams(max_tokens=2), options=DecodeOptions(native=True)))


def test_server_batch_steps_natively_and_agrees_with_the_model() -> None:
    model = random_gpt()
    native, plain = DecodeBatch(model, max_rows=3), DecodeBatch(model, max_rows=3)
    plain.decoder = None
    assert native.decoder is not None
    for batch in (native, plain):
        for prompt in ([1, 2, 3], [4, 5, 6, 7, 8, 9], [10]):
            batch.join(prompt)
    tokens = torch.tensor([11, 12, 13])
    for _ in range(3):
        torch.testing.assert_close(native.step(tokens), plain.step(tokens), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ choosing a form
@pytest.mark.parametrize(
    ("precision", "layer", "dtype"),
    [
        ("float32", layouts.OneDNNLinear, torch.float32),
        ("bfloat16", NativeLinear, torch.bfloat16),
        ("int8", NativeLinear, torch.bfloat16),
        ("int4", NativeLinear, torch.bfloat16),
    ],
)
def test_prepare_for_inference_uses_the_native_forms(precision: str, layer: type, dtype: torch.dtype) -> None:
    model = prepare_for_inference(random_gpt(), precision)
    assert type(model.transformer.h[0].mlp.c_fc) is layer and type(model.lm_head) is layer
    assert model.transformer.wte.weight.dtype == dtype
    assert native_decoder(model) is not None


def test_float32_prompts_multiply_in_onednn_with_the_models_own_weights_and_logits() -> None:
    """OneDNNLinear: oneDNN's float32 product in place of F.linear's BLAS (faster on AMD CPUs), same arithmetic
    up to the order of the sums, sharing the weights (the LM head stays tied to the embedding)."""
    plain = random_gpt(vocab_size=512)
    prepared = prepare_for_inference(copy.deepcopy(plain), "float32")
    assert prepared.lm_head.weight is prepared.transformer.wte.weight
    assert sum(p.numel() for p in prepared.parameters()) == sum(p.numel() for p in plain.parameters())
    tokens = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        torch.testing.assert_close(prepared(tokens).logits, plain(tokens).logits, atol=1e-5, rtol=1e-5)


def test_onednn_layer_multiplies_by_a_packed_copy_made_again_when_the_weight_changes() -> None:
    """The packed weight is oneDNN's own layout of the same values (not a buffer: state_dict holds the plain
    weight only); a weight changed in place (a merged adapter, a loaded state) is packed again before use."""
    torch.manual_seed(SEED)
    layer = layouts.OneDNNLinear.from_linear(torch.nn.Linear(64, 96))
    packed = layer.packed_weight()
    assert packed.is_mkldnn and layer.packed_weight() is packed  # made once, at conversion
    assert set(layer.state_dict()) == {"weight", "bias"}
    x = torch.randn(3, 7, 64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
        layer.weight.mul_(-2.0)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    assert layer.packed_weight() is not packed
    copied = copy.deepcopy(layer)  # oneDNN's opaque copy stays behind; the copy packs its own
    with torch.no_grad():
        torch.testing.assert_close(copied(x), layer(x), atol=0, rtol=0)
    assert copied.packed_weight() is not layer.packed_weight()


def test_float32_steps_of_many_rows_run_the_model_and_of_few_rows_the_native_decoder() -> None:
    """Past FLOAT32_MAX_ROWS rows oneDNN's products (the weights read once for all rows) beat the native float32
    product (read again every 4 rows); the packed formats read them once either way and always step natively."""
    float32 = native_decoder(prepare_for_inference(random_gpt(), "float32"))
    int8 = native_decoder(prepare_for_inference(random_gpt(), "int8"))
    assert float32 is not None and int8 is not None
    assert float32.takes(FLOAT32_MAX_ROWS) and not float32.takes(FLOAT32_MAX_ROWS + 1)
    assert int8.takes(64)


def test_onednn_layer_takes_nn_linears_path_where_gradients_are_needed() -> None:
    torch.manual_seed(SEED)
    linear = torch.nn.Linear(64, 96)
    onednn = layouts.OneDNNLinear.from_linear(linear)
    x = torch.randn(5, 64, requires_grad=True)
    onednn(x).sum().backward()
    assert x.grad is not None and linear.weight.grad is not None  # F.linear ran, under autograd
    torch.testing.assert_close(x.grad, linear.weight.sum(0).expand(5, 64))
    with torch.no_grad():
        torch.testing.assert_close(onednn(x), F.linear(x, linear.weight, linear.bias), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("precision", "layer"), [("float32", SplitLinear), ("int8", Int8Linear), ("int4", Int4Linear)])
@pytest.mark.parametrize("fast_bfloat16", [True, False])
def test_without_the_kernels_prepare_falls_back_to_the_pytorch_layouts(
    precision: str, layer: type, fast_bfloat16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8 / int4 activations are bfloat16 only where the CPU multiplies bfloat16 fast (emulated, it is slower
    than float32); the logits stay those of the model's quantized weights either way."""
    monkeypatch.setattr(layouts, "use_native_kernels", lambda: False)
    monkeypatch.setattr(layouts, "cpu_prefers_bf16", lambda: fast_bfloat16)
    reference = random_gpt().eval()
    model = prepare_for_inference(copy.deepcopy(reference), precision)
    assert type(model.transformer.h[0].mlp.c_fc) is layer
    expected_dtype = torch.bfloat16 if fast_bfloat16 and precision != "float32" else torch.float32
    assert model.transformer.wte.weight.dtype == expected_dtype
    tokens = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        logits, want = model(tokens)[0].float(), reference(tokens)[0]
    # quantized weights: near, not equal (4 bits of these std-0.1 random weights are coarse: logits std 0.8)
    tolerance = {"float32": 1e-5, "int8": 0.1, "int4": 1.0}[precision]
    torch.testing.assert_close(logits, want, atol=tolerance, rtol=0)


def test_a_model_with_inputs_outside_blocks_of_32_keeps_the_pytorch_layouts() -> None:
    model = prepare_for_inference(random_gpt(n_embd=48), "int8")  # 48 inputs: not whole blocks of 32
    assert type(model.lm_head) is Int8Linear
    assert native_decoder(model) is None
