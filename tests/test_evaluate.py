"""Evaluation: sliding-window perplexity, continuation scoring as lm-evaluation-harness encodes it, HellaSwag and
LAMBADA, dataset fetching, `gpt2 eval`.

Most tests use models whose weights are set by hand so the right answer is known in closed form:

- the *zero* model (every weight 0) outputs logits 0 everywhere: each token costs exactly ln V;
- the *pair* model makes chosen byte pairs (u, w) predict each other. With one layer whose branches are
  zeroed, logits = ln_f(wte[x]) @ wte^T. Token u gets wte[u] = s (e0 - e1), its partner wte[w] = s (e0 - e2),
  ln_f's gain is (1, -1, -1) on those dims, so ln_f(wte[u]) = a (e0 + e1) with a = s / sqrt(2 s^2 / C + eps):
  the partner's logit is L = s a, every other logit 0 (u itself included). Tokens in no pair have a zero row:
  after them the distribution is uniform.
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpt2.cli import main
from gpt2.cli.eval import load_model_and_tokenizer
from gpt2.config import GPTConfig
from gpt2.eval import (
    count_bytes,
    encode_pair,
    evaluate_hellaswag,
    evaluate_lambada,
    fetch_dataset,
    parse_hellaswag_record,
    perplexity,
    perplexity_of_split,
    perplexity_of_text,
    read_lambada,
    score_continuations,
    score_texts,
    sliding_windows,
)
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer, load_tokenizer
from gpt2.weights import hub, save_pretrained

V = ByteTokenizer.vocab_size  # 257
N_EMBD = 64
PAIR_STRENGTH = 1.5  # s: partner logit L = s^2 / sqrt(2 s^2 / C + eps) ~ 12, so greedy picks the partner


def tiny_config(**overrides) -> GPTConfig:
    values = dict(vocab_size=V, block_size=16, n_layer=1, n_head=2, n_embd=N_EMBD)
    values.update(overrides)
    return GPTConfig(**values)


def zero_model(**overrides) -> GPT:
    model = GPT(tiny_config(**overrides))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    return model


def pair_model(pairs: list[tuple[str, str]], **overrides) -> tuple[GPT, float]:
    """The model described in the module docstring and its partner logit L."""
    model = zero_model(**overrides)
    s = PAIR_STRENGTH
    wte, gain = model.transformer.wte.weight, model.transformer.ln_f.weight
    with torch.no_grad():
        for k, (u, w) in enumerate(pairs):
            d = 3 * k
            wte[ord(u), d], wte[ord(u), d + 1] = s, -s
            wte[ord(w), d], wte[ord(w), d + 2] = s, -s
            gain[d : d + 3] = torch.tensor([1.0, -1.0, -1.0])
    eps = model.config.layer_norm_eps
    return model, s * s / math.sqrt(2 * s * s / N_EMBD + eps)


def partner_loss(L: float) -> float:
    """-log p(partner): the partner has logit L, the other V - 1 tokens 0."""
    return math.log1p((V - 1) * math.exp(-L))


def other_loss(L: float) -> float:
    """-log p(a non-partner token) after a paired token."""
    return math.log(math.exp(L) + V - 1)


def random_model(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(n_layer=2, **overrides))


def random_tokens(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, V, size=n)


# ------------------------------------------------------------------------------------------- windows
def test_sliding_windows_score_every_token_but_the_first_exactly_once() -> None:
    windows = sliding_windows(50, context_length=16, stride=5)
    scored = [w.start + 1 + j for w in windows for j in range(w.first_scored, w.end - w.start)]
    assert sorted(scored) == list(range(1, 50))
    assert sum(w.num_scored for w in windows) == 49


@settings(max_examples=200, deadline=None)
@given(
    num_tokens=st.integers(2, 300),
    context_length=st.integers(1, 64),
    stride_fraction=st.floats(0.0, 1.0),
)
def test_sliding_windows_property(num_tokens: int, context_length: int, stride_fraction: float) -> None:
    stride = max(1, round(stride_fraction * context_length))
    windows = sliding_windows(num_tokens, context_length, stride)
    scored = [w.start + 1 + j for w in windows for j in range(w.first_scored, w.end - w.start)]
    assert scored == list(range(1, num_tokens))  # once each, in order
    assert {w.end - w.start for w in windows} == {min(context_length, num_tokens - 1)}  # stackable
    for w in windows[1:]:
        assert w.first_scored >= min(context_length - stride, w.start + w.first_scored)  # context kept


def test_sliding_windows_refuse_a_stride_longer_than_the_context() -> None:
    with pytest.raises(ValueError, match="stride must be in"):
        sliding_windows(100, context_length=16, stride=17)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        sliding_windows(1, context_length=16, stride=8)


# ---------------------------------------------------------------------------------------- perplexity
def test_zero_model_has_perplexity_equal_to_the_vocabulary_size() -> None:
    result = perplexity(zero_model(), random_tokens(100), stride=5, batch_size=3)
    assert result.loss == pytest.approx(math.log(V), rel=1e-6)
    assert result.perplexity == pytest.approx(V, rel=1e-5)
    assert result.num_tokens == 99
    assert result.bits_per_token == pytest.approx(math.log2(V), rel=1e-6)


def test_pair_model_loss_matches_the_hand_computed_value() -> None:
    model, L = pair_model([("a", "b")], block_size=4)
    tokens = list(b"abazabq")
    # targets:  b|a  a|b  z|a  a|z  b|a  q|b
    expected = [partner_loss(L), partner_loss(L), other_loss(L), math.log(V), partner_loss(L), other_loss(L)]
    result = perplexity(model, tokens, stride=1, batch_size=2)
    assert result.num_tokens == 6
    assert result.loss == pytest.approx(sum(expected) / 6, rel=1e-5)


def test_a_text_that_fits_one_window_matches_the_model_loss() -> None:
    model = random_model()
    tokens = torch.tensor(random_tokens(12, seed=1))
    with torch.no_grad():
        direct = model(tokens[None, :-1], targets=tokens[None, 1:]).loss
    result = perplexity(model, tokens, stride=4)
    assert result.num_windows == 1
    assert result.loss == pytest.approx(float(direct), rel=1e-6)


def test_stride_one_gives_every_token_its_full_context() -> None:
    model = random_model()
    tokens = torch.tensor(random_tokens(40, seed=2))
    block = model.config.block_size
    with torch.no_grad():  # reference: one forward per token, over exactly the block_size tokens before it
        losses = []
        for i in range(1, len(tokens)):
            context = tokens[max(0, i - block) : i]
            logits = model(context[None]).logits[0, -1]
            losses.append(-torch.log_softmax(logits, dim=-1)[tokens[i]].item())
    result = perplexity(model, tokens, stride=1, batch_size=7)
    assert result.loss == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_batching_windows_does_not_change_the_result() -> None:
    model = random_model()
    tokens = random_tokens(90, seed=3)
    one = perplexity(model, tokens, stride=5, batch_size=1)
    many = perplexity(model, tokens, stride=5, batch_size=8)
    assert many.loss == pytest.approx(one.loss, rel=1e-6)
    assert many.num_windows == one.num_windows


def test_perplexity_is_deterministic_and_restores_train_mode() -> None:
    model = random_model(dropout=0.2)
    model.train()
    tokens = random_tokens(60, seed=4)
    first = perplexity(model, tokens, stride=8)
    second = perplexity(model, tokens, stride=8)
    assert first == second  # dropout is off during evaluation
    assert model.training


def test_bits_per_byte_counts_the_utf8_bytes_of_the_text() -> None:
    tokenizer = ByteTokenizer()
    text = "naïve café ☕ " * 5
    tokens = [tokenizer.eot_token, *tokenizer.encode(text)]  # EOT first, so every text token is scored
    num_bytes = count_bytes(tokenizer, tokens[1:], V)
    assert num_bytes == len(text.encode("utf-8"))
    result = perplexity(zero_model(), tokens, num_bytes=num_bytes)
    assert result.bits_per_byte == pytest.approx(math.log2(V), rel=1e-6)  # one byte per token


def test_count_bytes_ignores_the_end_of_text_token() -> None:
    tokenizer = ByteTokenizer()
    assert count_bytes(tokenizer, [tokenizer.eot_token, *b"hi", tokenizer.eot_token, *b"!"]) == 3


@pytest.mark.slow
def test_count_bytes_with_gpt2_bpe_equals_the_text_bytes(gpt2_bpe_dir: Path) -> None:

    tokenizer = load_tokenizer(gpt2_bpe_dir)
    text = "Hello world — déjà vu, 東京 🙂"
    assert count_bytes(tokenizer, tokenizer.encode(text), tokenizer.vocab_size) == len(text.encode("utf-8"))


def test_perplexity_of_text_scores_every_byte_after_an_end_of_text_prefix() -> None:
    tokenizer, model = ByteTokenizer(), random_model()
    text = "naïve café, twice: naïve café"
    result = perplexity_of_text(model, tokenizer, text, stride=4)
    tokens = [tokenizer.eot_token, *tokenizer.encode(text)]
    assert result == perplexity(model, tokens, stride=4, num_bytes=len(text.encode("utf-8")))
    assert result.num_tokens == result.num_bytes == len(text.encode("utf-8"))


def test_perplexity_of_text_without_the_prefix_and_with_max_tokens() -> None:
    tokenizer, model = ByteTokenizer(), random_model()
    result = perplexity_of_text(model, tokenizer, "abcdefghij", eot_prefix=False, max_tokens=6, stride=4)
    assert result == perplexity(model, list(b"abcdef"), stride=4, num_bytes=5)  # "a" is context only
    with pytest.raises(ValueError, match="max_tokens must be at least 2"):
        perplexity_of_text(model, tokenizer, "abc", max_tokens=1)


def test_perplexity_of_split_refuses_data_tokenized_by_another_tokenizer(tmp_path: Path, gpt2_bpe_dir: Path) -> None:
    from gpt2.data import PrepareOptions, prepare

    source = tmp_path / "corpus.txt"
    source.write_text("a a a a é é q a\n" * 50, encoding="utf-8")
    prepare([source], tmp_path / "shards", ByteTokenizer(), PrepareOptions(val_fraction=0.2), progress=False)
    with pytest.raises(ValueError, match="was tokenized with"):
        perplexity_of_split(zero_model(), load_tokenizer(gpt2_bpe_dir), tmp_path / "shards", "val")


# ------------------------------------------------------------------------------------- continuations
def test_score_continuations_keeps_the_continuation_when_the_context_is_too_long() -> None:
    model, L = pair_model([("a", "b")], block_size=4)
    context = list(b"zzzzzzzzza")
    [score] = score_continuations(model, [(context, list(b"bab"))])
    assert score.num_tokens == 3
    assert score.loss_sum == pytest.approx(3 * partner_loss(L), abs=1e-4)
    assert score.greedy


def test_encode_pair_moves_the_context_trailing_whitespace_into_the_continuation() -> None:
    tokenizer = ByteTokenizer()
    assert encode_pair(tokenizer, "ab\n  ", " c") == (list(b"ab"), list(b"\n   c"))
    assert encode_pair(tokenizer, "ab", " c") == (list(b"ab"), list(b" c"))  # nothing to move


def test_encode_pair_scores_the_tokens_of_running_text_with_gpt2_bpe(gpt2_bpe_dir: Path) -> None:
    tokenizer = load_tokenizer(gpt2_bpe_dir)
    # code: the target " return" (1441) after "\n   " is scored with the newline and indentation tokens
    [(context, target)] = read_lambada([{"text": "def add(a, b):\n    return"}])
    assert (context, target) == ("def add(a, b):\n   ", " return")
    assert encode_pair(tokenizer, context, target) == ([4299, 751, 7, 64, 11, 275, 2599], [198, 220, 220, 220, 1441])
    # a double space before the last word: " Ann" (5506) comes with the first space (220)
    [(context, target)] = read_lambada([{"text": "she handed the keys to  Ann"}])
    assert encode_pair(tokenizer, context, target) == ([7091, 10158, 262, 8251, 284], [220, 5506])


def test_encode_pair_puts_end_of_text_before_a_context_of_only_whitespace() -> None:
    tokenizer = ByteTokenizer()
    assert encode_pair(tokenizer, "  ", " c") == ([tokenizer.eot_token], list(b"   c"))
    assert encode_pair(tokenizer, "", "c") == ([tokenizer.eot_token], list(b"c"))


def full_sequence_loss(model: GPT, tokenizer, context: str, continuation: str) -> float:
    """Reference: one forward over the whole text's tokens, summing -log p of every token after those of the
    context without its trailing whitespace (what the harness calls the continuation)."""
    tokens = tokenizer.encode(context + continuation)
    first = len(tokenizer.encode(context.rstrip()))
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([tokens[:-1]])).logits[0].float(), dim=-1)  # (T, V)
    return -sum(float(log_probs[i - 1, tokens[i]]) for i in range(first, len(tokens)))


WHITESPACE_PAIRS = [
    ("def add(a, b):\n   ", " return"),  # LAMBADA split of code: the context ends in "\n" + 3 spaces
    ("she handed the keys to ", " Ann"),  # a double space before the last word
    ("Cooking: How to cook rice. ", " Rinse the rice."),  # HellaSwag lm-eval style after a "[title]"
]


@pytest.mark.slow
def test_scores_after_trailing_whitespace_match_a_full_sequence_forward(gpt2_bpe_dir: Path) -> None:
    tokenizer = load_tokenizer(gpt2_bpe_dir)
    model = random_model(vocab_size=tokenizer.vocab_size, block_size=32).eval()
    scores = score_texts(model, tokenizer, WHITESPACE_PAIRS, batch_size=3)  # one right-padded batch
    expected = [full_sequence_loss(model, tokenizer, context, target) for context, target in WHITESPACE_PAIRS]
    assert [s.loss_sum for s in scores] == pytest.approx(expected, rel=1e-5)
    assert [s.num_tokens for s in scores] == [5, 2, 6]


@pytest.mark.slow
def test_lambada_after_indentation_or_a_double_space_matches_a_full_sequence_forward(gpt2_bpe_dir: Path) -> None:
    tokenizer = load_tokenizer(gpt2_bpe_dir)
    model = random_model(vocab_size=tokenizer.vocab_size, block_size=32).eval()
    texts = ["def add(a, b):\n    return", "she handed the keys to  Ann"]
    result = evaluate_lambada(model, tokenizer, [{"text": text} for text in texts])
    losses = [full_sequence_loss(model, tokenizer, *read_lambada([{"text": text}])[0]) for text in texts]
    assert result["perplexity"] == pytest.approx(math.exp(sum(losses) / 2), rel=1e-5)
    assert result["token_perplexity"] == pytest.approx(math.exp(sum(losses) / 7), rel=1e-5)  # 5 + 2 tokens


# ---------------------------------------------------------------------------------------- HellaSwag
def hellaswag_record(ctx: str, endings: list[str], label: int, **extra) -> dict:
    return {
        "ind": 0,
        "activity_label": "Testing",
        "ctx_a": ctx,
        "ctx_b": "",
        "ctx": ctx,
        "split": "val",
        "split_type": "indomain",
        "label": label,
        "endings": endings,
        "source_id": "test",
        **extra,
    }


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# The pair model with pairs (" ", "a") and ("\xc3", "\xa9") (the two bytes of "é"); p = partner loss, o = a
# non-partner after a paired token, u = ln V after an unpaired token. Every context ends in "a", so " " costs p.
# Record 2: " a a a a a a a a a q" (19p + o over 20 tokens) loses on the sum to " q" (p + o) but wins on the
# means. Record 3: " éééé" (8p + o, 9 tokens, 4 characters) beats " a a a q" (7p + o, 8 tokens, 7 characters)
# on the mean per token only. So acc = 1/3, acc_norm = 3/3, acc_char_norm = 2/3.
HELLASWAG_RECORDS = [
    hellaswag_record("xa", ["qqqq", "q", "a a", "zz"], label=2),  # " a a" is all partner steps: every metric
    hellaswag_record("xa", ["a a a a a a a a a q", "qqqq", "q", "qz"], label=0),
    hellaswag_record("xa", ["éééé", "a a a q", "qqqq", "zzzz"], label=0),
]


def hellaswag_model() -> tuple[GPT, float]:
    return pair_model([(" ", "a"), ("\xc3", "\xa9")], block_size=32)


def test_hellaswag_scores_a_crafted_model_exactly_as_expected(tmp_path: Path) -> None:
    model, L = hellaswag_model()
    p, o, u = partner_loss(L), other_loss(L), math.log(V)
    # hand-computed (summed loss, tokens, characters) of the endings of record 2, then of record 3
    record2 = [(19 * p + o, 20, 19), (p + o + 3 * u, 5, 4), (p + o, 2, 1), (p + o + u, 3, 2)]
    record3 = [(8 * p + o, 9, 4), (7 * p + o, 8, 7), (p + o + 3 * u, 5, 4), (p + o + 3 * u, 5, 4)]
    tokenizer = ByteTokenizer()
    for record, expected in ((HELLASWAG_RECORDS[1], record2), (HELLASWAG_RECORDS[2], record3)):
        context = tokenizer.encode(record["ctx"])
        scores = score_continuations(model, [(context, tokenizer.encode(" " + e)) for e in record["endings"]])
        assert [s.num_tokens for s in scores] == [n for _, n, _ in expected]
        assert [s.loss_sum for s in scores] == pytest.approx([total for total, _, _ in expected], rel=1e-4)
    # record 1: all right; record 2: sum wrong, means right; record 3: token mean right, sum and chars wrong
    result = evaluate_hellaswag(model, tokenizer, write_jsonl(tmp_path / "hellaswag.jsonl", HELLASWAG_RECORDS))
    assert result == {
        "task": "hellaswag",
        "style": "nanogpt",
        "num_examples": 3,
        "num_fewshot": 0,
        "acc": pytest.approx(1 / 3),
        "acc_norm": pytest.approx(1.0),
        "acc_char_norm": pytest.approx(2 / 3),
    }


def test_hellaswag_limit_evaluates_the_first_examples(tmp_path: Path) -> None:
    model, _ = hellaswag_model()
    path = write_jsonl(tmp_path / "hellaswag.jsonl", HELLASWAG_RECORDS)
    result = evaluate_hellaswag(model, ByteTokenizer(), path, limit=1)
    assert result["num_examples"] == 1 and result["acc"] == 1.0


def test_hellaswag_accepts_records_in_memory_and_restores_train_mode() -> None:
    model, _ = hellaswag_model()
    model.train()
    result = evaluate_hellaswag(model, ByteTokenizer(), HELLASWAG_RECORDS, batch_size=5)
    assert result["acc_norm"] == 1.0
    assert model.training
    assert all(p.grad is None for p in model.parameters())


def test_hellaswag_lm_eval_style_renders_the_context_like_the_harness() -> None:
    record = hellaswag_record("", ["is fine [title] then.", "b", "c", "d"], label="1")
    record.update(activity_label="Home", ctx_a="A man [header] sits.", ctx_b="he")
    example = parse_hellaswag_record(record, "x", style="lm-eval")
    assert example.context == "Home: A man sits. He"
    assert example.endings[0] == " is fine. then."
    assert example.normalizers[0] == len("is fine. then.")
    assert example.label == 1  # the Hub copy's string labels are accepted


def test_hellaswag_ending_left_empty_by_the_clean_up_is_the_space_alone_and_never_wins_per_character() -> None:
    model, L = hellaswag_model()
    p, o, u = partner_loss(L), other_loss(L), math.log(V)
    record = hellaswag_record("xa", ["[header]", "q", "qq", "zz"], label=0)
    example = parse_hellaswag_record(record, "x", style="lm-eval")
    assert example.endings == (" ", " q", " qq", " zz") and example.normalizers == (0, 1, 2, 2)
    # " " costs p (the best total and mean); per character it has no characters, so " qq" (p + o + u) / 2 wins
    result = evaluate_hellaswag(model, ByteTokenizer(), [record], style="lm-eval")
    assert (result["acc"], result["acc_norm"], result["acc_char_norm"]) == (1.0, 1.0, 0.0)
    assert (p + o + u) / 2 < p + o  # why " qq" beats " q" per character


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"ctx": "a", "label": 0}), "missing field 'endings'"),
        (json.dumps(hellaswag_record("a", ["b", "c"], label=0)), "list of 4 strings"),
        (json.dumps(hellaswag_record("a", ["b", "c", "d", "e"], label=7)), "'label' must be an integer"),
        (json.dumps({k: v for k, v in hellaswag_record("a", list("bcde"), 0).items() if k != "label"}), "no 'label'"),
    ],
)
def test_malformed_hellaswag_lines_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(HELLASWAG_RECORDS[0]) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        evaluate_hellaswag(zero_model(), ByteTokenizer(), path)
    assert f"{path}:3" in str(info.value)


# ------------------------------------------------------------------------------------------ LAMBADA
LAMBADA_RECORDS = [{"text": "x a a"}, {"text": "x a q"}, {"text": "x za a a"}]


def test_lambada_scores_a_crafted_model_exactly_as_expected(tmp_path: Path) -> None:
    model, L = pair_model([(" ", "a")], block_size=32)
    p, o = partner_loss(L), other_loss(L)
    path = write_jsonl(tmp_path / "lambada.jsonl", LAMBADA_RECORDS)
    result = evaluate_lambada(model, ByteTokenizer(), path)
    # targets " a" (right), " q" (q after " " is not the partner: wrong), " a" (right)
    per_word = [2 * p, p + o, 2 * p]
    assert result["task"] == "lambada" and result["num_examples"] == 3
    assert result["acc"] == pytest.approx(2 / 3)
    assert result["perplexity"] == pytest.approx(math.exp(sum(per_word) / 3), rel=1e-4)
    assert result["token_perplexity"] == pytest.approx(math.exp(sum(per_word) / 6), rel=1e-4)


def test_lambada_target_is_the_last_word_with_its_space() -> None:
    assert read_lambada([{"text": "he said to his friend Ann"}]) == [("he said to his friend", " Ann")]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (json.dumps({"txt": "a b"}), "missing field 'text'"),
        (json.dumps({"text": 3}), "must be str"),
        (json.dumps({"text": "oneword"}), "no 'context last-word' split"),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_malformed_lambada_lines_name_the_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LAMBADA_RECORDS[0]) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as info:
        read_lambada(path)
    assert f"{path}:2" in str(info.value)


def test_a_missing_data_file_is_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_lambada(tmp_path / "nope.jsonl")


# ----------------------------------------------------------------------------------------- fetching
def test_fetch_dataset_offline_says_how_to_pass_a_local_file(tmp_path: Path, monkeypatch) -> None:
    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(hub.urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match="--data PATH"):
        fetch_dataset("lambada", tmp_path)


def test_fetch_dataset_uses_the_cached_file_without_the_network(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hub.urllib.request, "urlopen", lambda *a, **k: pytest.fail("network used"))
    cached = write_jsonl(tmp_path / "hellaswag_val.jsonl", HELLASWAG_RECORDS)
    assert fetch_dataset("hellaswag", tmp_path) == cached


def test_fetch_dataset_refuses_a_download_with_the_wrong_checksum(tmp_path: Path, monkeypatch) -> None:
    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self) -> bytes:
            return b'{"text": "tampered text"}\n'

    monkeypatch.setattr(hub.urllib.request, "urlopen", lambda *a, **k: Response())
    with pytest.raises(ValueError, match="sha256"):
        fetch_dataset("lambada", tmp_path)
    assert not list(tmp_path.iterdir())  # nothing half-written


class FakeResponse:
    """What urlopen returns, serving fixed bytes."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self) -> bytes:
        return self.data


