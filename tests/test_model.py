"""The GPT-2 model: configuration, architecture invariants, initialisation and input checking."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gpt2 import GPT, GPTConfig
from gpt2.config import PRESETS

TINY = GPTConfig(vocab_size=97, block_size=32, n_layer=2, n_head=4, n_embd=32)


def tiny_model(**overrides) -> GPT:
    torch.manual_seed(0)
    return GPT(TINY.replace(**overrides)).eval()


# ------------------------------------------------------------------------------------ config
@pytest.mark.slow
@pytest.mark.parametrize(
    "name, expected",
    [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)],
)
def test_released_sizes_have_the_published_parameter_counts_and_match_transformers(name, expected):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPTConfig.from_name(name)
    with torch.device("meta"):  # shapes only: no 6 GB allocation for gpt2-xl
        ours = GPT(config)
        theirs = GPT2LMHeadModel(GPT2Config(n_layer=config.n_layer, n_head=config.n_head, n_embd=config.n_embd))
    assert ours.num_parameters() == expected
    assert theirs.num_parameters() == expected


def test_presets_have_the_gpt2_shapes():
    shapes = {name: (c.n_layer, c.n_embd, c.n_head) for name, c in PRESETS.items()}
    assert shapes["gpt2"] == (12, 768, 12)
    assert shapes["gpt2-medium"] == (24, 1024, 16)
    assert shapes["gpt2-large"] == (36, 1280, 20)
    assert shapes["gpt2-xl"] == (48, 1600, 25)
    assert all(c.vocab_size == 50257 and c.layer_norm_eps == 1e-5 for c in PRESETS.values())


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(n_embd=100, n_head=3), "n_embd (100) must be divisible by n_head (3)"),
        (dict(n_layer=0), "n_layer must be a positive integer, got 0"),
        (dict(vocab_size=-5), "vocab_size must be a positive integer, got -5"),
        (dict(block_size=2.5), "block_size must be a positive integer, got 2.5"),
        (dict(dropout=1.5), "dropout must be in [0, 1), got 1.5"),
        (dict(layer_norm_eps=0.0), "layer_norm_eps must be positive"),
        (dict(attn_impl="flash"), "attn_impl must be 'sdpa' or 'explicit'"),
    ],
)
def test_config_rejects_bad_values_naming_them(fields, message):
    with pytest.raises(ValueError) as err:
        GPTConfig(**fields)
    assert message in str(err.value)


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown model preset 'gpt3'.*gpt2-medium"):
        GPTConfig.from_name("gpt3")


def test_preset_overrides_are_validated():
    assert GPTConfig.from_name("gpt2", dropout=0.1).dropout == 0.1
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig.from_name("gpt2", n_head=7)


# ------------------------------------------------------------------------------ architecture
def test_forward_returns_full_logits_with_and_without_targets():
    model = tiny_model()
    idx = torch.randint(0, 97, (3, 10))
    logits, loss = model(idx)
    assert logits.shape == (3, 10, 97) and loss is None
    logits2, loss2 = model(idx, targets=idx)
    assert logits2.shape == (3, 10, 97)
    assert torch.allclose(loss2, F.cross_entropy(logits2.view(-1, 97), idx.view(-1)))


def test_loss_ignores_positions_marked_minus_100():
    model = tiny_model()
    idx = torch.randint(0, 97, (2, 8))
    targets = idx.roll(-1, dims=1)
    masked = targets.clone()
    masked[:, 5:] = -100
    logits, loss = model(idx, targets=masked)
    expected = F.cross_entropy(logits[:, :5].reshape(-1, 97), targets[:, :5].reshape(-1))
    assert torch.allclose(loss, expected)


def test_lm_head_is_tied_to_the_token_embedding():
    model = tiny_model()
    assert model.lm_head.weight is model.transformer.wte.weight


def test_sdpa_path_equals_explicit_path():
    sdpa = tiny_model()
    explicit = GPT(TINY.replace(attn_impl="explicit")).eval()
    explicit.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 97, (2, 32))
    assert torch.allclose(sdpa(idx).logits, explicit(idx).logits, atol=1e-5)


def test_sdpa_path_equals_explicit_path_with_left_padding_and_in_training_mode_without_dropout():
    sdpa = tiny_model().train()
    explicit = GPT(TINY.replace(attn_impl="explicit")).train()
    explicit.load_state_dict(sdpa.state_dict())
    idx = torch.randint(0, 97, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0
    a = sdpa(idx, attention_mask=mask).logits
    b = explicit(idx, attention_mask=mask).logits
    assert torch.allclose(a[0], b[0], atol=1e-5)
    assert torch.allclose(a[1, 4:], b[1, 4:], atol=1e-5)


def test_changing_a_future_token_never_changes_earlier_logits():
    model = tiny_model()
    idx = torch.randint(0, 97, (1, 20))
    changed = idx.clone()
    changed[0, 12] = (idx[0, 12] + 1) % 97
    before, after = model(idx).logits, model(changed).logits
    assert torch.equal(before[:, :12], after[:, :12])
    assert not torch.allclose(before[:, 12:], after[:, 12:])


def test_attention_weights_are_causal_rows_summing_to_one():
    model = tiny_model()
    weights = model.attention_weights(torch.randint(0, 97, (2, 9)))
    assert len(weights) == TINY.n_layer
    for w in weights:
        assert w.shape == (2, TINY.n_head, 9, 9)
        assert torch.allclose(w.sum(-1), torch.ones(2, TINY.n_head, 9))
        assert torch.all(w.triu(diagonal=1) == 0)


def test_attention_scores_are_scaled_by_one_over_sqrt_head_dim():
    """Recompute layer 0's attention by hand from its q and k; an unscaled variant would not match."""
    model = tiny_model()
    idx = torch.randint(0, 97, (1, 6))
    block = model.transformer.h[0]
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(6))
    q, k, _ = block.attn.c_attn(block.ln_1(x)).split(TINY.n_embd, dim=2)
    hs = TINY.head_dim
    q = q.view(1, 6, TINY.n_head, hs).transpose(1, 2)
    k = k.view(1, 6, TINY.n_head, hs).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
    scores = scores.masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    assert torch.allclose(model.attention_weights(idx)[0], scores.softmax(-1), atol=1e-6)


