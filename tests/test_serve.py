"""The OpenAI-compatible server (gpt2.serve): what the official `openai` client gets equals what the library
computes offline (generate, the scorer, transformers); continuous batching computes what each request computes
alone; every error is OpenAI-shaped and no client input gets a 5xx.

Servers run in-process with uvicorn on 127.0.0.1 and a free port (the real client needs a real socket), over a
tiny random model with the byte tokenizer (GPT-2's BPE where the scorer's text handling matters). Tests that must
catch the engine mid-request hold it before each decode step (`StepGate`), so nothing depends on timing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from conftest import headless_chromium, shared_file
from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams, generate
from gpt2.model import GPT
from gpt2.serve import (
    DecodeBatch,
    Engine,
    EngineStopped,
    SequenceOutput,
    SequenceRequest,
    ServerConfig,
)
from gpt2.tokenizer import ByteTokenizer, load_tokenizer
from gpt2.tokenizer.chat import encode_chat
from gpt2.weights import save_pretrained

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

MODEL = "tiny"
BLOCK_SIZE = 128
WAIT_SECONDS = 60  # an upper bound on waits for a server or an engine, never a timing claim
STARTUP_SECONDS = 300  # ... and for a new `gpt2 serve` process, which imports torch and the server on a busy machine


def tiny_gpt(vocab_size: int = ByteTokenizer.vocab_size, block_size: int = BLOCK_SIZE, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=vocab_size, block_size=block_size))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)  # peaked distributions: greedy text is not a run of ties
        if vocab_size == ByteTokenizer.vocab_size:
            # end-of-text's logit is then 0 while the best of 256 random logits is far above: greedy text runs on
            model.transformer.wte.weight[ByteTokenizer.eot_token].zero_()
    return model.eval()


def save_model(directory: Path, model: GPT, tokenizer: Any) -> Path:
    save_pretrained(model, directory)
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("tiny"), tiny_gpt(), ByteTokenizer())


@pytest.fixture(scope="module")
def llm(model_dir: Path) -> LLM:
    """What the server serves."""
    return LLM.load(model_dir)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> LLM:
    """A second copy for the offline answers, so the test thread never shares a model with the engine."""
    return LLM.load(model_dir)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running(llm: LLM, saes: dict[str, Any] | None = None, **settings: Any) -> Iterator[str]:
    """A server for `llm` (with `saes` by name, for steering) on a free loopback port in a background thread;
    yields its base URL."""
    from gpt2.serve import uvicorn_server

    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP (else each small write
    # of a keep-alive connection waits ~40 ms for a delayed ACK)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = ServerConfig(model_name=MODEL, port=port, **settings)
    server = uvicorn_server(llm, config, log_level="warning", saes=saes)
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_SECONDS
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(WAIT_SECONDS)
        sock.close()


@pytest.fixture(scope="module")
def base_url(llm: LLM) -> Iterator[str]:
    with running(llm) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url: str) -> Any:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def post(url: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    """POST a JSON body to /v1/completions (json.dumps escapes what httpx would refuse, such as a lone surrogate)."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    return httpx.post(f"{url}/v1/completions", content=json.dumps(body), headers=headers, timeout=WAIT_SECONDS)


def wait_until(condition: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=WAIT_SECONDS).json()


