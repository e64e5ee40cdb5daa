"""Automatic prefix caching (gpt2.serve.prefix_cache): a prompt that starts with an earlier prompt's tokens reuses
their keys and values, computes what a full prefill computes (logits to float32 rounding, the same greedy text),
skips the shared prefill (counted, never timed), and stays under its memory bound by evicting the least recently
used blocks; the server turns it on by default, reports it in /metrics, and `--no-prefix-cache` turns it off.

Tiny random models with the byte tokenizer, as tests/test_serve.py builds them.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams
from gpt2.model import GPT
from gpt2.serve import DecodeBatch, Engine, SequenceRequest, ServerConfig
from gpt2.serve.prefix_cache import BLOCK_TOKENS, PrefixCache
from gpt2.tokenizer import ByteTokenizer
from test_serve import Collector, serve_parser

WAIT_SECONDS = 60  # an upper bound on waits for the engine, never a timing claim
LONG_CONTEXT = 1024
SHARED = 500  # tokens two prompts share: 31 whole blocks and 4 tokens of the 32nd, all reusable
N_LAYER, N_HEAD, HEAD_SIZE = 2, 2, 16
BLOCK_BYTES = 2 * N_LAYER * N_HEAD * BLOCK_TOKENS * HEAD_SIZE * 4  # keys and values of one block, float32


def tiny_gpt(block_size: int = 128, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(
        n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_HEAD * HEAD_SIZE, vocab_size=ByteTokenizer.vocab_size,
        block_size=block_size,
    )  # fmt: skip
    model = GPT(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)  # peaked distributions: greedy text is not a run of ties
        model.transformer.wte.weight[ByteTokenizer.eot_token].zero_()  # greedy text runs on past end-of-text
    return model.eval()


def solo_logits(model: GPT, tokens: list[int]) -> torch.Tensor:
    """The plain path: a full forward of the sequence alone, (V,) logits after it."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


def random_tokens(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(count)]


