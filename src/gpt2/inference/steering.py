"""Steering: change the residual stream while generating, per row of a batch.

An intervention names a hook (TransformerLens' names, as gpt2.inspect) and what to do there, at every
position the forward computes (the prompt's, then each new token's):

    {"hook": "blocks.6.hook_resid_pre", "vector": [C floats], "scale": 4.0}     x + scale * vector
    {"hook": "blocks.6.hook_resid_pre", "sae": SAE, "feature": 123, "value": 8.0}
        the SAE's feature set to `value`, the rest of x kept: x + decode(acts with feature = value) - decode(acts)
        (the SAE's reconstruction error stays in, as SAELens' HookedSAETransformer with use_error_term=True)

Hooks: blocks.{i}.hook_resid_pre (entering block i), hook_attn_out, hook_mlp_out (a branch's output, before
it is added) and hook_resid_post (leaving block i). `steer(model, plan)` holds PyTorch forward hooks on those
blocks while it is open: plan[b] lists row b's interventions (a plan of one list applies it to every row), so
rows with and without interventions share one batched forward, and a row without any is computed exactly as
unsteered (its rows are left untouched, not added zero). The hooks run in the model's PyTorch forward:
generation under steering must take that path (`STEERED_ENGINE`: no native decode step, no compile).

`parse_steering` turns plain data (a request's JSON) into interventions, refusing a malformed one with a
ValueError that names the field (`steering[1].vector: ...`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch

from gpt2.config import is_finite_number
from gpt2.inference.faults import RowFaults

if TYPE_CHECKING:
    from gpt2.model import GPT, Block

STEERABLE = ("hook_resid_pre", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
STEERED_ENGINE: dict[str, Any] = {"native": False, "compile": False}
"""Decode options under steering: the native step and compiled graphs do not run the model's modules."""
T = TypeVar("T")


class FeatureDictionary(Protocol):
    """What clamping a feature needs of a sparse autoencoder (gpt2.inspect.sae.SparseAutoencoder is one)."""

    @property
    def hook_name(self) -> str: ...

    @property
    def d_in(self) -> int: ...

    @property
    def d_sae(self) -> int: ...

    def clamped(self, x: torch.Tensor, feature: int, value: float) -> torch.Tensor:
        """x (..., C) with `feature` set to `value` and the reconstruction error kept."""
        ...


@dataclass(frozen=True)
class AddVector:
    hook: str
    vector: torch.Tensor  # (C,)
    scale: float = 1.0


@dataclass(frozen=True)
class ClampFeature:
    hook: str
    sae: FeatureDictionary
    feature: int
    value: float


Intervention = AddVector | ClampFeature


