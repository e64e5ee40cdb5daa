"""gpt2.inspect: named activations equal the model's and transformers' own, hooks patch exactly, the logit lens
and the logit attribution add up, and the pictures are written.

Tiny random models with every parameter perturbed (so biases and LayerNorm gains are not the trivial 0 and 1),
saved in HF format and read back by transformers' GPT2LMHeadModel with eager attention, which returns its
attention weights and hidden states to compare against.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.inspect import (
    direct_logit_attribution,
    hook_names,
    logit_lens,
    run_with_cache,
    run_with_hooks,
)
from gpt2.inspect.attention_html import attention_html
from gpt2.inspect.pictures import attention_picture, logit_lens_picture, token_labels
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import save_pretrained

VOCAB = 257  # the byte tokenizer's size, so the CLI tests can use it
ATOL = 1e-5  # fp32 round-off between two orders of the same arithmetic


def tiny_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=VOCAB))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))  # non-trivial biases and gains
    return model.eval()


@pytest.fixture
def model() -> GPT:
    return tiny_model()


@pytest.fixture
def idx() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))  # (B, T)


@pytest.fixture
def hf_outputs(model: GPT, idx: torch.Tensor, tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    save_pretrained(model, tmp_path / "tiny")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "tiny", attn_implementation="eager").eval()
    with torch.no_grad():
        return hf(idx, output_attentions=True, output_hidden_states=True)


# ------------------------------------------------------------------------------- run_with_cache
def test_cached_run_returns_the_models_logits(model: GPT, idx: torch.Tensor) -> None:
    with torch.no_grad():
        logits, _ = run_with_cache(model, idx)
        expected = model(idx).logits
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def test_patterns_equal_transformers_attentions(model: GPT, idx: torch.Tensor, hf_outputs) -> None:
    with torch.no_grad():
        _, cache = run_with_cache(model, idx, lambda name: name.endswith("hook_pattern"))
    assert len(cache) == model.config.n_layer
    for i, hf_pattern in enumerate(hf_outputs.attentions):
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_pattern"], hf_pattern, atol=ATOL, rtol=0)


def test_residuals_equal_transformers_hidden_states(model: GPT, idx: torch.Tensor, hf_outputs) -> None:
    # HF's hidden_states[i] enters block i; its last one is taken after ln_f
    with torch.no_grad():
        _, cache = run_with_cache(model, idx)
    n_layer = model.config.n_layer
    assert len(hf_outputs.hidden_states) == n_layer + 1
    for i in range(n_layer):
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_pre"], hf_outputs.hidden_states[i], atol=ATOL, rtol=0)
    for i in range(n_layer - 1):
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_post"], cache[f"blocks.{i + 1}.hook_resid_pre"])
    torch.testing.assert_close(cache["ln_final.hook_normalized"], hf_outputs.hidden_states[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], cache["hook_embed"] + cache["hook_pos_embed"])


@pytest.mark.slow
def test_transformer_lens_caches_the_same_activations_under_the_same_names(
    model: GPT, idx: torch.Tensor, tmp_path: Path
) -> None:
    """TransformerLens itself (its TransformerBridge over transformers' model, raw weights, no weight processing)
    on the same weights: every name we cache is one of its names, with the same shape and values.

    Two differences of TransformerLens 4's bridge from its HookedTransformer, whose meaning we keep: a LayerNorm's
    output with gain and bias applied (`x * w + b`), HookedTransformer's `hook_normalized`, is the bridge's
    `hook_out` (its `hook_normalized` is the value before the gain); masked attention scores, -inf in
    HookedTransformer, are float32's minimum in the bridge (transformers' eager attention). Both compared as such."""
    transformers = pytest.importorskip("transformers")
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    save_pretrained(model, tmp_path / "tiny")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "tiny", attn_implementation="eager").eval()
    bridge = bridge_module.TransformerBridge.boot_transformers(str(tmp_path / "tiny"), device="cpu", hf_model=hf)
    with torch.no_grad():
        theirs_logits, theirs = bridge.run_with_cache(idx)
        logits, ours = run_with_cache(model, idx)
    torch.testing.assert_close(logits, theirs_logits, atol=ATOL, rtol=0)
    assert set(ours) == set(hook_names(model.config.n_layer))
    for name, value in ours.items():
        expected = theirs[name.replace("hook_normalized", "hook_out")]
        assert value.shape == expected.shape, name
        if name.endswith("hook_attn_scores"):
            causal = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).tril()
            torch.testing.assert_close(value[..., causal], expected[..., causal], atol=ATOL, rtol=0)
            assert (value[..., ~causal] == float("-inf")).all()
            assert (expected[..., ~causal] <= torch.finfo(torch.float32).min).all()
        else:
            torch.testing.assert_close(value, expected, atol=ATOL, rtol=0, msg=name)


def test_every_activation_has_its_documented_shape(model: GPT, idx: torch.Tensor) -> None:
    B, T = idx.shape
    C, nh = model.config.n_embd, model.config.n_head
    with torch.no_grad():
        _, cache = run_with_cache(model, idx)
    assert list(cache) == hook_names(model.config.n_layer)  # all of them, in forward order
    for name, tensor in cache.items():
        if name.endswith(("hook_q", "hook_k", "hook_v", "hook_z")):
            assert tensor.shape == (B, T, nh, C // nh), name
        elif name.endswith(("hook_attn_scores", "hook_pattern")):
            assert tensor.shape == (B, nh, T, T), name
        elif name.startswith("blocks.0.mlp."):
            assert tensor.shape == (B, T, 4 * C), name
        elif ".mlp." not in name:
            assert tensor.shape == (B, T, C), name


def test_scores_are_masked_above_the_diagonal_and_softmax_to_the_pattern(model: GPT, idx: torch.Tensor) -> None:
    with torch.no_grad():
        _, cache = run_with_cache(model, idx, ["blocks.1.attn.hook_attn_scores", "blocks.1.attn.hook_pattern"])
    scores = cache["blocks.1.attn.hook_attn_scores"]
    future = torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool).triu(1)
    assert torch.isneginf(scores[..., future]).all() and torch.isfinite(scores[..., ~future]).all()
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], scores.softmax(-1))


def test_only_the_requested_activations_are_kept(model: GPT, idx: torch.Tensor) -> None:
    with torch.no_grad():
        assert list(run_with_cache(model, idx, "hook_embed")[1]) == ["hook_embed"]
        assert list(run_with_cache(model, idx, ["blocks.1.hook_mlp_out", "hook_embed"])[1]) == [
            "hook_embed",
            "blocks.1.hook_mlp_out",
        ]
        _, cache = run_with_cache(model, idx, lambda name: name.startswith("blocks.1.ln"))
    assert list(cache) == ["blocks.1.ln1.hook_normalized", "blocks.1.ln2.hook_normalized"]
    with pytest.raises(KeyError, match="was not cached"):
        cache["hook_embed"]


def test_an_unknown_name_is_refused_with_the_valid_names(model: GPT, idx: torch.Tensor) -> None:
    with pytest.raises(ValueError) as caught:
        run_with_cache(model, idx, ["blocks.0.attn.hook_patern"])
    message = str(caught.value)
    assert "did you mean 'blocks.0.attn.hook_pattern'" in message
    assert "blocks.{i}.hook_resid_pre" in message and "ln_final.hook_normalized" in message
    assert "i in 0..1" in message
    with pytest.raises(ValueError, match="unknown activation name 'blocks.2.hook_resid_pre'"):
        run_with_hooks(model, idx, [("blocks.2.hook_resid_pre", lambda x, name: x)])  # only 2 blocks


def test_bad_token_ids_are_refused(model: GPT) -> None:
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run_with_cache(model, torch.tensor([[1, VOCAB]]))
    with pytest.raises(ValueError, match="shape \\(B, T\\)"):
        run_with_cache(model, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="block_size=128"):
        run_with_cache(model, torch.zeros(1, 129, dtype=torch.long))


def test_the_model_in_an_inference_layout_gives_the_same_activations(model: GPT, idx: torch.Tensor) -> None:
    from gpt2.cpu import optimize_for_inference

    with torch.no_grad():
        logits, cache = run_with_cache(model, idx, "blocks.1.hook_mlp_out")
        optimize_for_inference(model)  # every nn.Linear replaced; the submodules keep their names
        split_logits, split_cache = run_with_cache(model, idx, "blocks.1.hook_mlp_out")
    torch.testing.assert_close(split_logits, logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(split_cache["blocks.1.hook_mlp_out"], cache["blocks.1.hook_mlp_out"], atol=ATOL, rtol=0)


def test_inspecting_leaves_the_model_untouched(model: GPT, idx: torch.Tensor) -> None:
    with torch.no_grad():
        before = model(idx).logits
        run_with_hooks(model, idx, [("blocks.0.attn.hook_z", lambda z, name: torch.zeros_like(z))])
        run_with_cache(model, idx)
        after = model(idx).logits
    assert torch.equal(before, after)
    assert not any(module._forward_hooks or module._forward_pre_hooks for module in model.modules())


# ------------------------------------------------------------------------------- run_with_hooks
def test_hooks_that_return_their_input_change_nothing(model: GPT, idx: torch.Tensor) -> None:
    seen: list[str] = []

    def look(tensor: torch.Tensor, name: str) -> torch.Tensor:
        seen.append(name)
        return tensor

    with torch.no_grad():
        plain, _ = run_with_cache(model, idx, [])
        hooked = run_with_hooks(model, idx, [(name, look) for name in hook_names(model.config.n_layer)])
    assert seen == hook_names(model.config.n_layer)
    assert torch.equal(hooked, plain)


def test_zeroing_one_head_equals_the_hand_computed_result(model: GPT, idx: torch.Tensor) -> None:
    # Ablate head 2 of the last block: its attention output loses exactly z_2 @ W_O[:, head 2's columns]^T;
    # the rest of the block and the head are computed by hand with the model's own modules.
    last, head = model.config.n_layer - 1, 2
    hs = model.config.head_dim
    block = model.transformer.h[last]

    def zero_head(z: torch.Tensor, name: str) -> torch.Tensor:  # z: (B, T, nh, hs)
        z = z.clone()
        z[:, :, head] = 0.0
        return z

    with torch.no_grad():
        ablated = run_with_hooks(model, idx, [(f"blocks.{last}.attn.hook_z", zero_head)])
        _, cache = run_with_cache(model, idx)
        z = cache[f"blocks.{last}.attn.hook_z"][:, :, head]  # (B, T, hs)
        w_o = block.attn.c_proj.weight[:, head * hs : (head + 1) * hs]  # (C, hs)
        attn_out = cache[f"blocks.{last}.hook_attn_out"] - z @ w_o.T
        x = cache[f"blocks.{last}.hook_resid_pre"] + attn_out
        x = x + block.mlp(block.ln_2(x))
        expected = model.lm_head(model.transformer.ln_f(x))
    torch.testing.assert_close(ablated, expected, atol=ATOL, rtol=0)
    assert not torch.allclose(ablated, model(idx).logits, atol=1e-3)  # the head mattered


def test_patching_a_residual_from_another_run_carries_its_logits(model: GPT, idx: torch.Tensor) -> None:
    other = torch.flip(idx, dims=[1])
    with torch.no_grad():
        other_logits, other_cache = run_with_cache(model, other, "blocks.1.hook_resid_pre")
        patched = run_with_hooks(
            model, idx, [("blocks.1.hook_resid_pre", lambda x, name: other_cache[name])]
        )  # everything after block 0 now sees the other prompt's stream
    torch.testing.assert_close(patched, other_logits, atol=ATOL, rtol=0)


def test_hooks_on_one_name_run_in_order_and_the_cache_holds_the_result(model: GPT, idx: torch.Tensor) -> None:
    hooks = [("hook_embed", lambda x, name: x + 1.0), ("hook_embed", lambda x, name: x * 2.0)]
    with torch.no_grad():
        clean, clean_cache = run_with_cache(model, idx, "hook_embed")
        _, cache = run_with_cache(model, idx, "hook_embed", fwd_hooks=hooks)
    torch.testing.assert_close(cache["hook_embed"], (clean_cache["hook_embed"] + 1.0) * 2.0)


def test_a_hook_must_keep_the_shape(model: GPT, idx: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="must return None or a tensor of shape \\(2, 11, 64\\)"):
        run_with_hooks(model, idx, [("hook_embed", lambda x, name: x[:, :1])])


# ------------------------------------------------------------------------------- logit lens, attribution
def test_the_logit_lens_of_the_last_layer_is_the_models_logits(model: GPT, idx: torch.Tensor) -> None:
    lens = logit_lens(model, idx)
    n_layer = model.config.n_layer
    assert lens.logits.shape == (n_layer + 1, *idx.shape, VOCAB)
    assert lens.names == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"]
    with torch.no_grad():
        expected = model(idx).logits
        embed_only = model.lm_head(
            model.transformer.ln_f(model.transformer.wte(idx) + model.transformer.wpe.weight[:11])
        )
    torch.testing.assert_close(lens.logits[-1], expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(lens.logits[0], embed_only, atol=ATOL, rtol=0)


def test_the_logit_lens_reads_the_positions_asked_for(model: GPT, idx: torch.Tensor) -> None:
    full = logit_lens(model, idx)
    some = logit_lens(model, idx, positions=[0, -1])
    assert some.positions == [0, 10]
    torch.testing.assert_close(some.logits, full.logits[:, :, [0, 10]])
    probabilities, ids = some.top_tokens(3)
    assert ids.shape == probabilities.shape == (3, 2, 2, 3)
    assert torch.equal(ids[..., 0], some.logits.argmax(-1))
    with pytest.raises(ValueError, match="positions must be in"):
        logit_lens(model, idx, positions=[11])


def test_attributions_add_up_to_the_logit(model: GPT, idx: torch.Tensor) -> None:
    # logit[t] = embed + pos_embed + sum over layers (attn + mlp) + final_bias, and per layer
    # attn = sum over heads + c_proj's bias part, with ln_f's scale taken from the full final residual
    dla = direct_logit_attribution(model, idx, target=[5, 200], position=-2)
    with torch.no_grad():
        logits = model(idx).logits
    expected = torch.stack([logits[0, 9, 5], logits[1, 9, 200]])
    torch.testing.assert_close(dla.logit, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(dla.total(), expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(dla.heads.sum(-1) + dla.attn_bias, dla.attn, atol=ATOL, rtol=0)
    assert dla.heads.shape == (2, model.config.n_layer, model.config.n_head)
    assert dla.position == 9 and dla.target.tolist() == [5, 200]


def test_attribution_takes_one_target_or_one_per_row_and_needs_eval_mode(model: GPT, idx: torch.Tensor) -> None:
    dla = direct_logit_attribution(model, idx, target=7)
    assert dla.target.tolist() == [7, 7]
    assert torch.isfinite(dla.heads).all()
    with pytest.raises(ValueError, match="one token id or one per batch row"):
        direct_logit_attribution(model, idx, target=[1, 2, 3])
    with pytest.raises(ValueError, match="call model.eval"):
        dropout_model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=VOCAB, dropout=0.1)).train()
        direct_logit_attribution(dropout_model, idx, target=7)


# ------------------------------------------------------------------------------- pictures and the CLI
@pytest.fixture
def byte_tokenizer():
    return load_tokenizer("bytes")


@pytest.mark.slow
def test_attention_png_and_html_are_written(model: GPT, byte_tokenizer, tmp_path: Path) -> None:
    png = attention_picture(model, byte_tokenizer, "The cat sat.", tmp_path / "attention.png", layer=1)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = attention_picture(model, byte_tokenizer, "The cat\nsat.", tmp_path / "attention.html", head=3)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>") and "<canvas" in text
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)  # self-contained: nothing fetched
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S).group(1))
    assert data["tokens"] == token_labels(byte_tokenizer, byte_tokenizer.encode("The cat\nsat."))
    assert "\\n" in data["tokens"] and data["layers"] == [0, 1] and data["heads"] == [3]
    assert [len(row) for row in data["patterns"][0][0]] == list(range(1, 13))  # causal rows only


def test_the_html_carries_the_patterns_and_escapes_the_tokens(model: GPT) -> None:
    patterns = torch.tensor([[[[1.0, 0.0], [0.25, 0.75]]]])  # (1 layer, 1 head, T=2, T=2)
    page = attention_html(patterns, ["</script>", "<b>&"], layers=[0], heads=[0], title="<x>")
    assert "</script><" not in page.split('type="application/json">')[1].split("</script>")[0]
    assert "<title>&lt;x&gt;</title>" in page
    payload = page.split('type="application/json">')[1].split("</script>")[0]
    assert json.loads(payload) == {
        "tokens": ["</script>", "<b>&"],
        "layers": [0],
        "heads": [0],
        "patterns": [[[[1.0], [0.25, 0.75]]]],
    }


def test_the_logit_lens_png_is_written(model: GPT, byte_tokenizer, tmp_path: Path) -> None:
    path = logit_lens_picture(model, byte_tokenizer, "Costs $5, ok", tmp_path / "lens.png")
    assert path.read_bytes().startswith(b"\x89PNG")
    assert model.training is False


def test_a_picture_needs_a_known_format_and_existing_heads(model: GPT, byte_tokenizer, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="end the file name in .png or .html"):
        attention_picture(model, byte_tokenizer, "hi", tmp_path / "attention.svg")
    with pytest.raises(ValueError, match="end the file name in .png"):
        logit_lens_picture(model, byte_tokenizer, "hi", tmp_path / "lens.html")
    with pytest.raises(ValueError, match="--head 4 does not exist: the model has 4 heads"):
        attention_picture(model, byte_tokenizer, "hi", tmp_path / "attention.png", head=4)
    with pytest.raises(ValueError, match="prompt is empty"):
        attention_picture(model, byte_tokenizer, "", tmp_path / "attention.png")


def test_pictures_leave_the_model_in_its_mode(model: GPT, byte_tokenizer, tmp_path: Path) -> None:
    model.train()
    attention_picture(model, byte_tokenizer, "hi", tmp_path / "a.html")
    assert model.training


@pytest.fixture
def model_dir(model: GPT, byte_tokenizer, tmp_path: Path) -> Path:
    save_pretrained(model, tmp_path / "model")
    byte_tokenizer.save(tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.slow
def test_cli_writes_attention_and_logit_lens(model_dir: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pictures"
    common = ["--model", str(model_dir), "--prompt", "To be or not", "--device", "cpu"]
    assert main(["inspect", "attention", *common, "--layer", "0", "--head", "1", "--out", str(out / "a.png")]) == 0
    assert main(["inspect", "attention", *common, "--out", str(out / "a.html")]) == 0
    assert main(["inspect", "logit-lens", *common, "--out", str(out / "lens.png")]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["a.html", "a.png", "lens.png"]
    assert f"wrote {out / 'lens.png'}" in capsys.readouterr().out


def test_cli_reports_a_bad_choice_in_one_line(model_dir: Path, tmp_path: Path, capsys) -> None:
    common = ["--model", str(model_dir), "--prompt", "hi", "--device", "cpu"]
    assert main(["inspect", "attention", *common, "--layer", "7", "--out", str(tmp_path / "a.png")]) == 2
    error = capsys.readouterr().err
    assert error.strip() == ("gpt2 inspect: error: --layer 7 does not exist: the model has 2 layers, numbered 0 to 1")