def fake_kv(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V (n_layer, nh, T, hs) whose values say which token they belong to."""
    k = torch.arange(tokens, dtype=torch.float32).view(1, 1, tokens, 1).expand(N_LAYER, N_HEAD, tokens, HEAD_SIZE)
    return k.clone(), -k.clone()


# ------------------------------------------------------------------------------------ the cache
def test_a_prompt_finds_every_token_it_shares_with_a_cached_one() -> None:
    """Whole blocks down the hash chain, then as many first tokens of a block stored after them as agree (of a
    prompt's last, partial block too): token by token, as llama-server reuses a slot's cache."""
    cache = PrefixCache(max_bytes=1 << 20)
    tokens = list(range(40))
    k, v = fake_kv(40)
    cache.insert(tokens, k, v)
    assert len(cache) == 3 and cache.nbytes == 3 * BLOCK_BYTES  # 2 whole blocks, and 8 tokens in a block of their own
    found = cache.lookup([*tokens, 99])
    assert found.length == 40
    cached_k, cached_v = torch.zeros_like(k[:, :, :20]), torch.zeros_like(v[:, :, :20])
    found.copy_into(cached_k, cached_v)  # a prefix of the prefix: what join_many reuses
    torch.testing.assert_close(cached_k, k[:, :, :20], rtol=0, atol=0)
    torch.testing.assert_close(cached_v, v[:, :, :20], rtol=0, atol=0)
    assert cache.lookup([*range(20), 0, *range(21, 40)]).length == 20  # differs at token 20, in block 1
    assert cache.lookup(list(range(15))).length == 15  # the first tokens of block 0
    assert cache.lookup([*range(37), 0]).length == 37  # of the partial block 2
    assert cache.lookup([7, *range(1, 40)]).length == 0  # nothing from the first token on


def test_a_block_is_keyed_by_every_token_before_it() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.insert(list(range(32)), *fake_kv(32))
    other_start = [255, *range(1, 32)]  # block 1's own tokens are the same, what comes before is not
    assert cache.lookup(other_start).length == 0


def test_the_least_recently_used_blocks_are_evicted_under_the_byte_budget() -> None:
    cache = PrefixCache(max_bytes=3 * BLOCK_BYTES)
    first, second, third = ([start] * 16 for start in (1, 2, 3))
    cache.insert(first, *fake_kv(16))
    cache.insert(second, *fake_kv(16))
    assert cache.lookup(first).length == 16  # first is now more recent than second
    cache.insert(third, *fake_kv(16))  # fits: 3 blocks
    cache.insert([4] * 16, *fake_kv(16))  # the fourth evicts the least recently used: second
    assert cache.evictions == 1 and len(cache) == 3 and cache.nbytes == 3 * BLOCK_BYTES
    assert [cache.lookup(prompt).length for prompt in (first, second, third)] == [16, 0, 16]


def test_an_evicted_block_is_lent_to_no_prompt() -> None:
    cache = PrefixCache(max_bytes=2 * BLOCK_BYTES)
    prompt = list(range(24))
    cache.insert(prompt, *fake_kv(24))  # a whole block and one of 8 tokens: the pool is full
    assert cache.lookup(prompt).length == 24
    cache.insert([7] * 16, *fake_kv(16))  # room for it: the prompt's last block (its least recent) goes
    assert cache.evictions == 1 and cache.nbytes == 2 * BLOCK_BYTES
    assert cache.lookup(prompt).length == 16 and cache.lookup([7] * 16).length == 16


def test_a_prefix_loses_its_tail_before_its_head() -> None:
    cache = PrefixCache(max_bytes=3 * BLOCK_BYTES)
    prompt = list(range(48))
    cache.insert(prompt, *fake_kv(48))
    cache.insert([7] * 16, *fake_kv(16))  # one block must go: the prompt's last
    assert cache.lookup(prompt).length == 32


def test_a_prompt_longer_than_the_budget_keeps_its_first_blocks() -> None:
    cache = PrefixCache(max_bytes=2 * BLOCK_BYTES + 1)
    prompt = list(range(80))
    cache.insert(prompt, *fake_kv(80))
    assert len(cache) == 2 and cache.evictions == 0 and cache.lookup(prompt).length == 32


def test_blocks_live_in_one_pool_reserved_up_front() -> None:
    """max_bytes // BLOCK_BYTES blocks, allocated once: inserts copy into free blocks, evictions free them."""
    cache = PrefixCache(max_bytes=3 * BLOCK_BYTES + BLOCK_BYTES // 2)
    cache.reserve(N_LAYER, N_HEAD, HEAD_SIZE, dtype=torch.float32)
    assert cache.capacity == 3 and cache.nbytes == 0
    storages = set()
    for start in range(10):  # seven evictions
        prompt = [start] * 16
        cache.insert(prompt, *fake_kv(16))
        (block,) = cache.lookup(prompt).blocks
        storages.add(block.k.untyped_storage().data_ptr())
    assert cache.evictions == 7 and cache.nbytes == 3 * BLOCK_BYTES and len(storages) == 1


def test_a_batch_reserves_its_caches_pool_when_it_is_made() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    DecodeBatch(tiny_gpt(), max_rows=2, prefix_cache=cache)
    assert cache.capacity == (1 << 20) // cache.block_bytes > 0 and cache.nbytes == 0


def test_a_cache_holds_one_models_keys_and_values() -> None:
    cache = PrefixCache(max_bytes=1 << 20)
    cache.reserve(N_LAYER, N_HEAD, HEAD_SIZE, dtype=torch.float32)
    cache.reserve(N_LAYER, N_HEAD, HEAD_SIZE, dtype=torch.float32)  # the same shape: nothing to do
    with pytest.raises(ValueError, match=r"give each model a cache of its own"):
        cache.reserve(N_LAYER + 1, N_HEAD, HEAD_SIZE, dtype=torch.float32)


def test_a_prefix_is_copied_out_before_its_blocks_are_given_away() -> None:
    cache = PrefixCache(max_bytes=BLOCK_BYTES)
    cache.insert([1] * 16, *fake_kv(16))
    found = cache.lookup([1] * 16)
    cache.insert([2] * 16, *fake_kv(16))  # takes the only block
    with pytest.raises(AssertionError, match=r"copied before the next insert"):
        found.copy_into(*fake_kv(16))


@pytest.mark.parametrize("max_bytes", [0, -1, 1.5, True, "256"])
def test_the_budget_must_be_a_positive_number_of_bytes(max_bytes: Any) -> None:
    with pytest.raises(ValueError, match=r"max_bytes must be an integer >= 1, got "):
        PrefixCache(max_bytes=max_bytes)


# ------------------------------------------------------------------------------------ the batch
def test_a_join_that_reuses_a_cached_prefix_computes_what_a_full_prefill_does() -> None:
    model = tiny_gpt(block_size=LONG_CONTEXT)
    cache = PrefixCache(max_bytes=1 << 24)
    batch = DecodeBatch(model, max_rows=2, prefix_cache=cache)
    shared = random_tokens(SHARED, seed=1)
    first, second = [*shared, *random_tokens(20, seed=2)], [*shared, *random_tokens(30, seed=3)]
    batch.join(first)
    assert (cache.queries, cache.hits) == (len(first), 0)
    logits = batch.join(second)
    assert (cache.queries, cache.hits) == (len(first) + len(second), SHARED)  # every token the two share
    torch.testing.assert_close(logits, solo_logits(model, second), atol=1e-5, rtol=0)
    tokens = [[*first], [*second, int(logits.argmax())]]
    tokens[0].append(int(solo_logits(model, first).argmax()))
    for _ in range(5):  # the reused keys and values serve the decode steps too
        step = batch.step(torch.tensor([row[-1] for row in tokens]))
        for row, sequence in enumerate(tokens):
            torch.testing.assert_close(step[row], solo_logits(model, sequence), atol=1e-5, rtol=0)
            sequence.append(int(step[row].argmax()))


def test_a_repeated_prompt_still_prefills_its_last_token() -> None:
    model = tiny_gpt()
    cache = PrefixCache(max_bytes=1 << 20)
    batch = DecodeBatch(model, max_rows=2, prefix_cache=cache)
    prompt = random_tokens(2 * BLOCK_TOKENS, seed=4)  # exactly two blocks
    batch.join(prompt)
    logits = batch.join(prompt)
    assert cache.hits == 2 * BLOCK_TOKENS - 1  # all but the last token, whose logits must be computed
    torch.testing.assert_close(logits, solo_logits(model, prompt), atol=1e-5, rtol=0)


def test_join_many_with_cached_prefixes_of_different_lengths_gives_each_prompts_logits() -> None:
    model = tiny_gpt()
    cache = PrefixCache(max_bytes=1 << 20)
    batch = DecodeBatch(model, max_rows=5, prefix_cache=cache)
    header = random_tokens(64, seed=5)
    batch.join(header + [1])
    prompts = [
        [*header, *random_tokens(3, seed=6)],  # 64 cached, 3 left
        [*header[:40], *random_tokens(10, seed=7)],  # 40 cached (of 3 blocks), 10 left
        random_tokens(9, seed=8),  # nothing cached, shorter than what the others feed
        [*header, *random_tokens(12, seed=9)],  # 64 cached, 12 left: the most, so every row feeds 12
    ]
    queries, hits = cache.queries, cache.hits
    logits = batch.join_many(prompts)  # (n, V)
    for prompt, row in zip(prompts, logits, strict=True):
        torch.testing.assert_close(row, solo_logits(model, prompt), atol=1e-5, rtol=0)
    assert cache.queries - queries == sum(map(len, prompts))
    assert cache.hits - hits == (67 - 12) + (50 - 12) + 0 + (76 - 12)  # each row reuses P - 12 of its cached tokens


def test_scoring_a_prompt_uses_no_cached_prefix_but_stores_its_blocks() -> None:
    model = tiny_gpt()
    cache = PrefixCache(max_bytes=1 << 20)
    batch = DecodeBatch(model, max_rows=2, prefix_cache=cache)
    prompt = random_tokens(40, seed=10)
    batch.join(prompt)
    all_logits = batch.join(prompt, all_logits=True)  # (P, V): every position's, from a full prefill
    assert all_logits.shape == (40, ByteTokenizer.vocab_size) and (cache.queries, cache.hits) == (40, 0)
    with torch.no_grad():
        torch.testing.assert_close(all_logits, model(torch.tensor([prompt])).logits[0], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------ the engine


def run_engine(engine: Engine, requests: list[SequenceRequest]) -> Collector:
    """Submit the requests at once and wait for all of them."""
    collector = Collector(len(requests))
    engine.submit(requests, collector)
    assert collector.done.wait(WAIT_SECONDS), "the engine did not finish"
    return collector


def greedy(prompt: list[int], max_tokens: int = 12) -> SequenceRequest:
    """Greedy decoding, with each drawn token's log-probability (the logits, seen through the engine)."""
    return SequenceRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0), logprobs=0)


def chat_prompts() -> list[list[int]]:
    """Prompts that share a long header, and a conversation whose turns extend each other."""
    header = random_tokens(SHARED, seed=11)
    turn = [*header, *random_tokens(40, seed=12)]
    return [
        [*header, *random_tokens(7, seed=13)],
        [*header, *random_tokens(25, seed=14)],
        turn,
        [*turn, *random_tokens(33, seed=15)],
        random_tokens(50, seed=16),
    ]


def test_the_engine_gives_the_same_greedy_tokens_with_and_without_the_cache() -> None:
    model = tiny_gpt(block_size=LONG_CONTEXT)
    plain = Engine(model, ByteTokenizer(), max_batch=4)
    cached = Engine(model, ByteTokenizer(), max_batch=4, prefix_cache=PrefixCache(1 << 24))
    try:
        for prompt in chat_prompts():  # one at a time: each joins alone
            expected, got = run_engine(plain, [greedy(prompt)]), run_engine(cached, [greedy(prompt)])
            assert got.tokens(0) == expected.tokens(0)
            assert got.logprobs(0) == pytest.approx(expected.logprobs(0), abs=1e-5)
    finally:
        plain.stop()
        cached.stop()
    assert cached.prefix_cache is not None and cached.prefix_cache.hits > 0 and plain.prefix_cache is None


def test_a_second_request_sharing_a_long_prefix_skips_prefilling_it() -> None:
    engine = Engine(tiny_gpt(block_size=LONG_CONTEXT), ByteTokenizer(), max_batch=2, prefix_cache=PrefixCache(1 << 24))
    header = random_tokens(SHARED, seed=17)
    first, second = [*header, *random_tokens(9, seed=18)], [*header, *random_tokens(21, seed=19)]
    try:
        run_engine(engine, [greedy(first, max_tokens=2)])
        cache = engine.prefix_cache
        assert cache is not None and (cache.queries, cache.hits) == (len(first), 0)
        run_engine(engine, [greedy(second, max_tokens=2)])
    finally:
        engine.stop()
    assert (cache.queries, cache.hits) == (len(first) + len(second), SHARED)


def test_concurrent_requests_sharing_a_prefix_get_what_they_get_one_by_one() -> None:
    model = tiny_gpt(block_size=LONG_CONTEXT)
    prompts = chat_prompts()
    sequential = Engine(model, ByteTokenizer(), max_batch=8)
    concurrent = Engine(model, ByteTokenizer(), max_batch=8, prefix_cache=PrefixCache(1 << 24))
    try:
        expected = [run_engine(sequential, [greedy(prompt)]).tokens(0) for prompt in prompts]
        run_engine(concurrent, [greedy(prompts[0], max_tokens=1)])  # the header is cached ...
        together = run_engine(concurrent, [greedy(prompt) for prompt in prompts])  # ... and these join together
    finally:
        sequential.stop()
        concurrent.stop()
    assert [together.tokens(index) for index in range(len(prompts))] == expected
    assert concurrent.prefix_cache is not None and concurrent.prefix_cache.hits > len(prompts[0])


def test_prompt_logprobs_are_the_same_with_the_cache() -> None:
    model = tiny_gpt()
    prompt = random_tokens(60, seed=20)
    request = SequenceRequest(prompt, SamplingParams(max_tokens=3, temperature=0), logprobs=2, prompt_logprobs=True)
    outputs = []
    for prefix_cache in (None, PrefixCache(1 << 20)):
        engine = Engine(model, ByteTokenizer(), max_batch=2, prefix_cache=prefix_cache)
        try:
            run_engine(engine, [greedy(prompt)])  # the prompt is cached, when there is a cache
            outputs.append(run_engine(engine, [request]).outputs[0])
        finally:
            engine.stop()
    without, with_cache = outputs
    assert [o.token_ids for o in with_cache] == [o.token_ids for o in without]
    scored, expected = with_cache[0].prompt_logprobs, without[0].prompt_logprobs
    assert scored is not None and expected is not None and len(scored) == len(expected) == 60
    for got, want in zip(scored[1:], expected[1:], strict=True):
        assert got is not None and want is not None and got.token == want.token
        assert got.logprob == pytest.approx(want.logprob, abs=1e-5)


# ------------------------------------------------------------------------------------ the server
def test_the_metrics_count_queried_and_reused_prompt_tokens() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from gpt2.serve import create_app

    def scrape(client: Any) -> dict[str, float]:
        text = client.get("/metrics").text
        return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}

    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"))
    header = "You are a helpful assistant. Answer briefly. " * 2  # 90 bytes: 5 whole blocks and 10 bytes
    with TestClient(create_app(llm, ServerConfig(model_name="tiny"))) as client:
        before = scrape(client)
        for question in ("Hi?", "Why?"):
            body = {"model": "tiny", "prompt": header + question, "max_tokens": 2, "temperature": 0}
            assert client.post("/v1/completions", json=body).status_code == 200
        after = scrape(client)
    assert before["gpt2_prefix_cache_queries_total"] == before["gpt2_prefix_cache_hits_total"] == 0
    assert after["gpt2_prefix_cache_queries_total"] == 2 * len(header) + len("Hi?") + len("Why?")
    assert after["gpt2_prefix_cache_hits_total"] == len(header)
    # 5 whole blocks, and each prompt's last block: the header's last 10 bytes and its question
    assert after["gpt2_prefix_cache_bytes"] == (5 + 2) * BLOCK_BYTES
    assert after["gpt2_prefix_cache_evictions_total"] == 0


def test_gpt2_serve_caches_prefixes_by_default_and_no_prefix_cache_turns_it_off() -> None:
    pytest.importorskip("fastapi")
    from gpt2.cli.serve import server_config
    from gpt2.serve import create_app

    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"))
    default = server_config(serve_parser().parse_args(["serve", "--model", "m"]))
    off = server_config(serve_parser().parse_args(["serve", "--model", "m", "--no-prefix-cache"]))
    small = server_config(serve_parser().parse_args(["serve", "--model", "m", "--prefix-cache-mb", "8"]))
    assert (default.prefix_cache, default.prefix_cache_mb) == (True, 256)
    cache = create_app(llm, default).state.engine.prefix_cache
    assert isinstance(cache, PrefixCache) and cache.max_bytes == 256 << 20
    assert create_app(llm, off).state.engine.prefix_cache is None
    assert create_app(llm, small).state.engine.prefix_cache.max_bytes == 8 << 20


@pytest.mark.parametrize("value", ["0", "-3"])
def test_a_bad_prefix_cache_size_is_refused_in_one_line_before_loading(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpt2.cli import main

    assert main(["serve", "--model", "does/not/exist", "--prefix-cache-mb", value]) == 2
    assert capsys.readouterr().err.strip() == (
        f"gpt2 serve: error: prefix_cache_mb must be a whole number of MiB >= 1, got {value} "
        "(to turn the cache off: --no-prefix-cache)"
    )


def test_a_prefix_cache_size_that_is_not_a_number_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        serve_parser().parse_args(["serve", "--model", "m", "--prefix-cache-mb", "lots"])
    assert exited.value.code == 2
    assert "argument --prefix-cache-mb: invalid int value: 'lots'" in capsys.readouterr().err
