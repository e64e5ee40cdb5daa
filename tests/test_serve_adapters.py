"""Many LoRA adapters behind one server (gpt2.serve.adapters): a request's `model` picks the base model or an
adapter; requests for several adapters and the base decode together in one batch, each as the merged fine-tune
and transformers + PEFT decode it; adapters load and unload while requests run, and a request keeps the adapter it
started with; bad names and folders are answered 4xx naming what is wrong."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from gpt2.api import LLM
from gpt2.cli import main
from gpt2.inference.embedding import embed
from gpt2.inference.lora_batch import RoutedView
from gpt2.inference.sampling import SamplingParams
from test_adapters import PEFT_ADAPTERS, adapters, base, merged_copy, peft_adapter, peft_greedy_ids, tiny_gpt2  # noqa: F401
from test_serve import MODEL, running, wait_until

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

BASE = MODEL
PROMPTS = ["The quick brown fox", "Once upon a time", "To be, or not"]
MAX_TOKENS = 12
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)


def prefix_cache_hits(url: str) -> float:
    """The server's gpt2_prefix_cache_hits_total, as Prometheus reads it from /metrics."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("gpt2_prefix_cache_hits_total "):
            return float(line.split()[1])
    raise AssertionError("/metrics has no gpt2_prefix_cache_hits_total")


def client(url: str) -> Any:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def complete(url: str, prompt: str, model: str) -> Any:
    return client(url).completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)


@pytest.fixture
def llm(base: Path, adapters: dict[str, Path]) -> LLM:  # noqa: F811
    return LLM.load(base, device="cpu", precision="float32", adapters=adapters)


