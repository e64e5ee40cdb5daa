"""Many LoRA adapters on one base model (gpt2.weights.adapters, gpt2.inference.lora_batch, LLM's adapters):
prompts with different adapters decode in one batch, each as the merged fine-tune and as transformers + PEFT
decode it; an adapter costs its own size; adapters that do not fit the base are refused at load."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import shared_file
from gpt2.api import LLM
from gpt2.finetune.lora import LoRAConfig, LoRALinear, add_lora, save_adapter
from gpt2.inference.generation import generate, left_pad
from gpt2.inference.lora_batch import AdaptedLinear, DuplicateAdapterError, UnknownAdapterError
from gpt2.inference.sampling import SamplingParams
from gpt2.weights import load_model
from gpt2.weights.adapters import read_lora_adapter

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

PROMPTS = ["The quick brown fox", "Once upon a time", "To be, or not", "A"]
ADAPTER_OF_PROMPT = ["style", None, "terse", "style"]
GREEDY = SamplingParams(max_tokens=12, temperature=0)
PEFT_ADAPTERS = {  # name -> (rank, targets, seed)
    "style": (4, ["c_attn", "c_fc"], 2),
    "terse": (2, ["c_attn", "c_proj"], 3),
}


def tokenizer_files(directory: Path, gpt2_bpe_dir: Path) -> None:
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(gpt2_bpe_dir / name, directory / name)


def tiny_gpt2(directory: Path, width: int = 64, depth: int = 2) -> Path:
    """A tiny random GPT-2 made and saved by transformers."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=width, n_layer=depth, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


@pytest.fixture
def base(tmp_path: Path, gpt2_bpe_dir: Path) -> Path:
    """tiny_gpt2 with GPT-2's tokenizer beside it."""
    tokenizer_files(tiny_gpt2(tmp_path / "base"), gpt2_bpe_dir)
    return tmp_path / "base"


def peft_adapter(base: Path, directory: Path, rank: int, targets: list[str], seed: int) -> Path:
    """An adapter made and saved by PEFT, with random B (init_lora_weights=False) so it changes the text."""
    model = transformers.GPT2LMHeadModel.from_pretrained(base)
    config = peft.LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, fan_in_fan_out=True,
                             init_lora_weights=False, task_type="CAUSAL_LM")  # fmt: skip
    torch.manual_seed(seed)
    peft.get_peft_model(model, config).save_pretrained(directory)
    return directory


@pytest.fixture
def adapters(base: Path, tmp_path: Path) -> dict[str, Path]:
    return {name: peft_adapter(base, tmp_path / name, *spec) for name, spec in PEFT_ADAPTERS.items()}


def merged_copy(base: Path, adapter: Path, directory: Path, gpt2_bpe_dir: Path) -> Path:
    """The base with the adapter merged in by PEFT, saved as a plain model: the one-fine-tune-one-model way."""
    model = peft.PeftModel.from_pretrained(transformers.GPT2LMHeadModel.from_pretrained(base), adapter)
    model.merge_and_unload().save_pretrained(directory)
    tokenizer_files(directory, gpt2_bpe_dir)
    return directory


def peft_greedy_ids(base: Path, adapter: Path | None, prompt_ids: list[int], steps: int) -> list[int]:
    model = transformers.GPT2LMHeadModel.from_pretrained(base)
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter)
    with torch.no_grad():
        out = model.eval().generate(torch.tensor([prompt_ids]), max_new_tokens=steps, min_new_tokens=steps,
                                    do_sample=False, pad_token_id=0)  # fmt: skip
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.slow
def test_one_mixed_batch_decodes_each_prompt_as_its_merged_fine_tune_and_peft(
    base: Path, adapters: dict[str, Path], tmp_path: Path, gpt2_bpe_dir: Path
) -> None:
    llm = LLM.load(base, device="cpu", precision="float32", adapters=adapters)
    texts = llm.generate(PROMPTS, GREEDY, adapter=ADAPTER_OF_PROMPT)
    merged = {
        name: LLM.load(merged_copy(base, path, tmp_path / f"merged-{name}", gpt2_bpe_dir), precision="float32")
        for name, path in adapters.items()
    }
    plain = LLM.load(base, device="cpu", precision="float32")
    for prompt, name, text in zip(PROMPTS, ADAPTER_OF_PROMPT, texts, strict=True):
        alone = (plain if name is None else merged[name]).generate(prompt, GREEDY)
        assert text == alone, (prompt, name)
    # the adapters change the text: the comparison above is not between copies of the base's output
    assert llm.generate(PROMPTS, GREEDY) != texts


