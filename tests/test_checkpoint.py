"""Checkpoint interop: our GPT computes exactly what transformers' GPT2LMHeadModel computes on the same weights,
and reads/writes the formats real GPT-2 checkpoints come in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt2 import GPT, GPTConfig
from gpt2.weights import load_llmc, load_model, save_pretrained

transformers = pytest.importorskip("transformers")

# (name, n_layer, n_head, n_embd, block_size, vocab_size): the full 124M shape, a tiny one and an odd one.
PARITY_CONFIGS = [
    pytest.param("gpt2-124M-shape", 12, 12, 768, 1024, 50257, marks=pytest.mark.slow),
    ("tiny", 2, 4, 64, 128, 1000),
    ("odd", 3, 3, 48, 77, 517),
]


def random_hf_model(n_layer, n_head, n_embd, block_size, vocab_size, seed=0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=block_size, vocab_size=vocab_size
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # non-trivial biases and LayerNorm parameters, so every term of the forward counts
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.05)
    return model


def assert_same_outputs(ours: GPT, theirs, vocab_size: int, T: int) -> None:
    torch.manual_seed(1)
    idx = torch.randint(0, vocab_size, (2, T))
    with torch.no_grad():
        hf = theirs(idx, labels=idx)
        logits, loss = ours(idx[:, :-1], targets=idx[:, 1:])  # ours takes next-token targets, HF shifts labels
        full = ours(idx).logits
    assert (full - hf.logits).abs().max().item() <= 1e-4
    assert torch.allclose(logits, hf.logits[:, :-1], atol=1e-4)
    assert abs(loss.item() - hf.loss.item()) <= 1e-5


@pytest.mark.parametrize("name, n_layer, n_head, n_embd, block_size, vocab_size", PARITY_CONFIGS)
def test_hf_directory_loads_and_matches_transformers(tmp_path, name, n_layer, n_head, n_embd, block_size, vocab_size):
    theirs = random_hf_model(n_layer, n_head, n_embd, block_size, vocab_size)
    theirs.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    assert ours.config.n_layer == n_layer and ours.config.block_size == block_size
    assert_same_outputs(ours, theirs, vocab_size, T=min(block_size, 96))


@pytest.mark.parametrize("name, n_layer, n_head, n_embd, block_size, vocab_size", PARITY_CONFIGS)
def test_our_save_pretrained_loads_in_transformers_and_matches(
    tmp_path, name, n_layer, n_head, n_embd, block_size, vocab_size
):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, vocab_size=vocab_size))
    ours.eval()
    save_pretrained(ours, tmp_path)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert_same_outputs(ours, theirs, vocab_size, T=min(block_size, 96))


def test_full_context_parity_on_the_odd_config(tmp_path):
    theirs = random_hf_model(3, 3, 48, 77, 517, seed=3)
    theirs.save_pretrained(tmp_path)
    assert_same_outputs(load_model(tmp_path), theirs, 517, T=77)


def test_bias_free_model_saves_as_zero_biases_transformers_computes_identically(tmp_path):
    torch.manual_seed(0)
    ours = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=50, bias=False)).eval()
    save_pretrained(ours, tmp_path)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert_same_outputs(ours, theirs, 50, T=16)


# ----------------------------------------------------------------------- shared fixtures (no transformers)
def test_hf_tiny_fixture_reproduces_the_recorded_logits_and_loss(fixtures_dir):
    expected = json.loads((fixtures_dir / "expected.json").read_text())
    model = load_model(fixtures_dir / "hf-tiny")
    idx = torch.tensor(expected["input_ids"])
    with torch.no_grad():
        logits = model(idx).logits
        _, loss = model(idx[:, :-1], targets=idx[:, 1:])
    assert (logits[:, -1] - torch.tensor(expected["logits_last"])).abs().max() <= 1e-5
    assert logits[:, -1].argmax(-1).tolist() == expected["argmax_last"]
    assert abs(loss.item() - expected["loss"]) <= 2e-6


@pytest.mark.parametrize(
    "filename, key, tolerance", [("model_fp32.bin", None, 1e-5), ("model_bf16.bin", "bf16_weights", 1e-4)]
)
def test_llmc_checkpoints_reproduce_the_recorded_logits(fixtures_dir, filename, key, tolerance):
    expected = json.loads((fixtures_dir / "expected.json").read_text())
    reference = expected[key] if key else expected
    model = load_llmc(fixtures_dir / "llmc-tiny" / filename)
    with torch.no_grad():
        logits = model(torch.tensor(expected["input_ids"])).logits
    assert (logits[:, -1] - torch.tensor(reference["logits_last"])).abs().max() <= tolerance


# ------------------------------------------------------------------------------ layouts and keys
@pytest.fixture
def saved_tiny(tmp_path) -> tuple[GPT, Path]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=40)).eval()
    save_pretrained(model, tmp_path / "ref")
    return model, tmp_path


def same_weights(a: GPT, b: GPT) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=False))


def test_saved_files_use_conv1d_layout_with_prefixed_keys_and_no_lm_head(saved_tiny):
    model, tmp = saved_tiny
    tensors = load_file(tmp / "ref" / "model.safetensors")
    assert "lm_head.weight" not in tensors
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (16, 48)  # [in, out]
    assert tensors["transformer.h.0.mlp.c_proj.weight"].shape == (64, 16)
    assert torch.equal(tensors["transformer.h.1.mlp.c_fc.weight"], model.transformer.h[1].mlp.c_fc.weight.t())


def test_unprefixed_keys_with_attention_mask_buffers_load_like_the_hub_gpt2_file(saved_tiny):
    """The real `gpt2` repo stores `h.0.attn.c_attn.weight`, `wte.weight` and `h.N.attn.bias` mask buffers."""
    model, tmp = saved_tiny
    tensors = load_file(tmp / "ref" / "model.safetensors")
    hub_style = {key.removeprefix("transformer."): t for key, t in tensors.items()}
    for layer in range(2):
        hub_style[f"h.{layer}.attn.bias"] = torch.ones(1, 1, 8, 8).tril()
        hub_style[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    (tmp / "hub").mkdir()
    save_file(hub_style, tmp / "hub" / "model.safetensors")
    (tmp / "hub" / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    assert same_weights(load_model(tmp / "hub"), model)


def test_sharded_safetensors_with_index_load(saved_tiny):
    model, tmp = saved_tiny
    tensors = load_file(tmp / "ref" / "model.safetensors")
    shard_dir = tmp / "sharded"
    shard_dir.mkdir()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for filename, keys in halves.items():
        save_file({k: tensors[k] for k in keys}, shard_dir / filename)
        weight_map.update({k: filename for k in keys})
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (shard_dir / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    assert same_weights(load_model(shard_dir), model)


def test_pytorch_model_bin_loads_with_weights_only(saved_tiny):
    model, tmp = saved_tiny
    legacy = tmp / "legacy"
    legacy.mkdir()
    torch.save(load_file(tmp / "ref" / "model.safetensors"), legacy / "pytorch_model.bin")
    (legacy / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    assert same_weights(load_model(legacy), model)


class _Payload:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path('PWNED').write_text('ran')",))


def test_pickle_payload_in_pytorch_model_bin_is_refused_without_running(saved_tiny, monkeypatch):
    _, tmp = saved_tiny
    evil = tmp / "evil"
    evil.mkdir()
    monkeypatch.chdir(evil)
    torch.save({"transformer.wte.weight": torch.zeros(40, 16), "x": _Payload()}, evil / "pytorch_model.bin")
    (evil / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    with pytest.raises(ValueError, match="could not be read as plain tensors"):
        load_model(evil)
    assert not (evil / "PWNED").exists()


def rewrite(tmp: Path, change) -> Path:
    tensors = load_file(tmp / "ref" / "model.safetensors")
    change(tensors)
    out = tmp / "changed"
    out.mkdir(exist_ok=True)
    save_file(tensors, out / "model.safetensors")
    (out / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    return out


def test_missing_tensor_is_named(saved_tiny):
    _, tmp = saved_tiny
    path = rewrite(tmp, lambda t: t.pop("transformer.h.1.ln_2.weight"))
    with pytest.raises(ValueError, match=r"missing tensors: \['transformer.h.1.ln_2.weight'\]"):
        load_model(path)


def test_unexpected_tensor_is_named(saved_tiny):
    _, tmp = saved_tiny
    path = rewrite(tmp, lambda t: t.update({"transformer.h.2.ln_1.weight": torch.ones(16)}))
    with pytest.raises(ValueError, match=r"unexpected tensors: \['transformer.h.2.ln_1.weight'\]"):
        load_model(path)


def test_misshapen_tensor_names_both_shapes(saved_tiny):
    _, tmp = saved_tiny
    path = rewrite(tmp, lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(48, 16)}))
    with pytest.raises(
        ValueError,
        match=r"transformer.h.0.attn.c_attn.weight has shape \(48, 16\) in the checkpoint "
        r"but the config needs \(16, 48\)",
    ):
        load_model(path)


def test_untied_head_is_refused(saved_tiny):
    _, tmp = saved_tiny
    path = rewrite(tmp, lambda t: t.update({"lm_head.weight": torch.randn(40, 16)}))
    with pytest.raises(ValueError, match="lm_head.weight differs from wte.weight"):
        load_model(path)


def test_non_gpt2_activation_is_refused(saved_tiny):
    _, tmp = saved_tiny
    config = json.loads((tmp / "ref" / "config.json").read_text())
    config["activation_function"] = "gelu"
    (tmp / "ref" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="activation_function 'gelu' is not GPT-2's tanh GELU"):
        load_model(tmp / "ref")


def test_directory_without_weights_says_what_it_expected(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"vocab_size": 10, "n_positions": 8, "n_layer": 1, "n_head": 1, "n_embd": 4})
    )
    with pytest.raises(FileNotFoundError, match="expected model.safetensors"):
        load_model(tmp_path)


def test_config_overrides_apply_on_load(saved_tiny):
    model, tmp = saved_tiny
    explicit = load_model(tmp / "ref", attn_impl="explicit", dropout=0.1)
    assert explicit.config.attn_impl == "explicit" and explicit.config.dropout == 0.1
    assert same_weights(explicit, model)


def test_hub_name_offline_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="'gpt2' is not a local directory and could not be fetched"):
        load_model("gpt2")


def test_local_path_that_does_not_exist_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nowhere")


# --------------------------------------------------------------------------- OpenAI TensorFlow release
def test_openai_tf_checkpoint_reproduces_the_recorded_logits(fixtures_dir):
    expected = json.loads((fixtures_dir / "expected.json").read_text())
    model = load_model(fixtures_dir / "openai-tf-tiny")  # hparams.json + model.ckpt.*, no TensorFlow
    with torch.no_grad():
        logits = model(torch.tensor(expected["input_ids"])).logits
    assert (logits[:, -1] - torch.tensor(expected["logits_last"])).abs().max() <= 1e-5


def test_all_three_fixture_formats_hold_identical_weights(fixtures_dir):
    tf = load_model(fixtures_dir / "openai-tf-tiny")
    hf = load_model(fixtures_dir / "hf-tiny")
    llmc = load_model(fixtures_dir / "llmc-tiny" / "model_fp32.bin")
    assert same_weights(tf, hf) and same_weights(llmc, hf)


def test_tf_variable_names_map_to_ours():
    from gpt2.weights import tf_name_to_hf

    assert tf_name_to_hf("model/wte") == "transformer.wte.weight"
    assert tf_name_to_hf("model/h11/attn/c_attn/w") == "transformer.h.11.attn.c_attn.weight"
    assert tf_name_to_hf("model/h0/ln_1/g") == "transformer.h.0.ln_1.weight"
    assert tf_name_to_hf("model/ln_f/b") == "transformer.ln_f.bias"


def test_tf_checkpoint_with_a_missing_data_file_names_it(fixtures_dir, tmp_path):
    import shutil

    for name in ("hparams.json", "checkpoint", "model.ckpt.index"):
        shutil.copy(fixtures_dir / "openai-tf-tiny" / name, tmp_path / name)
    with pytest.raises(FileNotFoundError, match="model.ckpt.data-00000-of-00001 is missing"):
        load_model(tmp_path)


def test_truncated_llmc_file_is_refused(fixtures_dir, tmp_path):
    truncated = tmp_path / "model.bin"
    truncated.write_bytes((fixtures_dir / "llmc-tiny" / "model_fp32.bin").read_bytes()[:-100])
    with pytest.raises(ValueError, match="its header describes a 176640-byte checkpoint"):
        load_model(truncated)


# --------------------------------------------------------------------------- bad files, one line each
def test_truncated_safetensors_is_one_line_naming_the_file(saved_tiny, tmp_path):
    _, tmp = saved_tiny
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes((tmp / "ref" / "model.safetensors").read_bytes()[:300])
    with pytest.raises(ValueError, match="model.safetensors is not a readable safetensors file") as caught:
        load_model(broken)
    assert "\n" not in str(caught.value)


def test_garbage_safetensors_is_refused_as_corrupt(saved_tiny, tmp_path):
    _, tmp = saved_tiny
    (tmp_path / "config.json").write_text((tmp / "ref" / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        load_model(tmp_path)


def test_config_of_another_architecture_names_the_file(saved_tiny, tmp_path):
    _, tmp = saved_tiny
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 10}))
    with pytest.raises(ValueError, match=r"config.json: config.json has model_type 'llama'; only 'gpt2'"):
        load_model(tmp_path)


def test_empty_directory_says_it_is_empty_and_what_was_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"is not a GPT-2 checkpoint \(it is empty\): expected a HF-format"):
        load_model(tmp_path)


def test_every_format_builds_on_the_meta_device_without_a_random_init(fixtures_dir, monkeypatch):
    """GPT-2's init (which would cost seconds at 1.5B) only ever runs on meta tensors before a load's copy."""
    initialised_on = []
    real = GPT.reset_parameters

    def recording(self):
        initialised_on.append(self.transformer.wte.weight.device.type)
        real(self)

    monkeypatch.setattr(GPT, "reset_parameters", recording)
    load_model(fixtures_dir / "hf-tiny")
    load_model(fixtures_dir / "llmc-tiny" / "model_fp32.bin")
    load_model(fixtures_dir / "openai-tf-tiny")
    assert initialised_on == ["meta", "meta", "meta"]
