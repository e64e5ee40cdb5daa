"""Chunked prefill (gpt2.serve.engine, gpt2.serve.batch.ChunkedPrefill): a turn of the engine prefills at most
`prefill_chunk` prompt tokens, so a long prompt is prefilled over several turns, each followed by a decode step of
the running streams. It computes what one prefill computes (logits to float32 rounding, the same greedy tokens,
the same prompt log-probabilities), the prefix cache keeps working, and a stream that is decoding never waits for
more than one chunk: asserted on the engine's timeline of turns (tokens prefilled, rows stepped), never on time.

Tiny random models with the byte tokenizer, as tests/test_serve.py and tests/test_prefix_cache.py build them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gpt2.api import LLM
from gpt2.inference import SamplingParams
from gpt2.model import GPT
from gpt2.serve import DecodeBatch, Engine, SequenceRequest, ServerConfig
from gpt2.serve.batch import ChunkedPrefill
from gpt2.serve.engine import PREFILL_CHUNK, TurnRecord
from gpt2.serve.prefix_cache import BLOCK_TOKENS, PrefixCache
from gpt2.tokenizer import ByteTokenizer
from test_prefix_cache import greedy, run_engine
from test_prefix_cache import tiny_gpt as prefix_cache_model
from test_serve import Collector, StepGate, serve_parser, wait_until

WAIT_SECONDS = 60  # an upper bound on waits for the engine, never a timing claim
CONTEXT = 256
CHUNK = 32


def tiny_gpt(block_size: int = CONTEXT, seed: int = 0) -> GPT:
    """test_prefix_cache's model (peaked random weights, byte vocabulary) at this file's context."""
    return prefix_cache_model(block_size, seed)


def random_tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(count)]


def full_logits(model: GPT, tokens: list[int]) -> torch.Tensor:
    """The plain path: one forward of the whole sequence alone, every position's logits (T, V)."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def prefill_in_chunks(prefill: ChunkedPrefill, sizes: list[int]) -> list[torch.Tensor]:
    """Feed the chunks in turn (the last takes what is left); each chunk's logits."""
    logits = [prefill.advance(size) for size in sizes]
    if prefill.remaining:
        logits.append(prefill.advance(prefill.remaining))
    return logits


# ------------------------------------------------------------------------------------ the batch
@pytest.mark.parametrize("sizes", [[1], [7, 7, 7], [16, 1, 40], [199]])
def test_a_prompt_prefilled_in_chunks_has_the_logits_and_keys_of_one_prefill(sizes: list[int]) -> None:
    model = tiny_gpt()
    prompt = random_tokens(200, seed=1)
    prefill = ChunkedPrefill(model, prompt)
    last = prefill_in_chunks(prefill, sizes)[-1]
    assert last.shape == (1, ByteTokenizer.vocab_size) and prefill.remaining == 0 and prefill.done == 200
    torch.testing.assert_close(last[0], full_logits(model, prompt)[-1], atol=1e-5, rtol=0)
    cache = model.new_kv_cache(1, max_len=200)
    with torch.no_grad():
        model(torch.tensor([prompt]), kv_cache=cache)
    k, v = prefill.keys_values()
    torch.testing.assert_close(k, cache.k[:, 0], atol=1e-5, rtol=0)
    torch.testing.assert_close(v, cache.v[:, 0], atol=1e-5, rtol=0)


def test_with_all_logits_the_chunks_logits_are_every_positions_logits_of_one_forward() -> None:
    model = tiny_gpt()
    prompt = random_tokens(100, seed=2)
    chunks = prefill_in_chunks(ChunkedPrefill(model, prompt, all_logits=True), [CHUNK] * 3)
    assert [len(chunk) for chunk in chunks] == [32, 32, 32, 4]
    torch.testing.assert_close(torch.cat(chunks), full_logits(model, prompt), atol=1e-5, rtol=0)