@pytest.mark.slow
def test_requests_for_every_adapter_and_the_base_decode_in_one_batch_as_merged_fine_tunes_and_peft(
    llm: LLM,
    base: Path,  # noqa: F811
    adapters: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    gpt2_bpe_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mixed: list[int] = []  # distinct adapters (the base counted as one) of every forward that ran the mixed view
    real_rows = RoutedView.rows

    def recorded(view: RoutedView, rows: Any, *rest: Any) -> Any:
        if any(adapter is not None for adapter in rows):
            mixed.append(len({id(adapter) for adapter in rows}))
        return real_rows(view, rows, *rest)

    monkeypatch.setattr(RoutedView, "rows", recorded)
    jobs = [(prompt, model) for prompt in PROMPTS for model in (BASE, *adapters)]
    with running(llm) as url:
        with ThreadPoolExecutor(len(jobs)) as pool:
            answers = list(pool.map(lambda job: complete(url, *job), jobs))
    assert max(mixed) == 3  # the base's rows and both adapters' rows shared forwards
    merged = {
        name: LLM.load(merged_copy(base, path, tmp_path / f"merged-{name}", gpt2_bpe_dir), precision="float32")
        for name, path in adapters.items()
    }
    plain = LLM.load(base, device="cpu", precision="float32")
    for (prompt, model), answer in zip(jobs, answers, strict=True):
        text = answer.choices[0].text
        assert answer.model == model
        assert text == (plain if model == BASE else merged[model]).generate(prompt, GREEDY)[0], (prompt, model)
        theirs = peft_greedy_ids(base, adapters.get(model), llm.tokenizer.encode(prompt), MAX_TOKENS)
        assert text == llm.tokenizer.decode(theirs), (prompt, model)
    for prompt in PROMPTS:  # the adapters change the text: the comparisons are not of copies of the base's text
        assert len({answer.choices[0].text for (p, _), answer in zip(jobs, answers, strict=True) if p == prompt}) > 1


@pytest.mark.slow
def test_models_lists_the_base_and_each_adapter_with_the_base_as_parent(llm: LLM) -> None:
    with running(llm) as url:
        listed = {model.id: model for model in client(url).models.list().data}
        style = client(url).models.retrieve("style")
    assert set(listed) == {BASE, *PEFT_ADAPTERS}
    assert listed[BASE].model_extra["parent"] is None
    for name in PEFT_ADAPTERS:
        assert listed[name].model_extra["parent"] == BASE
        assert Path(listed[name].model_extra["root"]).is_dir()
    assert style.id == "style" and style.model_extra["parent"] == BASE


@pytest.mark.slow
def test_an_unknown_model_is_a_404_naming_the_base_and_the_adapters(llm: LLM) -> None:
    with running(llm) as url:
        with pytest.raises(openai.NotFoundError) as caught:
            complete(url, "Hello", "stlye")
        with pytest.raises(openai.NotFoundError):
            client(url).embeddings.create(model="stlye", input="Hello")
        embedded = client(url).embeddings.create(model="style", input="Hello")
    message = caught.value.body["message"]
    assert "'stlye'" in message and "'tiny'" in message and "'style'" in message and "'terse'" in message
    assert embedded.model == "style"
    ids = [llm.tokenizer.encode("Hello")]
    vector = torch.tensor(embedded.data[0].embedding)
    assert torch.allclose(vector, embed(llm.adapters.model_for(llm.adapters.get("style")), ids)[0], atol=1e-6)
    assert not torch.allclose(vector, embed(llm.model, ids)[0], atol=1e-3)  # the adapter's, not the base's


@pytest.mark.slow
def test_the_prefix_cache_keys_an_adapters_prompts_apart_from_the_bases(llm: LLM) -> None:
    prompt = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
    with running(llm) as url:
        base_text = complete(url, prompt, BASE).choices[0].text
        hits = prefix_cache_hits(url)
        first = complete(url, prompt, "style").choices[0].text
        assert prefix_cache_hits(url) == hits  # the base's blocks are not the adapter's keys and values
        again = complete(url, prompt, "style").choices[0].text
        assert prefix_cache_hits(url) > hits  # the adapter's own blocks are
    assert first == again == llm.generate(prompt, GREEDY, adapter="style")[0] != base_text


@pytest.mark.slow
def test_adapters_load_and_unload_under_load_and_a_running_request_keeps_its_adapter(
    base: Path,  # noqa: F811
    adapters: dict[str, Path],  # noqa: F811
    tmp_path: Path,
) -> None:
    llm = LLM.load(base, device="cpu", precision="float32", adapters={"style": adapters["style"]})
    offline = LLM.load(base, device="cpu", precision="float32", adapters=adapters)
    long = SamplingParams(max_tokens=40, temperature=0)
    expected = offline.generate(PROMPTS[0], long, adapter="style")[0]
    with running(llm, runtime_lora_updating=True) as url:
        http = httpx.Client(base_url=url, timeout=60)
        with ThreadPoolExecutor(4) as pool:
            background = [pool.submit(complete, url, prompt, BASE) for prompt in PROMPTS * 2]  # the load
            stream = client(url).completions.create(model="style", prompt=PROMPTS[0], max_tokens=40, temperature=0,
                                                    stream=True)  # fmt: skip
            pieces = [next(iter(stream)).choices[0].text]  # it runs with "style" now
            unloaded = http.post("/v1/unload_lora_adapter", json={"lora_name": "style"})
            terse = {"lora_name": "terse", "lora_path": str(adapters["terse"])}
            loaded = http.post("/v1/load_lora_adapter", json=terse)
            pieces += [chunk.choices[0].text for chunk in stream if chunk.choices]
            assert all(job.result().choices[0].finish_reason == "length" for job in background)  # none failed
        assert (unloaded.status_code, unloaded.text) == (200, "Success: LoRA adapter 'style' removed successfully.")
        assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'terse' added successfully.")
        assert "".join(pieces) == expected  # the stream kept "style" to its end
        with pytest.raises(openai.NotFoundError):
            complete(url, PROMPTS[0], "style")
        assert (
            complete(url, PROMPTS[1], "terse").choices[0].text
            == offline.generate(PROMPTS[1], GREEDY, adapter="terse")[0]
        )
        assert {model.id for model in client(url).models.list().data} == {BASE, "terse"}

        again = http.post("/v1/load_lora_adapter", json=terse)
        missing = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path / "none")})
        as_base = http.post("/v1/load_lora_adapter", json={"lora_name": BASE, "lora_path": str(adapters["terse"])})
        extra = http.post("/v1/load_lora_adapter", json={"lora_name": "y", "lora_path": "z", "load_inplace": True})
        unknown = http.post("/v1/unload_lora_adapter", json={"lora_name": "style"})
    assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    assert missing.status_code == 404 and "does not exist" in missing.json()["error"]["message"]
    assert as_base.status_code == 400 and "base model" in as_base.json()["error"]["message"]
    assert extra.status_code == 400 and extra.json()["error"]["param"] == "load_inplace"
    assert unknown.status_code == 404 and "'style'" in unknown.json()["error"]["message"]


@pytest.mark.slow
def test_an_adapter_for_another_base_is_a_400_at_load(
    base: Path,  # noqa: F811
    adapters: dict[str, Path],  # noqa: F811
    tmp_path: Path,
    gpt2_bpe_dir: Path,
) -> None:
    wider = peft_adapter(tiny_gpt2(tmp_path / "wider", width=96), tmp_path / "wider-adapter", 4, ["c_attn"], 1)
    llm = LLM.load(base, device="cpu", precision="float32")
    with running(llm, runtime_lora_updating=True) as url:
        answer = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "wide", "lora_path": str(wider)})
        models = {model.id for model in client(url).models.list().data}
    assert answer.status_code == 400 and "another base model" in answer.json()["error"]["message"]
    assert models == {BASE}