@pytest.mark.slow
def test_mixed_batch_tokens_equal_transformers_with_peft_token_for_token(base: Path, adapters: dict[str, Path]) -> None:
    llm = LLM.load(base, device="cpu", precision="float32", adapters=adapters)
    prompt_ids = [llm.tokenizer.encode(prompt) for prompt in PROMPTS]
    idx, mask = left_pad(prompt_ids, pad_token_id=0)
    rows = llm.adapters.resolve(ADAPTER_OF_PROMPT, len(PROMPTS))
    with llm.adapters.routed(rows) as model:
        ours = generate(model, idx, 12, temperature=0, attention_mask=mask)[:, idx.size(1) :].tolist()
    for ids, name, tokens in zip(prompt_ids, ADAPTER_OF_PROMPT, ours, strict=True):
        theirs = peft_greedy_ids(base, None if name is None else adapters[name], ids, 12)
        assert tokens == theirs, name


@pytest.mark.slow
def test_a_lone_prompt_and_its_samples_take_the_named_adapter(base: Path, adapters: dict[str, Path]) -> None:
    llm = LLM.load(base, device="cpu", precision="float32", adapters=adapters)
    batch = llm.generate(PROMPTS, GREEDY, adapter="terse")
    alone = [llm.generate(prompt, GREEDY, adapter="terse")[0] for prompt in PROMPTS]
    assert [texts[0] for texts in batch] == alone
    streamed = "".join(llm.stream(PROMPTS[0], GREEDY, adapter="terse"))
    assert streamed == alone[0]
    sampled = SamplingParams(max_tokens=8, temperature=0.8, seed=5, n=2)
    mixed = llm.generate(PROMPTS[:2], sampled, adapter=["terse", "style"])
    assert mixed[0] == llm.generate(PROMPTS[:1], sampled, adapter="terse")[0]


@pytest.mark.slow
def test_the_mixed_batch_adds_the_low_rank_update_to_the_float32_path_without_the_native_decoder(
    base: Path, adapters: dict[str, Path]
) -> None:
    llm = LLM.load(base, device="cpu", precision="float32", adapters=adapters)
    rows = llm.adapters.resolve(ADAPTER_OF_PROMPT, len(PROMPTS))
    with llm.adapters.routed(rows) as model:
        adapted = [module for module in model.modules() if isinstance(module, AdaptedLinear)]
        assert len(adapted) == 4 * 2  # c_attn, attn.c_proj, c_fc, mlp.c_proj in both blocks
        assert all(type(module.base) is type(llm.model.lm_head) for module in adapted)  # the base's own layers
    assert not any(isinstance(module, AdaptedLinear) for module in llm.model.modules())  # the base is untouched


@pytest.mark.slow
def test_an_adapter_costs_its_own_size_not_a_model_copy(base: Path, adapters: dict[str, Path]) -> None:
    llm = LLM.load(base, device="cpu", precision="float32")
    before = {id(parameter): parameter.data_ptr() for parameter in llm.model.parameters()}
    for name, path in adapters.items():
        adapter = llm.adapters.add(name, path)
        stored = load_file(str(path / "adapter_model.safetensors"))
        assert adapter.nbytes == sum(tensor.numel() * 4 for tensor in stored.values())  # float32, as stored
    model = llm.adapters.model_for(llm.adapters.get("style"))
    assert {id(parameter): parameter.data_ptr() for parameter in model.parameters()} == before  # shared weights
    assert sum(tensor.numel() for tensor in model.state_dict().values()) == sum(
        tensor.numel() for tensor in llm.model.state_dict().values()
    )