def test_a_prompt_prefilled_between_steps_joins_the_running_rows_as_a_join_would() -> None:
    model = tiny_gpt(block_size=64)
    batch = DecodeBatch(model, max_rows=3)
    rows: list[list[int]] = []

    def step() -> None:
        logits = batch.step(torch.tensor([tokens[-1] for tokens in rows]))  # (B, V)
        for row, tokens in enumerate(rows):
            torch.testing.assert_close(logits[row], full_logits(model, tokens)[-1], atol=1e-5, rtol=0)
            tokens.append(int(logits[row].argmax()))

    for prompt in ([5, 6, 7], random_tokens(20, seed=3)):
        rows.append([*prompt, int(batch.join(prompt).argmax())])
    long = random_tokens(45, seed=4)
    prefill = batch.start_prefill(long)
    for _ in range(4):  # the rows decode between its chunks (and the width moves on)
        prefill.advance(10)
        step()
    logits = prefill.advance(prefill.remaining)  # (1, V)
    batch.join_prefilled(prefill)  # wider than the width: the other rows move right
    assert batch.lengths == [len(rows[0]) - 1, len(rows[1]) - 1, 45]
    rows.append([*long, int(logits.argmax())])
    while len(rows[2]) < 64:  # up to the context
        step()
    assert batch.width == 63 and batch.lengths[2] == 63


def test_a_chunked_prompt_reuses_cached_blocks_and_stores_its_own_when_complete() -> None:
    model = tiny_gpt()
    cache = PrefixCache(max_bytes=1 << 24)
    header = random_tokens(70, seed=5)
    ChunkedPrefill(model, header, prefix_cache=cache).advance(70)  # its 4 whole blocks and 6 tokens are stored
    prompt = [*header, *random_tokens(90, seed=6)]  # 160 tokens: 10 blocks
    prefill = ChunkedPrefill(model, prompt, prefix_cache=cache)
    assert prefill.done == 70  # the header, copied in at the start, and counted then
    assert (cache.queries, cache.hits) == (70 + 160, 70)
    last = prefill_in_chunks(prefill, [CHUNK])[-1]
    torch.testing.assert_close(last[0], full_logits(model, prompt)[-1], atol=1e-5, rtol=0)
    assert cache.lookup(prompt).length == 10 * BLOCK_TOKENS  # all its blocks, once its last token was in


def test_a_scored_prompt_reuses_no_cached_prefix() -> None:
    model = tiny_gpt()
    cache = PrefixCache(max_bytes=1 << 24)
    prompt = random_tokens(40, seed=7)
    ChunkedPrefill(model, prompt, prefix_cache=cache).advance(40)
    scored = ChunkedPrefill(model, prompt, prefix_cache=cache, all_logits=True)
    assert scored.done == 0 and (cache.queries, cache.hits) == (40, 0)


@pytest.mark.parametrize("length", [0, CONTEXT + 1])
def test_a_chunked_prompt_must_hold_1_to_block_size_tokens(length: int) -> None:
    with pytest.raises(ValueError, match=f"a prompt must hold 1 to {CONTEXT} tokens to be prefilled, got {length}"):
        ChunkedPrefill(tiny_gpt(), [1] * length)


# ------------------------------------------------------------------------------------ the engine
@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[StepGate]:
    step_gate = StepGate(monkeypatch)
    yield step_gate
    step_gate.open()  # nothing stays blocked after the test


def mixed_prompts() -> list[list[int]]:
    """Short and long prompts, two of them sharing a header of 100 tokens (6 whole blocks)."""
    header = random_tokens(100, seed=8)
    return [
        random_tokens(3, seed=9),
        [*header, *random_tokens(97, seed=10)],
        random_tokens(40, seed=11),
        [*header, *random_tokens(30, seed=12)],
        random_tokens(CONTEXT - 13, seed=13),
        random_tokens(CHUNK, seed=14),
    ]


def assert_no_stream_waited_more_than_one_chunk(timeline: list[TurnRecord], chunk: int) -> None:
    for turn in timeline:
        assert turn.prefilled <= chunk, turn
        assert turn.running == 0 or turn.stepped >= turn.running, turn  # every decoding row took its step


@pytest.mark.parametrize("prefix_cache", [False, True], ids=["no-cache", "prefix-cache"])
def test_the_engine_gives_the_same_greedy_tokens_and_logprobs_chunked_and_unchunked(prefix_cache: bool) -> None:
    model = tiny_gpt()
    prompts = mixed_prompts()
    whole = Engine(model, ByteTokenizer(), max_batch=8, prefill_chunk=CONTEXT)  # every prompt in one prefill
    chunked = Engine(
        model,
        ByteTokenizer(),
        max_batch=8,
        prefill_chunk=CHUNK,
        prefix_cache=PrefixCache(1 << 24) if prefix_cache else None,
    )
    try:
        expected = [run_engine(whole, [greedy(prompt)]) for prompt in prompts]  # one at a time: each alone
        got = run_engine(chunked, [greedy(prompt) for prompt in prompts])  # together, over many turns
    finally:
        whole.stop()
        chunked.stop()
    for index, alone in enumerate(expected):
        assert got.tokens(index) == alone.tokens(0), f"prompt {index}"
        assert got.logprobs(index) == pytest.approx(alone.logprobs(0), abs=1e-5)
    assert max(turn.prefilled for turn in whole.timeline) == CONTEXT - 13  # the unchunked engine prefilled it whole
    assert_no_stream_waited_more_than_one_chunk(chunked.timeline, CHUNK)
    reused = chunked.prefix_cache.hits if chunked.prefix_cache is not None else 0
    assert sum(turn.prefilled for turn in chunked.timeline) == sum(map(len, prompts)) - reused  # each token once
    assert (reused > 0) == prefix_cache  # a prompt reused the shared header, prefilled in chunks before it


