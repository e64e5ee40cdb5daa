"""Activation patching: which activations carry the difference between a clean and a corrupted prompt.

For two prompts of the same length, the corrupted run is repeated with one activation replaced by the clean
run's, and a metric of the final position's logits (by default the answer's logit minus a wrong answer's) is
read off. Sites, as TransformerLens' `transformer_lens.patching` functions of the same job:

    resid_pre  blocks.L.hook_resid_pre at one position   (n_layer, T)   get_act_patch_resid_pre
    attn_out   blocks.L.hook_attn_out at one position    (n_layer, T)   get_act_patch_attn_out
    mlp_out    blocks.L.hook_mlp_out at one position     (n_layer, T)   get_act_patch_mlp_out
    head       blocks.L.attn.hook_z of one head, every   (n_layer, nh)  get_act_patch_attn_head_out_all_pos
               position (the head's output before c_proj)

TransformerLens runs one forward per cell. Here a layer's cells run as one batch of patched copies, and
each batch starts at the patched block from the corrupted run's cached residual stream (the blocks before it
compute the same thing in every copy), so a whole sweep costs about n_layer / 2 forwards of T rows. Only the
final position goes through the LM head.

`attribution_patching` is the first-order estimate of the same table from one forward and one backward of
the corrupted run: (clean - corrupted activation) . d metric / d activation, summed over the cell's entries
(Nanda's "attribution patching"; cf. TransformerLens' tutorials, which compute it by hand with hooks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpt2.inspect.hooks import ActivationCache, check_token_ids, forward_from, run_with_cache
from gpt2.model import GPT

Metric = Callable[[torch.Tensor], torch.Tensor]
"""metric(logits) -> values: logits (N, V) of the final position of N runs -> (N,) one value per run."""

SITES = ("resid_pre", "attn_out", "mlp_out", "head")
_HOOKS = {"resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "head": "attn.hook_z"}
DEFAULT_ROWS = 64  # patched copies per forward; a layer of more cells runs in several batches


@dataclass(frozen=True)
class PatchingResult:
    """The metric with each cell patched: values (n_layer, T) for positions, (n_layer, nh) for heads."""

    site: str
    values: torch.Tensor
    clean: float
    """The metric of the clean run (what a patch can at best restore)."""
    corrupted: float
    """The metric of the unpatched corrupted run."""

    def to_dict(self, labels: list[str], *, key: str = "logit_diff") -> dict[str, object]:
        """Plain data for JSON: the site, the token labels, the table under `key` ([layer][position] or
        [layer][head]) and the clean and corrupted runs' values."""
        return {
            "site": self.site,
            "tokens": labels,
            key: self.values.tolist(),
            "clean": self.clean,
            "corrupted": self.corrupted,
        }


