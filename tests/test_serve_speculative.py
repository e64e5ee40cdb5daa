"""Speculative decoding in the server's engine: a greedy request decoding alone takes speculative steps (the
drafter's tokens verified in one forward of its row) and gets exactly the tokens plain greedy decoding gives, at
every temperature below the greedy threshold; requests that run together, sampled ones, or those that ask for
rules or log-probabilities decode as usual, so a seeded request's text is the same alone and under load;
/metrics counts drafted and accepted tokens; `gpt2 serve --prompt-lookup / --draft` configure it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from gpt2.api import LLM
from gpt2.cli.serve import server_config
from gpt2.inference import SamplingParams
from gpt2.inference.speculative import DraftModel, PromptLookup
from gpt2.serve import DecodeBatch, Engine, SequenceRequest
from gpt2.tokenizer import ByteTokenizer
from test_prefix_cache import random_tokens, run_engine, tiny_gpt
from test_serve import WAIT_SECONDS, Collector, serve_parser, wait_until


def prompts() -> list[list[int]]:
    """Prompts of several lengths, some repeating a motif (so n-gram lookup finds drafts)."""
    motif = random_tokens(6, seed=3)
    return [motif * 4, random_tokens(30, seed=4), [*random_tokens(9, seed=5), *motif, *motif], motif]


def greedy(prompt: list[int], max_tokens: int = 40) -> SequenceRequest:
    return SequenceRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))


def decode_alone(engine: Engine, requests: list[SequenceRequest]) -> list[list[int]]:
    """Each request submitted after the one before has ended: every one decodes alone."""
    return [run_engine(engine, [request]).tokens(0) for request in requests]


def run_later(engine: Engine, request: SequenceRequest) -> Collector:
    """Submit a request and return at once; the collector says when it has ended."""
    collector = Collector(1)
    engine.submit([request], collector)
    return collector


def stepping_turns(engine: Engine) -> int:
    return sum(1 for turn in engine.timeline if turn.stepped)


@pytest.mark.parametrize("drafter_kind", ["lookup", "draft"])
def test_a_request_alone_gets_plain_greedy_tokens_in_fewer_steps(drafter_kind: str) -> None:
    model = tiny_gpt()
    drafter = PromptLookup(num_tokens=4) if drafter_kind == "lookup" else DraftModel(tiny_gpt(seed=0))  # = target
    plain, speculative = Engine(model, ByteTokenizer()), Engine(model, ByteTokenizer(), drafter=drafter)
    try:
        expected = decode_alone(plain, [greedy(prompt) for prompt in prompts()])
        got = decode_alone(speculative, [greedy(prompt) for prompt in prompts()])
    finally:
        plain.stop()
        speculative.stop()
    assert got == expected
    generated = sum(len(tokens) for tokens in got)
    assert stepping_turns(plain) == generated - len(got)  # a token a step (the first comes from the prefill)
    assert stepping_turns(speculative) < 0.8 * stepping_turns(plain)  # several tokens a verification


def test_a_request_that_asks_for_logprobs_or_rules_decodes_one_token_a_step() -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), drafter=PromptLookup(num_tokens=4))
    prompt = prompts()[0]
    requests = [
        SequenceRequest(prompt, SamplingParams(max_tokens=20, temperature=0), logprobs=0),
        SequenceRequest(prompt, SamplingParams(max_tokens=20, temperature=0, repetition_penalty=1.3)),
    ]
    try:
        decode_alone(engine, requests)
    finally:
        engine.stop()
    assert stepping_turns(engine) == 2 * 19


@pytest.mark.slow
def test_a_speculating_request_joined_by_another_goes_on_in_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request speculates alone (its verifications held at a gate), the second arrives: both then step
    together, and each gets its solo greedy tokens."""
    model = tiny_gpt()
    first, second = greedy(prompts()[0], max_tokens=60), greedy(prompts()[1], max_tokens=30)
    reference = Engine(model, ByteTokenizer())
    try:
        expected = decode_alone(reference, [first, second])
    finally:
        reference.stop()
    permits, verifications = threading.Semaphore(0), []
    real_extend = DecodeBatch.extend

    def gated_extend(batch: DecodeBatch, tokens: torch.Tensor) -> torch.Tensor:
        verifications.append(tokens.numel())
        assert permits.acquire(timeout=WAIT_SECONDS), "the test never let this verification through"
        return real_extend(batch, tokens)

    monkeypatch.setattr(DecodeBatch, "extend", gated_extend)
    engine = Engine(model, ByteTokenizer(), drafter=PromptLookup(num_tokens=4))
    try:
        early = run_later(engine, first)
        permits.release(3)
        wait_until(lambda: len(verifications) == 4, "three verifications, the fourth held")
        late = run_later(engine, second)
        permits.release(1_000_000)
        assert early.done.wait(WAIT_SECONDS) and late.done.wait(WAIT_SECONDS)
    finally:
        permits.release(1_000_000)
        engine.stop()
    assert [early.tokens(0), late.tokens(0)] == expected
    assert max(verifications) > 1 and any(turn.stepped == 2 for turn in engine.timeline)  # drafted, then batched