def parse_steering(
    items: Sequence[Mapping[str, Any] | Intervention],
    model: GPT,
    saes: Mapping[str, FeatureDictionary] | None = None,
    *,
    field: str = "steering",
) -> list[Intervention]:
    """Interventions from plain data (or interventions, checked again), each checked against `model`; an SAE
    is named from `saes` or given as the object. A ValueError names the bad field: `steering[0].hook`."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise ValueError(f"{field} must be a list of interventions, got {type(items).__name__}")
    return [_parse_one(item, model, saes or {}, f"{field}[{i}]") for i, item in enumerate(items)]


def _parse_one(
    item: Mapping[str, Any] | Intervention, model: GPT, saes: Mapping[str, FeatureDictionary], where: str
) -> Intervention:
    if isinstance(item, AddVector):
        item = {"hook": item.hook, "vector": item.vector, "scale": item.scale}
    elif isinstance(item, ClampFeature):
        item = {"hook": item.hook, "sae": item.sae, "feature": item.feature, "value": item.value}
    if not isinstance(item, Mapping):
        raise ValueError(f"{where} must be an object with a hook, got {type(item).__name__}")
    allowed = {"hook", "vector", "scale"} if "vector" in item else {"hook", "sae", "feature", "value"}
    unknown = sorted(set(item) - allowed)
    if unknown:
        raise ValueError(
            f"{where}.{unknown[0]}: unknown field; an intervention is {{hook, vector, scale}} or "
            "{hook, sae, feature, value}"
        )
    hook = _hook(item.get("hook"), model, f"{where}.hook")
    if "vector" in item:
        vector = _vector(item["vector"], model.config.n_embd, f"{where}.vector")
        return AddVector(hook, vector, _finite(item.get("scale", 1.0), f"{where}.scale"))
    if "sae" not in item:
        raise ValueError(f"{where}: give a vector (with a scale) or an sae with a feature and a value")
    sae = item["sae"]
    if isinstance(sae, str):
        if sae not in saes:
            known = ", ".join(sorted(saes)) or "none (start with --sae NAME=DIR)"
            raise ValueError(f"{where}.sae: no SAE named {sae!r}; known: {known}")
        sae = saes[sae]
    if not hasattr(sae, "clamped"):
        raise ValueError(f"{where}.sae must name a sparse autoencoder, got {type(sae).__name__}")
    check_feature_dictionary(sae, model, f"{where}.sae")
    if sae.hook_name != hook:
        raise ValueError(f"{where}.hook: the SAE reads {sae.hook_name!r}, not {hook!r}")
    feature = item.get("feature")
    if isinstance(feature, bool) or not isinstance(feature, int) or not 0 <= feature < sae.d_sae:
        raise ValueError(f"{where}.feature must be an integer in [0, {sae.d_sae}), got {feature!r}")
    return ClampFeature(hook, sae, feature, _finite(item.get("value"), f"{where}.value"))


def check_feature_dictionary(sae: FeatureDictionary, model: GPT, where: str) -> None:
    """A ValueError (starting with `where`) unless steering can clamp `sae`'s features in `model`: its hook is one
    steering uses and exists in the model, and it reads the residual stream's width. What a server checks of its
    SAEs at start, and `parse_steering` of each SAE a request names."""
    _hook(sae.hook_name, model, f"{where} hook")
    if sae.d_in != model.config.n_embd:
        raise ValueError(
            f"{where} reads {sae.d_in} values at {sae.hook_name!r}; the model has {model.config.n_embd} there: use "
            "an SAE made for this model"
        )


def _hook(name: object, model: GPT, where: str) -> str:
    n_layer = model.config.n_layer
    valid = {f"blocks.{i}.{suffix}" for i in range(n_layer) for suffix in STEERABLE}
    if not isinstance(name, str) or name not in valid:
        raise ValueError(
            f"{where}: {name!r} is not a hook steering can use; one of blocks.{{i}}.{', '.join(STEERABLE)} "
            f"with i in 0..{n_layer - 1}"
        )
    return name


def _vector(values: object, width: int, where: str) -> torch.Tensor:
    if isinstance(values, list | tuple):  # plain data: each entry a number, never a JSON true / false
        if any(isinstance(value, bool) for value in values):
            raise ValueError(f"{where} must be a list of {width} numbers, got a boolean among them")
        if any(isinstance(value, int | float) and not is_finite_number(value) for value in values):
            raise ValueError(f"{where} holds NaN, infinity or a number past float's range; every value must be finite")
    try:
        vector = torch.as_tensor(values, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{where} must be a list of {width} numbers ({err})") from None
    if vector.shape != (width,):
        raise ValueError(f"{where} has shape {tuple(vector.shape)}; the model's residual stream has {width} values")
    if not bool(torch.isfinite(vector).all()):
        raise ValueError(f"{where} holds NaN or infinity; every value must be finite")
    return vector


def _finite(value: object, where: str) -> float:
    if not is_finite_number(value):
        raise ValueError(f"{where} must be a finite number, got {value!r}")
    return float(value)


# ------------------------------------------------------------------------------------------ in the forward
@contextlib.contextmanager
def steer(model: GPT, plan: Sequence[Sequence[Intervention]], faults: RowFaults | None = None) -> Iterator[None]:
    """While open, every forward of `model` applies plan[b] to row b (B == len(plan)), or plan[0] to every
    row when the plan has one list. `faults`: an intervention that raises is recorded there against its rows,
    which keep their activations (gpt2.inference.faults); without it, the exception ends the forward. The hooks are
    removed on leaving, whatever happens."""
    by_hook: dict[str, list[tuple[int | None, Intervention]]] = {}
    for row, interventions in enumerate(plan):
        for intervention in interventions:
            by_hook.setdefault(intervention.hook, []).append((None if len(plan) == 1 else row, intervention))
    handles = []
    try:
        for hook, entries in by_hook.items():
            block = cast("Block", model.transformer.h[int(hook.split(".")[1])])
            suffix = hook.split(".", 2)[2]
            if suffix == "hook_resid_pre":
                handles.append(block.register_forward_pre_hook(_pre_hook(entries, len(plan), faults)))
            else:
                modules: dict[str, torch.nn.Module] = {"hook_attn_out": block.attn, "hook_mlp_out": block.mlp}
                module = modules.get(suffix, block)
                handles.append(module.register_forward_hook(_post_hook(entries, len(plan), faults)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def steered_stream(model: GPT, plan: Sequence[Sequence[Intervention]], pieces: Iterator[T]) -> Iterator[T]:
    """`pieces` (a generation stream) consumed under `steer(model, plan)`."""
    with steer(model, plan):
        yield from pieces


def apply_interventions(
    x: torch.Tensor,
    entries: Sequence[tuple[int | None, Intervention]],
    rows: int,
    faults: RowFaults | None = None,
) -> torch.Tensor:
    """x (B, T, C) with each (row, intervention) applied to that row (row None: every row). With `faults`, an
    intervention that raises is recorded against its rows, which are left as they are from then on."""
    if rows != 1 and x.shape[0] != rows:
        raise ValueError(f"the steering plan has {rows} rows but the forward has {x.shape[0]}")
    for row, intervention in entries:
        affected = range(x.shape[0]) if row is None else (row,)
        if faults is not None and any(each in faults for each in affected):
            continue
        target = x if row is None else x[row : row + 1]  # (B or 1, T, C)
        try:
            if isinstance(intervention, AddVector):
                changed = target + intervention.scale * intervention.vector.to(x.device, x.dtype)
            else:
                changed = intervention.sae.clamped(target, intervention.feature, intervention.value).to(x.dtype)
            if changed.shape != target.shape:
                raise ValueError(f"it gives shape {tuple(changed.shape)} for activations of {tuple(target.shape)}")
        except Exception as error:
            if faults is None:
                raise
            faults.record(affected, f"its steering at {intervention.hook}", error)
            continue
        if row is None:
            x = changed
        else:
            x = torch.cat([x[:row], changed, x[row + 1 :]])
    return x


def _pre_hook(entries: list[tuple[int | None, Intervention]], rows: int, faults: RowFaults | None) -> Any:
    def hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (apply_interventions(args[0], entries, rows, faults), *args[1:])

    return hook


def _post_hook(entries: list[tuple[int | None, Intervention]], rows: int, faults: RowFaults | None) -> Any:
    def hook(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return apply_interventions(output, entries, rows, faults)

    return hook
