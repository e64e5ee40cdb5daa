"""Decoding rules and beam search against transformers' generate on the same random weights: logits processors
built from SamplingParams (repetition penalty, no-repeat n-grams, minimum length, bad words) token for token with
greedy decoding, and beam search's sequences and scores."""

from __future__ import annotations

import pytest
import torch

from gpt2.inference.beam import beam_search
from gpt2.inference.generation import generate, left_pad
from gpt2.inference.processors import (
    BadWords,
    NoRepeatNGram,
    PresenceFrequencyPenalty,
    RepetitionPenalty,
    build_processors,
)
from gpt2.inference.sampling import SamplingParams
from gpt2.model import GPT
from gpt2.weights import load_model

SEED = 1234
EOS = 299  # the random model's end-of-text (and pad) id


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[GPT, object]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(SEED)
    config = transformers.GPT2Config(
        vocab_size=300, n_positions=128, n_embd=32, n_layer=2, n_head=4, initializer_range=0.1,
        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=EOS,
    )  # fmt: skip
    directory = tmp_path_factory.mktemp("hf")
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(directory)
    hf = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    return load_model(directory).eval(), hf


def prompts(lengths: list[int]) -> list[list[int]]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randint(0, 299, (n,), generator=generator).tolist() for n in lengths]


# ------------------------------------------------------------------------------- rules == transformers, greedy
RULES = [
    (dict(repetition_penalty=1.5), dict(repetition_penalty=1.5)),
    (dict(repetition_penalty=0.7), dict(repetition_penalty=0.7)),
    (dict(no_repeat_ngram_size=2), dict(no_repeat_ngram_size=2)),
    (dict(no_repeat_ngram_size=3), dict(no_repeat_ngram_size=3)),
    (dict(min_tokens=30, stop_token_ids=[EOS]), dict(min_new_tokens=30)),
    (dict(bad_words=[[17], [5, 6], [40, 41, 42]]), dict(bad_words_ids=[[17], [5, 6], [40, 41, 42]])),
    (
        dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_tokens=10, stop_token_ids=[EOS]),
        dict(repetition_penalty=1.3, no_repeat_ngram_size=2, min_new_tokens=10),
    ),
]


@pytest.mark.parametrize(("ours", "theirs"), RULES)
def test_decoding_rules_give_transformers_greedy_tokens(hf_pair: tuple[GPT, object], ours: dict, theirs: dict) -> None:
    model, hf = hf_pair
    idx = torch.tensor(prompts([9]))
    expected = hf.generate(  # type: ignore[attr-defined]
        idx, attention_mask=torch.ones_like(idx), do_sample=False, max_new_tokens=40, pad_token_id=EOS, **theirs
    )
    got = generate(model, idx, 40, temperature=0, **({"stop_token_ids": [EOS]} | ours))
    assert got.tolist() == expected.tolist()


def test_repetition_penalty_with_left_padding_gives_transformers_tokens(hf_pair: tuple[GPT, object]) -> None:
    model, hf = hf_pair
    idx, mask = left_pad(prompts([3, 10, 6]), pad_token_id=EOS)
    expected = hf.generate(  # type: ignore[attr-defined]
        idx, attention_mask=mask, do_sample=False, max_new_tokens=30, min_new_tokens=30, pad_token_id=EOS,
        repetition_penalty=1.4,
    )  # fmt: skip
    assert generate(model, idx, 30, temperature=0, repetition_penalty=1.4, attention_mask=mask).tolist() == (
        expected.tolist()
    )


# ------------------------------------------------------------------------------- each rule alone
def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens() -> None:
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    out = RepetitionPenalty(2.0)(torch.tensor([[0, 1, 1]]), logits.clone())
    assert out.tolist() == [[1.0, -4.0, 2.0, -2.0]]


def test_no_repeat_ngram_bans_the_token_completing_a_seen_ngram() -> None:
    out = NoRepeatNGram(2)(torch.tensor([[3, 1, 2, 3]]), torch.zeros(1, 5))
    assert out.tolist() == [[0.0, float("-inf"), 0.0, 0.0, 0.0]]  # "3 1" was seen: 1 may not follow 3 again


def test_bad_words_ban_the_last_token_only_after_the_rest() -> None:
    rule = BadWords(((4,), (1, 2)))
    assert rule(torch.tensor([[0, 1]]), torch.zeros(1, 5)).isinf().nonzero()[:, 1].tolist() == [2, 4]
    assert rule(torch.tensor([[1, 0]]), torch.zeros(1, 5)).isinf().nonzero()[:, 1].tolist() == [4]


def test_presence_and_frequency_penalties_count_only_the_continuation() -> None:
    rule = PresenceFrequencyPenalty(presence=0.5, frequency=0.25, prompt_length=2)
    out = rule(torch.tensor([[1, 1, 2, 2, 3]]), torch.zeros(1, 4))
    assert out.tolist() == [[0.0, 0.0, -1.0, -0.75]]  # token 1 is only in the prompt