def test_layernorm_is_mean_and_population_variance_with_eps_1e5():
    model = tiny_model()
    ln = model.transformer.h[0].ln_1
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    x = torch.randn(4, 7, TINY.n_embd) * 3 + 1
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # population variance (divide by C, not C - 1)
    expected = (x - mean) / torch.sqrt(var + 1e-5) * ln.weight + ln.bias
    assert ln.eps == 1e-5
    assert torch.allclose(ln(x), expected, atol=1e-5)


def test_mlp_is_4x_wide_with_tanh_gelu():
    model = tiny_model()
    mlp = model.transformer.h[0].mlp
    assert mlp.c_fc.weight.shape == (4 * TINY.n_embd, TINY.n_embd)
    x = torch.randn(2, 3, TINY.n_embd)
    h = mlp.c_fc(x)
    tanh_gelu = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    assert torch.allclose(mlp(x), mlp.c_proj(tanh_gelu), atol=1e-6)


def test_blocks_are_pre_norm_with_an_unnormalised_residual_stream():
    model = tiny_model()
    block = model.transformer.h[0]
    x = torch.randn(1, 5, TINY.n_embd) * 10
    h = x + block.attn(block.ln_1(x), None)
    expected = h + block.mlp(block.ln_2(h))
    assert torch.allclose(block(x, None), expected, atol=1e-5)


# ------------------------------------------------------------------------------------- init
def test_initialisation_follows_gpt2():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=5000, block_size=256, n_layer=6, n_head=4, n_embd=256)
    model = GPT(config)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    for name, p in model.named_parameters():
        if name.endswith("c_proj.weight"):
            assert abs(p.std().item() - residual_std) < 0.1 * residual_std, name
            assert abs(p.mean().item()) < 0.1 * residual_std, name
        elif p.dim() == 2:
            assert abs(p.std().item() - 0.02) < 0.002, name
        elif "ln" in name and name.endswith("weight"):
            assert torch.all(p == 1), name
        else:
            assert torch.all(p == 0), name  # biases, LayerNorm biases