class StepGate:
    """Holds the engine before each decode step until the test lets steps through, and records each step's
    batch size (every DecodeBatch while the test runs) and how many steps reached it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.permits = threading.Semaphore(0)
        self.sizes: list[int] = []
        self.reached = 0  # steps that reached the gate (let through or waiting)
        real_step = DecodeBatch.step

        def gated_step(batch: DecodeBatch, tokens: torch.Tensor, **options: Any) -> torch.Tensor:
            self.reached += 1
            assert self.permits.acquire(timeout=WAIT_SECONDS), "the test never let this step through"
            self.sizes.append(batch.size)
            return real_step(batch, tokens, **options)

        monkeypatch.setattr(DecodeBatch, "step", gated_step)

    def allow(self, steps: int) -> None:
        self.permits.release(steps)

    def steps_until(self, condition: Callable[[], bool], most: int = 1000) -> int:
        """Let steps through one at a time until `condition` holds; the number of steps that took. (A cancelled
        row is freed at the next step boundary, so the engine must be let go on for it to leave.)"""
        steps_wanted = len(self.sizes)

        def stepped() -> bool:
            return len(self.sizes) >= steps_wanted or condition()

        for taken in range(most):
            if condition():
                return taken
            steps_wanted += 1
            self.allow(1)
            wait_until(stepped, "a step")
        raise AssertionError(f"still not so after {most} steps")

    def open(self) -> None:
        self.permits.release(1_000_000)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[StepGate]:
    step_gate = StepGate(monkeypatch)
    yield step_gate
    step_gate.open()  # nothing stays blocked after the test


# ------------------------------------------------------------------------------------ the batch
def solo_logits(model: GPT, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


def test_a_full_batch_refuses_more_sequences_and_says_how_to_go_on() -> None:
    batch = DecodeBatch(tiny_gpt(block_size=64), max_rows=2)
    batch.join([1, 2, 3])
    with pytest.raises(ValueError, match=r"2 sequence\(s\) do not fit in 1 free rows; wait for a sequence to leave"):
        batch.join_many([[4, 5], [6]])
    assert batch.size == 1 and batch.lengths == [3]  # nothing was half-added
    batch.join([4, 5])
    with pytest.raises(ValueError, match="the batch is full"):
        batch.join([6])


@pytest.mark.slow
def test_batched_logits_equal_each_sequence_alone_as_sequences_join_and_leave() -> None:
    model = tiny_gpt(block_size=64)
    batch = DecodeBatch(model, max_rows=4)
    rng = random.Random(0)
    rows: list[list[int]] = []
    widths = []
    for _ in range(300):
        if len(rows) < 4 and rng.random() < 0.3:  # one joins, or several at once (one batched prefill)
            count = rng.randint(1, 4 - len(rows)) if rng.random() < 0.5 else 1
            prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 40))] for _ in range(count)]
            joined = batch.join_many(prompts) if count > 1 else batch.join(prompts[0]).unsqueeze(0)  # (n, V)
            for prompt, logits in zip(prompts, joined, strict=True):
                torch.testing.assert_close(logits, solo_logits(model, prompt), atol=1e-5, rtol=0)
                rows.append([*prompt, int(logits.argmax())])
        for row in reversed(range(len(rows))):
            if len(rows[row]) == 64 or rng.random() < 0.04:  # at the context, or at random
                batch.leave(row)
                rows[row] = rows[-1]
                rows.pop()
        if not rows:
            continue
        logits = batch.step(torch.tensor([tokens[-1] for tokens in rows]))
        widths.append(batch.width)
        for row, tokens in enumerate(rows):
            torch.testing.assert_close(logits[row], solo_logits(model, tokens), atol=1e-5, rtol=0)
            tokens.append(int(logits[row].argmax()))
    assert max(widths) == 64  # the cache filled up and was compacted, and the logits stayed the same


def test_a_long_prompt_moves_the_running_rows_right_and_a_full_cache_moves_them_left() -> None:
    model = tiny_gpt(block_size=32)
    batch = DecodeBatch(model, max_rows=2)
    short, long = [1, 2, 3], list(range(10, 30))
    tokens = [[*short, int(batch.join(short).argmax())]]
    assert batch.width == 3
    tokens.append([*long, int(batch.join(long).argmax())])
    assert batch.width == 20 and batch.lengths == [3, 20]  # the short row now sits in columns [17, 20)
    while len(tokens[1]) < 32:
        logits = batch.step(torch.tensor([row[-1] for row in tokens]))
        for row, sequence in enumerate(tokens):
            torch.testing.assert_close(logits[row], solo_logits(model, sequence), atol=1e-5, rtol=0)
            sequence.append(int(logits[row].argmax()))
    batch.leave(1)  # the long one reached the context
    assert batch.width == 31
    logits = batch.step(torch.tensor([tokens[0][-1]]))  # shared padding of 17 of 31 columns: moved left
    assert batch.width == len(tokens[0])
    torch.testing.assert_close(logits[0], solo_logits(model, tokens[0]), atol=1e-5, rtol=0)


def test_a_prompt_must_leave_room_for_a_token() -> None:
    batch = DecodeBatch(tiny_gpt(block_size=16), max_rows=1)
    with pytest.raises(ValueError, match="a prompt must hold 1 to 15 tokens"):
        batch.join(list(range(16)))


# ------------------------------------------------------------------------------------ the engine
class Collector:
    """A sink that gathers each sequence's outputs and says when all have ended."""

    def __init__(self, count: int) -> None:
        self.outputs: list[list[SequenceOutput]] = [[] for _ in range(count)]
        self.done = threading.Event()
        self._ended = 0
        self._lock = threading.Lock()

    def __call__(self, output: SequenceOutput) -> None:
        with self._lock:
            self.outputs[output.index].append(output)
            if output.final:
                self._ended += 1
                if self._ended == len(self.outputs):
                    self.done.set()

    def text(self, index: int) -> str:
        return "".join(output.text for output in self.outputs[index])

    def tokens(self, index: int) -> list[int]:
        return [token for output in self.outputs[index] for token in output.token_ids]

    def logprobs(self, index: int) -> list[float]:
        return [logprob.logprob for output in self.outputs[index] for logprob in output.logprobs]

    def finish(self, index: int) -> SequenceOutput:
        return self.outputs[index][-1]


@pytest.mark.slow
def test_sequences_join_a_running_batch_and_each_gets_its_solo_answer(reference: LLM, gate: StepGate) -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=4)
    tokenizer = ByteTokenizer()
    first = SequenceRequest(tokenizer.encode("Hello"), SamplingParams(max_tokens=40, temperature=0))
    second = SequenceRequest(tokenizer.encode("Hi there, you"), SamplingParams(max_tokens=30, seed=5, top_k=20))
    early, late = Collector(1), Collector(1)
    engine.submit([first], early)
    wait_until(lambda: engine.active == 1, "the first sequence to start")  # held before its first step
    engine.submit([second], late)
    gate.open()
    assert early.done.wait(WAIT_SECONDS) and late.done.wait(WAIT_SECONDS)
    engine.stop()
    assert early.text(0) == reference.generate("Hello", first.params)[0]
    assert late.text(0) == reference.generate("Hi there, you", second.params)[0]
    assert gate.sizes[0] == 1 and 2 in gate.sizes  # it joined the running batch


@pytest.mark.slow
def test_stopping_the_engine_ends_running_sequences_with_an_error(gate: StepGate) -> None:
    engine = Engine(tiny_gpt(), ByteTokenizer(), max_batch=1)
    collector = Collector(2)
    engine.submit([SequenceRequest([104, 105], SamplingParams(max_tokens=50))] * 2, collector)
    wait_until(lambda: engine.active == 1, "the first sequence to start")
    stopper = threading.Thread(target=engine.stop, kwargs=dict(timeout=0.0))
    stopper.start()
    gate.open()
    stopper.join(WAIT_SECONDS)
    assert collector.done.is_set()
    errors = [collector.finish(index).error for index in range(2)]
    assert all(isinstance(error, EngineStopped) and str(error) == "the server is shutting down" for error in errors)


# ------------------------------------------------------------------------------------ completions
def test_models_lists_the_served_model(client: Any) -> None:
    models = client.models.list()
    assert [model.id for model in models] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize(
    "settings",
    [
        dict(max_tokens=30, temperature=0),
        dict(max_tokens=30, seed=7),
        dict(max_tokens=40, seed=3, temperature=0.7, top_p=0.8, top_k=40),
        dict(max_tokens=60, temperature=0, stop=["2", "xyz"]),
    ],
    ids=["greedy", "seeded", "filtered", "stop"],
)
def test_completion_text_equals_generate_on_the_same_settings(client: Any, reference: LLM, settings: dict) -> None:
    top_k = settings.pop("top_k", None)
    response = client.completions.create(
        model=MODEL, prompt="Once upon a time", extra_body={"top_k": top_k} if top_k else None, **settings
    )
    expected = reference.generate("Once upon a time", SamplingParams(top_k=top_k, **settings))[0]
    assert response.choices[0].text == expected


