"""Failure is a property of a row: a request whose own steering, adapter or sparse autoencoder breaks its forward
(logits that overflow to NaN or infinity, or an exception) ends alone, answered 400 (a stream too, when it fails
before its first token) or, once streaming, with an error chunk the openai client raises; the requests decoding
beside it in the same batch produce exactly the text they produce alone, and the server stays healthy.

A run-time adapter with NaN weights is refused at the door with a 400. Servers run in-process as in test_serve,
and the engine is held before its decode steps (`StepGate`) where a test needs requests to arrive mid-stream.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt2.api import LLM
from gpt2.inference import SamplingParams, sample_next_token
from gpt2.inspect.sae import SAEConfig, SparseAutoencoder
from gpt2.tokenizer import ByteTokenizer
from test_serve import MODEL, WAIT_SECONDS, StepGate, health, running, save_model, tiny_gpt, wait_until
from test_serve_adapter_checks import WEIGHTS, broken_copy, load, make_adapter

httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

WIDTH = 32  # tiny_gpt's residual stream
HOOK = "blocks.0.hook_resid_post"  # leaving block 0: block 1 reads the steered stream
OVERFLOWING = [{"hook": HOOK, "vector": [1e30] * WIDTH, "scale": 1e30}]  # finite numbers whose product is not
NEAR_MAX = [{"hook": HOOK, "vector": [1e38] * WIDTH}]  # finite, but the next layer norm's variance overflows
PLAIN = [  # the four streams that run beside the failing requests: greedy and seeded samples
    ("The first stream says", dict(temperature=0)),
    ("A second, longer prompt for the second stream", dict(seed=1, temperature=0.9)),
    ("Third", dict(temperature=0)),
    ("And a fourth one, sampled", dict(seed=4, top_p=0.9)),
]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("base"), tiny_gpt(), ByteTokenizer())


@pytest.fixture(scope="module")
def good(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(base, tmp_path_factory.mktemp("good") / "adapter")


@pytest.fixture(scope="module")
def overflowing(good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The good adapter with every weight 1e30: finite (it passes every check at the door), but its update
    overflows float32 (1e30 * 1e30 per product) in the first layer it touches."""
    folder = shutil.copytree(good, tmp_path_factory.mktemp("overflowing") / "adapter")
    tensors = {key: torch.full_like(tensor, 1e30) for key, tensor in load_file(str(folder / WEIGHTS)).items()}
    save_file(tensors, str(folder / WEIGHTS))
    return folder


