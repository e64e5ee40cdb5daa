"""Every field the server accepts is applied, or the request is a 400 naming it: unknown fields, beam search's
(offline only), vLLM's structured-output names through the same grammar path as the Python API; special-token
text in a prompt is the special token; vLLM's /tokenize and /detokenize and OpenAI's /v1/embeddings (with the
`openai` client); the connection cap reaches uvicorn; a client dropping its body mid-way logs no traceback."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import shared_file
from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams
from gpt2.inference.embedding import embed
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import save_pretrained

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
pytest.importorskip("xgrammar")
from fastapi.testclient import TestClient  # noqa: E402

from gpt2.serve import ServerConfig  # noqa: E402
from gpt2.serve.app import create_app  # noqa: E402

MODEL = "tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random GPT-2 with GPT-2's BPE (so <|endoftext|> is a special token with its own id)."""
    tokenizer = load_tokenizer(Path(shared_file("gpt2-bpe/encoder.json")).parent)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=len(tokenizer), block_size=64))
    directory = tmp_path_factory.mktemp("tiny")
    save_pretrained(model, directory)
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> LLM:
    return LLM.load(model_dir, device="cpu")


@pytest.fixture(scope="module")
def http(model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(LLM.load(model_dir, device="cpu"), ServerConfig(model_name=MODEL))) as client:
        yield client


@pytest.fixture(scope="module")
def client(http: TestClient) -> Any:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0)


def complete(http: TestClient, **body: Any) -> Any:
    return http.post("/v1/completions", json={"model": MODEL, "prompt": "The cat", "max_tokens": 4, **body})


@pytest.mark.slow
@pytest.mark.parametrize("field", ["foo", "best_of_many", "reasoning_effort"])
def test_an_unknown_field_is_a_400_naming_it(http, field):
    answer = complete(http, **{field: 1})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == field
    chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                   field: 1})  # fmt: skip
    assert chat.status_code == 400 and chat.json()["error"]["param"] == field


@pytest.mark.parametrize("field, value", [("use_beam_search", True), ("length_penalty", 0.5), ("early_stopping", True)])
def test_beam_search_fields_are_refused_as_offline_only(http, field, value):
    answer = complete(http, **{field: value})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["param"] == field and "offline only" in error["message"]


def texts(http: TestClient, n: int = 3, **body: Any) -> list[str]:
    answer = complete(http, **{"max_tokens": 24, "temperature": 1.0, "seed": 0, "n": n, **body})
    assert answer.status_code == 200, answer.text
    return [choice["text"] for choice in answer.json()["choices"]]


@pytest.mark.parametrize("body", [{"guided_regex": "[0-9]{3}"}, {"regex": "[0-9]{3}"},
                                  {"structured_outputs": {"regex": "[0-9]{3}"}}])  # fmt: skip
def test_vllm_regex_fields_constrain_as_the_python_api_does(http, reference, body):
    got = texts(http, **body)
    assert all(re.fullmatch("[0-9]{3}", text) for text in got), got
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=0, regex="[0-9]{3}")
    assert got[0] == reference.generate("The cat", params)[0]


def test_guided_choice_gives_one_of_the_choices(http):
    for body in ({"guided_choice": ["yes", "no"]}, {"structured_outputs": {"choice": ["yes", "no"]}}):
        assert set(texts(http, n=4, **body)) <= {"yes", "no"}


def test_guided_json_and_structured_outputs_json_follow_the_schema(http):
    schema = {"type": "object", "properties": {"b": {"type": "boolean"}, "a": {"type": "integer"}},
              "required": ["b", "a"], "additionalProperties": False}  # fmt: skip
    for body in ({"guided_json": schema}, {"structured_outputs": {"json": schema}}):
        for text in texts(http, max_tokens=60, **body):
            value = json.loads(text)
            assert list(value) == ["b", "a"] and isinstance(value["a"], int), text


def test_structured_output_fields_are_one_at_a_time_and_checked(http):
    both = complete(http, guided_regex="a", response_format={"type": "json_object"})
    assert both.status_code == 400 and "not several" in both.json()["error"]["message"]
    grammar = complete(http, structured_outputs={"grammar": "root ::= 'a'"})
    assert grammar.status_code == 400 and grammar.json()["error"]["param"] == "structured_outputs.grammar"
    bad = complete(http, guided_regex="(")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "guided_regex"


