"""Generation: cached decoding equals full recompute and transformers; sampling filters; stopping; windows;
streaming text; the `gpt2 sample` command."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import gpt2.inference.generation as generation
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.inference.generation import generate, left_pad, stream, stream_text
from gpt2.inference.sampling import SamplingParams, filter_top_k, filter_top_p, sample_next_token
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import load_model, save_pretrained

SEED = 1234
NEG_INF = float("-inf")


def random_gpt(*, vocab_size: int = 300, block_size: int = 64, weight_std: float = 0.1) -> GPT:
    """A tiny GPT with weights large enough (std 0.1, GPT-2's is 0.02) that argmax ties are not a coin flip."""
    torch.manual_seed(SEED)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, vocab_size=vocab_size, block_size=block_size))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, weight_std)
    return model.eval()


@pytest.fixture
def model() -> GPT:
    return random_gpt()


def prompts(lengths: list[int], vocab_size: int = 300) -> list[list[int]]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def record_logits(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Capture the (B, V) logits the decode loop samples from at each step."""
    seen: list[torch.Tensor] = []
    real = generation.sample_next_token

    def recording(logits: torch.Tensor, **options: object) -> torch.Tensor:
        seen.append(logits.clone())
        return real(logits, **options)

    monkeypatch.setattr(generation, "sample_next_token", recording)
    return seen


# ------------------------------------------------------------------------------- transformers parity
@pytest.fixture
def hf_pair(tmp_path: Path) -> tuple[GPT, object]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(
        vocab_size=300,
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=4,
        initializer_range=0.1,
        bos_token_id=299,
        eos_token_id=299,
        pad_token_id=299,
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    hf.save_pretrained(tmp_path)
    return load_model(tmp_path), hf


def test_greedy_64_tokens_match_transformers_batch_1(hf_pair: tuple[GPT, object]) -> None:
    ours, hf = hf_pair
    idx = torch.tensor(prompts([7])).long()
    expected = hf.generate(
        idx,
        attention_mask=torch.ones_like(idx),
        do_sample=False,
        max_new_tokens=64,
        min_new_tokens=64,
        pad_token_id=299,
    )
    assert torch.equal(generate(ours, idx, 64, temperature=0), expected)


def test_greedy_64_tokens_match_transformers_left_padded_batch_of_3(hf_pair: tuple[GPT, object]) -> None:
    ours, hf = hf_pair
    idx, mask = left_pad(prompts([3, 11, 6]), pad_token_id=299)
    expected = hf.generate(
        idx, attention_mask=mask, do_sample=False, max_new_tokens=64, min_new_tokens=64, pad_token_id=299
    )
    assert torch.equal(generate(ours, idx, 64, temperature=0, attention_mask=mask), expected)


# ------------------------------------------------------------------------------- cache == recompute
@pytest.mark.parametrize("length", [1, 5, 23])
def test_cached_logits_equal_full_recompute_at_every_step(
    model: GPT, monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    seen = record_logits(monkeypatch)
    idx = torch.tensor(prompts([length, length]))
    out = generate(model, idx, 20, temperature=0.8, seed=0)
    assert len(seen) == 20
    for step, logits in enumerate(seen):
        full = model(out[:, : length + step]).logits[:, -1]
        torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)


@pytest.mark.parametrize("lengths", [[1, 4, 9], [12, 3, 12]])
def test_cached_logits_equal_full_recompute_with_left_padding(
    model: GPT, monkeypatch: pytest.MonkeyPatch, lengths: list[int]
) -> None:
    seen = record_logits(monkeypatch)
    idx, mask = left_pad(prompts(lengths), pad_token_id=0)
    out = generate(model, idx, 20, temperature=0.8, seed=0, attention_mask=mask)
    T = idx.size(1)
    full_mask = torch.cat([mask, torch.ones(3, 20, dtype=torch.long)], dim=1)
    for step, logits in enumerate(seen):
        full = model(out[:, : T + step], attention_mask=full_mask[:, : T + step]).logits[:, -1]
        torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)


def test_each_padded_row_continues_as_it_would_alone(model: GPT) -> None:
    rows = prompts([2, 9, 5])
    idx, mask = left_pad(rows, pad_token_id=0)
    batch = generate(model, idx, 16, temperature=0, attention_mask=mask)
    for row, prompt in enumerate(rows):
        alone = generate(model, torch.tensor([prompt]), 16, temperature=0)
        assert batch[row, -16:].tolist() == alone[0, -16:].tolist()


# ------------------------------------------------------------------------------- filters
def logits_of(probabilities: list[float]) -> torch.Tensor:
    return torch.tensor([probabilities]).log()


def kept(logits: torch.Tensor) -> list[int]:
    return torch.nonzero(logits[0] > NEG_INF).flatten().tolist()


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [
        (0.5, [0]),  # the first token alone reaches 0.5
        (0.6, [0, 1]),
        (0.75, [0, 1]),  # exactly reached: the next token is not needed
        (0.8, [0, 1, 2, 3]),  # needs one 0.125 token; its tie comes too
        (1.0, [0, 1, 2, 3]),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p_with_ties_kept(top_p: float, expected: list[int]) -> None:
    assert kept(filter_top_p(logits_of([0.5, 0.25, 0.125, 0.125]), top_p)) == expected


def test_top_p_keeps_tokens_tied_with_the_most_probable() -> None:
    assert kept(filter_top_p(logits_of([0.2, 0.4, 0.4]), 0.1)) == [1, 2]


def test_top_p_result_does_not_depend_on_token_order() -> None:
    probabilities = torch.tensor([0.1, 0.3, 0.05, 0.3, 0.25])
    permutation = torch.tensor([3, 0, 4, 2, 1])
    direct = filter_top_p(probabilities.log().unsqueeze(0), 0.7)
    permuted = filter_top_p(probabilities[permutation].log().unsqueeze(0), 0.7)
    assert torch.equal(direct[0, permutation], permuted[0])


@pytest.mark.parametrize(("top_k", "expected"), [(1, [1, 2]), (2, [1, 2]), (3, [1, 2, 3]), (4, [0, 1, 2, 3])])
def test_top_k_keeps_the_k_largest_and_their_ties(top_k: int, expected: list[int]) -> None:
    assert kept(filter_top_k(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), top_k)) == expected


def test_top_k_with_k_beyond_the_vocabulary_keeps_everything() -> None:
    logits = torch.tensor([[1.0, 2.0]])
    assert torch.equal(filter_top_k(logits, 10), logits)


def test_samples_never_leave_the_nucleus() -> None:
    logits = logits_of([0.5, 0.25, 0.125, 0.125]).expand(2000, 4)
    draws = sample_next_token(logits, top_p=0.6, generator=torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1}


def full_vocabulary_draw(
    logits: torch.Tensor, seed: int, temperature: float, top_k: int, top_p: float | None
) -> torch.Tensor:
    """The sampler's rule written out over the whole vocabulary: scale, top-k, top-p, softmax, one draw."""
    from gpt2.inference.sampling import draw

    scaled = filter_top_k((logits - logits.amax(dim=-1, keepdim=True)) / temperature, top_k)
    if top_p is not None:
        scaled = filter_top_p(scaled, top_p)
    return draw(torch.softmax(scaled, dim=-1), torch.Generator().manual_seed(seed))


@pytest.mark.slow
@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.8, 50, None), (1.3, 5, 0.7), (0.5, 400, 0.95)])
def test_top_k_draws_are_those_of_the_whole_vocabulary_computation(
    temperature: float, top_k: int, top_p: float | None
) -> None:
    # sample_next_token draws among the k candidates alone; same seed, same token as over all 50257 ids
    for seed in range(200):
        logits = torch.randn(2, 50257, generator=torch.Generator().manual_seed(seed)) * 4
        options = dict(temperature=temperature, top_k=top_k, top_p=top_p)
        drawn = sample_next_token(logits, generator=torch.Generator().manual_seed(seed), **options)
        assert torch.equal(drawn, full_vocabulary_draw(logits, seed, **options))