def test_streamed_completion_text_equals_the_plain_completion(client: Any) -> None:
    settings = dict(model=MODEL, prompt="Streaming", max_tokens=40, seed=11)
    plain = client.completions.create(**settings).choices[0]
    chunks = list(client.completions.create(stream=True, **settings))
    assert "".join(chunk.choices[0].text for chunk in chunks) == plain.text
    assert chunks[-1].choices[0].finish_reason == plain.finish_reason == "length"


def test_the_stream_is_server_sent_events_ending_with_done_and_usage(base_url: str) -> None:
    body = dict(model=MODEL, prompt="abc", max_tokens=5, temperature=0, stream=True)
    body["stream_options"] = {"include_usage": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=WAIT_SECONDS) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(event.startswith("data: ") for event in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_n_choices_use_consecutive_seeds_like_generate(client: Any, reference: LLM) -> None:
    response = client.completions.create(model=MODEL, prompt="Dice", max_tokens=12, n=3, seed=100)
    expected = reference.generate("Dice", SamplingParams(max_tokens=12, n=3, seed=100))
    assert [choice.index for choice in response.choices] == [0, 1, 2]
    assert [choice.text for choice in response.choices] == expected


def test_a_list_of_prompts_gets_its_choices_in_order(client: Any, reference: LLM) -> None:
    prompts = ["one", "two", "three"]
    response = client.completions.create(model=MODEL, prompt=prompts, max_tokens=8, temperature=0, n=2)
    greedy = SamplingParams(max_tokens=8, temperature=0)
    assert [choice.text for choice in response.choices] == [
        reference.generate(prompt, greedy)[0] for prompt in prompts for _ in range(2)
    ]
    assert response.usage.prompt_tokens == len("one") + len("two") + len("three")


def test_a_token_id_prompt_equals_the_text_prompt(client: Any) -> None:
    as_text = client.completions.create(model=MODEL, prompt="Bytes!", max_tokens=10, temperature=0)
    as_ids = client.completions.create(model=MODEL, prompt=list(b"Bytes!"), max_tokens=10, temperature=0)
    assert as_ids.choices[0].text == as_text.choices[0].text


def test_usage_counts_prompt_and_completion_tokens(client: Any) -> None:
    response = client.completions.create(model=MODEL, prompt="count me", max_tokens=9, temperature=0)
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (8, 9, 17)


def test_greedy_completion_equals_transformers(client: Any, model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    prompt = "The tiny model says"
    ids = torch.tensor([list(prompt.encode())])
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=40)
    new = [token for token in expected[0, ids.size(1) :].tolist()]
    new = new[: new.index(256)] if 256 in new else new  # our text ends at end-of-text
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
    assert response.choices[0].text == ByteTokenizer().decode(new)


def test_max_tokens_is_capped_by_the_context(client: Any) -> None:
    prompt = "x" * (BLOCK_SIZE - 5)
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=50, temperature=0)
    assert response.usage.completion_tokens == 5 and response.choices[0].finish_reason == "length"


def test_a_prompt_longer_than_the_context_is_refused_with_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x" * (BLOCK_SIZE + 1), max_tokens=1)
    assert caught.value.body["code"] == "context_length_exceeded" and caught.value.body["param"] == "prompt"


