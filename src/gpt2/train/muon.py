"""Muon (MomentUm Orthogonalized by Newton-Schulz) for the transformer blocks' matrices, AdamW for the rest, in one
optimizer so the Trainer, the GradScaler and checkpoints see a single object.

Muon, per 2-D parameter W (shape [out, in], as nn.Linear stores it) with gradient G:

    B <- mu * B + (1 - mu) * G                      momentum buffer (an EMA, as torch.optim.Muon and Keller Jordan's)
    U <- (1 - mu) * G + mu * B   (nesterov)         else U <- B
    O <- NS_k(U)                                     k quintic Newton-Schulz steps: ~ the orthogonal factor of U
    W <- W * (1 - lr * wd)                           decoupled weight decay
    W <- W - lr * sqrt(max(1, out / in)) * O         the scale keeps the update's RMS alike across shapes

NS_k: X = U / max(||U||_F, eps), transposed to be wide (rows <= cols); k times A = X X^T,
X <- a X + (b A + c A^2) X with (a, b, c) = (3.4445, -4.7750, 2.0315); transposed back. This is
torch.optim.Muon's algorithm (adjust_lr_fn "original"), computed differently: torch loops over the parameters in
Python and always runs NS in bfloat16, which on a CPU without AMX is 50x slower than float32. Here every group
of same-shaped matrices (a block's c_attn over all layers, ...) is stacked and orthogonalized by one chain of
batched matmuls (`torch.baddbmm`), in bfloat16 on CUDA (modded-nanogpt) and on CPUs that multiply it fast, in
float32 on other CPUs, optionally torch.compile'd; the momentum and the weight updates are `torch._foreach_*`
calls.

Sharded parameters (FSDP2 DTensors): NS needs the whole matrix, so each rank all-gathers the momentum-corrected
update of every sharded matrix (`full_tensor`), orthogonalizes all of them (redundantly: the same result on every
rank), and applies its own shard of the result. The momentum buffers stay sharded like the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch.optim.adamw import adamw

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The quintic's (a, b, c): Keller Jordan's, also torch.optim.Muon's defaults."""
NS_EPS = 1e-7


def newton_schulz(
    updates: torch.Tensor, steps: int, coefficients: tuple[float, float, float] = NS_COEFFICIENTS, eps: float = NS_EPS
) -> torch.Tensor:
    """The approximate orthogonal factor of each matrix of `updates` (n, rows, cols), rows <= cols, in the dtype
    given (the caller casts). One chain of batched matmuls for all n matrices.

    In float32, a matrix at least twice as wide as tall takes the Gram form: every iterate is X_k = M_k X_0 with
    M_k a polynomial in A_0 = X_0 X_0^T, so the iterations run on (rows, rows) matrices (P = aI + bA + cA^2,
    M <- P M, A <- P^2 A, since P commutes with A) and X_0 is touched twice instead of 2 * steps times: the same
    result in exact arithmetic, ~40% fewer FLOPs for the MLP's [C, 4C]. bfloat16 keeps the plain form (the Gram
    form loses accuracy in low precision)."""
    a, b, c = coefficients
    norms = torch.linalg.vector_norm(updates, dim=(-2, -1), keepdim=True).clamp_min(eps)  # (n, 1, 1)
    x = updates / norms  # spectral norm <= Frobenius norm = 1
    rows, cols = x.shape[-2:]
    if x.dtype == torch.float32 and cols >= 2 * rows:
        gram = torch.bmm(x, x.mT)  # A_0: (n, rows, rows)
        identity = torch.eye(rows, dtype=x.dtype, device=x.device).expand_as(gram)
        transform = None
        for step in range(steps):
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c).add_(identity, alpha=a)  # P = aI + bA + cA^2
            transform = poly if transform is None else torch.bmm(poly, transform)  # M <- P M
            if step < steps - 1:
                gram = torch.bmm(poly, torch.bmm(poly, gram))  # A <- P A P = P^2 A
        return torch.bmm(transform, x) if transform is not None else x
    for _ in range(steps):
        gram = torch.bmm(x, x.mT)  # (n, rows, rows)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x