@pytest.mark.slow
def test_rows_with_a_generator_each_draw_what_they_draw_alone_even_beside_a_tied_row() -> None:
    # the server's engine draws its rows together; a row tied at the k-th value (which takes the whole-vocabulary
    # computation) must not change what the others draw, nor the other way round
    for seed in range(100):
        logits = torch.randn(4, 50257, generator=torch.Generator().manual_seed(seed)) * 4
        logits[2, :8] = logits[2].max() + 1  # 8 tokens tie at the top: the 5th largest ties past k
        options = dict(temperature=0.8, top_k=5, top_p=0.9 if seed % 2 else None)
        together = sample_next_token(
            logits, generator=[torch.Generator().manual_seed(seed * 4 + row) for row in range(4)], **options
        )
        alone = [
            sample_next_token(logits[row : row + 1], generator=torch.Generator().manual_seed(seed * 4 + row), **options)
            for row in range(4)
        ]
        assert torch.equal(together, torch.cat(alone))
        assert int(together[2]) < 8


def test_top_k_keeps_every_token_tied_with_the_kth_when_sampling() -> None:
    logits = torch.tensor([[0.0, 5.0, 1.0, 5.0, 1.0, 1.0, -3.0]]).expand(3000, -1)  # the 3rd largest ties thrice
    two = sample_next_token(logits, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(two.tolist()) == {1, 3}
    three = sample_next_token(logits, top_k=3, generator=torch.Generator().manual_seed(0))
    assert set(three.tolist()) == {1, 2, 3, 4, 5}  # 5, 5 and the three tied 1s
    assert torch.equal(three, full_vocabulary_draw(logits, 0, temperature=1.0, top_k=3, top_p=None))


def test_temperature_zero_is_argmax() -> None:
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next_token(logits, temperature=0), logits.argmax(-1))