def test_logit_bias_and_vocab_limit_become_processors() -> None:
    params = SamplingParams(logit_bias={3: 5.0})
    rules = build_processors(params, prompt_length=1, vocab_size=6, vocab_limit=5)
    logits = torch.zeros(1, 6)
    for rule in rules:
        logits = rule(torch.tensor([[0]]), logits)
    assert logits.tolist() == [[0.0, 0.0, 0.0, 5.0, 0.0, float("-inf")]]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(repetition_penalty=0.0), "repetition_penalty must be a number > 0"),
        (dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size must be an integer >= 0"),
        (dict(min_tokens=20, max_tokens=10), r"min_tokens must be an integer in \[0, max_tokens=10\]"),
        (dict(bad_words=[""]), "bad_words must hold non-empty texts"),
        (dict(bad_words=[[]]), "bad_words must hold non-empty texts"),
        (dict(logit_bias={1: 200}), r"logit_bias values must be numbers in \[-100, 100\]"),
        (dict(presence_penalty=3), r"presence_penalty must be a number in \[-2, 2\]"),
        (dict(frequency_penalty=float("nan")), r"frequency_penalty must be a number in \[-2, 2\]"),
        (dict(num_beams=0), "num_beams must be an integer >= 1"),
        (dict(num_beams=4), "beam search, which is deterministic: pass temperature=0"),
        (dict(num_beams=2, n=3, temperature=0), "n=3 beams asked for but num_beams=2"),
        (dict(early_stopping="sometimes"), "early_stopping must be True, False or 'never'"),
        (dict(length_penalty=float("inf")), "length_penalty must be a finite number"),
    ],
)
def test_bad_rule_values_are_refused_in_one_line(fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**fields)


# ------------------------------------------------------------------------------- beam search == transformers
@pytest.mark.parametrize(
    ("max_tokens", "length_penalty", "early_stopping", "n"),
    [
        (5, 1.0, False, 1),
        (12, 1.0, True, 4),
        (20, 0.5, False, 2),
        (20, 2.0, "never", 3),
        (30, -1.0, True, 1),
        (30, 0.0, "never", 4),
    ],
)
def test_beam_search_gives_transformers_beams_and_scores(
    hf_pair: tuple[GPT, object], max_tokens: int, length_penalty: float, early_stopping: bool | str, n: int
) -> None:
    model, hf = hf_pair
    idx = torch.tensor(prompts([6]))
    expected = hf.generate(  # type: ignore[attr-defined]
        idx, attention_mask=torch.ones_like(idx), do_sample=False, num_beams=4, max_new_tokens=max_tokens,
        length_penalty=length_penalty, early_stopping=early_stopping, num_return_sequences=n, pad_token_id=EOS,
        return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0, num_beams=4, n=n, length_penalty=length_penalty,
        early_stopping=early_stopping, stop_token_ids=[EOS],
    )  # fmt: skip
    ours = beam_search(model, idx, params)
    assert ours.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(ours.scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("early_stopping", [True, False, "never"])
@pytest.mark.parametrize(("eos_bias", "length_penalty"), [(3.0, 1.0), (2.0, 2.0), (2.5, 0.5)])
def test_beam_search_that_ends_early_on_the_stop_id_gives_transformers_beams(
    hf_pair: tuple[GPT, object], early_stopping: bool | str, eos_bias: float, length_penalty: float
) -> None:
    # a bias towards the end-of-text id makes beams finish at different lengths
    model, hf = hf_pair
    idx = torch.tensor(prompts([4]))
    bias = {EOS: eos_bias}
    expected = hf.generate(  # type: ignore[attr-defined]
        idx, attention_mask=torch.ones_like(idx), do_sample=False, num_beams=4, max_new_tokens=25,
        num_return_sequences=4, pad_token_id=EOS, sequence_bias={(EOS,): eos_bias}, length_penalty=length_penalty,
        early_stopping=early_stopping, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    params = SamplingParams(
        max_tokens=25, temperature=0, num_beams=4, n=4, stop_token_ids=[EOS], logit_bias=bias,
        length_penalty=length_penalty, early_stopping=early_stopping,
    )  # fmt: skip
    ours = beam_search(model, idx, params)
    assert ours.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(ours.scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)


def test_beam_search_over_a_left_padded_batch_gives_transformers_beams(hf_pair: tuple[GPT, object]) -> None:
    model, hf = hf_pair
    idx, mask = left_pad(prompts([3, 8]), pad_token_id=EOS)
    expected = hf.generate(  # type: ignore[attr-defined]
        idx, attention_mask=mask, do_sample=False, num_beams=3, max_new_tokens=15, num_return_sequences=2,
        pad_token_id=EOS, repetition_penalty=1.2, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    params = SamplingParams(
        max_tokens=15, temperature=0, num_beams=3, n=2, stop_token_ids=[EOS], repetition_penalty=1.2
    )
    ours = beam_search(model, idx, params, attention_mask=mask)
    assert ours.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(ours.scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)


def test_generate_with_beams_returns_the_best_beam(hf_pair: tuple[GPT, object]) -> None:
    model, _ = hf_pair
    idx = torch.tensor(prompts([5]))
    params = SamplingParams(max_tokens=10, temperature=0, num_beams=3, stop_token_ids=[EOS])
    assert generate(model, idx, 10, temperature=0, num_beams=3, stop_token_ids=[EOS]).tolist() == (
        beam_search(model, idx, params).sequences.tolist()
    )