def test_seeded_sampling_with_speculation_is_reproducible_and_ends_at_max_tokens() -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), drafter=PromptLookup(num_tokens=4))
    request = SequenceRequest(prompts()[0], SamplingParams(max_tokens=25, temperature=0.8, seed=7))
    try:
        runs = decode_alone(engine, [request, request])
    finally:
        engine.stop()
    assert runs[0] == runs[1] and len(runs[0]) == 25


@pytest.mark.slow
def test_gpt2_serve_takes_the_speculation_flags_of_gpt2_sample() -> None:
    pytest.importorskip("fastapi")
    from gpt2.serve import create_app

    args = serve_parser().parse_args(["serve", "--model", "m", "--prompt-lookup"])
    assert (args.prompt_lookup, args.draft) == (10, None)
    with pytest.raises(SystemExit):
        serve_parser().parse_args(["serve", "--model", "m", "--prompt-lookup", "--draft", "d"])
    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"), prompt_lookup=args.prompt_lookup)
    engine = create_app(llm, server_config(args)).state.engine
    assert isinstance(engine._drafter, PromptLookup) and engine._drafter.num_tokens == 10


# ------------------------------------------------------------------------------------ through the server
PROMPT = "abcabcabcabc abc"


def speculating_llm(kind: str) -> LLM:
    options: dict = {"prompt_lookup": 4} if kind == "lookup" else {"draft": tiny_gpt()}  # = the target
    return LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"), **options)


def complete(client: Any, **body: Any) -> str:
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT, **body})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def scrape(client: Any) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = client.get("/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_the_server_speculating_at_tiny_temperatures_gives_plain_greedy_text(kind: str) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gpt2.serve import ServerConfig, create_app

    plain = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu")).generate(
        PROMPT, SamplingParams(max_tokens=30, temperature=0)
    )[0]
    assert plain
    with TestClient(create_app(speculating_llm(kind), ServerConfig(model_name="tiny"))) as client:
        for temperature in (0.0, 1e-45, 1e-30, 1e-6):
            assert complete(client, max_tokens=30, temperature=temperature, seed=1) == plain
        counters = scrape(client)
    assert counters["gpt2_spec_decode_num_drafts_total"] > 0  # it did speculate
    assert (
        0
        < counters["gpt2_spec_decode_num_accepted_tokens_total"]
        <= counters["gpt2_spec_decode_num_draft_tokens_total"]
    )


@pytest.mark.slow
def test_the_metrics_count_drafted_and_accepted_tokens() -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gpt2.serve import ServerConfig, create_app

    with TestClient(create_app(speculating_llm("lookup"), ServerConfig(model_name="tiny"))) as client:
        before = scrape(client)
        complete(client, max_tokens=30, temperature=0)
        after = scrape(client)
        engine = client.app.state.engine
    names = ["gpt2_spec_decode_num_drafts_total", "gpt2_spec_decode_num_draft_tokens_total"]
    names.append("gpt2_spec_decode_num_accepted_tokens_total")
    assert [before[name] for name in names] == [0, 0, 0]
    stats = engine.speculation
    assert [after[name] for name in names] == [stats.verifications, stats.drafted, stats.accepted]
    # every verification commits its kept drafts and one token of the target's: 29 tokens after the prefill's
    assert stats.verifications + stats.accepted == 29


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_a_seeded_sampled_request_gives_the_same_text_alone_and_under_load(kind: str) -> None:
    """Through a speculating server: alone, and while other requests stream, the text is LLM.generate's with the
    same speculation."""
    pytest.importorskip("fastapi")
    from concurrent.futures import ThreadPoolExecutor

    from fastapi.testclient import TestClient

    from gpt2.serve import ServerConfig, create_app

    sampled = {"max_tokens": 30, "temperature": 0.8, "seed": 5}
    expected = speculating_llm(kind).generate(PROMPT, SamplingParams(**sampled))[0]
    with TestClient(create_app(speculating_llm(kind), ServerConfig(model_name="tiny"))) as client:
        alone = complete(client, **sampled)
        engine = client.app.state.engine
        with ThreadPoolExecutor(3) as pool:
            others = [pool.submit(complete, client, max_tokens=90, temperature=0) for _ in range(2)]
            wait_until(lambda: engine.active == 2, "the other requests decoding")
            loaded = complete(client, **sampled)
            assert all(len(other.result()) == 90 for other in others)
    assert alone == loaded == expected


@pytest.mark.parametrize("kind", ["lookup", "draft"])
def test_an_engine_gives_a_seeded_sampled_request_its_text_among_others(kind: str) -> None:
    """Submitted with two longer requests, so it decodes among them from its first token to its last."""
    llm = speculating_llm(kind)
    prompt = list(PROMPT.encode())
    request = SequenceRequest(prompt, SamplingParams(max_tokens=30, temperature=0.8, seed=5))
    engine = Engine(llm.model, ByteTokenizer(), drafter=llm.new_drafter())
    try:
        alone = run_engine(engine, [request]).tokens(0)
        together = run_engine(engine, [greedy(prompts()[0], 60), request, greedy(prompts()[1], 60)])
    finally:
        engine.stop()
    assert len(together.tokens(0)) == len(together.tokens(2)) == 60 > len(alone)
    assert together.tokens(1) == alone
    assert ByteTokenizer().decode(alone) == llm.generate(PROMPT, request.params)[0]