# ------------------------------------------------------------------------------- sampling behaviour
def test_same_seed_gives_the_same_samples(model: GPT) -> None:
    idx = torch.tensor(prompts([4, 4]))
    first = generate(model, idx, 30, seed=7, top_k=50, top_p=0.9)
    assert torch.equal(first, generate(model, idx, 30, seed=7, top_k=50, top_p=0.9))
    assert not torch.equal(first, generate(model, idx, 30, seed=8, top_k=50, top_p=0.9))


def test_a_generator_gives_the_same_samples_as_its_seed(model: GPT) -> None:
    idx = torch.tensor(prompts([4]))
    generator = torch.Generator().manual_seed(3)
    assert torch.equal(generate(model, idx, 10, seed=3), generate(model, idx, 10, generator=generator))


def test_vocab_limit_keeps_draws_inside_the_tokenizer(model: GPT) -> None:
    out = generate(model, torch.tensor(prompts([4, 4])), 40, seed=0, temperature=5.0, vocab_limit=10)
    assert int(out[:, 4:].max()) < 10


def test_top_k_1_is_greedy(model: GPT) -> None:
    idx = torch.tensor(prompts([5, 5]))
    assert torch.equal(generate(model, idx, 30, top_k=1, seed=0), generate(model, idx, 30, temperature=0))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(temperature=-0.5), "temperature must be a number >= 0"),
        (dict(top_k=0), "top_k must be an integer >= 1"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(seed=1, generator=torch.Generator()), "either seed or generator"),
        (dict(truncate="right"), "truncate must be None"),
        (dict(stop_token_ids=[300]), "not a token id in"),
        (dict(slide_by=64), r"slide_by must be an integer in \[0, block_size=64\)"),
    ],
)
def test_bad_options_are_refused_with_the_value_and_the_range(model: GPT, options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        generate(model, torch.tensor([[1, 2]]), 3, **options)


def test_right_padding_is_refused(model: GPT) -> None:
    with pytest.raises(ValueError, match="left padding"):
        generate(model, torch.tensor([[1, 2, 0]]), 3, attention_mask=torch.tensor([[1, 1, 0]]))


# ------------------------------------------------------------------------------- stopping
def test_each_row_stops_on_its_own_stop_token_while_the_others_go_on(model: GPT) -> None:
    idx, mask = left_pad(prompts([10, 4]), pad_token_id=0)
    free = generate(model, idx, 24, temperature=0, attention_mask=mask)[:, -24:]
    stop, at, pad = free[1, 2].item(), 2, 299  # row 1 emits `stop` first at step 2; row 0 never does
    assert stop not in free[0].tolist() and stop not in free[1, :at].tolist()
    out = generate(model, idx, 24, temperature=0, attention_mask=mask, stop_token_ids=[stop], pad_token_id=pad)
    out = out[:, -24:]
    assert out[0].tolist() == free[0].tolist()
    assert out[1, : at + 1].tolist() == free[1, : at + 1].tolist()  # the stop token itself is kept
    assert set(out[1, at + 1 :].tolist()) == {pad}


def test_a_row_stops_on_a_stop_sequence(model: GPT) -> None:
    idx = torch.tensor(prompts([6]))
    free = generate(model, idx, 20, temperature=0)[0, 6:].tolist()
    sequence = free[4:6]
    out = generate(model, idx, 20, temperature=0, stop_sequences=[sequence])[0, 6:].tolist()
    end = next(i for i in range(1, 20) if free[i - 1 : i + 1] == sequence) + 1
    assert out == free[:end]  # every row stopped, so the loop ended there


def test_generation_ends_when_every_row_has_stopped(model: GPT) -> None:
    idx = torch.tensor(prompts([6, 6]))
    first = generate(model, idx, 1, temperature=0)[:, -1].tolist()
    out = generate(model, idx, 50, temperature=0, stop_token_ids=first)
    assert out.shape == (2, 7)


# ------------------------------------------------------------------------------- context window
def reference_window_greedy(model: GPT, prompt: list[int], max_new_tokens: int, slide_by: int) -> list[int]:
    """The documented window rule written as a full recompute per step: the context is every column since the
    window start, and when that exceeds block_size the window restarts block_size - slide_by columns back."""
    block_size = model.config.block_size
    tokens, start = list(prompt), 0
    for _ in range(max_new_tokens):
        if len(tokens) - start > block_size:
            start = len(tokens) - (block_size - slide_by)
        logits = model(torch.tensor([tokens[start:]])).logits[0, -1]
        tokens.append(int(logits.argmax()))
    return tokens


@pytest.mark.parametrize("slide_by", [0, 1, 5, 16, 23])
def test_generating_past_the_context_slides_the_window(slide_by: int) -> None:
    model = random_gpt(block_size=24)
    prompt = prompts([10])[0]
    out = generate(model, torch.tensor([prompt]), 60, temperature=0, slide_by=slide_by)
    assert out[0].tolist() == reference_window_greedy(model, prompt, 60, slide_by)


def test_slide_by_0_is_crop_to_the_last_block_size_tokens() -> None:
    model = random_gpt(block_size=16)
    tokens = prompts([5])[0]
    expected = list(tokens)
    for _ in range(40):
        expected.append(int(model(torch.tensor([expected[-16:]])).logits[0, -1].argmax()))
    assert generate(model, torch.tensor([tokens]), 40, temperature=0, slide_by=0)[0].tolist() == expected


def test_sliding_window_with_left_padding_matches_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    model = random_gpt(block_size=16)
    seen = record_logits(monkeypatch)
    idx, mask = left_pad(prompts([3, 10]), pad_token_id=0)
    out = generate(model, idx, 30, temperature=0, attention_mask=mask, slide_by=4)
    full_mask = torch.cat([mask, torch.ones(2, 30, dtype=torch.long)], dim=1)
    start = 0
    for step, logits in enumerate(seen):
        n = idx.size(1) + step
        if n - start > 16:
            start = n - 12
        full = model(out[:, start:n], attention_mask=full_mask[:, start:n]).logits[:, -1]
        torch.testing.assert_close(logits, full, atol=1e-4, rtol=0)


def test_a_prompt_longer_than_the_context_is_an_error(model: GPT) -> None:
    with pytest.raises(ValueError, match="exceeds the model's context block_size=64.*truncate='left'"):
        generate(model, torch.zeros(1, 65, dtype=torch.long), 1)


def test_truncate_left_keeps_the_last_block_size_tokens(model: GPT) -> None:
    long_prompt = torch.tensor(prompts([80]))
    out = generate(model, long_prompt, 5, temperature=0, truncate="left")
    assert torch.equal(out, generate(model, long_prompt[:, -64:], 5, temperature=0))


# ------------------------------------------------------------------------------- streaming
def test_stream_yields_the_tokens_generate_returns(model: GPT) -> None:
    idx, mask = left_pad(prompts([2, 5]), pad_token_id=0)
    steps = list(stream(model, idx, SamplingParams(max_tokens=12, seed=5), attention_mask=mask))
    assert torch.equal(torch.stack(steps, dim=1), generate(model, idx, 12, seed=5, attention_mask=mask)[:, -12:])


class ScriptedHead(torch.nn.Module):
    """An LM head whose logits put all mass on script[p - prompt_length] at sequence position p."""

    def __init__(self, vocab_size: int, script: list[int], prompt_length: int) -> None:
        super().__init__()
        self.vocab_size, self.script, self.prompt_length = vocab_size, script, prompt_length
        self.positions: range = range(0)  # the sequence positions of the hidden states it is given next

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        positions = self.positions if hidden.dim() == 3 else self.positions[-1:]  # (B, C): the last position
        logits = torch.full((*hidden.shape[:-1], self.vocab_size), -1e4)
        for t, position in enumerate(positions):
            step = position + 1 - self.prompt_length
            if 0 <= step < len(self.script):
                if hidden.dim() == 3:
                    logits[:, t, self.script[step]] = 0.0
                else:
                    logits[:, self.script[step]] = 0.0
        return logits


class ScriptedGPT(GPT):
    """A GPT whose next token is dictated by a script (see ScriptedHead). The real backbone still runs, so the
    cache advances as usual."""

    def __init__(self, config: GPTConfig, script: list[int], prompt_length: int) -> None:
        super().__init__(config)
        self.lm_head = ScriptedHead(config.vocab_size, script, prompt_length)

    def _hidden_states(self, idx, attention_mask, position_ids, kv_cache, weights_out=None):  # type: ignore
        past = kv_cache.length if kv_cache is not None else 0
        self.lm_head.positions = range(past, past + idx.size(1))
        return super()._hidden_states(idx, attention_mask, position_ids, kv_cache, weights_out)


def stream_pieces(tokenizer, text: str, prompt: str = "> ") -> tuple[list[str], list[int]]:
    script = tokenizer.encode(text) + [tokenizer.eot_token]
    config = GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=tokenizer.vocab_size, block_size=128)
    model = ScriptedGPT(config, script, len(tokenizer.encode(prompt))).eval()
    return list(stream_text(model, tokenizer, prompt, SamplingParams(max_tokens=100, temperature=0))), script


