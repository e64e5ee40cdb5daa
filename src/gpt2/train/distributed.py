"""Data-parallel training under torchrun: this process's rank, the process group, DDP replication and FSDP2
sharding, and the gathered ("full") model and optimizer states that checkpoints hold, so a checkpoint looks
the same whatever the world size or the wrapping.

Every rank computes the same global batch and keeps its own rows (see gpt2.data.BatchLoader), so N processes
compute what one process computes with the same global batch.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.nn as nn

from gpt2.model import GPT


@dataclass(frozen=True)
class Distributed:
    """This process's place in a torchrun job (rank 0 of 1 when not launched by torchrun)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of world size {self.world_size} is not a place in a job")

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def distributed_from_env() -> Distributed:
    """Read torchrun's RANK / LOCAL_RANK / WORLD_SIZE."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Distributed(int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world_size)


@contextlib.contextmanager
def process_group(dist: Distributed, device: torch.device) -> Iterator[None]:
    """Join the job's process group for the duration (NCCL on CUDA, gloo on the CPU), then leave it. Nothing
    happens for a single process or when the caller already initialized the group."""
    started = dist.enabled and not torch_dist.is_initialized()
    if started:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        torch_dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    try:
        yield
    finally:
        if started and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def barrier(dist: Distributed) -> None:
    if dist.enabled:
        torch_dist.barrier()


# ------------------------------------------------------------------------------------- reductions
def mean_over_ranks(value: torch.Tensor, dist: Distributed) -> torch.Tensor:
    """`value` averaged over the ranks, in place (SUM then divide: gloo has no AVG)."""
    if dist.enabled:
        torch_dist.all_reduce(value, op=torch_dist.ReduceOp.SUM)
        value /= dist.world_size
    return value


def any_rank(flag: bool, device: torch.device, dist: Distributed) -> bool:
    """True when `flag` is set on any rank (so all ranks stop at the same step)."""
    if not dist.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    torch_dist.all_reduce(value, op=torch_dist.ReduceOp.MAX)
    return bool(value.item())


# ---------------------------------------------------------------------------------------- wrapping
def shard(model: GPT) -> GPT:
    """FSDP2, in place: shard each block, then the root (embeddings, final LayerNorm, tied head). Do it before
    building the optimizer, which must hold the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


def replicate(model: nn.Module, device: torch.device) -> nn.Module:
    """DDP: a wrapper that all-reduces the gradients during backward; `model` itself is left as it is."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def is_sharded(model: nn.Module) -> bool:
    """True when FSDP2 has sharded `model`'s parameters (they are DTensors)."""
    if not torch_dist.is_available():
        return False
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce on all but the last micro-step (DDP no_sync; FSDP2's requires-sync flag)."""
    inner: Any = getattr(model, "_orig_mod", model)  # under torch.compile
    if hasattr(inner, "no_sync") and not enabled:
        return inner.no_sync()
    if hasattr(inner, "set_requires_gradient_sync"):
        inner.set_requires_gradient_sync(enabled)
    return contextlib.nullcontext()


# -------------------------------------------------------------------------------------- full states
def full_model(model: GPT) -> GPT:
    """An unsharded CPU copy of an FSDP model. A collective: every rank must call it, in step."""
    full = {name: _unshard(tensor) for name, tensor in model.state_dict().items()}  # FSDP2 keeps the names
    copy = GPT(model.config)
    copy.load_state_dict(full)
    return copy


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load an unsharded state dict into an FSDP model, sharding each tensor like the one it replaces."""
    current = model.state_dict()
    model.load_state_dict({name: _reshard(tensor, current[name]) for name, tensor in state.items()})


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state with every sharded tensor gathered: what one unsharded process would save."""
    state = optimizer.state_dict()
    state["state"] = {
        index: {key: _unshard(value) for key, value in entry.items()} for index, entry in state["state"].items()
    }
    return state


def load_full_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a gathered optimizer state, re-sharding each tensor like the parameter it belongs to."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    resharded = {}
    for index, entry in state["state"].items():
        param = params[int(index)]
        resharded[index] = {
            key: _reshard(value, param) if isinstance(value, torch.Tensor) and value.shape == param.shape else value
            for key, value in entry.items()
        }
    optimizer.load_state_dict({**state, "state": resharded})


def _unshard(tensor: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor().cpu() if isinstance(tensor, DTensor) else tensor


def _reshard(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`full` split across the ranks as `like` is (unchanged when `like` is not sharded)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full.to(like.device), like.device_mesh, like.placements)