def test_a_long_prompt_whose_prefix_is_cached_is_budgeted_at_the_tokens_it_feeds() -> None:
    """A chat's next turn: longer than a chunk, but all of it cached except the new tokens, so it is admitted whole,
    prefilled into its row (no chunks outside the batch), with a short prompt that arrived beside it."""
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=2, prefill_chunk=CHUNK, prefix_cache=PrefixCache(1 << 24))
    turn = random_tokens(3 * CHUNK, seed=20)
    try:
        run_engine(engine, [greedy(turn, max_tokens=1)])  # in 3 chunks: 96 > 32 tokens
        next_turn = [*turn, *random_tokens(10, seed=21)]  # 106 tokens, the first 6 blocks cached
        run_engine(engine, [greedy(next_turn, max_tokens=1), greedy(random_tokens(8, seed=22), max_tokens=1)])
    finally:
        engine.stop()  # its last turn's record is in once the thread has ended
    fed = 106 - 6 * BLOCK_TOKENS
    assert [record.prefilled for record in engine.timeline if record.prefilled] == [CHUNK] * 3 + [fed + 8]


@pytest.mark.slow
def test_a_long_prompt_arriving_while_8_streams_decode_stalls_each_by_one_chunk_at_most(gate: StepGate) -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=9, prefill_chunk=CHUNK)
    long = random_tokens(200, seed=15)
    streams = [
        SequenceRequest(random_tokens(3, seed=16 + i), SamplingParams(max_tokens=60, min_tokens=60, seed=i))
        for i in range(8)
    ]
    decoding, late = Collector(8), Collector(1)
    try:
        engine.submit(streams, decoding)
        wait_until(lambda: gate.reached == 1, "the 8 streams to start")  # held at their first step
        engine.submit([greedy(long, max_tokens=3)], late)
        gate.open()
        assert decoding.done.wait(WAIT_SECONDS) and late.done.wait(WAIT_SECONDS)
    finally:
        engine.stop()
    assert [len(decoding.tokens(i)) for i in range(8)] == [60] * 8 and len(late.tokens(0)) == 3
    timeline = engine.timeline
    assert_no_stream_waited_more_than_one_chunk(timeline, CHUNK)
    first, *rest = timeline
    assert (first.prefilled, first.running, first.stepped) == (24, 0, 8)  # the streams' prompts, then their step
    long_turns = [turn for turn in rest if turn.prefilled > 0]
    assert [turn.prefilled for turn in long_turns] == [32] * 6 + [8]  # 200 tokens, a chunk a turn
    assert all(turn.running == 8 for turn in long_turns)  # while the 8 streams decoded ...
    assert [turn.stepped for turn in long_turns] == [8] * 6 + [9]  # ... each stepped every turn; then it joined
    assert len(long_turns) == math.ceil(200 / CHUNK)


def test_a_burst_of_prompts_is_prefilled_a_chunk_per_turn_at_most() -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=4, prefill_chunk=CHUNK)
    prompts = [random_tokens(length, seed=20 + length) for length in (5, 31, 33, 100, 64, 2, 150, 1)]
    try:
        collector = run_engine(engine, [greedy(prompt, max_tokens=5) for prompt in prompts])
    finally:
        engine.stop()
    assert all(len(collector.tokens(index)) == 5 for index in range(len(prompts)))
    assert_no_stream_waited_more_than_one_chunk(engine.timeline, CHUNK)
    assert sum(turn.prefilled for turn in engine.timeline) == sum(map(len, prompts))


def prompt_scores(model: GPT, prompt: list[int], top: int) -> list[tuple[int, float, list[int]]]:
    """Each prompt token after the first: (token, log-probability, ids of the `top` most likely) from one forward."""
    logprobs = F.log_softmax(full_logits(model, prompt), dim=-1)  # (P, V)
    return [
        (token, float(logprobs[t, token]), torch.topk(logprobs[t], top).indices.tolist())
        for t, token in enumerate(prompt[1:])
    ]


