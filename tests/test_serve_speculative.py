"""Speculative decoding in the server's engine: a request decoding alone takes speculative steps (the drafter's
tokens verified in one forward of its row) and gets exactly the tokens plain greedy decoding gives; requests that
run together, or that ask for rules or log-probabilities, decode as usual; `gpt2 serve --prompt-lookup / --draft`
configure it."""

from __future__ import annotations

import threading

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