# --------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "idx, message",
    [
        (torch.zeros(1, 33, dtype=torch.long), "sequence length 33 exceeds the model's context length block_size=32"),
        (torch.tensor([[1, 97]]), "token id 97 is outside the vocabulary [0, 97)"),
        (torch.tensor([[-1, 3]]), "token id -1 is outside the vocabulary [0, 97)"),
        (torch.zeros(1, 4), "idx must hold integer token ids (torch.long), got dtype torch.float32"),
        (torch.zeros(4, dtype=torch.long), "idx must have shape (B, T), got 1 dimension(s) (4,)"),
        (torch.zeros(1, 2, 3, dtype=torch.long), "idx must have shape (B, T), got 3 dimension(s)"),
        (torch.zeros(1, 0, dtype=torch.long), "idx has no positions"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(idx, message):
    with pytest.raises(ValueError) as err:
        tiny_model()(idx)
    assert message in str(err.value)


def test_non_tensor_input_is_a_type_error():
    with pytest.raises(TypeError, match="idx must be a torch.Tensor"):
        tiny_model()([[1, 2, 3]])


def test_bad_targets_are_refused():
    model = tiny_model()
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"targets must have the same shape as idx \(2, 4\), got \(2, 3\)"):
        model(idx, targets=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="target id 500 is outside the vocabulary"):
        model(idx, targets=torch.full((2, 4), 500))


def test_bad_attention_mask_is_refused():
    model = tiny_model()
    idx = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"attention_mask must have shape \(B, past \+ T\) = \(2, 4\)"):
        model(idx, attention_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match="only 0 .* and 1"):
        model(idx, attention_mask=torch.full((2, 4), 2))


def test_left_padding_does_not_change_the_real_tokens_logits():
    model = tiny_model()
    idx = torch.randint(0, 97, (1, 7))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), idx], dim=1)
    mask = torch.tensor([[0, 0, 0] + [1] * 7])
    assert torch.allclose(model(padded, attention_mask=mask).logits[:, 3:], model(idx).logits, atol=1e-5)


def test_kv_cache_decoding_equals_full_recompute():
    model = tiny_model()
    idx = torch.randint(0, 97, (2, 20))
    full = model(idx).logits
    cache = model.new_kv_cache(batch_size=2)
    pieces = [model(idx[:, :8], kv_cache=cache).logits]
    pieces += [model(idx[:, t : t + 1], kv_cache=cache).logits for t in range(8, 14)]
    pieces.append(model(idx[:, 14:], kv_cache=cache).logits)  # several new positions over a filled cache
    assert cache.length == 20
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5)


def test_kv_cache_overflow_is_refused():
    model = tiny_model()
    cache = model.new_kv_cache(batch_size=1)
    model(torch.zeros(1, 30, dtype=torch.long), kv_cache=cache)
    with pytest.raises(ValueError, match=r"sequence length 33 \(30 cached \+ 3 new\) exceeds"):
        model(torch.zeros(1, 3, dtype=torch.long), kv_cache=cache)


def test_hidden_states_through_the_head_are_the_logits():
    model = tiny_model()
    idx = torch.randint(0, 97, (2, 11))
    hidden = model.hidden_states(idx)
    assert hidden.shape == (2, 11, TINY.n_embd)
    assert torch.allclose(model.lm_head(hidden), model(idx).logits, atol=1e-6)
    assert torch.allclose(model.lm_head(hidden[:, -1]), model(idx).logits[:, -1], atol=1e-6)
    with pytest.raises(ValueError, match="token id 97 is outside the vocabulary"):
        model.hidden_states(torch.tensor([[97]]))


def test_activation_checkpointing_gives_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, vocab_size=50, block_size=16, dropout=0.0)).train()
    idx = torch.randint(0, 50, (2, 16))
    grads = []
    for checkpointing in (False, True):
        model.zero_grad()
        model.activation_checkpointing = checkpointing
        loss = model(idx, targets=idx.roll(-1, 1)).loss
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (loss_plain, grads_plain), (loss_ckpt, grads_ckpt) = grads
    assert torch.equal(loss_plain, loss_ckpt)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-5) for a, b in zip(grads_plain, grads_ckpt, strict=True))