def test_stream_text_never_splits_a_multibyte_character() -> None:
    from gpt2.tokenizer import ByteTokenizer

    text = "naïve café — 日本語 🤗!"
    pieces, script = stream_pieces(ByteTokenizer(), text)
    assert "".join(pieces) == text == ByteTokenizer().decode(script[:-1])
    assert all("\ufffd" not in piece for piece in pieces)  # every piece is whole characters
    assert "🤗" in pieces  # its four bytes came as four tokens, and out as one piece


@pytest.mark.slow
def test_stream_text_with_gpt2_bpe_equals_decode(gpt2_bpe_dir: Path) -> None:

    tokenizer = load_tokenizer(gpt2_bpe_dir)
    text = "Emoji 🤗🦄 and ṩ ꙮ mixed with words."
    pieces, script = stream_pieces(tokenizer, text)
    assert "".join(pieces) == tokenizer.decode(script[:-1]) == text
    assert all("\ufffd" not in piece for piece in pieces)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_stream_text_pieces_concatenate_to_the_decoded_text(text: str) -> None:
    from gpt2.tokenizer import ByteTokenizer

    pieces, _ = stream_pieces(ByteTokenizer(), text)
    assert "".join(pieces) == text
    assert all(piece for piece in pieces)


# ------------------------------------------------------------------------------- precision and compile
def test_bfloat16_model_generates_close_to_float32(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    idx = torch.tensor(prompts([8]))
    reference = generate(model, idx, 16, temperature=0)
    seen = record_logits(monkeypatch)
    low = random_gpt().to(torch.bfloat16)
    generate(low, reference[:, :8], 1, temperature=0)
    assert seen[0].dtype == torch.bfloat16
    full = model(reference[:, :8]).logits[:, -1]
    assert (seen[0].float() - full).abs().max() < 0.1  # bf16 keeps ~3 significant digits


def test_split_linear_layout_computes_exactly_the_linear_layer() -> None:
    from gpt2.cpu import SplitLinear

    torch.manual_seed(SEED)
    linear = torch.nn.Linear(64, 301)  # 301 is not a multiple of 4: the last block is padded
    x = torch.randn(2, 3, 64)
    for parts in (1, 2, 4, 7):
        torch.testing.assert_close(SplitLinear.from_linear(linear, parts)(x), linear(x), atol=1e-6, rtol=1e-6)


def test_model_optimized_for_inference_gives_the_same_logits_and_tokens(model: GPT) -> None:
    from gpt2.cpu import optimize_for_inference

    idx = torch.tensor(prompts([8, 8]))
    reference_logits = model(idx).logits
    reference_tokens = generate(model, idx, 24, temperature=0)
    fast = optimize_for_inference(random_gpt(), parts=4)
    assert not any(isinstance(m, torch.nn.Linear) for m in fast.modules())
    torch.testing.assert_close(fast(idx).logits, reference_logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(generate(fast, idx, 24, temperature=0), reference_tokens)


def test_int8_kernel_computes_the_dequantized_linear() -> None:
    from gpt2.cpu import Int8Linear

    torch.manual_seed(SEED)
    layer = Int8Linear.from_linear(torch.nn.Linear(64, 301), dtype=torch.bfloat16)  # odd width, like V
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)  # a few rows: the int8 kernel
    torch.testing.assert_close(layer(x).float(), layer.reference_forward(x).float(), atol=2e-2, rtol=1e-2)
    many = torch.randn(4, layer.dequantize_from_rows, 64, dtype=torch.bfloat16)  # a prefill: one bf16 matmul
    assert torch.equal(layer(many), layer.reference_forward(many))


def test_int8_weights_stay_close_to_the_float_model(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpt2.cpu import quantize_int8

    idx = torch.tensor(prompts([8, 8]))
    full = model(idx).logits[:, -1]
    seen = record_logits(monkeypatch)
    generate(quantize_int8(random_gpt()), idx, 1, temperature=0)
    assert (seen[0].float() - full).abs().max() < 0.1


def test_draw_follows_the_probabilities_and_never_picks_a_zero() -> None:
    from gpt2.inference.sampling import draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.3, 0.2, 0.0]]).expand(40_000, -1)
    drawn = draw(probs, torch.Generator().manual_seed(SEED))
    frequencies = torch.bincount(drawn, minlength=6).float() / len(drawn)
    assert frequencies[[0, 2, 5]].sum() == 0
    torch.testing.assert_close(frequencies, probs[0], atol=0.01, rtol=0)
    edges = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])  # unnormalized rows are fine
    assert draw(edges.repeat(1000, 1)).view(1000, 3).eq(torch.tensor([2, 0, 1])).all()
    again = draw(probs[:50], torch.Generator().manual_seed(SEED))
    assert torch.equal(again, drawn[:50])  # a seed gives the same draws


