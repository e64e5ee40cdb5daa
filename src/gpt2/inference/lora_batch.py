"""Many LoRA adapters on one base model, chosen per row of a batch (S-LoRA / Punica's grouped low-rank product).

A batch whose rows use different adapters (or none) runs the base model's products once for all rows; then, in
each adapted layer, the rows of each adapter present are gathered and get their own low-rank update:

    y = base(x)                                  # x (B, T, in) -> y (B, T, out), every row
    for adapter, rows in groups:                 # one small product per adapter present
        y[rows] += scaling * (x[rows] A^T) B^T   # (b, T, in) -> (b, T, r) -> (b, T, out), PEFT's order

No merged copy of the model exists: an adapter costs its own A and B (`LoRAAdapter.nbytes`), nothing more.

How: `adapted_view(model, routing)` is a second GPT over the same weights (the same tensors and layer objects;
only the blocks' container modules are new, and they share the model's hooks) whose adapted layers are
`AdaptedLinear`s reading `routing`, which says which rows take which adapter. A view with one adapter for every row
has fixed routing, so any number of them can decode at once; a `RoutedView`'s routing is set for each batch it
runs (`RoutedView.rows`), one batch at a time: `AdapterSet.routed` for `LLM.generate`, the server's runner for
its batch (gpt2.serve.runner), where the adapter is a property of each row.

Decode steps of a view run through the model's layers in PyTorch (float32 layers: oneDNN's products), not in the
native decoder (gpt2.cpu.decoder), which runs a whole step in one C++ call with no place for the low-rank
update; rows without an adapter in a batch of their own keep the native decoder.
"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar, cast

import torch
import torch.nn as nn

from gpt2.inference.faults import RowFaults
from gpt2.weights.adapters import TARGETABLE, LoRAAdapter, read_lora_adapter

if TYPE_CHECKING:
    from gpt2.model import GPT

Groups = list[tuple[LoRAAdapter, torch.Tensor | None]]  # an adapter and its rows (None: every row)


class UnknownAdapterError(KeyError):
    """An adapter name that is not loaded; the message names those that are."""

    def __str__(self) -> str:
        return str(self.args[0])


class DuplicateAdapterError(ValueError):
    """An adapter name that is already loaded."""


class TooManyAdaptersError(ValueError):
    """An adapter past the number the set may hold (`AdapterSet.add`'s max_loaded)."""


class AdapterRouting:
    """Which rows of the batch running now take which adapter: a list of (adapter, row indices (b,) or None for
    every row). Empty: no row has an adapter."""

    def __init__(self, groups: Groups | None = None) -> None:
        self.groups: Groups = groups or []
        self.faults: RowFaults | None = None  # where an update that raises is recorded (None: it propagates)

    @classmethod
    def for_rows(cls, rows: Sequence[LoRAAdapter | None], device: torch.device) -> AdapterRouting:
        """The routing of a batch whose row i takes rows[i] (None: the base model alone)."""
        indices: dict[int, list[int]] = {}
        adapters: dict[int, LoRAAdapter] = {}
        for row, adapter in enumerate(rows):
            if adapter is not None:
                indices.setdefault(id(adapter), []).append(row)
                adapters[id(adapter)] = adapter
        groups: Groups = []
        for key, members in indices.items():
            every_row = len(members) == len(rows)
            groups.append((adapters[key], None if every_row else torch.tensor(members, device=device)))
        return cls(groups)


class AdaptedLinear(nn.Module):
    """A base linear layer (any layout: nn.Linear, OneDNNLinear, NativeLinear, Int8Linear, ...) plus the low-rank
    update of each row's adapter, as the shared routing says. The base layer is the model's own object."""

    def __init__(self, base: nn.Module, name: str, routing: AdapterRouting) -> None:
        super().__init__()
        self.base = base
        self.name = name  # the module name adapters key their weights by: transformer.h.N.attn.c_attn, ...
        self.routing = routing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (B, T, out) or (B, out)
        faults = self.routing.faults
        for adapter, rows in self.routing.groups:
            weights = adapter.layers.get(self.name)
            if weights is None:
                continue  # this adapter leaves this layer alone
            a, b = weights  # (r, in), (out, r)
            if faults and any(row in faults for row in _members(rows, x)):
                continue  # its rows failed in an earlier layer: they end after this forward
            try:
                if rows is None:
                    y = y + ((x.float() @ a.T) @ b.T * adapter.scaling).to(y.dtype)
                else:
                    y = y.index_add(0, rows, ((x[rows].float() @ a.T) @ b.T * adapter.scaling).to(y.dtype))
            except Exception as error:
                if faults is None:
                    raise
                faults.record(_members(rows, x), f"its adapter {adapter.name!r} in {self.name}", error)
        return y

    def extra_repr(self) -> str:
        return f"name={self.name}"


def _members(rows: torch.Tensor | None, x: torch.Tensor) -> Sequence[int]:
    """A group's rows of the batch x (B, ...) as indices (None: every row)."""
    return range(x.shape[0]) if rows is None else rows.tolist()


def adapted_view(model: GPT, routing: AdapterRouting) -> GPT:
    """A GPT over `model`'s own weights whose targetable layers (c_attn, c_proj, c_fc of every block) add the
    updates `routing` names. Only the container modules from the root to those layers are new objects (see the
    module docstring); the model itself is unchanged."""
    view = _shell(model)
    transformer = _shell(model.transformer)
    view._modules["transformer"] = transformer
    blocks = _shell(model.transformer.h)
    transformer._modules["h"] = blocks
    for index, block in enumerate(model.transformer.h):
        new_block = _shell(block)
        blocks._modules[str(index)] = new_block
        for part in ("attn", "mlp"):
            new_part = _shell(cast("nn.Module", getattr(block, part)))
            new_block._modules[part] = new_part
            for name, layer in list(new_part._modules.items()):
                if name in TARGETABLE and layer is not None:
                    full_name = f"transformer.h.{index}.{part}.{name}"
                    new_part._modules[name] = AdaptedLinear(layer, full_name, routing)
    return view


M = TypeVar("M", bound=nn.Module)


def _shell(module: M) -> M:
    """A new module object of the same class sharing `module`'s parameters, buffers and children: only the
    dictionaries that hold them are new, so replacing a child in the shell leaves `module` as it is."""
    shell = copy.copy(module)
    shell._modules = dict(module._modules)
    shell._parameters = dict(module._parameters)
    shell._buffers = dict(module._buffers)
    return shell


class RoutedView:
    """One adapted view of a model whose routing is set for each batch it runs: `with view.rows(adapters) as
    model` (the model itself when no row has an adapter). One batch at a time holds it: the routing is its state."""

    def __init__(self, model: GPT) -> None:
        self.model = model
        self._routing = AdapterRouting()
        self._view: GPT | None = None  # made on first use
        self._lock = threading.Lock()

    @contextmanager
    def rows(self, rows: Sequence[LoRAAdapter | None], faults: RowFaults | None = None) -> Iterator[GPT]:
        """The model for a batch whose row i takes rows[i] (None: the base model alone), until the block ends.
        `faults`: an update that raises is recorded there against its rows (gpt2.inference.faults)."""
        if all(adapter is None for adapter in rows):
            yield self.model
            return
        device = self.model.transformer.wte.weight.device
        with self._lock:
            if self._view is None:
                self._view = adapted_view(self.model, self._routing)
            self._routing.groups = AdapterRouting.for_rows(rows, device).groups
            self._routing.faults = faults
            try:
                yield self._view
            finally:
                self._routing.groups = []
                self._routing.faults = None


class AdapterSet:
    """The adapters loaded for one base model, by name, and the views that run them.

    `add` reads and checks an adapter (PEFT's format), `remove` forgets one (a batch already running with it keeps
    its weights: they live as long as something refers to them), `model_for(adapter)` is the model to decode a
    batch whose every row takes one adapter (or none: the base model itself), `routed(rows)` that of a batch
    mixing them. Adding and removing are safe from any thread (the server loads adapters while it runs)."""

    def __init__(self, model: GPT) -> None:
        self.model = model
        self._adapters: dict[str, LoRAAdapter] = {}
        self._views: dict[str, GPT] = {}
        self._mixed = RoutedView(model)
        self._lock = threading.Lock()

    @property
    def names(self) -> list[str]:
        return list(self._adapters)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def __len__(self) -> int:
        return len(self._adapters)

    def add(
        self,
        name: str,
        directory: str | os.PathLike[str],
        *,
        max_rank: int | None = None,
        max_loaded: int | None = None,
    ) -> LoRAAdapter:
        """Load the adapter in `directory` under `name`, registered only once it is read and checked (errors:
        DuplicateAdapterError, TooManyAdaptersError when `max_loaded` are held already, and read_lora_adapter's,
        a rank above `max_rank` among them)."""
        if not name or not isinstance(name, str):
            raise ValueError(f"an adapter needs a non-empty name, got {name!r}")
        with self._lock:
            if name in self._adapters:
                raise DuplicateAdapterError(f"an adapter named {name!r} is already loaded; pick another name")
            if max_loaded is not None and len(self._adapters) >= max_loaded:
                raise TooManyAdaptersError(
                    f"{len(self._adapters)} adapters are loaded, the most allowed here; unload one first "
                    "(gpt2 serve --max-cpu-loras sets the limit)"
                )
            adapter = read_lora_adapter(directory, self.model.config, name, max_rank=max_rank)
            adapter = adapter.to(self.model.transformer.wte.weight.device)
            self._adapters[name] = adapter
            return adapter

    def remove(self, name: str) -> LoRAAdapter:
        with self._lock:
            adapter = self.get(name)
            del self._adapters[name]
            self._views.pop(name, None)
            return adapter

    def get(self, name: str) -> LoRAAdapter:
        """The adapter called `name`; UnknownAdapterError naming the loaded ones otherwise."""
        adapter = self._adapters.get(name)
        if adapter is None:
            known = ", ".join(repr(known) for known in self._adapters) or "none"
            raise UnknownAdapterError(f"no adapter named {name!r} is loaded (loaded: {known})")
        return adapter

    def resolve(self, names: str | None | Sequence[str | None], count: int) -> list[LoRAAdapter | None]:
        """Per row, the adapter a request names: one name (or None) for all `count` rows, or one per row."""
        if names is None or isinstance(names, str):
            names = [names] * count
        if len(names) != count:
            raise ValueError(f"got {len(names)} adapter names for {count} prompts; pass one name or one per prompt")
        return [None if name is None else self.get(name) for name in names]

    def model_for(self, adapter: LoRAAdapter | None) -> GPT:
        """The model for rows that all take `adapter` (None: the base model, native decoder and all)."""
        if adapter is None:
            return self.model
        view = self._views.get(adapter.name)
        if view is None or self._adapters.get(adapter.name) is not adapter:
            view = adapted_view(self.model, AdapterRouting([(adapter, None)]))
            if self._adapters.get(adapter.name) is adapter:
                self._views[adapter.name] = view
        return view

    @contextmanager
    def routed(self, rows: Sequence[LoRAAdapter | None]) -> Iterator[GPT]:
        """The model for a batch whose row i takes rows[i]; a batch mixing adapters holds the mixed view (one
        such batch at a time) until the block ends."""
        if len({id(adapter) for adapter in rows}) == 1:
            yield self.model_for(rows[0])
            return
        with self._mixed.rows(rows) as model:
            yield model