# ------------------------------------------------------------------------------------ logprobs
def test_echo_with_max_tokens_0_gives_every_prompt_tokens_logprob_as_transformers(client: Any, model_dir: Path) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    text = "Every token scored."
    response = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=3)
    choice = response.choices[0]
    choice_logprobs = choice.logprobs
    ids = list(text.encode())
    with torch.no_grad():
        expected = F.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)  # (T, V)
    assert choice.text == text and choice_logprobs.tokens == list(text)
    assert choice_logprobs.token_logprobs[0] is None and choice_logprobs.top_logprobs[0] is None
    got = torch.tensor(choice_logprobs.token_logprobs[1:], dtype=torch.float64)
    torch.testing.assert_close(got, expected[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0], atol=1e-4, rtol=0)
    for position, top in enumerate(choice_logprobs.top_logprobs[1:]):
        values, top_ids = expected[position].topk(3)
        texts = [ByteTokenizer().decode([token]) for token in top_ids.tolist()]  # bytes >= 128 alone are U+FFFD
        assert top == pytest.approx(dict(zip(texts, values.tolist(), strict=True)), abs=1e-4)


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model with GPT-2's own tokenizer, in HF format (transformers' tokenizer reads it too)."""
    shared_file("gpt2-bpe/encoder.json")
    tokenizer = load_tokenizer(shared_file("gpt2-bpe/vocab.bpe").parent)
    return save_model(tmp_path_factory.mktemp("bpe"), tiny_gpt(vocab_size=50257), tokenizer)


@pytest.fixture(scope="module")
def bpe_url(bpe_model_dir: Path) -> Iterator[tuple[str, LLM]]:
    """A server over `bpe_model_dir`, and the same model loaded apart from it."""
    with running(LLM.load(bpe_model_dir)) as url:
        yield url, LLM.load(bpe_model_dir)


@pytest.mark.slow
def test_echo_logprobs_equal_the_offline_scorer(bpe_url: tuple[str, LLM]) -> None:
    from gpt2.eval import encode_pair, score_continuations

    url, offline = bpe_url
    context, continuation = "The quick brown fox", " jumps over the lazy dog.\n\n  Done"
    response = post(url, dict(model=MODEL, prompt=context + continuation, max_tokens=0, echo=True, logprobs=0))
    token_logprobs = response.json()["choices"][0]["logprobs"]["token_logprobs"]
    context_ids, continuation_ids = encode_pair(offline.tokenizer, context, continuation)
    assert len(token_logprobs) == len(context_ids) + len(continuation_ids)
    score = score_continuations(offline.model, [(context_ids, continuation_ids)])[0]
    assert sum(token_logprobs[-len(continuation_ids) :]) == pytest.approx(-score.loss_sum, abs=1e-4)


LM_EVAL_TASK = """\
task: gpt2_local_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
"""
LM_EVAL_DOCS = [  # contexts ending in whitespace too: the harness moves it into the continuation
    {"context": "The capital of France is", "choices": [" Paris.", " Rome.", " a city"], "label": 0},
    {"context": "def add(a, b):\n    ", "choices": ["return a + b", "pass"], "label": 0},
    {"context": "Two  spaces then ", "choices": ["words", "more  words", "é🤗"], "label": 1},
    {"context": "Once upon a time", "choices": [", there was", " in a land far away"], "label": 1},
]


@pytest.mark.slow
def test_lm_evaluation_harness_local_completions_scores_as_offline(
    bpe_url: tuple[str, LLM], bpe_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lm-evaluation-harness's own `local-completions` model (echo + logprobs over HTTP) on a local multiple-choice
    task gets the log-likelihoods our offline scorer computes."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    from gpt2.eval import encode_pair, score_continuations

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    url, offline = bpe_url
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in LM_EVAL_DOCS), encoding="utf-8")
    (tmp_path / "task.yaml").write_text(LM_EVAL_TASK.format(data=data), encoding="utf-8")
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={
            "base_url": f"{url}/v1/completions",
            "model": MODEL,
            "tokenizer_backend": "huggingface",
            "tokenizer": str(bpe_model_dir),
            "max_retries": 1,
        },
        tasks=["gpt2_local_choice"],
        task_manager=TaskManager(include_path=str(tmp_path)),
        log_samples=True,
    )
    samples = sorted(results["samples"]["gpt2_local_choice"], key=lambda sample: sample["doc_id"])
    assert len(samples) == len(LM_EVAL_DOCS)
    correct = []
    for doc, sample in zip(LM_EVAL_DOCS, samples, strict=True):
        pairs = [encode_pair(offline.tokenizer, doc["context"], choice) for choice in doc["choices"]]
        scores = score_continuations(offline.model, pairs)
        harness = [response[0] for response in sample["resps"]]  # per choice: [(log-likelihood, is_greedy)]
        for (loglikelihood, greedy), score in zip(harness, scores, strict=True):
            assert loglikelihood == pytest.approx(-score.loss_sum, abs=1e-4)
            assert greedy == score.greedy
        best = max(range(len(scores)), key=lambda i: -scores[i].loss_sum)
        correct.append(float(best == doc["label"]))
    assert results["results"]["gpt2_local_choice"]["acc,none"] == pytest.approx(sum(correct) / len(correct))


def test_generated_tokens_logprobs_are_the_models(client: Any, reference: LLM) -> None:
    response = client.completions.create(model=MODEL, prompt="Scores", max_tokens=6, temperature=0, logprobs=2)
    logprobs = response.choices[0].logprobs
    tokens = generate(reference.model, torch.tensor([list(b"Scores")]), 6, temperature=0)[0].tolist()
    assert logprobs.tokens == [ByteTokenizer().decode([token]) for token in tokens[6:]]
    with torch.no_grad():
        expected = F.log_softmax(reference.model(torch.tensor([tokens])).logits[0], dim=-1)  # (T, V)
    for offset, token in enumerate(tokens[6:]):
        assert logprobs.token_logprobs[offset] == pytest.approx(float(expected[5 + offset, token]), abs=1e-4)
        assert len(logprobs.top_logprobs[offset]) == 2
        assert max(logprobs.top_logprobs[offset].values()) == pytest.approx(logprobs.token_logprobs[offset])  # greedy
    assert logprobs.text_offset == list(range(6, 12))


# ------------------------------------------------------------------------------------ penalties
def greedy_with_penalties(model: GPT, prompt: list[int], steps: int, presence: float, frequency: float) -> list[int]:
    """OpenAI's formula, written out: logit -= frequency * count + presence * (count > 0), counts over the
    completion so far; then argmax."""
    counts = torch.zeros(model.config.vocab_size)
    new: list[int] = []
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + new])).logits[0, -1]
        token = int((logits - frequency * counts - presence * (counts > 0).float()).argmax())
        if token == ByteTokenizer.eot_token:
            break
        new.append(token)
        counts[token] += 1
    return new


def test_presence_and_frequency_penalties_follow_openais_formula(client: Any, reference: LLM) -> None:
    settings = dict(model=MODEL, prompt="Repeat", max_tokens=40, temperature=0)
    plain = client.completions.create(**settings).choices[0].text
    penalized = client.completions.create(presence_penalty=0.5, frequency_penalty=1.5, **settings).choices[0].text
    expected = greedy_with_penalties(reference.model, list(b"Repeat"), 40, presence=0.5, frequency=1.5)
    assert penalized == ByteTokenizer().decode(expected) != plain


def test_logit_bias_forces_a_token(client: Any) -> None:
    response = client.completions.create(model=MODEL, prompt="x", max_tokens=5, temperature=0, logit_bias={"65": 100})
    assert response.choices[0].text == "AAAAA"


@pytest.mark.parametrize("temperature", [1e-45, 1e-6, 0.7, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_streamed_tokens_are_what_llm_generate_draws(client: Any, reference: LLM, temperature: float, seed: int):
    # one sampler for both: the same greedy threshold, the same per-sequence generator and draw
    stream = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=temperature,
                                       seed=seed, stream=True)  # fmt: skip
    streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    params = SamplingParams(max_tokens=24, temperature=temperature, seed=seed)
    assert streamed == reference.generate("Hello", params)[0]


@pytest.mark.parametrize(
    "rule, context",
    [
        (dict(repetition_penalty=1.5), {}),
        (dict(no_repeat_ngram_size=2), {}),
        (dict(min_tokens=5), dict(logit_bias={256: 100.0})),  # end-of-text favoured: only min_tokens holds it off
        (dict(bad_words=["A", [66, 66]]), dict(logit_bias={65: 8.0, 66: 8.0})),  # "A" and "BB" favoured, banned
        (dict(presence_penalty=1.5, frequency_penalty=0.5), dict(logit_bias={67: 3.0})),
    ],
)
def test_generation_rules_are_extra_body_fields_applied_as_llm_generate_applies_them(
    client: Any, reference: LLM, rule: dict[str, Any], context: dict[str, Any]
) -> None:
    body = {**rule, **context, "logit_bias": {str(k): v for k, v in context.get("logit_bias", {}).items()}}
    response = client.completions.create(model=MODEL, prompt="Hello hello", max_tokens=30, temperature=0,
                                         extra_body=body)  # fmt: skip
    expected = reference.generate("Hello hello", SamplingParams(max_tokens=30, temperature=0, **rule, **context))[0]
    without_rule = reference.generate("Hello hello", SamplingParams(max_tokens=30, temperature=0, **context))[0]
    assert response.choices[0].text == expected != without_rule


def test_beam_search_is_refused_by_the_server_with_a_400(base_url: str) -> None:
    response = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": "x", "num_beams": 2,
                                                               "temperature": 0}, timeout=WAIT_SECONDS)  # fmt: skip
    assert response.status_code == 400 and response.json()["error"]["param"] == "num_beams"


# ------------------------------------------------------------------------------------ chat
def test_chat_reply_is_the_completion_of_gpt2s_chat_template(client: Any, reference: LLM) -> None:
    messages = [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30, seed=1)
    as_trained = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    prompt, _ = encode_chat(as_trained, reference.tokenizer, add_generation_prompt=True)  # what fine-tuning trains
    assert (
        reference.tokenizer.decode(prompt)
        == "<|system|>\nBe brief.<|endoftext|><|user|>\nHello!<|endoftext|><|assistant|>\n"
    )
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == reference.generate(prompt, SamplingParams(max_tokens=30, seed=1))[0]
    assert response.object == "chat.completion" and response.usage.prompt_tokens == len(prompt)


def test_an_endoftext_text_in_a_message_stays_text(client: Any, reference: LLM) -> None:
    messages = [{"role": "user", "content": "a<|endoftext|>b"}]
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    prompt, _ = encode_chat(messages, reference.tokenizer, add_generation_prompt=True)
    assert prompt.count(reference.tokenizer.eot_token) == 1  # only the template's own end of the turn
    assert response.usage.prompt_tokens == len(prompt)


def test_chat_stops_at_the_requests_own_stops_too(client: Any) -> None:
    settings = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=50, temperature=0)
    unstopped = client.chat.completions.create(**settings).choices[0].message.content
    stop = unstopped[-10:-8]  # a text the reply reaches
    stopped = client.chat.completions.create(stop=stop, **settings).choices[0]
    assert stopped.finish_reason == "stop" and stopped.message.content == unstopped[: unstopped.index(stop)]


def test_streamed_chat_equals_the_plain_chat(client: Any) -> None:
    settings = dict(model=MODEL, messages=[{"role": "user", "content": "Tell me"}], max_tokens=25, seed=4)
    plain = client.chat.completions.create(**settings).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **settings))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == plain.message.content
    assert chunks[-1].choices[0].finish_reason == plain.finish_reason


def test_chat_logprobs_give_each_tokens_bytes_and_alternatives(client: Any) -> None:
    response = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        seed=0,
        logit_bias={str(ByteTokenizer.eot_token): -100},  # four tokens, whatever a random model draws first
    )
    content = response.choices[0].logprobs.content
    assert len(content) == 4 and all(len(item.top_logprobs) == 2 for item in content)
    assert all(len(item.bytes) == 1 for item in content)  # byte tokenizer: one byte per token


# ------------------------------------------------------------------------------------ under load
@pytest.mark.slow
def test_16_concurrent_clients_each_get_the_answer_they_get_alone(
    client: Any, base_url: str, reference: LLM, gate: StepGate
) -> None:
    prompts = [("Client number " + str(i) + " says") * (1 + i % 3) for i in range(16)]
    settings = [
        [
            dict(max_tokens=10 + 3 * i, temperature=0),
            dict(max_tokens=20, seed=i, temperature=0.8, top_k=20),
            dict(max_tokens=30, seed=i, top_p=0.9, stop=["2"]),
        ][i % 3]
        for i in range(16)
    ]

    def ask(i: int) -> str:
        options = dict(settings[i])
        top_k = options.pop("top_k", None)
        extra = {"top_k": top_k} if top_k else None
        if i % 4 == 0:  # some stream
            stream = client.completions.create(model=MODEL, prompt=prompts[i], stream=True, extra_body=extra, **options)
            return "".join(chunk.choices[0].text for chunk in stream)
        return client.completions.create(model=MODEL, prompt=prompts[i], extra_body=extra, **options).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        answers = [pool.submit(ask, i) for i in range(16)]
        # hold the decode steps until every request is in, so that all 16 decode together
        wait_until(lambda: health(base_url)["active"] + health(base_url)["waiting"] == 16, "16 requests in flight")
        gate.open()
        texts = [answer.result(WAIT_SECONDS) for answer in answers]
    for i in range(16):
        assert texts[i] == reference.generate(prompts[i], SamplingParams(**settings[i]))[0], f"client {i}"
    assert max(gate.sizes) == 16


# ------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize(
    ("changes", "param"),
    [
        (dict(temperature=-1), "temperature"),
        (dict(temperature=5), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=0.5), "top_k"),
        (dict(max_tokens=-1), "max_tokens"),
        (dict(max_tokens="10"), "max_tokens"),
        (dict(n=0), "n"),
        (dict(stop=[1, 2]), "stop"),
        (dict(stop={"a": 1}), "stop"),
        (dict(seed=2**70), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(logprobs=99), "logprobs"),
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(frequency_penalty="x"), "frequency_penalty"),
        (dict(logit_bias={"x": 1}), "logit_bias"),
        (dict(logit_bias={"65": 1000}), "logit_bias"),
        (dict(logit_bias={"99999": 1}), "logit_bias"),
        (dict(logit_bias={"²": 1}), "logit_bias"),
        (dict(n=10**9), "n"),
        (dict(prompt="\ud800"), "prompt"),
        (dict(stream_options={"include_usage": True}), "stream_options"),
        (dict(prompt=[]), "prompt"),
        (dict(prompt=[1, "a"]), "prompt"),
        (dict(prompt=[999]), "prompt"),
        (dict(stop_token_ids=[10**6]), "stop_token_ids"),
        (dict(stream="yes"), "stream"),
        (dict(echo=1), "echo"),
        (dict(suffix="!"), "suffix"),
        (dict(model=None), "model"),
    ],
)
def test_bad_parameters_are_openai_shaped_400s_naming_the_field(base_url: str, changes: dict, param: str) -> None:
    response = post(base_url, {"model": MODEL, "prompt": "x", "max_tokens": 2, **changes})
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[1, 2]", b'"text"', b'{"model": "tiny", "prompt": "x", "temperature": NaN}', b"\xff\xfe", b""],
    ids=["broken", "array", "string", "nan", "not-utf8", "empty"],
)
def test_a_malformed_body_is_a_400(base_url: str, body: bytes) -> None:
    response = httpx.post(f"{base_url}/v1/completions", content=body, timeout=WAIT_SECONDS)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_an_unknown_model_is_a_404(client: Any) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="gpt-4", prompt="x")
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])


def test_unknown_routes_and_methods_get_openai_shaped_errors(base_url: str) -> None:
    missing = httpx.get(f"{base_url}/v1/engines", timeout=WAIT_SECONDS)
    wrong_method = httpx.get(f"{base_url}/v1/completions", timeout=WAIT_SECONDS)
    assert (missing.status_code, wrong_method.status_code) == (404, 405)
    assert set(missing.json()["error"]) == set(wrong_method.json()["error"]) == {"message", "type", "param", "code"}


def test_a_body_over_the_limit_is_a_413(llm: LLM) -> None:
    with running(llm, max_body_bytes=1000) as url:
        response = post(url, {"model": MODEL, "prompt": "x" * 2000})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_bad_chat_messages_are_400s(client: Any) -> None:
    for messages in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 5}], ["hi"]):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=MODEL, messages=messages)
        assert caught.value.body["param"] == "messages"


@pytest.mark.slow
def test_the_api_key_is_required_when_set(llm: LLM) -> None:
    with running(llm, api_key="sesame") as url:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
        missing = post(url, body)
        wrong = post(url, body, headers={"Authorization": "Bearer nope"})
        right = post(url, body, headers={"Authorization": "Bearer sesame"})
        models = httpx.get(f"{url}/v1/models", timeout=WAIT_SECONDS)
        alive = httpx.get(f"{url}/health", timeout=WAIT_SECONDS)
        keyed = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0)
        assert keyed.completions.create(model=MODEL, prompt="x", max_tokens=1).choices[0].finish_reason
    assert (missing.status_code, wrong.status_code, right.status_code, models.status_code) == (401, 401, 200, 401)
    assert missing.json()["error"]["type"] == "authentication_error" and alive.status_code == 200


@pytest.mark.slow
def test_a_full_queue_answers_429_with_retry_after(llm: LLM, gate: StepGate) -> None:
    with running(llm, max_batch=1, max_queue=1, retry_after_seconds=3) as url:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 5}
        with ThreadPoolExecutor(2) as pool:
            running_one = pool.submit(post, url, body)
            wait_until(lambda: health(url)["active"] == 1, "the first request to run")
            queued_one = pool.submit(post, url, body)
            wait_until(lambda: health(url)["waiting"] == 1, "the second request to queue")
            refused = post(url, body)
            gate.open()
            assert running_one.result(WAIT_SECONDS).status_code == queued_one.result(WAIT_SECONDS).status_code == 200
    assert refused.status_code == 429 and refused.headers["retry-after"] == "3"
    assert refused.json()["error"]["code"] == "queue_full"


def test_engine_errors_answer_by_type_in_one_table() -> None:
    from gpt2.serve import EngineError, EngineFailed, QueueFull
    from gpt2.serve.app import ENGINE_ERRORS, engine_error

    assert set(ENGINE_ERRORS) == set(EngineError.__subclasses__())  # every kind the engine raises has its answer
    full = engine_error(QueueFull("the queue is full"), retry_after=3)
    assert (full.status, full.code, full.headers) == (429, "queue_full", {"Retry-After": "3"})
    stopping = engine_error(EngineStopped("shutting down is not what decides"))  # the type decides, not the text
    assert (stopping.status, stopping.type, stopping.code) == (503, "server_error", "shutting_down")
    failed = engine_error(EngineFailed("the server is shutting down"))
    assert (failed.status, failed.code) == (500, None)


def test_a_request_is_checked_once(llm: LLM, client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    check = Engine.check_prompt
    monkeypatch.setattr(Engine, "check_prompt", lambda self, prompt: calls.append(len(prompt)) or check(self, prompt))
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=2)
    assert len(calls) == 1


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(12 if depth < 2 else 9)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, 2, 5, 16, 64, 127, 128, 129, 256, 257, 2**31, 2**63, -(2**63) - 1, 2**80])
    if kind == 3:
        return rng.randint(-3, 40)
    if kind == 4:
        return rng.choice([0.0, -0.0, 0.5, 1.0, 1e-320, 1e-30, 2.0, 2.0001, 1e308, -1e308, rng.uniform(-3, 3)])
    if kind == 5:
        return rng.choice(["", "tiny", "x", "\u0000", "é🤗", "\ud800", "<|endoftext|>", "a" * 300, "null", "²"])
    if kind == 6:
        return "".join(chr(rng.randrange(1, 0x2FFF)) for _ in range(rng.randrange(12)))
    if kind in (7, 8):
        return rng.uniform(0, 2) if kind == 7 else rng.randrange(0, 8)
    if kind == 9:
        return rng.choice([{"65": 5}, {"99999": 1}, {"²": 1}, {"-1": 1}, {"65": float("inf")}])
    if kind == 10:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {str(random_value(rng, depth + 1))[:10]: random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


FUZZ_FIELDS = [
    "model", "prompt", "messages", "max_tokens", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream",
    "logprobs", "echo", "presence_penalty", "frequency_penalty", "logit_bias", "stream_options", "top_logprobs",
    "best_of", "suffix", "max_completion_tokens", "stop_token_ids", "user",
]  # fmt: skip


def random_body(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.05:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
    if roll < 0.1:
        return json.dumps({"model": MODEL, "prompt": "abc"}).encode()[: rng.randrange(30)]
    if roll < 0.15:
        return json.dumps(random_value(rng)).encode()
    body: dict[str, Any] = {"model": MODEL if rng.random() < 0.9 else random_value(rng), "max_tokens": 3}
    if rng.random() < 0.5:
        body["messages"] = [{"role": rng.choice(["user", "system", "assistant", "x"]), "content": "hi"}]
    else:
        body["prompt"] = rng.choice(["hello", ["a", "b"], [104, 105], [[104], [105, 106]]])
    for name in rng.sample(FUZZ_FIELDS, rng.randrange(1, 6)):
        body[name] = random_value(rng)
    if isinstance(body.get("n"), int) and 4 < body["n"] <= 64:
        body["n"] = 4  # keep a fuzz run short: valid bodies generate real tokens (more than 64 are refused)
    if isinstance(body.get("max_tokens"), int) and body["max_tokens"] > 8:
        body["max_tokens"] = 8
    return json.dumps(body).encode()  # json.dumps writes NaN/Infinity for such floats: that is fuzz too


@pytest.mark.parametrize("count", [300, pytest.param(1000, marks=pytest.mark.slow)])
def test_a_fuzz_of_random_and_malformed_bodies_never_gets_a_5xx(
    base_url: str, client: Any, reference: LLM, count: int
) -> None:
    rng = random.Random(count)
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base_url, timeout=WAIT_SECONDS) as http:
        for _ in range(count):
            path = rng.choice(["/v1/completions", "/v1/chat/completions"])
            response = http.post(path, content=random_body(rng), headers={"Content-Type": "application/json"})
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            assert response.status_code < 500, response.text
            if response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            elif response.headers["content-type"].startswith("text/event-stream"):
                assert response.text.endswith("data: [DONE]\n\n"), response.text  # no stream broke midway
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0  # both kinds were exercised
    wait_until(lambda: health(base_url)["active"] == 0, "the engine to be idle")
    alive = client.completions.create(model=MODEL, prompt="still alive", max_tokens=4, seed=5)  # and still right
    assert alive.choices[0].text == reference.generate("still alive", SamplingParams(max_tokens=4, seed=5))[0]


# ------------------------------------------------------------------------------------ the HTTP server
@pytest.mark.skipif(sys.platform == "win32", reason="uvloop has no Windows build (asyncio's loop serves there)")
def test_the_server_runs_on_uvloop_and_httptools(llm: LLM) -> None:
    """uvicorn's compiled event loop and HTTP parser (the serve extra installs them): a streamed token costs the
    event loop less than with asyncio's loop and h11 (`gpt2 bench serve`)."""
    import uvloop
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from gpt2.serve import uvicorn_server

    config = uvicorn_server(llm, ServerConfig(model_name=MODEL, port=0), log_level="warning").config
    config.load()
    assert config.get_loop_factory() is uvloop.new_event_loop
    protocol = config.http_protocol_class  # httptools' protocol with a deadline for the request headers
    assert issubclass(getattr(protocol, "func", protocol), HttpToolsProtocol)


