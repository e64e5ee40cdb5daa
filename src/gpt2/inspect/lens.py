"""What each layer already predicts (the logit lens), and how much each layer and head adds to one logit
(direct logit attribution).

Logit lens: the residual stream entering every block, and the one leaving the last, each read through the
final LayerNorm and the tied LM head as if the model stopped there. The last row is the model's logits.

Direct logit attribution (DLA). The residual stream at the end is a sum of parts:

    resid = embed + pos_embed + sum_l (attn_out_l + mlp_out_l)          (dropout off: model.eval())
    attn_out_l = sum_h z_lh @ W_O[:, h] + b_O                           (head h's slice of attn.c_proj)

and the logit of token t is lm_head(ln_f(resid))[t] = ((resid - mean(resid)) / s) . (g * W_U[t]) + b . W_U[t],
with s = sqrt(var(resid) + eps), g and b ln_f's gain and bias. Only s is not linear in the parts. The convention
(TransformerLens': `cache.apply_ln_to_stack(..., layer=-1)`, `logit_attrs`): s is taken from the full final
residual and frozen, each part is centred and divided by it, so the parts' attributions add up exactly:

    logit[t] = embed + pos_embed + sum_l (attn_l + mlp_l) + final_bias
    attn_l   = sum_h heads[l, h] + attn_bias_l

`LogitAttribution.total()` is the first sum; the tests check both identities. An attribution is the change of
the logit if the part were removed *with s held fixed*, not the effect of ablating it (use run_with_hooks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpt2.inspect.hooks import blocks, check_token_ids, run_with_cache
from gpt2.model import GPT


@dataclass(frozen=True)
class LogitLens:
    """The logit lens of a batch: row r of `logits` is what residual `names[r]` predicts.

    logits: (n_layer + 1, B, P, V) for P = len(positions); names: the n_layer + 1 residuals read
    (`blocks.{i}.hook_resid_pre` for every block, then the last block's `hook_resid_post`).
    """

    names: list[str]
    positions: list[int]
    logits: torch.Tensor

    def top_tokens(self, k: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(probabilities, token ids) of the k most likely next tokens at each layer and position, each
        (n_layer + 1, B, P, k), most likely first."""
        if not 0 < k <= self.logits.shape[-1]:
            raise ValueError(f"k must be in [1, vocab_size={self.logits.shape[-1]}], got {k}")
        return torch.softmax(self.logits.float(), dim=-1).topk(k, dim=-1)


@torch.no_grad()
def logit_lens(model: GPT, idx: torch.Tensor, *, positions: Sequence[int] | None = None) -> LogitLens:
    """Every layer's residual stream through ln_f and the LM head: `LogitLens.logits` (n_layer + 1, B, P, V).

    positions: which positions to read (default all; a few save memory, as V is large; negative counts
    from the end). The last layer's row equals the model's logits.

    >>> from gpt2.config import GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> lens = logit_lens(model, torch.tensor([[1, 2, 3]]), positions=[-1])
    >>> lens.logits.shape, lens.names[0], lens.positions
    (torch.Size([3, 1, 1, 100]), 'blocks.0.hook_resid_pre', [2])
    """
    check_token_ids(model, idx)
    wanted = _positions(positions, idx.shape[1])
    n_layer = model.config.n_layer
    names = [f"blocks.{i}.hook_resid_pre" for i in range(n_layer)] + [f"blocks.{n_layer - 1}.hook_resid_post"]
    _, cache = run_with_cache(model, idx, names)
    index = torch.tensor(wanted, device=idx.device)
    residuals = torch.stack([cache[name].index_select(1, index) for name in names])  # (n_layer + 1, B, P, C)
    logits = model.lm_head(model.transformer.ln_f(residuals))  # (n_layer + 1, B, P, V)
    return LogitLens(names, wanted, logits)


@dataclass(frozen=True)
class LogitAttribution:
    """Direct logit attribution of `target` at one position; all tensors are per batch row.

    logit (B,): the model's logit. embed, pos_embed, final_bias (B,); attn, attn_bias, mlp (B, n_layer);
    heads (B, n_layer, nh). See the module docstring for the convention and the identities they satisfy.
    """

    target: torch.Tensor
    position: int
    logit: torch.Tensor
    embed: torch.Tensor
    pos_embed: torch.Tensor
    attn: torch.Tensor
    attn_bias: torch.Tensor
    heads: torch.Tensor
    mlp: torch.Tensor
    final_bias: torch.Tensor

    def total(self) -> torch.Tensor:
        """The sum of the parts (B,): equals `logit` up to rounding."""
        return self.embed + self.pos_embed + self.attn.sum(-1) + self.mlp.sum(-1) + self.final_bias


@torch.no_grad()
def direct_logit_attribution(
    model: GPT, idx: torch.Tensor, target: int | Sequence[int] | torch.Tensor, *, position: int = -1
) -> LogitAttribution:
    """How much each part of the residual stream writes towards the logit of `target` at `position`.

    target: one token id for every row, or one per row (B,). The model must be in eval mode (dropout would
    make the residual something other than the sum of its parts). Needs plain nn.Linear weights in
    attn.c_proj and lm_head (not the int8 or split inference layouts).

    >>> from gpt2.config import GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> dla = direct_logit_attribution(model, torch.tensor([[1, 2, 3]]), target=7)
    >>> dla.heads.shape, bool(torch.allclose(dla.total(), dla.logit, atol=1e-5))
    (torch.Size([1, 2, 4]), True)
    """
    check_token_ids(model, idx)
    if model.training and model.config.dropout > 0:
        raise ValueError("direct_logit_attribution needs dropout off: call model.eval() first")
    B, T = idx.shape
    (pos,) = _positions([position], T)
    targets = torch.as_tensor(target, device=idx.device).long().reshape(-1)
    if targets.numel() not in (1, B):
        raise ValueError(f"target must be one token id or one per batch row ({B}), got {targets.numel()} ids")
    targets = targets.expand(B)  # (B,)
    vocab_size = model.config.vocab_size
    if int(targets.min()) < 0 or int(targets.max()) >= vocab_size:
        raise ValueError(f"target token ids must be in [0, {vocab_size}), got {targets.tolist()}")

    n_layer, nh, C = model.config.n_layer, model.config.n_head, model.config.n_embd
    hs = C // nh
    names = ["hook_embed", "hook_pos_embed", f"blocks.{n_layer - 1}.hook_resid_post"]
    for i in range(n_layer):
        names += [f"blocks.{i}.attn.hook_z", f"blocks.{i}.hook_attn_out", f"blocks.{i}.hook_mlp_out"]
    logits, cache = run_with_cache(model, idx, names)

    ln_f = model.transformer.ln_f
    unembed = _linear_weight(model.lm_head, "lm_head")[targets]  # (B, C): W_U rows of the targets
    direction = unembed * ln_f.weight  # (B, C): ln_f's gain folded in
    direction = direction - direction.mean(-1, keepdim=True)  # centring a part = projecting out the mean
    resid = cache[f"blocks.{n_layer - 1}.hook_resid_post"][:, pos]  # (B, C)
    scale = (resid.var(-1, unbiased=False) + ln_f.eps).sqrt()  # (B,): frozen, from the full residual

    def attribution(part: torch.Tensor) -> torch.Tensor:  # part (B, ..., C) -> (B, ...)
        flat = part.reshape(B, -1, C)
        return (torch.einsum("bnc,bc->bn", flat, direction) / scale[:, None]).reshape(part.shape[:-1])

    attn_parts, bias_parts, head_parts, mlp_parts = [], [], [], []
    for i, block in enumerate(blocks(model)):
        w_o = _linear_weight(block.attn.c_proj, f"h.{i}.attn.c_proj").view(C, nh, hs)  # (C_out, nh, hs)
        z = cache[f"blocks.{i}.attn.hook_z"][:, pos]  # (B, nh, hs)
        per_head = torch.einsum("bhd,chd->bhc", z, w_o)  # (B, nh, C): each head's write into the stream
        bias = block.attn.c_proj.bias
        head_parts.append(attribution(per_head))
        bias_parts.append(attribution(bias.expand(B, C)) if bias is not None else torch.zeros_like(scale))
        attn_parts.append(attribution(cache[f"blocks.{i}.hook_attn_out"][:, pos]))
        mlp_parts.append(attribution(cache[f"blocks.{i}.hook_mlp_out"][:, pos]))
    final_bias = unembed @ ln_f.bias if ln_f.bias is not None else torch.zeros_like(scale)
    return LogitAttribution(
        target=targets,
        position=pos,
        logit=logits[torch.arange(B), pos, targets],
        embed=attribution(cache["hook_embed"][:, pos]),
        pos_embed=attribution(cache["hook_pos_embed"][:, pos]),
        attn=torch.stack(attn_parts, dim=1),
        attn_bias=torch.stack(bias_parts, dim=1),
        heads=torch.stack(head_parts, dim=1),
        mlp=torch.stack(mlp_parts, dim=1),
        final_bias=final_bias,
    )


def _positions(positions: Sequence[int] | None, T: int) -> list[int]:
    if positions is None:
        return list(range(T))
    wanted = [int(p) for p in positions]
    bad = [p for p in wanted if not -T <= p < T]
    if bad or not wanted:
        raise ValueError(f"positions must be in [-{T}, {T}) for a {T}-token input, got {list(positions)}")
    return [p % T for p in wanted]


def _linear_weight(module: torch.nn.Module, name: str) -> torch.Tensor:
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise ValueError(
            f"{name} is a {type(module).__name__} without a plain weight (an inference layout); "
            "attribute on the model as loaded, before quantize_int8 / optimize_for_inference"
        )
    return weight