def test_int4_codes_give_each_weight_back_within_half_a_step() -> None:
    from gpt2.cpu import Int4Linear

    weight = torch.randn(48, 96, generator=torch.Generator().manual_seed(SEED))
    codes, scale, minimum = Int4Linear.quantize_groups(weight, group_size=32)
    assert codes.min() >= 0 and codes.max() <= 15 and scale.shape == minimum.shape == (3, 48)
    step = scale.T.repeat_interleave(32, dim=1)  # (out, in): each weight's own group scale
    assert ((Int4Linear.dequantize(codes, scale, minimum) - weight).abs() <= step / 2 + 1e-6).all()


def test_int4_kernel_computes_the_dequantized_linear() -> None:
    from gpt2.cpu import Int4Linear

    torch.manual_seed(SEED)
    linear = torch.nn.Linear(64, 301)  # odd width, like V
    layer = Int4Linear.from_linear(linear)
    weight = Int4Linear.dequantize(*Int4Linear.quantize_groups(linear.weight, group_size=32))
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    expected = F.linear(x.float(), weight, linear.bias.detach())
    torch.testing.assert_close(layer(x).float(), expected, atol=3e-2, rtol=2e-2)


def test_int4_weights_stay_close_to_the_float_model(model: GPT, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpt2.cpu import prepare_for_inference

    idx = torch.tensor(prompts([8, 8]))
    full = model(idx).logits[:, -1]
    seen = record_logits(monkeypatch)
    generate(prepare_for_inference(random_gpt(), "int4"), idx, 1, temperature=0)
    quantized = seen[0].float()
    assert (quantized - full).abs().max() < 0.15 * (full.max() - full.min())  # 4 bits: coarser than int8
    assert F.cosine_similarity(quantized, full).min() > 0.97


def test_int4_needs_inputs_in_whole_groups() -> None:
    from gpt2.cpu import Int4Linear

    with pytest.raises(ValueError, match="int4 needs in_features divisible by 32"):
        Int4Linear.from_linear(torch.nn.Linear(48, 8))


@pytest.mark.slow
def test_compiled_decode_step_matches_eager(model: GPT) -> None:
    idx, mask = left_pad(prompts([3, 7]), pad_token_id=0)
    eager = generate(model, idx, 12, temperature=0, attention_mask=mask)
    assert torch.equal(generate(model, idx, 12, temperature=0, attention_mask=mask, compile=True), eager)


# ------------------------------------------------------------------------------- left_pad
def test_left_pad_puts_padding_first_and_masks_it() -> None:
    idx, mask = left_pad([[5, 6, 7], [8]], pad_token_id=9)
    assert idx.tolist() == [[5, 6, 7], [9, 9, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_left_pad_refuses_an_empty_prompt() -> None:
    with pytest.raises(ValueError, match="sequence 1 is empty"):
        left_pad([[1], []], pad_token_id=0)


# ------------------------------------------------------------------------------- gpt2 sample
@pytest.fixture
def saved_model_dir(tmp_path: Path) -> Path:
    """What `gpt2 train` leaves: a HF-format model directory with its tokenizer saved alongside."""
    from gpt2.tokenizer import ByteTokenizer

    directory = tmp_path / "run"
    save_pretrained(random_gpt(vocab_size=ByteTokenizer.vocab_size), directory)
    ByteTokenizer().save(directory)
    return directory


def test_sample_cli_streams_what_the_library_generates(saved_model_dir: Path, capsys: pytest.CaptureFixture) -> None:

    assert (
        main(
            [
                "sample",
                "--model",
                str(saved_model_dir),
                "--prompt",
                "Hi",
                "--temperature",
                "0",
                "--max-new-tokens",
                "12",
            ]
        )
        == 0
    )
    model = load_model(saved_model_dir)
    tokenizer = load_tokenizer(saved_model_dir)
    expected = "".join(stream_text(model, tokenizer, "Hi", SamplingParams(max_tokens=12, temperature=0)))
    assert capsys.readouterr().out == "Hi" + expected + "\n"


def test_sample_cli_reads_the_prompt_from_stdin_and_repeats_with_a_seed(
    saved_model_dir: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    arguments = [
        "sample",
        "--model",
        str(saved_model_dir),
        "-n",
        "2",
        "--seed",
        "3",
        "--top-k",
        "20",
        "--max-new-tokens",
        "10",
        "--no-echo",
    ]
    outputs = []
    for _ in range(2):
        monkeypatch.setattr(sys, "stdin", io.StringIO("Once"))
        assert main(arguments) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert outputs[0].count("-" * 40) == 1  # two samples, one separator


def test_sample_cli_on_a_hf_directory_with_a_separate_tokenizer(
    fixtures_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from gpt2.tokenizer import ByteTokenizer

    ByteTokenizer().save(tmp_path / "tok")
    code = main(
        [
            "sample",
            "--model",
            str(fixtures_dir / "hf-tiny"),
            "--tokenizer",
            str(tmp_path / "tok"),
            "--prompt",
            "abc",
            "--max-new-tokens",
            "5",
            "--seed",
            "0",
            "--dtype",
            "bfloat16",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.startswith("abc")


def test_sample_cli_with_int8_weights(saved_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(
        [
            "sample",
            "--model",
            str(saved_model_dir),
            "--prompt",
            "abc",
            "--max-new-tokens",
            "5",
            "--temperature",
            "0",
            "--dtype",
            "int8",
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.startswith("abc")


def test_sample_cli_without_a_tokenizer_says_how_to_give_one(fixtures_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["sample", "--model", str(fixtures_dir / "hf-tiny"), "--prompt", "abc"])
    error = capsys.readouterr().err
    assert code == 2
    assert "pass --tokenizer" in error and len(error.strip().splitlines()) == 1


def test_sample_cli_refuses_bad_sampling_options(saved_model_dir: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["sample", "--model", str(saved_model_dir), "--prompt", "x", "--top-p", "1.5"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err


# ------------------------------------------------------------------------------- one input check
def test_the_model_generation_and_inspection_refuse_a_bad_id_with_one_error_type(model: GPT) -> None:
    from gpt2.inspect.hooks import run_with_cache
    from gpt2.model import TokenIdError

    idx = torch.tensor([[1, 300, 2]])
    for call in (lambda: model(idx), lambda: generate(model, idx, 2), lambda: run_with_cache(model, idx)):
        with pytest.raises(TokenIdError, match=r"token id 300 is outside the vocabulary \[0, 300\)"):
            call()


# ------------------------------------------------------------------------------- one sampler
EXTREME = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from([float("inf"), float("-inf"), 3.4e38, -3.4e38, 1e30, 0.0]),
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.lists(EXTREME, min_size=1, max_size=12), min_size=1, max_size=4).filter(
        lambda rows: len({len(row) for row in rows}) == 1
    ),
    temperature=st.one_of(st.sampled_from([0.0, 1e-45, 1e-6, 1e-5, 0.7, 1.0, 1e6]), st.floats(0, 1e3)),
    top_k=st.one_of(st.none(), st.integers(1, 12)),
    top_p=st.one_of(st.none(), st.floats(0.01, 1.0)),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_sampler_draws_an_id_in_the_vocabulary_with_a_finite_or_top_logit(
    rows: list[list[float]], temperature: float, top_k: int | None, top_p: float | None, seed: int
) -> None:
    logits = torch.tensor(rows, dtype=torch.float32)
    usable = ~(torch.isnan(logits) | torch.isneginf(logits))  # (B, V): tokens that may be drawn
    generator = torch.Generator().manual_seed(seed)
    options = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    if not bool(usable.any(dim=-1).all()):
        # the first row with nothing to draw is named, and NaN as its cause where it holds one
        row = int((~usable.any(dim=-1)).nonzero()[0, 0])
        cause = "the logits are not finite" if bool(logits[row].isnan().any()) else "every token has logit -inf"
        with pytest.raises(ValueError, match=f"row {row}: {cause}"):
            sample_next_token(logits, **options)
        return
    token = sample_next_token(logits, **options)
    assert token.shape == (len(rows),) and token.dtype == torch.long
    assert bool(((token >= 0) & (token < logits.size(-1))).all())
    assert bool(usable.gather(1, token[:, None]).all())
    if bool(torch.isposinf(logits).any(dim=-1).all()):  # +inf tokens take the whole probability
        assert bool(torch.isposinf(logits.gather(1, token[:, None])).all())


def test_a_vanishing_temperature_is_greedy_not_an_id_past_the_vocabulary(model: GPT) -> None:
    # temperature=1e-45 overflows the scaled logits (a draw could land on id vocab_size): below
    # GREEDY_BELOW_TEMPERATURE the draw is argmax
    from gpt2.inference.sampling import GREEDY_BELOW_TEMPERATURE

    idx = torch.tensor(prompts([5]))
    greedy = generate(model, idx, 8, temperature=0)
    for temperature in (1e-45, 1e-6, GREEDY_BELOW_TEMPERATURE / 2):
        assert torch.equal(generate(model, idx, 8, temperature=temperature, seed=0), greedy)
    assert SamplingParams(temperature=1e-45).greedy and not SamplingParams(temperature=1e-5).greedy


@pytest.mark.parametrize("options", [{}, {"top_k": 10, "temperature": 0.7}, {"top_k": 10, "top_p": 0.8}])
def test_one_generator_per_row_draws_what_each_row_draws_alone(options: dict) -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    generators = [torch.Generator().manual_seed(s) for s in (7, 8, 9)]
    together = sample_next_token(logits, generator=generators, **options)
    alone = [
        int(sample_next_token(logits[i : i + 1], generator=torch.Generator().manual_seed(7 + i), **options)[0])
        for i in range(3)
    ]
    assert together.tolist() == alone