# ------------------------------------------------------------------------------------ disconnects, shutdown
@pytest.mark.slow
def test_a_streaming_client_that_disconnects_frees_its_row(llm: LLM, gate: StepGate) -> None:
    with running(llm, max_batch=1) as url:
        body = {"model": MODEL, "prompt": "bye", "max_tokens": 100, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=WAIT_SECONDS) as response:
            first = next(line for line in response.iter_lines() if line)  # drawn at admission, before any step
            assert first.startswith("data: ")
        assert gate.steps_until(lambda: health(url)["active"] == 0) < 50  # far fewer than the 100 tokens asked for


@pytest.mark.slow
def test_a_queued_stream_whose_client_leaves_is_dropped_before_it_takes_a_row(llm: LLM, gate: StepGate) -> None:
    with running(llm, max_batch=1) as url, ThreadPoolExecutor(1) as pool:
        holder = pool.submit(post, url, {"model": MODEL, "prompt": "first", "max_tokens": 3})
        wait_until(lambda: health(url)["active"] == 1, "the first request to take the only row")
        body = json.dumps({"model": MODEL, "prompt": "second", "max_tokens": 100, "stream": True}).encode()
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        # a raw socket: a stream answers nothing before its first output, which a queued one has not drawn
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as sock:
            sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_until(lambda: health(url)["waiting"] == 1, "the stream to queue")
        wait_until(lambda: health(url)["waiting"] == 0, "the queued stream to be dropped")
        assert gate.sizes == []  # no step ran meanwhile: it left the queue because its client went away
        gate.open()
        assert holder.result().status_code == 200