@pytest.mark.parametrize("max_tokens", [0, 4], ids=["scored-only", "scored-and-continued"])
def test_echoed_prompt_logprobs_chunk_by_chunk_are_one_forwards(max_tokens: int) -> None:
    model = tiny_gpt()
    prompt = random_tokens(150, seed=30)
    request = SequenceRequest(
        prompt, SamplingParams(max_tokens=max_tokens, temperature=0), logprobs=2, prompt_logprobs=True
    )
    whole = Engine(model, ByteTokenizer(), prefill_chunk=CONTEXT)
    chunked = Engine(model, ByteTokenizer(), prefill_chunk=CHUNK, prefix_cache=PrefixCache(1 << 24))
    try:
        expected = run_engine(whole, [request])
        got = run_engine(chunked, [request])
    finally:
        whole.stop()
        chunked.stop()
    scored = got.outputs[0][0].prompt_logprobs
    assert scored is not None and len(scored) == 150 and scored[0] is None
    for got_score, (token, logprob, top) in zip(scored[1:], prompt_scores(model, prompt, top=2), strict=True):
        assert got_score is not None and got_score.token == token
        assert got_score.logprob == pytest.approx(logprob, abs=1e-5)
        assert [alternative for alternative, _ in got_score.top] == top
    assert got.tokens(0) == expected.tokens(0) and len(got.tokens(0)) == max_tokens
    assert got.finish(0).finish_reason == "length"
    assert [turn.prefilled for turn in chunked.timeline if turn.prefilled] == [32] * 4 + [22]


@pytest.mark.slow
def test_a_prompt_cancelled_while_prefilling_in_chunks_frees_its_row(gate: StepGate) -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=2, prefill_chunk=CHUNK)
    stream, late = Collector(1), Collector(1)
    try:
        engine.submit([SequenceRequest([1, 2, 3], SamplingParams(max_tokens=20, min_tokens=20))], stream)
        wait_until(lambda: gate.reached == 1, "the stream to start")
        ticket = engine.submit([greedy(random_tokens(200, seed=31))], late)
        gate.allow(1)
        wait_until(lambda: gate.reached == 2, "the next turn: the long prompt's first chunk")
        assert engine.active == 2  # the stream, and the prompt part-way prefilled: it holds a row
        ticket.cancel()  # between two of its chunks
        gate.open()
        assert late.done.wait(WAIT_SECONDS) and stream.done.wait(WAIT_SECONDS)
        wait_until(lambda: engine.active == 0, "every row to be free")
    finally:
        engine.stop()
    assert late.finish(0).finish_reason == "cancelled" and late.tokens(0) == []
    assert len(stream.tokens(0)) == 20
    assert [turn.prefilled for turn in engine.timeline if turn.prefilled] == [3, CHUNK]  # no chunk after the cancel


# ------------------------------------------------------------------------------------ the setting
@pytest.mark.parametrize("value", [0, -1, 1.5, True, "512"])
def test_the_chunk_must_be_a_positive_number_of_tokens(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^prefill_chunk must be an integer >= 1, got "):
        Engine(tiny_gpt(), ByteTokenizer(), prefill_chunk=value)
    with pytest.raises(ValueError, match=r"^prefill_chunk must be an integer >= 1, got "):
        ServerConfig(prefill_chunk=value)


def test_gpt2_serve_prefill_chunk_sets_the_engines_chunk() -> None:
    pytest.importorskip("fastapi")
    from gpt2.cli.serve import server_config
    from gpt2.serve import create_app

    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"))
    default = server_config(serve_parser().parse_args(["serve", "--model", "m"]))
    small = server_config(serve_parser().parse_args(["serve", "--model", "m", "--prefill-chunk", "64"]))
    assert default.prefill_chunk == PREFILL_CHUNK == 512
    assert create_app(llm, default).state.engine.prefill_chunk == 512
    assert create_app(llm, small).state.engine.prefill_chunk == 64


def test_a_bad_prefill_chunk_is_refused_in_one_line_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    from gpt2.cli import main

    assert main(["serve", "--model", "does/not/exist", "--prefill-chunk", "0"]) == 2
    assert capsys.readouterr().err.strip() == "gpt2 serve: error: prefill_chunk must be an integer >= 1, got 0"
