"""No client input answers 5xx: every numeric field is bounded (a JSON integer of 400 digits, a float past float's
range, NaN and infinity are a 400 naming the field), booleans are not numbers, and /tokenize, /detokenize and
/v1/embeddings check `model` as completions do. A property test sends every endpoint random bodies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_file
from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import save_pretrained

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gpt2.serve import ServerConfig  # noqa: E402
from gpt2.serve.app import create_app  # noqa: E402

MODEL = "tiny"
WIDTH = 32  # the tiny model's residual stream
HOOK = "blocks.0.hook_resid_post"
HUGE = 10**400  # an exact JSON integer no float holds
PAST_FLOAT = "1e400"  # a JSON float that overflows to infinity when read
CHAT = [{"role": "user", "content": "hi"}]
# A valid body per endpoint; the tests change one field of it.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/completions": {"model": MODEL, "prompt": "The cat", "max_tokens": 2},
    "/v1/chat/completions": {"model": MODEL, "messages": CHAT, "max_tokens": 2},
    "/v1/embeddings": {"model": MODEL, "input": "The cat"},
    "/tokenize": {"model": MODEL, "prompt": "The cat"},
    "/detokenize": {"model": MODEL, "tokens": [464, 3797]},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 with GPT-2's BPE."""
    tokenizer = load_tokenizer(Path(shared_file("gpt2-bpe/encoder.json")).parent)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=WIDTH, vocab_size=len(tokenizer), block_size=64))
    directory = tmp_path_factory.mktemp("tiny")
    save_pretrained(model, directory)
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="module")
def http(model_dir: Path) -> Iterator[TestClient]:
    """The server answering as it would a client: an unexpected exception is a 500, not a test error."""
    app = create_app(LLM.load(model_dir, device="cpu"), ServerConfig(model_name=MODEL))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def post_raw(http: TestClient, path: str, text: str) -> Any:
    return http.post(path, content=text.encode(), headers={"content-type": "application/json"})


def with_field(path: str, field: str, literal: str) -> str:
    """The endpoint's valid body with `field` set to a JSON literal written as text (json.dumps cannot write
    10**400 as a float or 1e400 at all)."""
    text = json.dumps({**BODIES[path], field: "__value__"})
    return text.replace('"__value__"', literal)


def steering(**fields: Any) -> str:
    return json.dumps([{"hook": HOOK, "vector": [0.0] * WIDTH, **fields}])