@pytest.mark.slow
def test_a_plain_request_whose_client_goes_away_is_cancelled(llm: LLM, gate: StepGate) -> None:
    with running(llm, max_batch=1) as url:
        body = {"model": MODEL, "prompt": "bye", "max_tokens": 100}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/v1/completions", json=body, timeout=httpx.Timeout(WAIT_SECONDS, read=0.5))
        assert gate.steps_until(lambda: health(url)["active"] == 0) < 50  # far fewer than the 100 tokens asked for


@pytest.mark.slow
def test_sigterm_lets_the_stream_in_flight_finish_then_exits_0(tmp_path: Path) -> None:
    directory = save_model(tmp_path / "model", tiny_gpt(block_size=1024), ByteTokenizer())
    port = free_port()
    command = [sys.executable, "-m", "gpt2.cli", "serve", "--model", str(directory), "--port", str(port)]
    command += ["--served-model-name", MODEL, "--log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert server.poll() is None, server.communicate()[1].decode()
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(up, "the server to start", seconds=STARTUP_SECONDS)
        body = {"model": MODEL, "prompt": "long", "max_tokens": 1000, "temperature": 0, "stream": True}
        body["stream_options"] = {"include_usage": True}
        events = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=WAIT_SECONDS) as response:
            lines = (line for line in response.iter_lines() if line)
            events.append(next(lines))
            server.send_signal(signal.SIGTERM)
            events.extend(lines)
        assert server.wait(WAIT_SECONDS) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event[len("data: ") :]) for event in events[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 1000  # every token asked for, after the SIGTERM too


def serve_parser() -> argparse.ArgumentParser:
    """The `gpt2 serve` command's own argument parser."""
    from gpt2.cli import serve as serve_command

    parser = argparse.ArgumentParser()
    serve_command.register(parser.add_subparsers())
    return parser


def test_the_server_listens_on_loopback_unless_told_otherwise() -> None:
    assert ServerConfig().host == "127.0.0.1"
    assert serve_parser().parse_args(["serve", "--model", "m"]).host == "127.0.0.1"


def test_gpt2_serve_refuses_bad_settings_in_one_line_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    from gpt2.cli import main

    assert main(["serve", "--model", "does/not/exist", "--port", "70000"]) == 2
    assert capsys.readouterr().err.strip() == (
        "gpt2 serve: error: port must be an integer in [0, 65535] (0: any free port), got 70000"
    )


def test_gpt2_serve_takes_a_grammar_timeout_and_refuses_a_bad_one() -> None:
    from gpt2.cli.serve import server_config

    assert (
        server_config(serve_parser().parse_args(["serve", "--model", "m", "--grammar-timeout", "2.5"])).grammar_timeout
        == 2.5
    )
    with pytest.raises(ValueError, match="grammar_timeout must be a number of seconds > 0, got 0.0"):
        server_config(serve_parser().parse_args(["serve", "--model", "m", "--grammar-timeout", "0"]))


# ------------------------------------------------------------------------------------ playground
def test_the_playground_is_one_self_contained_page(base_url: str) -> None:
    response = httpx.get(base_url, timeout=WAIT_SECONDS)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "/v1/completions" in page and "stream: true" in page and "logprobs" in page
    assert "http://" not in page and "https://" not in page and "<link" not in page and " src=" not in page


def test_logprob_values_are_finite_json(base_url: str) -> None:
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "logprobs": 20, "temperature": 0}
    text = post(base_url, body).text
    assert "Infinity" not in text and "NaN" not in text
    assert all(math.isfinite(value) for value in json.loads(text)["choices"][0]["logprobs"]["token_logprobs"])