@pytest.fixture(scope="module")
def misfit() -> SparseAutoencoder:
    """A sparse autoencoder for a residual stream of 16 values, on a model whose stream has 32."""
    return SparseAutoencoder(SAEConfig(architecture="standard", d_in=WIDTH // 2, d_sae=8, hook_name=HOOK))


@pytest.fixture
def llm(base: Path, overflowing: Path) -> LLM:
    return LLM.load(base, device="cpu", precision="float32", adapters={"overflowing": str(overflowing)})


def test_an_sae_that_does_not_fit_the_model_is_refused_at_the_door(llm: LLM, misfit: SparseAutoencoder) -> None:
    with (
        pytest.raises(ValueError, match="reads 16 values .* the model has 32 there"),
        running(llm, saes={"misfit": misfit}),
    ):
        pass


def openai_client(url: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def stream_text(client: Any, prompt: str, **settings: Any) -> tuple[str, str | None]:
    """A streamed completion's text and its last finish reason."""
    text, finish = "", None
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, stream=True, **settings)
    for chunk in stream:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    return text, finish


def complete(url: str, prompt: str, **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, **fields}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT_SECONDS)


def error_of(answer: httpx.Response) -> str:
    assert answer.status_code == 400, answer.text
    return answer.json()["error"]["message"]


@pytest.mark.slow
def test_failing_requests_end_alone_while_four_streams_decode_as_they_do_alone(
    llm: LLM, good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nan_adapter = broken_copy(good, tmp_path / "nan", "nan")
    with running(llm, runtime_lora_updating=True) as url:
        client = openai_client(url)
        alone = [stream_text(client, prompt, **settings) for prompt, settings in PLAIN]
        gate = StepGate(monkeypatch)  # from here, each decode step waits for the test's permit
        try:
            with ThreadPoolExecutor(len(PLAIN) + 4) as pool:
                streams = [pool.submit(stream_text, client, prompt, **settings) for prompt, settings in PLAIN]
                gate.steps_until(lambda: health(url)["active"] == len(PLAIN))
                # the four are decoding (the engine waits before its next step) when the failing requests arrive
                failing = {
                    "overflowing steering": pool.submit(complete, url, "Steered", steering=OVERFLOWING),
                    "overflowing adapter": pool.submit(complete, url, "Adapted", model="overflowing"),
                }
                failing_stream = pool.submit(stream_text, client, "Streamed", extra_body={"steering": NEAR_MAX})
                wait_until(lambda: health(url)["waiting"] == len(failing) + 1, "the failing requests to queue")
                refused = load(url, "nan", str(nan_adapter))
                gate.open()
                texts = [stream.result(WAIT_SECONDS) for stream in streams]
                answers = {name: future.result(WAIT_SECONDS) for name, future in failing.items()}
                with pytest.raises(openai.BadRequestError) as streamed:  # a 400 before its first chunk
                    failing_stream.result(WAIT_SECONDS)
        finally:
            gate.open()
        assert texts == alone and all(finish == "length" for _, finish in texts)
        for name in ("overflowing steering", "overflowing adapter"):
            message = error_of(answers[name])
            assert "logits are not finite" in message and "exclude the whole vocabulary" not in message, name
        assert "its steering" in error_of(answers["overflowing steering"])
        assert "the adapter 'overflowing'" in error_of(answers["overflowing adapter"])
        assert "not finite" in streamed.value.message and "its steering" in streamed.value.message
        assert refused.status_code == 400 and "NaN or infinite" in refused.json()["error"]["message"]
        assert httpx.get(f"{url}/health", timeout=WAIT_SECONDS).json()["status"] == "ok"
        assert stream_text(client, PLAIN[0][0], **PLAIN[0][1]) == alone[0]  # a new request after them


@pytest.mark.slow
def test_a_request_seated_where_a_failed_row_was_decodes_as_it_does_alone(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A steered row (a zero vector: the text is the plain one) keeps the batch on the model's PyTorch forward,
    # whose attention reads the padding columns of every row (masked): a NaN left there by the failed row would
    # reach the short prompt seated in its place.
    beside = {"steering": [{"hook": HOOK, "vector": [0.0] * WIDTH, "scale": 0.0}]}
    long_prompt, short_prompt = "A long prompt that keeps the batch wide while others come and go", "Hi"
    with running(llm) as url:
        client = openai_client(url)
        alone = [stream_text(client, long_prompt, temperature=0, extra_body=beside),
                 stream_text(client, short_prompt, temperature=0)]  # fmt: skip
        gate = StepGate(monkeypatch)
        try:
            with ThreadPoolExecutor(3) as pool:
                long = pool.submit(stream_text, client, long_prompt, temperature=0, extra_body=beside)
                wait_until(lambda: health(url)["active"] == 1, "the long stream to decode")
                failed = pool.submit(complete, url, "A steered prompt that overflows", steering=OVERFLOWING)
                gate.steps_until(failed.done)
                short = pool.submit(stream_text, client, short_prompt, temperature=0)
                wait_until(lambda: health(url)["waiting"] == 1, "the short request to queue")
                gate.open()
                texts = [long.result(WAIT_SECONDS), short.result(WAIT_SECONDS)]
        finally:
            gate.open()
    assert "logits are not finite" in error_of(failed.result())
    assert texts == alone


class FailingDictionary:
    """A feature dictionary (gpt2.inference.steering.FeatureDictionary) that works for its first `works` forwards,
    then raises on every one: a dictionary that breaks in the middle of a generation."""

    hook_name = HOOK
    d_in = WIDTH
    d_sae = 8

    def __init__(self, works: int) -> None:
        self.works = works

    def clamped(self, x: torch.Tensor, feature: int, value: float) -> torch.Tensor:
        self.works -= 1
        if self.works < 0:
            raise RuntimeError("the dictionary's weights are gone")
        return x


@pytest.mark.slow
def test_a_stream_failing_after_its_first_tokens_ends_with_an_error_chunk_and_its_batch_mates_go_on(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = [{"hook": HOOK, "sae": "flaky", "feature": 0, "value": 1.0}]
    with running(llm, saes={"flaky": FailingDictionary(works=4)}) as url:  # the prompt's forward, then 3 steps
        client = openai_client(url)
        alone = [stream_text(client, prompt, **settings) for prompt, settings in PLAIN[:2]]
        gate = StepGate(monkeypatch)
        received = []

        def failing_stream() -> None:
            stream = client.completions.create(
                model=MODEL, prompt="Flaky", max_tokens=MAX_TOKENS, temperature=0, stream=True,
                extra_body={"steering": flaky},
            )  # fmt: skip
            for chunk in stream:
                received.append(chunk.choices[0].text)

        try:
            with ThreadPoolExecutor(3) as pool:
                streams = [pool.submit(stream_text, client, prompt, **settings) for prompt, settings in PLAIN[:2]]
                failing = pool.submit(failing_stream)
                wait_until(lambda: health(url)["active"] + health(url)["waiting"] == 3, "three requests in")
                gate.open()
                texts = [stream.result(WAIT_SECONDS) for stream in streams]
                with pytest.raises(openai.APIError) as ended:
                    failing.result(WAIT_SECONDS)
        finally:
            gate.open()
    assert texts == alone
    assert len(received) == 4  # a chunk for each of its first four tokens, then the error
    assert f"its steering at {HOOK} failed: RuntimeError: the dictionary's weights are gone" in ended.value.message


def test_offline_the_same_steering_is_an_error_naming_the_logits_not_the_rules(base: Path) -> None:
    with pytest.raises(ValueError, match="logits are not finite") as caught:
        LLM.load(base, device="cpu").generate("Steered", SamplingParams(max_tokens=4), steering=OVERFLOWING)
    assert "exclude the whole vocabulary" not in str(caught.value)


def test_sampling_tells_nan_logits_from_a_vocabulary_the_rules_exclude() -> None:
    with pytest.raises(ValueError, match="not finite"):
        sample_next_token(torch.full((1, 5), float("nan")), temperature=1.0)
    with pytest.raises(ValueError, match="exclude the whole vocabulary"):
        sample_next_token(torch.full((1, 5), float("-inf")), temperature=1.0)
