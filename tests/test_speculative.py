"""Speculative decoding: greedy output is plain greedy decoding's token for token (prompt lookup and a draft
model, over many prompts); sampled output is distributed as the target's (chi-square against the exact
distribution of short continuations); the n-gram drafter; the LLM facade and `gpt2 sample` flags."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import pytest
import torch
from scipy.stats import chisquare

from gpt2.api import LLM
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.inference.generation import generate
from gpt2.inference.prompt import DecodeOptions
from gpt2.inference.sampling import SamplingParams, sample_next_token
from gpt2.inference.speculative import (
    DraftModel,
    PromptLookup,
    Sampler,
    SpeculationStats,
    speculative_stream,
)
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer

SEED = 1234


def random_gpt(*, seed: int = SEED, vocab_size: int = 300, block_size: int = 64, n_layer: int = 2) -> GPT:
    """A tiny GPT with weights large enough (std 0.1) that argmax ties are not a coin flip."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=n_layer, n_head=4, n_embd=32, vocab_size=vocab_size, block_size=block_size))
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.1)
    return model.eval()


def prompts(count: int, vocab_size: int = 300) -> list[list[int]]:
    """Prompts of several lengths, half of them repeating a motif (so n-gram lookup finds drafts)."""
    generator = torch.Generator().manual_seed(SEED)
    out = []
    for i in range(count):
        length = 1 + (i * 7) % 10  # at most 30 tokens: prompt and continuation stay within the window
        tokens = torch.randint(0, vocab_size, (length,), generator=generator).tolist()
        out.append(tokens * 3 if i % 2 else tokens)
    return out


def greedy(steps: int) -> SamplingParams:
    return SamplingParams(max_tokens=steps, temperature=0)


def plain_greedy(model: GPT, prompt: list[int], steps: int) -> list[int]:
    return generate(model, torch.tensor([prompt]), steps, temperature=0)[0, len(prompt) :].tolist()


# ------------------------------------------------------------------------------------------ greedy
@pytest.mark.parametrize("native", [True, False])
def test_prompt_lookup_greedy_equals_plain_greedy(native: bool) -> None:
    model = random_gpt()
    stats = SpeculationStats()
    for prompt in prompts(24):
        drafter = PromptLookup(num_tokens=4)
        out = list(
            speculative_stream(model, prompt, greedy(30), drafter, options=DecodeOptions(native=native), stats=stats)
        )
        assert out == plain_greedy(model, prompt, 30)
    assert stats.accepted > 50 and stats.accepted < stats.drafted  # both paths of the rule were taken


@pytest.mark.parametrize("draft_seed", [SEED, SEED + 1])  # the target itself (all kept), another model
def test_draft_model_greedy_equals_plain_greedy(draft_seed: int) -> None:
    model, draft = random_gpt(), random_gpt(seed=draft_seed, n_layer=1)
    stats = SpeculationStats()
    for prompt in prompts(16):
        out = list(speculative_stream(model, prompt, greedy(25), DraftModel(draft), stats=stats))
        assert out == plain_greedy(model, prompt, 25)
    assert stats.drafted > 0 and stats.generated == 16 * 25


def test_a_draft_identical_to_the_target_is_always_accepted() -> None:
    model = random_gpt()
    stats = SpeculationStats()
    list(speculative_stream(model, [1, 2, 3], greedy(20), DraftModel(random_gpt()), stats=stats))
    assert stats.accepted == stats.drafted > 0


def test_greedy_past_the_context_window_keeps_going() -> None:
    model = random_gpt(block_size=16)
    out = list(speculative_stream(model, [1, 2, 3, 1, 2], greedy(40), PromptLookup(num_tokens=3)))
    assert len(out) == 40
    assert out[:11] == plain_greedy(model, [1, 2, 3, 1, 2], 11)  # within the window: plain greedy's tokens


def test_stops_after_a_stop_token() -> None:
    model = random_gpt()
    full = plain_greedy(model, [5, 6, 7], 20)
    stop = full[7]
    params = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=[stop])
    out = list(speculative_stream(model, [5, 6, 7], params, PromptLookup()))
    assert out == full[: full.index(stop) + 1]