def update_scale(shape: torch.Size | tuple[int, ...]) -> float:
    """The LR multiplier of a matrix [out, in]: sqrt(max(1, out / in)) (torch's adjust_lr_fn='original')."""
    return math.sqrt(max(1.0, shape[0] / shape[1]))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (sharded) DTensor: an all-gather; a plain tensor as it is."""
    return tensor.full_tensor() if _is_dtensor(tensor) else tensor  # type: ignore[attr-defined]


def _like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """This rank's part of `full`, sharded like `param` (every rank holds the same `full`: no communication)."""
    if not _is_dtensor(param):
        return full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)  # type: ignore[attr-defined]


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return type(tensor).__name__ == "DTensor"


class MuonAdamW(torch.optim.Optimizer):
    """Muon for the param groups with `use_muon=True`, AdamW (torch's fused / foreach kernels) for the others.

    Muon groups: lr, weight_decay, momentum, nesterov, ns_steps, max_lr (the schedule's peak). AdamW groups: lr,
    betas, eps, weight_decay, max_lr. ns_dtype: the dtype NS runs in (float32 or bfloat16). compile: run NS
    through torch.compile. adamw_impl: 'fused', 'foreach' or 'for-loop' (as configure_optimizer resolves it).
    State: 'momentum_buffer' per Muon parameter; 'step', 'exp_avg', 'exp_avg_sq' per AdamW parameter (AdamW's
    own names), so checkpoints and the FSDP full-state helpers treat it like AdamW.
    """

    def __init__(
        self,
        param_groups: Iterable[dict[str, Any]],
        *,
        ns_dtype: torch.dtype = torch.float32,
        compile: bool = False,
        adamw_impl: str = "fused",
    ) -> None:
        defaults = dict(lr=0.02, weight_decay=0.0, momentum=0.95, nesterov=True, ns_steps=5, betas=(0.9, 0.95),
                        eps=1e-8, use_muon=False)  # fmt: skip
        super().__init__(list(param_groups), defaults)
        for group in self.param_groups:
            if group["use_muon"] and any(p.dim() != 2 for p in group["params"]):
                raise ValueError("Muon groups must hold 2-D matrices only; put other parameters in AdamW groups")
        self.ns_dtype = ns_dtype
        self.adamw_impl = adamw_impl
        self._orthogonalize: Callable[..., torch.Tensor] = (
            torch.compile(newton_schulz, dynamic=False) if compile else newton_schulz
        )

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                (self._muon_step if group["use_muon"] else self._adamw_step)(group, params)
        return loss

    def _muon_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        momentum, lr = group["momentum"], group["lr"]
        grads = [cast(torch.Tensor, p.grad) for p in params]
        buffers = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffers.append(state["momentum_buffer"])
        torch._foreach_lerp_(buffers, grads, 1 - momentum)  # B <- mu B + (1 - mu) G
        updates = torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers
        # Stack same-shaped matrices, wide side out (a tall [out, in] is orthogonalized as its transpose).
        by_shape: dict[tuple[int, int], list[int]] = {}
        for i, p in enumerate(params):
            by_shape.setdefault(tuple(p.shape), []).append(i)  # type: ignore[arg-type]
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        for shape, indices in by_shape.items():
            tall = shape[0] > shape[1]
            stacked = torch.stack([_full(updates[i]) for i in indices]).to(self.ns_dtype)  # (n, out, in)
            stacked = stacked.mT if tall else stacked
            ortho = self._orthogonalize(stacked, group["ns_steps"])
            ortho = (ortho.mT if tall else ortho).to(params[indices[0]].dtype)
            parts = [_like(o, params[i]) for o, i in zip(ortho.unbind(0), indices, strict=True)]
            torch._foreach_add_([params[i] for i in indices], parts, alpha=-lr * update_scale(shape))

    def _adamw_step(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        exp_avgs, exp_avg_sqs, steps = [], [], []
        for p in params:
            state = self.state[p]
            if not state:  # AdamW's own state layout (torch.optim.AdamW)
                step_device = p.device if self.adamw_impl == "fused" else "cpu"
                state["step"] = torch.zeros((), dtype=torch.float32, device=step_device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        grads = [cast(torch.Tensor, p.grad) for p in params]
        adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps,
              foreach=self.adamw_impl == "foreach", fused=self.adamw_impl == "fused", amsgrad=False,
              beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
              maximize=False)  # fmt: skip
