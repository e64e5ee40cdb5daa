"""Adapters checked at the door (gpt2.weights.adapters.read_lora_adapter, gpt2.serve.adapters): one reader refuses a
malformed adapter_config.json, non-finite weights and a corrupt safetensors file with one line naming the file and
the field, for the Python API, the command line and the server alike; the server registers an adapter only once
every check has passed, holds at most --max-cpu-loras of rank at most --max-lora-rank, confines run-time paths to
--lora-root, and names paths only as they were given."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt2.api import LLM
from gpt2.finetune.lora import LoRAConfig, add_lora, save_adapter
from gpt2.serve.config import ServerConfig
from gpt2.tokenizer import ByteTokenizer
from gpt2.weights import load_model
from test_serve import MODEL, STARTUP_SECONDS, WAIT_SECONDS, running, save_model, tiny_gpt

pytest.importorskip("fastapi")

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
RANK = 4
# adapter_config.json's `r` written as raw JSON text, and what each malformed config is: (field it names, edit)
BAD_CONFIGS: dict[str, tuple[str, Any]] = {
    "a list": ("JSON object", lambda config: "[]"),
    "no r": ("the field r", lambda config: json.dumps({k: v for k, v in config.items() if k != "r"})),
    "r 8.9": ("r must be a positive integer", lambda config: raw(config, "r", "8.9")),
    "r 1e999": ("r must be a positive integer", lambda config: raw(config, "r", "1e999")),
    "r true": ("r must be a positive integer", lambda config: raw(config, "r", "true")),
    "r -1": ("r must be a positive integer", lambda config: raw(config, "r", "-1")),
    "lora_alpha null": ("lora_alpha must be a finite number", lambda config: raw(config, "lora_alpha", "null")),
    "target_modules 5": ("target_modules must be a list", lambda config: raw(config, "target_modules", "5")),
    "use_rslora 'false'": ("use_rslora must be true or false", lambda config: raw(config, "use_rslora", '"false"')),
}


def raw(config: dict[str, Any], field: str, text: str) -> str:
    """The config as JSON text with `field`'s value written as `text` exactly (1e999 stays 1e999)."""
    return json.dumps({**config, field: "<value>"}).replace('"<value>"', text)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("base"), tiny_gpt(), ByteTokenizer())


def make_adapter(base: Path, folder: Path, rank: int = RANK, seed: int = 1) -> Path:
    """An adapter for `base` in PEFT's format, with random B so it changes the text."""
    model = load_model(base)
    config = LoRAConfig(rank=rank, alpha=2.0 * rank, target_modules=("c_attn",))
    add_lora(model, config)
    torch.manual_seed(seed)
    for name, parameter in model.named_parameters():
        if name.endswith("lora_B"):
            parameter.data.normal_(0, 0.1)
    return save_adapter(model, config, folder)


