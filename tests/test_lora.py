"""LoRA adapters (gpt2.finetune.lora): merging changes nothing, PEFT reads ours and we read PEFT's, only the
adapters train, and `finetune(lora=True)` writes the adapter and the merged model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpt2.api import LLM
from gpt2.finetune import FinetuneConfig, LoRAConfig, add_lora, finetune, load_adapter, merge_lora, save_adapter
from gpt2.finetune.lora import LoRALinear
from gpt2.train.checkpoint import latest_checkpoint
from gpt2.weights import load_model

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

IDS = torch.tensor([[464, 3797, 3332, 319, 262, 2603, 13, 198]])


@pytest.fixture
def pretrained(tmp_path: Path) -> Path:
    """A tiny random GPT-2 made and saved by transformers."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    directory = tmp_path / "pretrained"
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    return directory


def randomize_adapters(model: torch.nn.Module) -> None:
    """B starts at zero (a no-op adapter); random B makes the comparisons mean something."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.copy_(torch.randn(module.lora_B.shape, generator=generator) * 0.1)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(IDS).logits


def test_a_fresh_adapter_changes_nothing_and_only_adapters_train(pretrained: Path) -> None:
    model = load_model(pretrained)
    before = logits(model)
    add_lora(model, LoRAConfig(rank=4, target_modules=("c_attn", "c_proj", "c_fc")))
    torch.testing.assert_close(logits(model), before, atol=0, rtol=0)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(name.endswith(("lora_A", "lora_B")) for name in trainable)
    assert len(trainable) == 2 * 4 * 2  # A and B for 4 layers (c_attn, attn.c_proj, c_fc, mlp.c_proj) x 2 blocks


def test_a_model_whose_target_layers_are_not_linear_is_refused_as_peft_refuses(pretrained: Path) -> None:
    model = load_model(pretrained)
    for block in model.transformer.h:
        block.attn.c_attn = torch.nn.Identity()  # as a model prepared for inference may hold it in another form
    with pytest.raises(ValueError, match="target modules c_attn are no linear layers of this model"):
        add_lora(model, LoRAConfig(rank=2, target_modules=("c_attn", "c_fc")))
    assert not any(isinstance(module, LoRALinear) for module in model.modules())  # nothing half-wrapped


def test_merged_logits_equal_unmerged_logits(pretrained: Path) -> None:
    model = add_lora(load_model(pretrained), LoRAConfig(rank=4, target_modules=("c_attn", "c_fc")))
    randomize_adapters(model)
    unmerged = logits(model)
    merge_lora(model)
    assert not any(isinstance(module, LoRALinear) for module in model.modules())
    torch.testing.assert_close(logits(model), unmerged, atol=1e-5, rtol=1e-5)


def test_peft_loads_our_adapter_with_the_same_logits(pretrained: Path, tmp_path: Path) -> None:
    config = LoRAConfig(rank=4, alpha=8, target_modules=("c_attn", "c_proj"))
    model = add_lora(load_model(pretrained), config)
    randomize_adapters(model)
    save_adapter(model, config, tmp_path / "adapter")
    keys = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")).keys()
    assert "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight" in keys
    base = transformers.GPT2LMHeadModel.from_pretrained(pretrained)
    theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter")
    torch.testing.assert_close(logits(theirs), logits(model), atol=1e-5, rtol=1e-5)


def test_we_load_an_adapter_made_by_peft(pretrained: Path, tmp_path: Path) -> None:
    base = transformers.GPT2LMHeadModel.from_pretrained(pretrained)
    lora = peft.LoraConfig(r=4, lora_alpha=16, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                           init_lora_weights=False, task_type="CAUSAL_LM")  # fmt: skip
    torch.manual_seed(2)
    theirs = peft.get_peft_model(base, lora)  # init_lora_weights=False: B is random, the adapter does something
    theirs.save_pretrained(tmp_path / "peft")
    model = load_model(pretrained)
    config = load_adapter(model, tmp_path / "peft")
    assert config.rank == 4 and set(config.target_modules) == {"c_attn", "c_fc"}
    torch.testing.assert_close(logits(model), logits(theirs), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_lora_finetune_writes_the_adapter_and_the_merged_model(
    pretrained: Path, tmp_path: Path, gpt2_bpe_dir: Path
) -> None:
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(gpt2_bpe_dir / name, pretrained / name)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q{i}: ", "completion": "yes"}) + "\n" for i in range(20)))
    out = tmp_path / "out"
    config = FinetuneConfig.from_overrides(model=str(pretrained), data=str(data), out_dir=str(out), lora=True,
                                           lora_rank=2, block_size=16, batch_size=4, max_steps=6, eval_interval=3,
                                           sample_tokens=0, device="cpu", dtype="float32", seed=0)  # fmt: skip
    result = finetune(config)
    assert result.best_val_loss < result.first_val_loss
    checkpoint = load_file(str(latest_checkpoint(out) / "trainable.safetensors"))  # the adapters only
    assert checkpoint and all(name.endswith(("lora_A", "lora_B")) for name in checkpoint)
    # the merged model (a plain HF directory) computes what the base plus PEFT's view of our adapter computes
    merged = LLM.load(out, device="cpu").model
    base = transformers.GPT2LMHeadModel.from_pretrained(pretrained)
    with_adapter = peft.PeftModel.from_pretrained(base, out / "adapter")
    torch.testing.assert_close(logits(merged), logits(with_adapter), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_gpt2_chat_merges_an_adapter_made_by_peft(pretrained: Path, tmp_path: Path, gpt2_bpe_dir: Path,
                                                  capsys, monkeypatch) -> None:  # fmt: skip
    import io

    from gpt2.cli import main

    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(gpt2_bpe_dir / name, pretrained / name)
    base = transformers.GPT2LMHeadModel.from_pretrained(pretrained)
    lora = peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    peft.get_peft_model(base, lora).save_pretrained(tmp_path / "peft")
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    args = ["chat", "--model", str(pretrained), "--adapter", str(tmp_path / "peft"), "--max-new-tokens", "3"]
    assert main([*args, "--seed", "0", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count("assistant> ") == 1
