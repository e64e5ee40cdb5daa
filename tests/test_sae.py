"""gpt2.inspect.sae: SAEs made and saved by SAELens load here with the same feature activations, one trained
here loads in SAELens with the same activations, and the SAE spliced into the forward gives the loss a hand
computation gives.

SAELens (sae-lens 6.x) pins transformer-lens < 4, which this project's environment is past; its tests run where
it is installed (.ci/run makes a venv with `--system-site-packages`, sae-lens and transformer-lens 3 installed
with `--no-deps`, and sets GPT2_REQUIRE_SAELENS=1 there, under which a missing SAELens fails) and skip elsewhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gpt2.cli import main
from gpt2.inspect.sae import (
    SAEConfig,
    SAETrainConfig,
    SparseAutoencoder,
    load_sae,
    sae_losses,
    save_sae,
    top_features,
    train_sae,
)
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import save_pretrained

VOCAB = 257
HOOK = "blocks.1.hook_resid_pre"
C = 64  # gpt2-tiny's n_embd


def saelens():
    """SAELens, or a skip (a failure where GPT2_REQUIRE_SAELENS=1: the CI venv that installs it)."""
    if os.environ.get("GPT2_REQUIRE_SAELENS") == "1":
        import sae_lens

        return sae_lens
    return pytest.importorskip("sae_lens")


@pytest.fixture
def model(perturbed_tiny_gpt: GPT) -> GPT:
    return perturbed_tiny_gpt


def random_sae(architecture: str = "standard", **options) -> SparseAutoencoder:
    torch.manual_seed(1)
    sae = SparseAutoencoder(SAEConfig(architecture=architecture, d_in=C, d_sae=96, hook_name=HOOK, **options))
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.copy_(0.2 * torch.randn_like(parameter))
        if architecture == "jumprelu":
            sae.threshold.copy_(0.1 * torch.rand(96))
    return sae


SAELENS_CASES = [
    ("standard", {}),
    ("standard", {"apply_b_dec_to_input": False, "normalize_activations": "layer_norm"}),
    ("standard", {"normalize_activations": "constant_norm_rescale"}),
    ("topk", {"k": 7}),
    ("topk", {"k": 7, "rescale_acts_by_decoder_norm": True}),
    ("jumprelu", {"normalize_activations": "layer_norm"}),
]


@pytest.mark.parametrize(("architecture", "options"), SAELENS_CASES)
def test_an_sae_saved_by_saelens_loads_with_the_same_activations(tmp_path: Path, architecture: str, options) -> None:
    sae_lens = saelens()
    from sae_lens.saes.sae import SAEMetadata

    classes = {"standard": "StandardSAE", "topk": "TopKSAE", "jumprelu": "JumpReLUSAE"}
    config_class = getattr(sae_lens, classes[architecture] + "Config")
    theirs = getattr(sae_lens, classes[architecture])(
        config_class(d_in=C, d_sae=96, metadata=SAEMetadata(hook_name=HOOK, model_name="tiny"), **options)
    )
    torch.manual_seed(2)
    with torch.no_grad():
        for parameter in theirs.parameters():
            parameter.copy_(0.2 * torch.randn_like(parameter))
        if architecture == "jumprelu":
            theirs.threshold.copy_(0.1 * torch.rand(96))
    theirs.save_model(tmp_path / "sae")
    ours = load_sae(tmp_path / "sae")
    assert ours.config.architecture == architecture and ours.hook_name == HOOK
    x = 3.0 * torch.randn(2, 5, C)
    with torch.no_grad():
        expected = theirs.encode(x)
        torch.testing.assert_close(ours.encode(x), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(ours(x), theirs.decode(theirs.encode(x)), atol=1e-5, rtol=0)
    assert (expected > 0).any() and (expected == 0).any()  # some features fire, some do not


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    from gpt2.data.shards import save_token_shards

    tokens = np.random.default_rng(0).integers(0, VOCAB, 4000)
    save_token_shards(tmp_path / "corpus", {"train": [tokens]}, load_tokenizer("bytes"))
    return tmp_path / "corpus"


@pytest.mark.parametrize("architecture", ["standard", "topk"])
def test_an_sae_trained_here_loads_in_saelens_with_the_same_activations(
    model: GPT, corpus: Path, tmp_path: Path, architecture: str
) -> None:
    sae_lens = saelens()
    config = SAETrainConfig(hook_name=HOOK, d_sae=96, architecture=architecture, k=8, steps=30)
    sae = train_sae(model, corpus, config)
    save_sae(sae, tmp_path / "trained")
    theirs = sae_lens.SAE.load_from_disk(tmp_path / "trained")
    assert theirs.cfg.metadata.hook_name == HOOK and theirs.cfg.architecture() == architecture
    x = torch.randn(3, 4, C)
    with torch.no_grad():
        torch.testing.assert_close(sae.encode(x), theirs.encode(x), atol=1e-5, rtol=0)
        torch.testing.assert_close(sae(x), theirs.decode(theirs.encode(x)), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_training_lowers_the_reconstruction_error(model: GPT, corpus: Path) -> None:
    idx = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(5))
    errors = []
    for steps in (1, 150):
        sae = train_sae(
            model, corpus, SAETrainConfig(hook_name=HOOK, d_sae=128, architecture="topk", k=16, steps=steps)
        )
        errors.append(sae_losses(model, idx, sae).mse)
    assert errors[1] < 0.5 * errors[0]


def test_the_spliced_loss_equals_a_hand_computation(model: GPT) -> None:
    sae = random_sae()
    idx = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(4))
    losses = sae_losses(model, idx, sae)
    with torch.no_grad():
        # block 0 by the model's own modules, the SAE written out, then block 1, ln_f and the head
        t = model.transformer
        x = t.wte(idx) + t.wpe(torch.arange(12))
        x = t.h[0](x, None)
        acts = F.relu((x - sae.b_dec) @ sae.W_enc + sae.b_enc)
        x_hat = acts @ sae.W_dec + sae.b_dec
        logits = model.lm_head(t.ln_f(t.h[1](x_hat, None)))
        expected = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
        clean = F.cross_entropy(model(idx).logits[:, :-1].reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
    assert losses.spliced_loss == pytest.approx(float(expected), abs=1e-5)
    assert losses.loss == pytest.approx(float(clean), abs=1e-5)
    assert losses.mse == pytest.approx(float((x_hat - x).pow(2).mean()), rel=1e-5)
    assert losses.spliced_loss != pytest.approx(losses.loss, abs=1e-3)


def test_a_saved_sae_reads_back_the_same(tmp_path: Path) -> None:
    sae = random_sae("jumprelu", normalize_activations="layer_norm")
    loaded = load_sae(save_sae(sae, tmp_path / "sae"))
    assert loaded.config.to_dict() == sae.config.to_dict()
    for name, parameter in sae.named_parameters():
        assert torch.equal(parameter, getattr(loaded, name)), name
    saved = json.loads((tmp_path / "sae" / "cfg.json").read_text())
    assert saved["metadata"]["hook_name"] == HOOK and saved["architecture"] == "jumprelu"


def test_an_earlier_saelens_config_reads_too() -> None:
    config = SAEConfig.from_dict(
        {
            "d_in": 768,
            "d_sae": 24576,
            "hook_point": "blocks.8.hook_resid_pre",
            "normalize_activations": False,
            "activation_fn_str": "topk",
            "activation_fn_kwargs": {"k": 32},
            "model_name": "gpt2",
        }
    )
    assert (config.architecture, config.k, config.hook_name) == ("topk", 32, "blocks.8.hook_resid_pre")
    assert config.normalize_activations == "none" and config.model_name == "gpt2"


def test_bad_sae_files_are_refused_naming_the_problem(model: GPT, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cfg.json"):
        (tmp_path / "empty").mkdir()
        load_sae(tmp_path / "empty")
    wide = SparseAutoencoder(SAEConfig(architecture="standard", d_in=32, d_sae=8, hook_name=HOOK))
    with pytest.raises(ValueError, match="reads 32 values at 'blocks.1.hook_resid_pre'; this model has 64"):
        sae_losses(model, torch.tensor([[1, 2]]), wide)
    deep = SparseAutoencoder(SAEConfig(architecture="standard", d_in=C, d_sae=8, hook_name="blocks.5.hook_resid_pre"))
    with pytest.raises(ValueError, match="has not"):
        top_features(model, torch.tensor([[1, 2]]), deep)
    with pytest.raises(ValueError, match="needs k"):
        SAEConfig(architecture="topk", d_in=C, d_sae=8, hook_name=HOOK)


def test_cli_writes_the_top_features_per_token(model: GPT, tmp_path: Path, capsys) -> None:
    save_pretrained(model, tmp_path / "model")
    load_tokenizer("bytes").save(tmp_path / "model")
    sae = random_sae()
    save_sae(sae, tmp_path / "sae")
    common = ["inspect", "sae", "--model", str(tmp_path / "model"), "--sae", str(tmp_path / "sae"), "--device", "cpu"]
    assert main([*common, "--prompt", "Hello", "--out", str(tmp_path / "f.json")]) == 0
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["hook"] == HOOK and data["tokens"] == ["H", "e", "l", "l", "o"]
    values, ids = top_features(model, torch.tensor([list(b"Hello")]), sae)
    assert [[f["feature"] for f in row] for row in data["features"]] == ids.tolist()
    assert data["mse"] >= 0 and data["spliced_loss"] > 0
    assert main([*common, "--prompt", "Hi <b>", "--out", str(tmp_path / "f.html")]) == 0
    assert "&lt;b&gt;" in (tmp_path / "f.html").read_text()
    assert f"wrote {tmp_path / 'f.html'}" in capsys.readouterr().out


def test_a_hub_folder_is_fetched_through_the_hub_module(tmp_path: Path, monkeypatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    save_sae(random_sae(), tmp_path / "repo" / "blocks.1.hook_resid_pre")
    asked = {}

    def snapshot_download(repo_id: str, allow_patterns: list[str]) -> str:  # the Hub, offline
        asked.update(repo_id=repo_id, allow_patterns=allow_patterns)
        return str(tmp_path / "repo")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    sae = load_sae("someone/gpt2-saes/blocks.1.hook_resid_pre")
    assert asked == {
        "repo_id": "someone/gpt2-saes",
        "allow_patterns": ["blocks.1.hook_resid_pre/cfg.json", "blocks.1.hook_resid_pre/sae_weights.safetensors"],
    }
    assert torch.equal(sae.W_enc, random_sae().W_enc)