@pytest.fixture(scope="module")
def good(base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(base, tmp_path_factory.mktemp("good") / "adapter")


def broken_copy(good: Path, folder: Path, case: str) -> Path:
    """A copy of `good` broken as `case` says: a BAD_CONFIGS key, "nan", "inf" or "corrupt"."""
    folder.mkdir(parents=True)
    config = json.loads((good / CONFIG).read_text())
    (folder / CONFIG).write_text(BAD_CONFIGS[case][1](config) if case in BAD_CONFIGS else json.dumps(config))
    tensors = load_file(str(good / WEIGHTS))
    if case in ("nan", "inf"):
        key = sorted(key for key in tensors if "lora_B" in key)[0]
        tensors[key][0, 0] = float(case)
    save_file(tensors, str(folder / WEIGHTS))
    if case == "corrupt":
        data = (folder / WEIGHTS).read_bytes()
        (folder / WEIGHTS).write_bytes(data[: len(data) // 2])  # a header promising bytes that are not there
    return folder


BROKEN: dict[str, tuple[str, str]] = {  # case -> (the file the message names, what it says)
    **{case: (CONFIG, says) for case, (says, _) in BAD_CONFIGS.items()},
    "nan": (WEIGHTS, "NaN or infinite"),
    "inf": (WEIGHTS, "NaN or infinite"),
    "corrupt": (WEIGHTS, "not a readable safetensors file"),
}


@pytest.fixture
def served(base: Path, good: Path) -> LLM:
    """A fresh model with the good adapter loaded as "good" (the server's run-time loads change its adapters)."""
    return LLM.load(base, device="cpu", precision="float32", adapters={"good": str(good)})


def load(url: str, name: str, path: str, http: Any = httpx) -> httpx.Response:
    # json.dumps escapes a lone surrogate as \ud800, which is valid JSON (httpx would refuse to encode it)
    body = json.dumps({"lora_name": name, "lora_path": path})
    return http.post(url + "/v1/load_lora_adapter", content=body, timeout=WAIT_SECONDS)


def unload(url: str, name: str, http: Any = httpx) -> httpx.Response:
    return http.post(url + "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=WAIT_SECONDS)


def listed(url: str) -> dict[str, dict[str, Any]]:
    answer = httpx.get(url + "/v1/models", timeout=WAIT_SECONDS)
    assert answer.status_code == 200, answer.text
    return {card["id"]: card for card in answer.json()["data"]}


@pytest.fixture
def url(served: LLM) -> Iterator[str]:
    with running(served, runtime_lora_updating=True) as address:
        yield address


# ------------------------------------------------------------------------------------------ the one reader
@pytest.mark.parametrize("case", list(BROKEN))
def test_llm_load_refuses_a_broken_adapter_in_one_line_naming_the_file_and_the_field(
    base: Path, good: Path, tmp_path: Path, case: str
) -> None:
    folder = broken_copy(good, tmp_path / "broken", case)
    with pytest.raises(ValueError) as caught:
        LLM.load(base, device="cpu", adapters={"broken": folder})
    file, says = BROKEN[case]
    message = str(caught.value)
    assert str(folder / file) in message and says in message and len(message.splitlines()) == 1


def test_a_config_without_use_rslora_or_lora_alpha_takes_peft_defaults(base: Path, good: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(good, tmp_path / "plain")
    config = json.loads((folder / CONFIG).read_text())
    (folder / CONFIG).write_text(json.dumps({k: v for k, v in config.items() if k not in ("use_rslora", "lora_alpha")}))
    adapter = LLM.load(base, device="cpu", adapters={"plain": folder}).adapters.get("plain")
    assert adapter.config.use_rslora is False and adapter.scaling == 8.0 / RANK


# ------------------------------------------------------------------------------------------ the server at run time
@pytest.mark.slow
@pytest.mark.parametrize("case", list(BROKEN))
def test_a_run_time_load_that_fails_a_check_is_a_400_and_registers_nothing(
    url: str, good: Path, tmp_path: Path, case: str
) -> None:
    folder = broken_copy(good, tmp_path / "broken", case)
    answer = load(url, "broken", str(folder))
    file, says = BROKEN[case]
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "lora_path"
    assert f"{folder / file}" in answer.json()["error"]["message"] and says in answer.json()["error"]["message"]
    assert set(listed(url)) == {MODEL, "good"}


def test_an_unencodable_lora_name_is_a_400_and_the_models_list_still_answers(url: str, good: Path) -> None:
    answer = load(url, "\ud800", str(good))
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "lora_name"
    assert set(listed(url)) == {MODEL, "good"}


def test_a_rank_above_max_lora_rank_is_a_400_saying_so(served: LLM, base: Path, tmp_path: Path) -> None:
    wide = make_adapter(base, tmp_path / "wide", rank=8)
    with running(served, runtime_lora_updating=True, max_lora_rank=RANK) as address:
        answer = load(address, "wide", str(wide))
        assert answer.status_code == 400 and "--max-lora-rank" in answer.json()["error"]["message"]
        assert set(listed(address)) == {MODEL, "good"}


def test_a_load_past_max_cpu_loras_is_a_400_saying_so(served: LLM, good: Path) -> None:
    with running(served, runtime_lora_updating=True, max_cpu_loras=2) as address:
        assert load(address, "second", str(good)).status_code == 200
        answer = load(address, "third", str(good))
        assert answer.status_code == 400 and "--max-cpu-loras" in answer.json()["error"]["message"]
        assert set(listed(address)) == {MODEL, "good", "second"}


@pytest.mark.slow
def test_300_run_time_loads_against_max_cpu_loras_keep_the_number_of_adapters_held_bounded(
    served: LLM, good: Path
) -> None:
    held, loaded, refused = [], [], 0
    with running(served, runtime_lora_updating=True, max_cpu_loras=3) as address, httpx.Client() as http:
        for i in range(300):
            answer = load(address, f"a{i}", str(good), http)
            if answer.status_code == 200:
                loaded.append(f"a{i}")
            else:
                assert answer.status_code == 400 and "--max-cpu-loras" in answer.json()["error"]["message"]
                refused += 1
            held.append(len(served.adapters))
            if i % 3 == 2:  # one unload for three loads: the loads outpace it and meet the cap
                assert unload(address, loaded.pop(0), http).status_code == 200
        cards = listed(address)
    assert max(held) == 3 and len(cards) == 1 + len(served.adapters)
    assert len(loaded) + 100 + refused == 300 and refused > 0  # each load was held (then unloaded) or refused


def test_lora_adapters_past_the_caps_are_refused_when_the_server_starts(served: LLM) -> None:
    from gpt2.serve import uvicorn_server

    with pytest.raises(ValueError, match="--max-lora-rank 2"):
        uvicorn_server(served, ServerConfig(model_name=MODEL, max_lora_rank=2))
    served.adapters.add("other", served.adapters.get("good").given)
    with pytest.raises(ValueError, match="more than --max-cpu-loras 1"):
        uvicorn_server(served, ServerConfig(model_name=MODEL, max_cpu_loras=1))


# ------------------------------------------------------------------------------------------ --lora-root
@pytest.fixture
def roots(base: Path, tmp_path: Path) -> tuple[Path, Path]:
    """An adapter inside the root folder and one outside it."""
    root = tmp_path / "root"
    root.mkdir()
    return make_adapter(base, root / "inside"), make_adapter(base, tmp_path / "outside")


def test_a_lora_path_inside_a_lora_root_loads(served: LLM, roots: tuple[Path, Path]) -> None:
    inside, _ = roots
    with running(served, runtime_lora_updating=True, lora_roots=(str(inside.parent),)) as address:
        assert load(address, "inside", str(inside)).status_code == 200


@pytest.mark.parametrize("way", ["plain", "dot-dot", "symlink"])
def test_a_lora_path_outside_the_lora_roots_is_a_400_however_it_is_spelled(
    served: LLM, roots: tuple[Path, Path], way: str
) -> None:
    inside, outside = roots
    root = inside.parent
    path = {"plain": str(outside), "dot-dot": f"{root}/../{outside.name}", "symlink": str(root / "link")}[way]
    if way == "symlink":
        (root / "link").symlink_to(outside, target_is_directory=True)
    with running(served, runtime_lora_updating=True, lora_roots=(str(root),)) as address:
        answer = load(address, "outside", path)
        assert answer.status_code == 400 and "--lora-root" in answer.json()["error"]["message"]
        assert str(root) not in answer.json()["error"]["message"].replace(path, "")  # the roots stay the server's
        assert set(listed(address)) == {MODEL, "good"}


# ------------------------------------------------------------------------------------------ paths as given
def test_models_shows_each_adapters_root_as_sent_or_as_given_on_the_command_line(
    base: Path, good: Path, tmp_path: Path
) -> None:
    run_folder = tmp_path / "run"  # a `gpt2 finetune --method lora` output folder: the adapter is in run/adapter
    (run_folder / "adapter").mkdir(parents=True)
    for name in (CONFIG, WEIGHTS):
        (run_folder / "adapter" / name).write_bytes((good / name).read_bytes())
    llm = LLM.load(base, device="cpu", precision="float32", adapters={"given": str(run_folder)})
    sent = f"{good}/."
    with running(llm, runtime_lora_updating=True) as address:
        assert load(address, "sent", sent).status_code == 200
        cards = listed(address)
    assert cards["given"]["root"] == str(run_folder) and cards["sent"]["root"] == sent


def test_an_error_names_the_lora_path_as_sent_not_where_a_symlink_leads(url: str, good: Path, tmp_path: Path) -> None:
    target = broken_copy(good, tmp_path / "hidden" / "target", "nan")
    (tmp_path / "link").symlink_to(target, target_is_directory=True)
    message = load(url, "linked", str(tmp_path / "link")).json()["error"]["message"]
    assert str(tmp_path / "link") in message and "hidden" not in message


# ------------------------------------------------------------------------------------------ the command line
def gpt2_command(*args: str, native_kernels: bool = True) -> subprocess.CompletedProcess[str]:
    """`gpt2 ARGS` in a subprocess; native_kernels=False runs it on the PyTorch layouts (for what happens around
    the model, not in its kernels: a process loading the kernels may wait on another's build of them)."""
    environment = {**os.environ, "PYTHONWARNINGS": "ignore", **({} if native_kernels else {"GPT2_NATIVE_KERNELS": "0"})}
    return subprocess.run([sys.executable, "-m", "gpt2.cli", *args], capture_output=True, text=True,
                          timeout=STARTUP_SECONDS, env=environment)  # fmt: skip


def assert_one_line_naming(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert result.returncode != 0 and "Traceback" not in result.stderr
    error = result.stderr.strip()
    assert len(error.splitlines()) == 1 and all(part in error for part in parts), error


@pytest.mark.slow
def test_gpt2_sample_names_a_malformed_adapter_config_in_one_line(base: Path, good: Path, tmp_path: Path) -> None:
    folder = broken_copy(good, tmp_path / "broken", "r 8.9")
    result = gpt2_command("sample", "--model", str(base), "--prompt", "x", "--adapter", f"broken={folder}")
    assert_one_line_naming(result, str(folder / CONFIG), "r must be a positive integer")


@pytest.mark.slow
def test_gpt2_serve_names_an_adapter_with_nan_weights_in_one_line(base: Path, good: Path, tmp_path: Path) -> None:
    folder = broken_copy(good, tmp_path / "broken", "nan")
    result = gpt2_command("serve", str(base), "--lora", f"broken={folder}", "--port", "0")
    assert_one_line_naming(result, str(folder / WEIGHTS), "NaN or infinite")


@pytest.mark.slow
def test_gpt2_serve_names_a_lora_rank_past_max_lora_rank_in_one_line(base: Path, good: Path) -> None:
    result = gpt2_command("serve", str(base), "--lora", f"good={good}", "--max-lora-rank", "2", "--port", "0")
    assert_one_line_naming(result, "'good'", "--max-lora-rank 2")


@pytest.mark.slow
def test_gpt2_export_gguf_lora_names_a_corrupt_safetensors_file_in_one_line(
    base: Path, good: Path, tmp_path: Path
) -> None:
    folder = broken_copy(good, tmp_path / "broken", "corrupt")
    out = tmp_path / "out.gguf"
    result = gpt2_command("export", "--model", str(base), "--format", "gguf-lora", "--adapter", str(folder),
                          "--out", str(out))  # fmt: skip
    assert_one_line_naming(result, str(folder / WEIGHTS), "not a readable safetensors file")
    assert not out.exists()


@pytest.mark.slow
def test_gpt2_export_merging_an_adapter_names_a_non_boolean_use_rslora_in_one_line(
    base: Path, good: Path, tmp_path: Path
) -> None:
    folder = broken_copy(good, tmp_path / "broken", "use_rslora 'false'")
    result = gpt2_command("export", "--model", str(base), "--format", "hf", "--adapter", str(folder),
                          "--out", str(tmp_path / "out"))  # fmt: skip
    assert_one_line_naming(result, str(folder / CONFIG), "use_rslora must be true or false")