# ------------------------------------------------------------------------------------------ sampling
def exact_distribution(model: GPT, prompt: list[int], steps: int, sampler: Sampler) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of `steps` tokens, from the model's filtered distributions."""
    vocab = model.config.vocab_size
    out = {}
    with torch.no_grad():
        for continuation in itertools.product(range(vocab), repeat=steps):
            ids = torch.tensor([prompt + list(continuation)])
            probs = sampler.probs(model(ids).logits[0, len(prompt) - 1 : -1])  # (steps, V)
            out[continuation] = float(probs[torch.arange(steps), torch.tensor(continuation)].prod())
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("drafter_kind", "sampler"),
    [
        ("lookup", Sampler(temperature=1.0)),
        ("draft", Sampler(temperature=1.0)),
        ("draft", Sampler(temperature=0.7, top_k=3)),
    ],
)
def test_sampled_output_is_distributed_as_the_target(drafter_kind: str, sampler: Sampler) -> None:
    vocab, steps, samples = 5, 3, 3000
    model = random_gpt(vocab_size=vocab, block_size=16)
    draft = random_gpt(seed=SEED + 7, vocab_size=vocab, block_size=16, n_layer=1)
    prompt = [0, 1, 2, 0, 1]
    generator = torch.Generator().manual_seed(SEED)
    stats = SpeculationStats()
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(samples):
        drafter = PromptLookup(num_tokens=2) if drafter_kind == "lookup" else DraftModel(draft)
        out = speculative_stream(
            model,
            prompt,
            SamplingParams(max_tokens=steps, temperature=sampler.temperature, top_k=sampler.top_k),
            drafter,
            generator=generator,
            stats=stats,
        )
        counts[tuple(out)] += 1
    assert 0 < stats.accepted < stats.drafted  # drafts were both kept and rejected
    expected = exact_distribution(model, prompt, steps, sampler)
    assert set(counts) <= {key for key, p in expected.items() if p > 0}  # nothing the filters exclude
    # cells expected fewer than 5 times are pooled into one, as the chi-square approximation needs
    big = [key for key, p in expected.items() if p * samples >= 5]
    observed = [counts[key] for key in big] + [samples - sum(counts[key] for key in big)]
    wanted = [expected[key] * samples for key in big] + [samples * (1 - sum(expected[key] for key in big))]
    wanted[-1] = samples - sum(wanted[:-1])
    if wanted[-1] < 1e-9:  # nothing pooled: the big cells hold all the probability, up to float rounding
        observed, wanted = observed[:-1], [value * samples / sum(wanted[:-1]) for value in wanted[:-1]]
    assert chisquare(observed, wanted).pvalue > 1e-3


@pytest.mark.parametrize("sampler", [Sampler(temperature=0.5, top_k=7), Sampler(temperature=1e-4, top_p=0.9)])
def test_sampler_probabilities_are_those_sample_next_token_draws_from(sampler: Sampler) -> None:
    """Every row's draws from `sample_next_token` follow `Sampler.probs` (one uniform each: the inverse CDF)."""
    logits = torch.randn(1, 12, generator=torch.Generator().manual_seed(SEED)) * 3
    probs = sampler.probs(logits)[0]
    generator = torch.Generator().manual_seed(SEED)
    draws = 4000
    counts = Counter(
        int(sample_next_token(logits, temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p,
                              generator=generator))
        for _ in range(draws)
    )  # fmt: skip
    assert set(counts) <= set(probs.nonzero().view(-1).tolist())
    for token, count in counts.items():
        assert abs(count / draws - float(probs[token])) < 0.04


@pytest.mark.parametrize("temperature", [0.0, 1e-45, 1e-30, 1e-6])
def test_sampler_below_the_greedy_threshold_is_greedy_as_sample_next_token(temperature: float) -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(SEED)) * 30
    assert Sampler(temperature).greedy
    assert sample_next_token(logits, temperature=temperature).tolist() == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.0, 1e-45, 1e-30, 1e-6])
@pytest.mark.parametrize("speculation", ["prompt_lookup", "draft"])
def test_speculation_at_a_tiny_temperature_gives_plain_greedy_text(temperature: float, speculation: str) -> None:
    options = {"prompt_lookup": 8} if speculation == "prompt_lookup" else {"draft": random_gpt(seed=SEED + 1)}
    greedy = byte_llm().generate("abcabcab", SamplingParams(max_tokens=30, temperature=0))
    params = SamplingParams(max_tokens=30, temperature=temperature, seed=1)
    assert byte_llm(**options).generate("abcabcab", params) == greedy
    assert greedy  # a text, so the comparison says something
    params = SamplingParams(max_tokens=20, temperature=temperature)
    tokens = list(speculative_stream(random_gpt(), [5, 6, 7, 5, 6, 7, 5], params, PromptLookup()))
    assert tokens == plain_greedy(random_gpt(), [5, 6, 7, 5, 6, 7, 5], 20)


def test_a_seeded_sampled_request_gives_the_same_text_with_and_without_speculation() -> None:
    params = SamplingParams(max_tokens=30, temperature=0.9, seed=3)
    for options in ({"prompt_lookup": 4}, {"draft": random_gpt(seed=SEED + 1)}):
        assert byte_llm(**options).generate("abcabcab", params) == byte_llm().generate("abcabcab", params)


# ------------------------------------------------------------------------------------------ drafters
def test_prompt_lookup_proposes_what_followed_the_latest_match() -> None:
    tokens = torch.tensor([1, 2, 3, 9, 1, 2, 4, 8, 1, 2])
    drafts, q = PromptLookup(num_tokens=3, adaptive=False).propose(tokens, 10, 3, Sampler(0), 10, None)
    assert drafts.tolist() == [4, 8, 1] and q is None