NUMERIC_FIELDS = [
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("repetition_penalty", "repetition_penalty"),
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("min_p", "min_p"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field", [name for name, _ in NUMERIC_FIELDS])
@pytest.mark.parametrize(
    "literal", [str(HUGE), str(-HUGE), PAST_FLOAT, "-" + PAST_FLOAT], ids=["huge", "-huge", "1e400", "-1e400"]
)
def test_a_number_no_float_holds_is_a_400_naming_its_field(http, path, field, literal):
    answer = post_raw(http, path, with_field(path, field, literal))
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field


@pytest.mark.parametrize("literal", [str(HUGE), PAST_FLOAT, "true"], ids=["huge", "1e400", "true"])
def test_a_logit_bias_value_no_float_holds_is_a_400_naming_logit_bias(http, literal):
    body = with_field("/v1/completions", "logit_bias", '{"5": __bias__}').replace("__bias__", literal)
    answer = post_raw(http, "/v1/completions", body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "logit_bias", answer.text


def test_a_logit_bias_key_of_400_digits_is_a_400_naming_logit_bias(http):
    answer = post_raw(http, "/v1/completions", with_field("/v1/completions", "logit_bias", f'{{"{HUGE}": 1}}'))
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "logit_bias", answer.text


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json_numbers(http, constant):
    answer = post_raw(http, "/v1/completions", with_field("/v1/completions", "temperature", constant))
    assert answer.status_code == 400 and "not a valid JSON number" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    "literal",
    [
        steering(scale="__huge__"),
        steering(scale="__past__"),
        json.dumps([{"hook": HOOK, "vector": [1.0] * (WIDTH - 1) + ["__huge__"]}]),
        json.dumps([{"hook": HOOK, "vector": [1.0] * (WIDTH - 1) + ["__past__"]}]),
    ],
    ids=["huge-scale", "1e400-scale", "huge-entry", "1e400-entry"],
)
def test_a_steering_number_no_float_holds_is_a_400_naming_steering(http, literal):
    literal = literal.replace('"__huge__"', str(HUGE)).replace('"__past__"', PAST_FLOAT)
    answer = post_raw(http, "/v1/completions", with_field("/v1/completions", "steering", literal))
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "steering", answer.text
    assert "steering[0]" in answer.json()["error"]["message"]


def test_a_steering_vector_of_booleans_is_refused(http):
    vector = json.dumps([{"hook": HOOK, "vector": [True, False] * (WIDTH // 2)}])
    answer = post_raw(http, "/v1/completions", with_field("/v1/completions", "steering", vector))
    assert answer.status_code == 400 and "boolean" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty", "repetition_penalty", "temperature"])
def test_sampling_params_refuse_an_integer_past_floats_range(field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: HUGE})


def test_add_special_tokens_must_be_a_boolean(http):
    answer = http.post("/tokenize", json={**BODIES["/tokenize"], "add_special_tokens": "maybe"})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "add_special_tokens"
    assert http.post("/tokenize", json={**BODIES["/tokenize"], "add_special_tokens": False}).status_code == 200


TOKEN_PATHS = ["/tokenize", "/detokenize", "/v1/embeddings"]


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_an_unknown_model_is_a_404_naming_the_served_one(http, path):
    answer = http.post(path, json={**BODIES[path], "model": "gpt-4"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "model_not_found"
    assert repr(MODEL) in answer.json()["error"]["message"]


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_a_model_that_is_not_a_string_is_a_400_naming_model(http, path):
    answer = http.post(path, json={**BODIES[path], "model": 5})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model"


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_without_a_model_the_served_model_answers(http, path):
    body = {key: value for key, value in BODIES[path].items() if key != "model"}
    answer = http.post(path, json=body)
    assert answer.status_code == 200, answer.text
    if path == "/v1/embeddings":
        assert answer.json()["model"] == MODEL


# ------------------------------------------------------------------------------------------ property
# Literals json.dumps cannot write, swapped in for these markers after dumping.
RAW_LITERALS = {
    '"__huge__"': str(HUGE),
    '"__minus_huge__"': str(-HUGE),
    '"__past_float__"': PAST_FLOAT,
    '"__deep__"': "[" * 5000 + "]" * 5000,
}
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, 50257, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),  # NaN and Infinity go out as JSON's non-numbers
    st.sampled_from(sorted(RAW_LITERALS)).map(lambda marker: marker.strip('"')),
    st.text(max_size=12),
    st.sampled_from(["\ud800", "\udfff", "a\ud800b", "<|endoftext|>", MODEL, HOOK]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6) | st.just("\ud800"), inner, max_size=4)
    ),  # fmt: skip
    max_leaves=12,
)
FIELDS = sorted({
    "model", "prompt", "messages", "input", "tokens", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "min_p", "n", "best_of", "stop", "stop_token_ids", "seed", "presence_penalty", "frequency_penalty",
    "logit_bias", "repetition_penalty", "no_repeat_ngram_size", "min_tokens", "bad_words", "num_beams", "stream",
    "stream_options", "logprobs", "top_logprobs", "echo", "encoding_format", "add_special_tokens",
    "add_generation_prompt", "response_format", "guided_choice", "structured_outputs", "suffix", "user",
})  # fmt: skip
steering_values = st.lists(
    st.fixed_dictionaries(
        {"hook": st.sampled_from([HOOK, "blocks.9.hook_resid_pre"]) | scalars},
        optional={
            "vector": st.lists(scalars, min_size=WIDTH, max_size=WIDTH) | values,
            "scale": scalars,
            "sae": scalars,
            "feature": scalars,
            "value": scalars,
        },
    ),
    max_size=2,
)
changes = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), values, max_size=4)
bodies = st.one_of(
    st.tuples(st.sampled_from(sorted(BODIES)), changes, st.one_of(st.none(), steering_values)),
    st.tuples(st.sampled_from(sorted(BODIES)), values, st.none()),  # a body that may not even be an object
)


def body_text(path: str, change: Any, steer: Any) -> str:
    body = {**BODIES[path], **change} if isinstance(change, dict) else change
    if steer is not None and isinstance(body, dict):
        body["steering"] = steer
    text = json.dumps(body)  # allow_nan: NaN and Infinity written as JSON's non-numbers
    for marker, literal in RAW_LITERALS.items():
        text = text.replace(marker, literal)
    return text


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(case=bodies)
def test_no_body_answers_a_server_error(http, case):
    path, change, steer = case
    text = body_text(path, change, steer)
    answer = post_raw(http, path, text)
    assert answer.status_code < 500, f"{path} {text[:300]}: {answer.status_code} {answer.text[:300]}"