@pytest.mark.slow
def test_the_playground_streams_a_completion_in_a_real_browser(base_url: str, reference: LLM, tmp_path: Path) -> None:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium(height=800) as driver:
        driver.get(base_url)
        wait = WebDriverWait(driver, WAIT_SECONDS)
        wait.until(lambda d: d.find_element(By.ID, "model").text == MODEL)
        driver.execute_script("document.getElementById('prompt').value = 'Once upon a time';")
        driver.execute_script("document.getElementById('max-tokens').value = '24';")
        driver.execute_script("document.getElementById('seed').value = '5';")
        driver.find_element(By.ID, "generate").click()
        wait.until(lambda d: d.find_element(By.ID, "status").text.startswith("done"))
        output = driver.find_element(By.ID, "output").get_attribute("textContent")
        expected = reference.generate("Once upon a time", SamplingParams(max_tokens=24, seed=5))[0]
        assert output == "Once upon a time" + expected
        token = driver.find_elements(By.CSS_SELECTOR, "#output .tok")[2]
        webdriver.ActionChains(driver).move_to_element(token).perform()
        tip = driver.find_element(By.ID, "tip")
        wait.until(lambda d: tip.is_displayed())
        assert "p = " in tip.text and "%" in tip.text
        driver.save_screenshot(str(tmp_path / "playground.png"))