def test_openai_client_extra_body_reaches_the_grammar(client):
    answer = client.completions.create(model=MODEL, prompt="The cat", max_tokens=8, seed=1,
                                       extra_body={"guided_choice": ["left", "right"]})  # fmt: skip
    assert answer.choices[0].text in ("left", "right")


def test_endoftext_in_a_prompt_is_the_special_token(http, reference):
    answer = http.post("/tokenize", json={"model": MODEL, "prompt": "<|endoftext|>The cat"})
    assert answer.status_code == 200
    assert answer.json()["tokens"][0] == 50256 and answer.json()["count"] == 3
    ids = reference.tokenizer.encode("<|endoftext|>The cat", allowed_special="all")
    greedy = reference.generate(ids, SamplingParams(max_tokens=6, temperature=0))[0]
    assert (
        complete(http, prompt="<|endoftext|>The cat", max_tokens=6, temperature=0).json()["choices"][0]["text"]
        == greedy
    )
    assert reference.tokenizer.encode("<|endoftext|>")[0] != 50256  # the Python API's rule: plain text


def test_tokenize_and_detokenize_take_vllms_bodies(http):
    tokens = http.post("/tokenize", json={"model": MODEL, "prompt": "Hello world"}).json()
    assert tokens["tokens"] == [15496, 995] and tokens["count"] == 2 and tokens["max_model_len"] == 64
    back = http.post("/detokenize", json={"model": MODEL, "tokens": [15496, 995]}).json()
    assert back == {"prompt": "Hello world"}
    chat = http.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > 1
    refused = http.post("/detokenize", json={"model": MODEL, "tokens": [-1]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"


def test_embeddings_with_the_openai_client_are_the_pooled_last_hidden_state(client, reference):
    answer = client.embeddings.create(model=MODEL, input=["The cat sat", "Hello world"])
    vectors = torch.tensor([item.embedding for item in answer.data])
    ids = [reference.tokenizer.encode("The cat sat"), reference.tokenizer.encode("Hello world")]
    expected = embed(reference.model, ids)
    assert vectors.shape == (2, 32) and answer.usage.prompt_tokens == 5
    torch.testing.assert_close(vectors, expected, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        last = reference.model.hidden_states(torch.tensor([ids[0]]))[0, -1]
    torch.testing.assert_close(vectors[0], last / last.norm(), atol=1e-5, rtol=1e-5)
    # the client asks for base64 and decodes it itself unless told a format; told "float", it gets floats
    as_floats = client.embeddings.create(model=MODEL, input="The cat sat", encoding_format="float")
    torch.testing.assert_close(torch.tensor(as_floats.data[0].embedding), vectors[0], atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_the_connection_cap_and_keep_alive_reach_uvicorn(model_dir):
    from gpt2.serve import uvicorn_server

    server = uvicorn_server(LLM.load(model_dir, device="cpu"),
                            ServerConfig(model_name=MODEL, max_connections=7, keep_alive_seconds=3))  # fmt: skip
    assert (server.config.limit_concurrency, server.config.timeout_keep_alive) == (7, 3)
    with pytest.raises(ValueError, match="max_connections must be an integer >= 1"):
        ServerConfig(max_connections=0)


@contextmanager
def running(model_dir: Path, **settings: Any) -> Iterator[int]:
    """A real uvicorn server for the tiny model on a free loopback port (ServerConfig `settings`); yields the port."""
    from gpt2.serve import uvicorn_server

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn_server(LLM.load(model_dir, device="cpu"), ServerConfig(model_name=MODEL, port=port, **settings),
                            log_level="warning")  # fmt: skip
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    try:
        for _ in range(6000):  # up to 60 s for the start, never a timing claim
            if server.started:
                break
            time.sleep(0.01)
        assert server.started
        yield port
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@pytest.mark.slow
def test_a_client_dropping_its_body_logs_no_traceback(model_dir, caplog):
    """A real socket: headers promising 1000 bytes, half a body, then the connection closes."""
    with running(model_dir) as port, caplog.at_level(logging.INFO):
        with socket.create_connection(("127.0.0.1", port)) as client:
            client.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: 1000\r\n\r\n" + b'{"model": "tiny", "prompt": "The')  # fmt: skip
        for _ in range(100):  # the server notices the close on its next read
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", port)) as health:
            health.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert health.recv(100).startswith(b"HTTP/1.1 200")
    assert not [record for record in caplog.records if record.exc_info], caplog.text


@pytest.mark.slow
def test_a_client_sending_its_headers_slowly_is_disconnected(model_dir):
    """Headers begun and never finished: the server closes the connection past --header-timeout, while a client
    that sends its request whole is answered."""
    with running(model_dir, header_timeout_seconds=1) as port:
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and nothing more
            slow.settimeout(60)  # never a timing claim: the close comes after the 1 s deadline
            assert slow.recv(100) == b""  # closed by the server, with no response
        with socket.create_connection(("127.0.0.1", port)) as prompt:
            prompt.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert prompt.recv(100).startswith(b"HTTP/1.1 200")
    with pytest.raises(ValueError, match="header_timeout_seconds must be an integer >= 1"):
        ServerConfig(header_timeout_seconds=0)


PERPLEXITY_TASK = """\
task: gpt2_local_perplexity
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


@pytest.mark.slow
def test_lm_eval_perplexity_over_text_requests_equals_over_token_requests_and_hf(model_dir, tmp_path, monkeypatch):
    """lm-evaluation-harness's `local-completions` with tokenized_requests=False sends rolling windows as text,
    each starting with <|endoftext|>: read as the special token, the perplexity equals that of the same windows
    sent as token ids, and that of lm-eval's `hf` model on the same weights at the equal window size. The rule:
    `local-completions` with max_length N cuts windows of N - 2 tokens (one kept for the generated token, one more
    in its rolling windows), as `hf` does with max_length N - 2; text requests score those windows when each
    window's text re-encodes to its ids, as it does here (a window ending between two tokens that BPE merges at
    the end of a text, e.g. "\\n" "\\n" into "\\n\\n", re-encodes to other ids)."""
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("transformers")
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    text = "The cat sat on the mat, and the dog lay by the door while the rain fell on the roof. " * 6
    docs = [text[i:] for i in (0, 40)]
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs), encoding="utf-8")
    (tmp_path / "task.yaml").write_text(PERPLEXITY_TASK.format(data=data), encoding="utf-8")
    max_length = 64  # the tiny model's block size: a 62-token window, then the one generated token
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for doc in docs:  # every window's text re-encodes to the window's ids
        for pair in get_rolling_token_windows(tokenizer.encode(doc), tokenizer.eos_token_id, max_length - 2, 1):
            context, continuation = make_disjoint_window(pair)
            assert tokenizer.encode(tokenizer.decode(context + continuation)) == context + continuation

    tasks = TaskManager(include_path=str(tmp_path))  # indexes lm-eval's own tasks too: built once

    def perplexity(model: str, model_args: dict[str, Any]) -> dict[str, float]:
        results = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["gpt2_local_perplexity"],
                                          task_manager=tasks)  # fmt: skip
        return results["results"]["gpt2_local_perplexity"]

    def served(port: int, tokenized: bool) -> dict[str, float]:
        return perplexity("local-completions", {
            "base_url": f"http://127.0.0.1:{port}/v1/completions", "model": MODEL, "tokenizer_backend": "huggingface",
            "tokenizer": str(model_dir), "tokenized_requests": tokenized, "max_length": max_length, "max_retries": 1,
        })  # fmt: skip

    with running(model_dir) as port:
        as_text, as_ids = served(port, tokenized=False), served(port, tokenized=True)
    hf = perplexity("hf", {"pretrained": str(model_dir), "max_length": max_length - 2, "device": "cpu"})
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert as_text[metric] == pytest.approx(as_ids[metric], rel=1e-9), metric
        assert as_text[metric] == pytest.approx(hf[metric], rel=1e-6), metric  # float32 sums on either side
