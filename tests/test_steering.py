"""gpt2.inference.steering: steered generation equals a forward steered by hand at every step, each row of a
batch gets its own interventions (a row without any is computed exactly as unsteered), SAE features clamp as
written, and malformed interventions are refused naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt2.api import LLM
from gpt2.cli import main
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.steering import AddVector, ClampFeature, parse_steering, steer
from gpt2.inspect import run_with_hooks
from gpt2.inspect.sae import SAEConfig, SparseAutoencoder, save_sae
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer

VOCAB = 257
C = 64


@pytest.fixture
def llm(perturbed_tiny_gpt: GPT) -> LLM:
    return LLM(perturbed_tiny_gpt, load_tokenizer("bytes"), torch.device("cpu"))


def direction(seed: int) -> torch.Tensor:
    return torch.randn(C, generator=torch.Generator().manual_seed(seed))


def random_sae() -> SparseAutoencoder:
    torch.manual_seed(1)
    sae = SparseAutoencoder(SAEConfig(architecture="standard", d_in=C, d_sae=32, hook_name="blocks.1.hook_resid_pre"))
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.copy_(0.3 * torch.randn_like(parameter))
    return sae


def greedy_by_hand(model: GPT, ids: list[int], steps: int, hooks) -> list[int]:
    """Greedy decoding with no cache: the whole sequence through the hooked forward at every step."""
    ids = list(ids)
    for _ in range(steps):
        with torch.no_grad():
            logits = run_with_hooks(model, torch.tensor([ids]), hooks)
        ids.append(int(logits[0, -1].argmax()))
    return ids


GREEDY = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[])


def test_steered_generation_equals_a_hand_steered_forward_at_every_step(llm: LLM) -> None:
    prompt = "To be or"
    vector = direction(0)
    steering = [
        {"hook": "blocks.0.hook_resid_pre", "vector": vector.tolist(), "scale": 6.0},
        {"hook": "blocks.1.hook_mlp_out", "vector": direction(1).tolist(), "scale": -2.0},
    ]
    hooks = [
        ("blocks.0.hook_resid_pre", lambda x, name: x + 6.0 * vector),
        ("blocks.1.hook_mlp_out", lambda x, name: x - 2.0 * direction(1)),
    ]
    ids = llm.tokenizer.encode(prompt)

    def text(tokens: list[int]) -> str:
        return llm.tokenizer.decode_bytes(tokens[len(ids) :]).decode("utf-8", errors="replace")

    steered = llm.generate(prompt, GREEDY, steering=steering)[0]
    assert steered == text(greedy_by_hand(llm.model, ids, 12, hooks))
    plain = llm.generate(prompt, GREEDY)[0]
    assert plain == text(greedy_by_hand(llm.model, ids, 12, []))
    assert plain != steered  # the steering mattered
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in llm.model.modules())


def test_a_batch_of_prompts_is_steered_row_by_row_as_each_alone(llm: LLM) -> None:
    steering = [{"hook": "blocks.1.hook_resid_post", "vector": direction(2).tolist(), "scale": 5.0}]
    prompts = ["abc", "hello there"]
    batch = llm.generate(prompts, GREEDY, steering=steering)
    assert batch == [llm.generate(prompt, GREEDY, steering=steering) for prompt in prompts]
    assert batch != llm.generate(prompts, GREEDY)


def test_each_row_gets_its_own_interventions_and_a_plain_row_stays_exact(llm: LLM) -> None:
    model = llm.model
    idx = torch.randint(0, VOCAB, (3, 7), generator=torch.Generator().manual_seed(0))
    first = [AddVector("blocks.0.hook_attn_out", direction(3), 3.0)]
    third = [ClampFeature("blocks.1.hook_resid_pre", random_sae(), 5, 4.0)]
    with torch.no_grad():
        with steer(model, [first, [], third]):
            together = model(idx).logits
        with steer(model, [first]):
            alone_first = model(idx[:1]).logits
        with steer(model, [third]):
            alone_third = model(idx[2:]).logits
        plain = model(idx).logits
    torch.testing.assert_close(together[0], alone_first[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(together[2], alone_third[0], atol=1e-5, rtol=0)
    assert torch.equal(together[1], plain[1])
    assert not torch.allclose(together[0], plain[0], atol=1e-3) and not torch.allclose(together[2], plain[2], atol=1e-3)


def test_clamping_a_feature_moves_the_stream_along_its_decoder_row(llm: LLM) -> None:
    sae = random_sae()
    x = torch.randn(2, 4, C)
    with torch.no_grad():
        acts = sae.encode(x)
        clamped = sae.clamped(x, 5, 4.0)
    expected = x + (4.0 - acts[..., 5:6]) * sae.W_dec[5]
    torch.testing.assert_close(clamped, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"hook": "blocks.9.hook_resid_pre", "vector": [0.0] * C}, r"steering\[0\].hook: 'blocks.9.hook_resid_pre'"),
        ({"hook": "blocks.0.attn.hook_z", "vector": [0.0] * C}, r"steering\[0\].hook"),
        ({"hook": "blocks.0.hook_resid_pre", "vector": [0.0] * 3}, r"steering\[0\].vector has shape \(3,\)"),
        ({"hook": "blocks.0.hook_resid_pre", "vector": [float("nan")] * C}, r"steering\[0\].vector holds NaN"),
        ({"hook": "blocks.0.hook_resid_pre", "vector": [0.0] * C, "scale": "big"}, r"steering\[0\].scale"),
        ({"hook": "blocks.0.hook_resid_pre", "vector": [0.0] * C, "sclae": 1}, r"steering\[0\].sclae: unknown"),
        ({"hook": "blocks.1.hook_resid_pre", "sae": "nope", "feature": 1, "value": 1.0}, r"steering\[0\].sae: no SAE"),
        ({"hook": "blocks.1.hook_resid_pre", "sae": "res1", "feature": 32, "value": 1.0}, r"steering\[0\].feature"),
        (
            {"hook": "blocks.0.hook_resid_pre", "sae": "res1", "feature": 1, "value": 1.0},
            r"steering\[0\].hook: the SAE",
        ),
        ({"hook": "blocks.1.hook_resid_pre", "sae": "res1", "feature": 1, "value": float("inf")}, r"\[0\].value"),
    ],
)
def test_a_malformed_intervention_is_refused_naming_the_field(llm: LLM, item, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_steering([item], llm.model, {"res1": random_sae()})


def test_steering_must_be_a_list(llm: LLM) -> None:
    with pytest.raises(ValueError, match="steering must be a list"):
        parse_steering({"hook": "blocks.0.hook_resid_pre"}, llm.model)  # type: ignore[arg-type]


def test_cli_sample_steers_with_a_file_and_an_sae(llm: LLM, tmp_path: Path, capsys) -> None:
    llm.save(tmp_path / "model")
    save_sae(random_sae(), tmp_path / "sae")
    items = [
        {"hook": "blocks.0.hook_resid_pre", "vector": direction(4).tolist(), "scale": 4.0},
        {"hook": "blocks.1.hook_resid_pre", "sae": "res1", "feature": 3, "value": 6.0},
    ]
    (tmp_path / "steer.json").write_text(json.dumps(items))
    common = ["sample", "--model", str(tmp_path / "model"), "--device", "cpu", "--prompt", "Hi", "--no-echo"]
    flags = ["--temperature", "0", "--max-new-tokens", "10"]
    steer_flags = ["--steer", str(tmp_path / "steer.json"), "--sae", f"res1={tmp_path / 'sae'}"]
    assert main([*common, *flags, *steer_flags]) == 0
    printed = capsys.readouterr().out
    items[1]["sae"] = random_sae()
    params = SamplingParams(max_tokens=10, temperature=0.0)
    assert printed == llm.generate("Hi", params, steering=items)[0] + "\n"
    assert main([*common, *flags, "--steer", str(tmp_path / "steer.json")]) == 2
    assert "steering[1].sae: no SAE named 'res1'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ through the server
@pytest.fixture
def served(perturbed_tiny_gpt: GPT, tmp_path: Path):
    """A server for a saved copy of the model (with the SAE as 'res1') and an offline LLM on another copy."""
    pytest.importorskip("fastapi")
    import socket
    import threading
    import time

    from gpt2.serve import ServerConfig, uvicorn_server

    LLM(perturbed_tiny_gpt, load_tokenizer("bytes"), torch.device("cpu")).save(tmp_path / "model")
    served_llm, offline = LLM.load(tmp_path / "model"), LLM.load(tmp_path / "model")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    config = ServerConfig(model_name="tiny", port=sock.getsockname()[1], max_batch=8)
    server = uvicorn_server(served_llm, config, log_level="warning", saes={"res1": random_sae()})
    thread = threading.Thread(target=server.run, kwargs=dict(sockets=[sock]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", offline
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


def complete(url: str, prompt: str, steering: list | None = None, max_tokens: int = 12) -> dict:
    import httpx

    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if steering is not None:
        body["steering"] = steering
    return httpx.post(f"{url}/v1/completions", json=body, timeout=120).json()


@pytest.mark.slow
def test_the_server_steers_each_request_as_offline_and_leaves_plain_ones_as_unsteered(served, monkeypatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from gpt2.serve.batch import DecodeBatch

    url, offline = served
    steerings = [
        [{"hook": "blocks.0.hook_resid_pre", "vector": direction(5).tolist(), "scale": 6.0}],
        [
            {"hook": "blocks.1.hook_attn_out", "vector": direction(6).tolist(), "scale": -3.0},
            {"hook": "blocks.1.hook_resid_pre", "sae": "res1", "feature": 4, "value": 5.0},
        ],
        [{"hook": "blocks.1.hook_resid_post", "vector": direction(7).tolist(), "scale": 2.5}],
    ]
    prompts = ["To be or not to be, that is", "Once upon a time", "The king said", "Hello, world"]
    plain_alone = {prompt: complete(url, prompt, max_tokens=24)["choices"][0]["text"] for prompt in prompts}
    steps: list[tuple[int, bool]] = []  # (rows, native) of every decode step
    real_step = DecodeBatch.step

    def recorded(batch: DecodeBatch, tokens: torch.Tensor, *, model: GPT | None = None) -> torch.Tensor:
        steps.append((batch.size, model is None))  # a model given: its forward, not the native decoder
        return real_step(batch, tokens, model=model)

    monkeypatch.setattr(DecodeBatch, "step", recorded)
    jobs = [(prompt, None) for prompt in prompts] + [(prompts[i % 4], s) for i, s in enumerate(steerings)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: complete(url, *job, max_tokens=24), jobs))
    assert any(rows > 1 and not native for rows, native in steps)  # steered and other rows shared a step
    for (prompt, steering), answer in zip(jobs, answers, strict=True):
        text = answer["choices"][0]["text"]
        if steering is None:
            assert text == plain_alone[prompt]
        else:
            items = [{**item, "sae": random_sae()} if "sae" in item else item for item in steering]
            params = SamplingParams(max_tokens=24, temperature=0.0)
            assert text == offline.generate(prompt, params, steering=items)[0]
            assert text != plain_alone[prompt]


@pytest.mark.slow
def test_the_prefix_cache_never_crosses_steered_and_plain_prompts(served) -> None:
    url, offline = served
    prompt = "A shared prompt, long enough to fill blocks of the prefix cache: "
    steering = [{"hook": "blocks.0.hook_resid_pre", "vector": direction(8).tolist(), "scale": 6.0}]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    plain, steered = offline.generate(prompt, params)[0], offline.generate(prompt, params, steering=steering)[0]
    assert plain != steered
    for _ in range(2):  # each after the other has been cached
        assert complete(url, prompt)["choices"][0]["text"] == plain
        assert complete(url, prompt, steering)["choices"][0]["text"] == steered


@pytest.mark.slow
def test_a_malformed_steering_field_is_a_400_naming_it(served) -> None:
    import httpx

    url, _ = served
    for steering, message in [
        ([{"hook": "blocks.0.hook_resid_pre", "vector": [1.0, 2.0]}], "steering[0].vector has shape (2,)"),
        ([{"hook": "blocks.7.hook_resid_pre", "vector": [0.0] * C}], "steering[0].hook"),
        ([{"hook": "blocks.1.hook_resid_pre", "sae": "nope", "feature": 1, "value": 1}], "steering[0].sae"),
        ({"hook": "blocks.0.hook_resid_pre"}, "steering must be a list"),
    ]:
        body = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "steering": steering}
        response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
        assert message in response.json()["error"]["message"] and response.json()["error"]["param"] == "steering"
    nan = '{"model": "tiny", "prompt": "Hi", "steering": [{"hook": "blocks.0.hook_resid_pre", "vector": [NaN]}]}'
    response = httpx.post(f"{url}/v1/completions", content=nan, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