# ------------------------------------------------------------------------------------ metrics
def scrape(url: str) -> dict[str, float]:
    """GET /metrics read by prometheus-client's own parser: {sample name with labels: value}."""
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{url}/metrics", timeout=WAIT_SECONDS)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_metrics_in_prometheus_format_move_as_requests_are_served(llm: LLM) -> None:
    with running(llm, api_key="sesame") as url:  # /metrics is open, as /health is (Prometheus scrapes it)
        before = scrape(url)
        assert before["gpt2_requests_total"] == 0 and before["gpt2_num_requests_running"] == 0
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sesame", max_retries=0)
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=7, temperature=0, n=2)
        stream = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0, stream=True)
        streamed = [chunk for chunk in stream]
        after = scrape(url)
    assert streamed and after["gpt2_requests_total"] == 2
    assert after["gpt2_prompt_tokens_total"] == 2 * len(b"Hello") + len(b"Hi")  # n=2: two sequences prefilled
    assert after["gpt2_generation_tokens_total"] == 2 * 7 + 5
    assert after["gpt2_request_finished_total{finish_reason=length}"] == 3
    assert after["gpt2_time_to_first_token_seconds_count"] == 3 and after["gpt2_e2e_request_latency_seconds_count"] == 3
    assert after["gpt2_time_per_output_token_seconds_count"] >= 2 * 6 + 4  # every token after each first one
    assert after["gpt2_num_requests_running"] == after["gpt2_num_requests_waiting"] == 0


def test_on_passing_thread_returns_what_the_function_computed_on_a_thread_that_has_ended() -> None:
    from gpt2.serve.server import on_passing_thread

    ran_on: list[threading.Thread] = []

    def load() -> int:
        ran_on.append(threading.current_thread())
        return 42

    assert on_passing_thread(load) == 42
    assert ran_on[0] is not threading.current_thread()
    assert not ran_on[0].is_alive()  # its OpenMP workers, if it made any, are gone with it


def test_on_passing_thread_raises_the_functions_error_in_the_caller() -> None:
    from gpt2.serve.server import on_passing_thread

    def load() -> None:
        raise FileNotFoundError("no model at does/not/exist")

    with pytest.raises(FileNotFoundError, match="does/not/exist"):
        on_passing_thread(load)


@pytest.mark.slow
def test_serve_keeps_the_loaded_process_out_of_later_garbage_collections(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full collection walks every tracked object; the model and app, frozen once loaded, are not walked while it
    serves."""
    import uvicorn

    from gpt2.serve.server import serve

    frozen_when_running: list[int] = []
    monkeypatch.setattr(
        uvicorn.Server, "run", lambda self, sockets=None: frozen_when_running.append(gc.get_freeze_count())
    )
    serve(llm, ServerConfig(model_name="tiny", port=0))
    assert frozen_when_running and frozen_when_running[0] > 10_000
    assert gc.get_freeze_count() == 0  # collectable again once it stopped, as at the interpreter's exit


def test_gpt2_serve_names_a_missing_model_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpt2.cli import main

    assert main(["serve", "--model", "does/not/exist"]) != 0  # loaded on its own thread, the error still reaches here
    assert "does/not/exist" in capsys.readouterr().err.strip()