def test_prompt_lookup_prefers_the_longest_ngram() -> None:
    tokens = torch.tensor([7, 2, 5, 0, 3, 2, 6, 7, 2])
    assert PromptLookup(num_tokens=2, adaptive=False).propose(tokens, 9, 2, Sampler(0), 10, None)[0].tolist() == [5, 0]


def test_prompt_lookup_drafts_longer_while_its_drafts_are_kept_and_shorter_after_a_rejection() -> None:
    tokens = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2])  # after "1 2": 3 4 5 ... to copy
    drafter = PromptLookup(num_tokens=4)
    drafter.start(slide_by=None, native=True)
    lengths = []
    for kept_all in (True, True, False, False, False, True):
        drafts = drafter.propose(tokens, 14, 10, Sampler(0), 20, None)[0]
        lengths.append(drafts.numel())
        drafter.accept(14 + (drafts.numel() if kept_all else 0))
    assert lengths == [1, 3, 4, 3, 2, 1]  # +2 after all kept (at most num_tokens), -1 after a rejection (at least 1)
    assert PromptLookup(num_tokens=4, adaptive=False).propose(tokens, 14, 10, Sampler(0), 20, None)[0].numel() == 10


def test_prompt_lookup_without_a_match_proposes_nothing() -> None:
    tokens = torch.tensor([1, 2, 3, 4])
    assert PromptLookup().propose(tokens, 4, 5, Sampler(0), 10, None)[0].numel() == 0


@pytest.mark.parametrize("sampler", [Sampler(0), Sampler(temperature=1.0)])
def test_draft_model_stops_after_a_token_it_is_unsure_of(sampler: Sampler) -> None:
    """transformers' assistant_confidence_threshold: drafting ends after a token drawn with probability below it."""
    draft = random_gpt(n_layer=1)
    tokens = torch.zeros(20, dtype=torch.long)
    tokens[:3] = torch.tensor([4, 5, 6])
    lengths = {}
    for confidence in (0.0, 0.99):
        drafter = DraftModel(draft, num_tokens=5, confidence=confidence)
        drafter.start(slide_by=None, native=True)
        drafts, q = drafter.propose(tokens, 3, 5, sampler, 300, torch.Generator().manual_seed(SEED))
        lengths[confidence] = drafts.numel()
        assert q is None if sampler.greedy else q.shape == (drafts.numel(), 300)  # type: ignore[union-attr]
    # the random draft is unsure of everything (its top probability is far below 0.99)
    assert lengths == {0.0: 5, 0.99: 1}


def test_bad_options_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="num_tokens"):
        PromptLookup(num_tokens=0)
    with pytest.raises(ValueError, match="confidence"):
        DraftModel(random_gpt(), confidence=1.0)
    model = random_gpt()
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        list(speculative_stream(model, [1], SamplingParams(max_tokens=3), DraftModel(random_gpt(vocab_size=100))))
    with pytest.raises(ValueError, match="without decoding rules"):
        list(speculative_stream(model, [1], SamplingParams(max_tokens=3, repetition_penalty=1.2), PromptLookup()))
    with pytest.raises(ValueError, match="vocab_limit, slide_by and native only"):
        list(speculative_stream(model, [1], greedy(3), PromptLookup(), options=DecodeOptions(truncate="left")))


# ------------------------------------------------------------------------------------------ facade and CLI
def byte_llm(**speculation: object) -> LLM:
    return LLM(random_gpt(), ByteTokenizer(), torch.device("cpu"), **speculation)  # type: ignore[arg-type]


@pytest.mark.parametrize("speculation", [{"prompt_lookup": 4}, {"draft": random_gpt(seed=SEED + 1, n_layer=1)}])
def test_llm_with_speculation_gives_plain_greedy_text(speculation: dict) -> None:
    params = SamplingParams(max_tokens=25, temperature=0)
    for prompt in ["abcabcab", "hello hello hel", "x"]:
        assert byte_llm(**speculation).generate(prompt, params) == byte_llm().generate(prompt, params)


def test_llm_refuses_both_drafters_at_once() -> None:
    with pytest.raises(ValueError, match="either a draft model or prompt_lookup"):
        byte_llm(prompt_lookup=3, draft=random_gpt())


def test_sample_command_with_prompt_lookup_prints_plain_greedy_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    byte_llm().save(tmp_path / "model")
    command = ["sample", "--model", str(tmp_path / "model"), "--prompt", "abab", "--temperature", "0"]
    assert main([*command, "--max-new-tokens", "20"]) == 0
    plain = capsys.readouterr().out
    assert main([*command, "--max-new-tokens", "20", "--prompt-lookup", "3"]) == 0
    assert capsys.readouterr().out == plain
    assert main([*command, "--max-new-tokens", "20", "--draft", str(tmp_path / "model")]) == 0
    assert capsys.readouterr().out == plain