@pytest.mark.slow
def test_a_gpt2_finetune_output_folder_is_an_adapter(base: Path, tmp_path: Path) -> None:
    model = add_lora(load_model(base), LoRAConfig(rank=2, target_modules=("c_fc",)))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_(std=0.5)
    save_adapter(model, LoRAConfig(rank=2, target_modules=("c_fc",)), tmp_path / "run" / "adapter")
    llm = LLM.load(base, device="cpu", precision="float32", adapters={"run": tmp_path / "run"})
    assert llm.adapters.get("run").source == tmp_path / "run" / "adapter"
    ids = torch.tensor([llm.tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        expected = model.eval()(ids).logits
        got = llm.adapters.model_for(llm.adapters.get("run"))(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.slow
def test_an_unknown_adapter_name_is_refused_naming_the_loaded_ones(base: Path, adapters: dict[str, Path]) -> None:
    llm = LLM.load(base, device="cpu", adapters=adapters)
    with pytest.raises(UnknownAdapterError, match="no adapter named 'nope' is loaded \\(loaded: 'style', 'terse'\\)"):
        llm.generate(PROMPTS, GREEDY, adapter=["style", "nope", None, None])


@pytest.mark.slow
def test_the_same_name_twice_is_refused(base: Path, adapters: dict[str, Path]) -> None:
    llm = LLM.load(base, device="cpu", adapters=adapters)
    with pytest.raises(DuplicateAdapterError, match="'style' is already loaded"):
        llm.adapters.add("style", adapters["terse"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("width", "depth", "message"),
    [(32, 2, "lora_A \\(2, 32\\).*needs \\(2, 64\\).*another base model"),
     (64, 3, "transformer.h.2.attn.c_attn.* is for no layer this base model adapts")],
    ids=["narrower", "deeper"],
)  # fmt: skip
def test_an_adapter_for_another_base_shape_is_refused_at_load(
    base: Path, tmp_path: Path, width: int, depth: int, message: str
) -> None:
    other = peft_adapter(tiny_gpt2(tmp_path / "other", width, depth), tmp_path / "other-adapter", 2, ["c_attn"], 0)
    with pytest.raises(ValueError, match=message):
        LLM.load(base, device="cpu", adapters={"other": other})


def edited_copy(adapter: Path, folder: Path, **config_changes: object) -> Path:
    """A copy of the adapter folder whose adapter_config.json has `config_changes`."""
    shutil.copytree(adapter, folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **config_changes}))
    return folder


@pytest.mark.slow
def test_a_rank_other_than_the_config_says_is_refused(base: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    folder = edited_copy(adapters["terse"], tmp_path / "lying", r=3)
    with pytest.raises(ValueError, match="with rank 3 needs"):
        LLM.load(base, device="cpu", adapters={"lying": folder})


@pytest.mark.slow
def test_a_target_module_the_base_lacks_is_refused(base: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    folder = edited_copy(adapters["terse"], tmp_path / "qproj", target_modules=["q_proj", "v_proj"])
    with pytest.raises(ValueError, match="target_modules \\['q_proj', 'v_proj'\\] must be some of"):
        LLM.load(base, device="cpu", adapters={"qproj": folder})


def test_missing_tensors_are_refused(base: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "half"
    shutil.copytree(adapters["terse"], folder)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    kept = {key: value for key, value in tensors.items() if ".h.1." not in key}
    save_file(kept, folder / "adapter_model.safetensors")
    with pytest.raises(ValueError, match="lacks lora_A or lora_B of transformer.h.1"):
        read_lora_adapter(folder, load_model(base).config, "half")


# ------------------------------------------------------------------------------------------ command line
@pytest.mark.slow
def test_gpt2_sample_decodes_with_an_adapter(base: Path, adapters: dict[str, Path], capsys) -> None:
    from gpt2.cli import main

    args = ["sample", "--model", str(base), "--prompt", PROMPTS[0], "--temperature", "0", "--max-new-tokens", "12"]
    assert main([*args, "--no-echo", "--device", "cpu", "--adapter", f"style={adapters['style']}"]) == 0
    expected = LLM.load(base, device="cpu", precision="float32", adapters=adapters).generate(
        PROMPTS[0], GREEDY, adapter="style"
    )
    assert capsys.readouterr().out == expected[0] + "\n"


def test_gpt2_sample_names_an_adapter_that_does_not_fit_in_one_line(base: Path, tmp_path: Path, capsys) -> None:
    from gpt2.cli import main

    args = ["sample", "--model", str(base), "--prompt", "x", "--device", "cpu", "--adapter", f"a={tmp_path}"]
    assert main(args) != 0
    error = capsys.readouterr().err.strip()
    assert "adapter_config.json does not exist" in error and len(error.splitlines()) == 1


# ------------------------------------------------------------------------------------------ GGUF LoRA
LLAMA_CPP_BIN = "GPT2_LLAMA_CPP_BIN"  # a llama.cpp build's bin folder (llama-completion or llama-cli): opt-in test


@pytest.fixture
def gguf_base(tmp_path: Path) -> Path:
    """gguf-tiny's HF model (weights N(0, 0.1): decisive greedy choices), copied so adapters can sit beside it."""
    directory = tmp_path / "gguf-base"
    shutil.copytree(shared_file("fixtures/gguf-tiny/hf"), directory)
    return directory


@pytest.mark.slow
def test_gguf_lora_holds_what_llamacpp_loads(base: Path, adapters: dict[str, Path], tmp_path: Path) -> None:
    from gpt2.cli import main

    gguf = pytest.importorskip("gguf")
    out = tmp_path / "style.gguf"
    args = ["export", "--model", str(base), "--format", "gguf-lora", "--dtype", "f32"]
    assert main([*args, "--adapter", str(adapters["style"]), "--out", str(out)]) == 0
    reader = gguf.GGUFReader(out)
    fields = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert fields["general.architecture"] == "gpt2" and fields["general.type"] == "adapter"
    assert fields["adapter.type"] == "lora" and fields["general.name"] == "style"
    assert fields["adapter.lora.alpha"] == 8.0  # PEFT_ADAPTERS' style: rank 4, alpha 8
    stored = load_file(str(adapters["style"] / "adapter_model.safetensors"))
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    assert len(tensors) == len(stored) == 2 * 2 * 2  # A and B of c_attn and c_fc in 2 blocks
    qkv_a, up_b = tensors["blk.0.attn_qkv.weight.lora_a"], tensors["blk.1.ffn_up.weight.lora_b"]
    assert list(qkv_a.shape) == [64, 4] and list(up_b.shape) == [4, 256]  # ggml's {in, r}, {r, out}
    peft_key = "base_model.model.transformer.h.{}.{}.lora_{}.weight"
    np.testing.assert_array_equal(qkv_a.data, stored[peft_key.format(0, "attn.c_attn", "A")].numpy())
    np.testing.assert_array_equal(up_b.data, stored[peft_key.format(1, "mlp.c_fc", "B")].numpy())


def test_gguf_lora_refuses_an_adapter_for_another_base(adapters: dict[str, Path], gguf_base: Path, tmp_path: Path):
    from gpt2.export.gguf_lora import export_gguf_lora

    with pytest.raises(ValueError, match="another base model"):
        export_gguf_lora(load_model(gguf_base).config, adapters["style"], tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.skipif(LLAMA_CPP_BIN not in os.environ, reason=f"set {LLAMA_CPP_BIN} to a llama.cpp build's bin folder")
def test_llama_server_applies_our_gguf_lora_with_our_greedy_text(gguf_base: Path, tmp_path: Path) -> None:
    from gpt2.cli import main

    adapter = peft_adapter(gguf_base, tmp_path / "adapter", 4, ["c_attn", "c_proj", "c_fc"], 7)
    assert main(["export", "--model", str(gguf_base), "--format", "gguf", "--dtype", "f32",
                 "--out", str(tmp_path / "base.gguf")]) == 0  # fmt: skip
    assert main(["export", "--model", str(gguf_base), "--format", "gguf-lora", "--dtype", "f32",
                 "--adapter", str(adapter), "--out", str(tmp_path / "lora.gguf")]) == 0  # fmt: skip
    prompt, greedy = "The quick brown fox", SamplingParams(max_tokens=16, temperature=0)
    llm = LLM.load(gguf_base, device="cpu", precision="float32", adapters={"a": adapter})
    ours = llm.generate(prompt, greedy, adapter="a")[0]
    assert ours != llm.generate(prompt, greedy)[0]  # the adapter changes the text
    server = Path(os.environ[LLAMA_CPP_BIN]) / "llama-server"
    assert llama_server_completion(server, tmp_path / "base.gguf", tmp_path / "lora.gguf", prompt, 16) == ours


def llama_server_completion(server: Path, model: Path, lora: Path, prompt: str, steps: int) -> str:
    """llama-server's greedy continuation of `prompt` by `model` with the adapter `lora` applied (its /completion)."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(server),
        "-m",
        str(model),
        "--lora",
        str(lora),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
        "-t",
        "2",
    ]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            assert process.poll() is None, process.stderr.read().decode()[-2000:] if process.stderr else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        body = {"prompt": prompt, "n_predict": steps, "temperature": 0, "cache_prompt": False}
        response = httpx.post(f"{url}/completion", json=body, timeout=60)
        response.raise_for_status()
        return str(response.json()["content"])
    finally:
        process.terminate()
        process.wait(timeout=30)
