"""Every count a request sends has an upper bound from the model (top_k at most the vocabulary, max_tokens and
no_repeat_ngram_size at most the context: a 400 naming the field), no 400 echoes a client's huge number whole,
and /metrics reports the memory each loaded LoRA adapter holds."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from gpt2.api import LLM
from gpt2.tokenizer import ByteTokenizer
from test_serve import BLOCK_SIZE, save_model, tiny_gpt
from test_serve_adapter_checks import make_adapter

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from gpt2.serve import ServerConfig  # noqa: E402
from gpt2.serve.app import create_app  # noqa: E402

MODEL = "tiny"
VOCAB = ByteTokenizer.vocab_size  # tiny_gpt's vocabulary: 257
CHAT = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/completions": {"model": MODEL, "prompt": "The cat", "max_tokens": 2, "temperature": 0},
    "/v1/chat/completions": {"model": MODEL, "messages": CHAT, "max_tokens": 2, "temperature": 0},
}
HUGE = "9" * 400  # a JSON integer of 400 digits


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("base"), tiny_gpt(), ByteTokenizer())


@pytest.fixture(scope="module")
def adapters(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    return {
        "small": make_adapter(base, folder / "small", rank=2),
        "large": make_adapter(base, folder / "large", rank=8),
    }


@pytest.fixture(scope="module")
def http(base: Path, adapters: dict[str, Path]) -> Iterator[TestClient]:
    llm = LLM.load(base, device="cpu", adapters={"small": adapters["small"]})
    app = create_app(llm, ServerConfig(model_name=MODEL, runtime_lora_updating=True))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def post(http: TestClient, path: str, **fields: object) -> tuple[int, dict]:
    answer = http.post(path, json={**BODIES[path], **fields})
    return answer.status_code, answer.json()


@pytest.mark.slow
@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    ("field", "bound", "what"),
    [("top_k", VOCAB, "the vocabulary"), ("max_tokens", BLOCK_SIZE, "context"),
     ("no_repeat_ngram_size", BLOCK_SIZE, "context")],
)  # fmt: skip
def test_a_count_past_the_models_bound_is_a_400_naming_its_field(http, path, field, bound, what):
    status, answer = post(http, path, **{field: bound + 1})
    assert status == 400, answer
    assert answer["error"]["param"] == field
    assert f"{field} must be at most {bound}" in answer["error"]["message"] and what in answer["error"]["message"]


@pytest.mark.parametrize("path", list(BODIES))
def test_a_count_at_the_models_bound_is_served(http, path):
    status, answer = post(http, path, top_k=VOCAB, no_repeat_ngram_size=BLOCK_SIZE)
    assert status == 200, answer


def test_chat_names_max_completion_tokens_when_it_is_the_one_sent(http):
    body = {"model": MODEL, "messages": CHAT, "max_completion_tokens": BLOCK_SIZE + 1}
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "max_completion_tokens"


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("field", ["top_k", "max_tokens", "seed", "n", "min_tokens", "logprobs"])
def test_a_400_never_echoes_a_huge_number_whole(http, path, field):
    if field == "logprobs" and path != "/v1/completions":
        field = "top_logprobs"
    text = json.dumps({**BODIES[path], "logprobs": field == "top_logprobs" or None, field: "<value>"})
    answer = http.post(path, content=text.replace('"<value>"', HUGE), headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert "9" * 21 not in message and len(message) < 300, message


def adapter_bytes(http: TestClient) -> dict[str, int]:
    """gpt2_lora_adapter_bytes by adapter name, as Prometheus reads /metrics."""
    found = {}
    for line in http.get("/metrics").text.splitlines():
        match = re.fullmatch(r'gpt2_lora_adapter_bytes\{adapter="([^"]+)"\} (\S+)', line)
        if match:
            found[match[1]] = int(float(match[2]))
    return found


def float32_bytes(folder: Path) -> int:
    """What an adapter's tensors hold once read (float32, 4 bytes a value), counted from its file."""
    return sum(4 * tensor.numel() for tensor in load_file(str(folder / "adapter_model.safetensors")).values())


def test_metrics_report_each_loaded_adapters_memory(http, adapters):
    assert adapter_bytes(http) == {"small": float32_bytes(adapters["small"])}
    loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "large", "lora_path": str(adapters["large"])})
    assert loaded.status_code == 200, loaded.text
    sizes = adapter_bytes(http)
    assert sizes == {"small": float32_bytes(adapters["small"]), "large": float32_bytes(adapters["large"])}
    assert sizes["large"] == 4 * sizes["small"]  # rank 8 against rank 2, on the same layers
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "large"}).status_code == 200
    assert set(adapter_bytes(http)) == {"small"}