@pytest.mark.slow
def test_loading_at_run_time_is_off_unless_the_server_allows_it(llm: LLM, adapters: dict[str, Path]) -> None:  # noqa: F811
    with running(llm) as url:
        load = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(adapters["style"])})
        unload = httpx.post(url + "/v1/unload_lora_adapter", json={"lora_name": "style"})
        still = complete(url, PROMPTS[0], "style")
    for answer in (load, unload):
        assert answer.status_code == 404 and "--allow-runtime-lora-updating" in answer.json()["error"]["message"]
    assert still.model == "style"


@pytest.mark.slow
def test_steered_requests_with_or_without_an_adapter_run_beside_adapted_ones_each_as_offline(llm: LLM) -> None:
    direction = torch.randn(llm.model.config.n_embd, generator=torch.Generator().manual_seed(3))
    steering = [{"hook": "blocks.1.hook_resid_pre", "vector": direction.tolist(), "scale": 6.0}]
    with running(llm) as url:
        body = {"prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "temperature": 0}
        with ThreadPoolExecutor(3) as pool:
            steered = pool.submit(httpx.post, url + "/v1/completions",
                                  json={**body, "model": BASE, "steering": steering}, timeout=60)  # fmt: skip
            adapted = pool.submit(complete, url, PROMPTS[0], "style")
            both = pool.submit(httpx.post, url + "/v1/completions",
                               json={**body, "model": "terse", "steering": steering}, timeout=60)  # fmt: skip
        texts = [steered.result().json()["choices"][0]["text"], adapted.result().choices[0].text,
                 both.result().json()["choices"][0]["text"]]  # fmt: skip
    assert texts[0] == llm.generate(PROMPTS[0], GREEDY, steering=steering)[0]
    assert texts[1] == llm.generate(PROMPTS[0], GREEDY, adapter="style")[0]
    assert texts[2] == llm.generate(PROMPTS[0], GREEDY, adapter="terse", steering=steering)[0]


def test_a_seeded_sampled_request_with_adapter_steering_and_grammar_is_llm_generates_alone_and_among_8_streams(
    llm: LLM,
) -> None:
    pytest.importorskip("xgrammar")
    direction = torch.randn(llm.model.config.n_embd, generator=torch.Generator().manual_seed(5))
    steering = [{"hook": "blocks.0.hook_resid_post", "vector": direction.tolist(), "scale": 3.0}]
    sampled = {"max_tokens": MAX_TOKENS, "temperature": 0.9, "top_p": 0.95, "seed": 11}
    regex = "[a-z ]+[.!]?"
    expected = llm.generate(PROMPTS[1], SamplingParams(**sampled, regex=regex), adapter="style", steering=steering)[0]
    body = {"model": "style", "prompt": PROMPTS[1], **sampled, "regex": regex, "steering": steering}

    def request() -> str:
        answer = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["text"]

    def stream(prompt: str, model: str) -> str:
        chunks = client(url).completions.create(model=model, prompt=prompt, max_tokens=60, temperature=0, stream=True)
        return "".join(chunk.choices[0].text for chunk in chunks)

    with running(llm) as url:
        alone = request()
        with ThreadPoolExecutor(9) as pool:
            streams = [pool.submit(stream, PROMPTS[i % 3], (BASE, "style", "terse")[i % 3]) for i in range(8)]
            wait_until(lambda: httpx.get(url + "/health").json()["active"] >= 4, "the streams decoding")
            among = request()
            assert all(future.result() for future in streams)
    assert alone == among == expected
    assert re.fullmatch(regex, expected)


@pytest.mark.slow
def test_gpt2_serve_names_a_bad_lora_flag_in_one_line(base: Path, tmp_path: Path, capsys) -> None:  # noqa: F811
    assert main(["serve", str(base), "--lora", f"poems={tmp_path / 'nowhere'}", "--port", "0"]) != 0
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "nowhere" in error and "adapter_config.json" in error


@pytest.mark.slow
def test_long_prompts_prefilled_in_chunks_and_scored_prompts_take_their_adapter(llm: LLM) -> None:
    prompt = " ".join(["The quick brown fox jumps over the lazy dog."] * 4)  # 44 tokens: chunks of 8
    ids = llm.tokenizer.encode(prompt)
    with running(llm, prefill_chunk=8) as url:
        long = complete(url, prompt, "style").choices[0].text
        scored = client(url).completions.create(model="style", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    assert long == llm.generate(prompt, GREEDY, adapter="style")[0]
    with torch.no_grad():
        logits = llm.adapters.model_for(llm.adapters.get("style"))(torch.tensor([ids])).logits[0]  # (T, V)
        base_logits = llm.model(torch.tensor([ids])).logits[0]
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(len(ids) - 1), ids[1:]]  # token t + 1 given t
    unadapted = torch.log_softmax(base_logits, dim=-1)[torch.arange(len(ids) - 1), ids[1:]]
    served = torch.tensor(scored.choices[0].logprobs.token_logprobs[1:])
    assert torch.allclose(served, expected, atol=1e-4)
    assert not torch.allclose(served, unadapted, atol=1e-2)  # the adapter's scores, not the base's