def logit_diff(answer: int, wrong: int) -> Metric:
    """The metric `logits[:, answer] - logits[:, wrong]` (final position), the usual patching metric."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, answer] - logits[:, wrong]

    return metric


def activation_patching(
    model: GPT,
    clean: torch.Tensor,
    corrupted: torch.Tensor,
    metric: Metric,
    site: str = "resid_pre",
    *,
    rows_per_forward: int = DEFAULT_ROWS,
) -> PatchingResult:
    """The metric of the corrupted run with each cell of `site` patched in from the clean run (one at a time).

    clean, corrupted: (1, T) token ids of the same length. The model must be in eval mode (no dropout).

    >>> from gpt2.config import GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> result = activation_patching(model, torch.tensor([[1, 2, 3]]), torch.tensor([[1, 5, 3]]), logit_diff(7, 8))
    >>> result.values.shape  # (n_layer, T)
    torch.Size([2, 3])
    """
    _check(model, clean, corrupted, site)
    if rows_per_forward < 1:
        raise ValueError(f"rows_per_forward must be at least 1, got {rows_per_forward}")
    n_layer, T, nh = model.config.n_layer, clean.shape[1], model.config.n_head
    hook = _HOOKS[site]
    names = [f"blocks.{i}.{hook}" for i in range(n_layer)]
    resid_names = [f"blocks.{i}.hook_resid_pre" for i in range(n_layer)]
    with torch.no_grad():
        clean_logits, clean_cache = run_with_cache(model, clean, names)
        corrupted_logits, corrupted_cache = run_with_cache(model, corrupted, resid_names)
        cells = nh if site == "head" else T
        values = torch.empty(n_layer, cells)
        for layer in range(n_layer):
            for start in range(0, cells, rows_per_forward):
                chosen = torch.arange(start, min(cells, start + rows_per_forward), device=clean.device)
                values[layer, chosen.cpu()] = (
                    _patched_metric(model, layer, names[layer], chosen, site, clean_cache, corrupted_cache, metric)
                    .float()
                    .cpu()
                )
        return PatchingResult(
            site,
            values,
            float(metric(clean_logits[:, -1])[0]),
            float(metric(corrupted_logits[:, -1])[0]),
        )


def _patched_metric(
    model: GPT,
    layer: int,
    name: str,
    chosen: torch.Tensor,
    site: str,
    clean_cache: ActivationCache,
    corrupted_cache: ActivationCache,
    metric: Metric,
) -> torch.Tensor:
    """One batch: N = len(chosen) copies of the corrupted run from block `layer` on, copy r with cell
    chosen[r] (a position, or a head) of activation `name` taken from the clean run. Returns the (N,) metric."""
    resid = corrupted_cache[f"blocks.{layer}.hook_resid_pre"]  # (1, T, C)
    N = len(chosen)
    clean_value = clean_cache[name]  # (1, T, C) or, for heads, (1, T, nh, hs)
    cell_axis = 2 if site == "head" else 1
    one_hot = torch.zeros(N, clean_value.shape[cell_axis], dtype=torch.bool, device=resid.device)
    one_hot[torch.arange(N, device=resid.device), chosen] = True  # (N, cells)
    shape = [N] + [1] * (clean_value.dim() - 1)
    shape[cell_axis] = clean_value.shape[cell_axis]
    mask = one_hot.view(shape)  # (N, T, 1) or (N, 1, nh, 1)

    def visit(hook_name: str, x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, clean_value, x) if hook_name == name else x

    final = forward_from(model, resid.expand(N, *resid.shape[1:]), layer, visit)  # (N, T, C)
    return metric(model.lm_head(final[:, -1]))  # (N,)


def attribution_patching(
    model: GPT, clean: torch.Tensor, corrupted: torch.Tensor, metric: Metric, site: str = "resid_pre"
) -> PatchingResult:
    """The first-order estimate of `activation_patching` from one forward and one backward of the corrupted
    run: for each cell, (clean - corrupted activation) . d metric / d activation over the cell's entries.
    The model's parameters' .grad are left as they were."""
    _check(model, clean, corrupted, site)
    n_layer = model.config.n_layer
    names = [f"blocks.{i}.{_HOOKS[site]}" for i in range(n_layer)]
    with torch.no_grad():
        clean_logits, clean_cache = run_with_cache(model, clean, names)
    with torch.enable_grad():
        # the graph starts at the embeddings even when the parameters are frozen
        hooks = [("hook_embed", lambda x, name: x if x.requires_grad else x.detach().requires_grad_())]
        corrupted_logits, corrupted_cache = run_with_cache(model, corrupted, names, fwd_hooks=hooks)
        value = metric(corrupted_logits[:, -1])
        gradients = torch.autograd.grad(value.sum(), [corrupted_cache[name] for name in names])
    rows = []
    for name, gradient in zip(names, gradients, strict=True):
        delta = (clean_cache[name] - corrupted_cache[name].detach()) * gradient  # (1, T, C) or (1, T, nh, hs)
        rows.append(delta.sum(dim=(1, 3)) if site == "head" else delta.sum(dim=2))  # (1, nh) or (1, T)
    values = torch.cat(rows).float().cpu()  # (n_layer, cells)
    return PatchingResult(site, values, float(metric(clean_logits[:, -1])[0]), float(value.detach()[0]))


def _check(model: GPT, clean: torch.Tensor, corrupted: torch.Tensor, site: str) -> None:
    if site not in SITES:
        raise ValueError(f"unknown patching site {site!r}; choose one of {', '.join(SITES)}")
    check_token_ids(model, clean)
    check_token_ids(model, corrupted)
    if clean.shape[0] != 1 or clean.shape != corrupted.shape:
        raise ValueError(
            f"clean and corrupted must be one prompt each of the same length, got shapes {tuple(clean.shape)} "
            f"and {tuple(corrupted.shape)}; pick prompts that tokenize to the same number of tokens"
        )
    if model.training and model.config.dropout > 0:
        raise ValueError("activation patching needs dropout off: call model.eval() first")