def test_fetch_dataset_downloads_once_into_the_cache_folder(tmp_path: Path, monkeypatch) -> None:
    data = "".join(json.dumps(r) + "\n" for r in HELLASWAG_RECORDS).encode()
    monkeypatch.setattr(hub.urllib.request, "urlopen", lambda *a, **k: FakeResponse(data))
    path = fetch_dataset("hellaswag", tmp_path / "cache")
    assert path == tmp_path / "cache" / "hellaswag_val.jsonl" and path.read_bytes() == data
    monkeypatch.setattr(hub.urllib.request, "urlopen", lambda *a, **k: pytest.fail("network used"))
    assert fetch_dataset("hellaswag", tmp_path / "cache") == path


def test_download_file_writes_the_file_when_its_sha256_matches(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hub.urllib.request, "urlopen", lambda *a, **k: FakeResponse(b"payload"))
    digest = hashlib.sha256(b"payload").hexdigest()
    path = hub.download_file("https://example.invalid/f", tmp_path / "sub" / "f.bin", sha256=digest)
    assert path.read_bytes() == b"payload"
    assert [p.name for p in path.parent.iterdir()] == ["f.bin"]  # no temporary file left


# ----------------------------------------------------------------------------------------------- CLI
@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A saved pair model with its ByteTokenizer alongside, as training checkpoints are written."""
    model, _ = pair_model([(" ", "a"), ("\xc3", "\xa9")], block_size=32)
    directory = tmp_path / "model"
    save_pretrained(model, directory)
    ByteTokenizer().save(directory)
    return directory


def test_cli_hellaswag_writes_json_and_prints_a_table(tmp_path: Path, model_dir: Path, capsys) -> None:
    data = write_jsonl(tmp_path / "hellaswag.jsonl", HELLASWAG_RECORDS)
    out = tmp_path / "results" / "hellaswag.json"
    status = main(["eval", "hellaswag", "--model", str(model_dir), "--data", str(data), "--out", str(out)])
    assert status == 0
    written = json.loads(out.read_text())
    assert written["acc"] == pytest.approx(1 / 3) and written["acc_norm"] == 1.0
    assert written["model"] == str(model_dir) and written["data"] == str(data)
    table = capsys.readouterr().out
    assert "acc_norm" in table and "1.0000" in table and "0.3333" in table


def test_cli_lambada_with_limit(tmp_path: Path, model_dir: Path, capsys) -> None:
    data = write_jsonl(tmp_path / "lambada.jsonl", LAMBADA_RECORDS)
    out = tmp_path / "lambada.json"
    argv = ["eval", "lambada", "--model", str(model_dir), "--data", str(data), "--limit", "2", "--out", str(out)]
    assert main(argv) == 0
    written = json.loads(out.read_text())
    assert written["num_examples"] == 2 and written["acc"] == pytest.approx(0.5)
    assert "token_perplexity" in capsys.readouterr().out


def test_cli_perplexity_on_a_text_file_reports_bits_per_byte(tmp_path: Path, model_dir: Path, capsys) -> None:
    text = "a a a a é é éé a\n" * 20
    data = tmp_path / "text.txt"
    data.write_text(text, encoding="utf-8")
    out = tmp_path / "ppl.json"
    argv = ["eval", "perplexity", "--model", str(model_dir), "--data", str(data), "--stride", "8", "--out", str(out)]
    assert main(argv) == 0
    written = json.loads(out.read_text())
    assert written["num_tokens"] == len(text.encode("utf-8"))  # EOT is prepended: every byte is scored
    assert written["num_bytes"] == len(text.encode("utf-8"))
    assert written["bits_per_byte"] == pytest.approx(written["loss"] / math.log(2))
    assert "bits_per_byte" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "int4"])
@pytest.mark.slow
def test_cli_perplexity_in_an_inference_precision_stays_near_the_trained_model(
    tmp_path: Path, model_dir: Path, dtype: str
) -> None:
    data = tmp_path / "text.txt"
    data.write_text("a a a a é é éé a\n" * 20, encoding="utf-8")
    losses = {}
    for name, extra in (("as trained", []), (dtype, ["--dtype", dtype])):
        out = tmp_path / f"{name}.json"
        argv = ["eval", "perplexity", "--model", str(model_dir), "--data", str(data), "--out", str(out), *extra]
        assert main(argv) == 0
        losses[name] = json.loads(out.read_text())["loss"]
    # int4 grids run from each group's minimum to its maximum: this hand-built model's many exact zeros fall
    # between two levels, so it moves most there
    tolerance = {"float32": 1e-5, "bfloat16": 0.05, "int8": 0.05, "int4": 0.25}[dtype]
    assert losses[dtype] == pytest.approx(losses["as trained"], abs=tolerance)


def test_cli_perplexity_on_prepared_shards(tmp_path: Path, model_dir: Path) -> None:
    from gpt2.data import PrepareOptions, load_split, prepare

    source = tmp_path / "corpus.txt"
    source.write_text("a a a a é é q a\n" * 50, encoding="utf-8")
    shards = tmp_path / "shards"
    prepare([source], shards, ByteTokenizer(), PrepareOptions(val_fraction=0.2), progress=False)
    out = tmp_path / "ppl.json"
    argv = ["eval", "perplexity", "--model", str(model_dir), "--data", str(shards), "--out", str(out)]
    assert main(argv) == 0
    written = json.loads(out.read_text())
    val = load_split(shards, "val")
    assert written["num_tokens"] == len(val) - 1 and written["split"] == "val"
    assert written["num_bytes"] == count_bytes(ByteTokenizer(), val[1:], V)


def test_cli_malformed_file_is_one_line_naming_the_file_and_line(tmp_path: Path, model_dir: Path, capsys) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine text"}\n{"text": 1}\n', encoding="utf-8")
    assert main(["eval", "lambada", "--model", str(model_dir), "--data", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data}:2" in err


def test_cli_missing_tokenizer_says_to_pass_one(tmp_path: Path) -> None:
    model, _ = pair_model([(" ", "a")])
    directory = tmp_path / "bare"
    save_pretrained(model, directory)
    data = write_jsonl(tmp_path / "lambada.jsonl", LAMBADA_RECORDS)
    with pytest.raises(FileNotFoundError, match="--tokenizer"):
        load_model_and_tokenizer(str(directory), None, torch.device("cpu"))
    assert main(["eval", "lambada", "--model", str(directory), "--data", str(data)]) == 2
