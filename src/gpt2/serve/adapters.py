"""The names a request's `model` field may take: the base model's, and each LoRA adapter's loaded on it (vLLM's
multi-LoRA serving). A request naming an adapter decodes with it, in the same batch as every other request
(gpt2.inference.lora_batch: the base's products once, each row's low-rank update added); the engine's sequence
holds the adapter itself, so an adapter unloaded meanwhile stays with the requests that started with it.

`/v1/models` lists the base and each adapter, the base as each adapter's `parent` (vLLM's model cards). vLLM's
`POST /v1/load_lora_adapter` {"lora_name", "lora_path"} and `POST /v1/unload_lora_adapter` {"lora_name"} add and
remove adapters while the server runs, answered with vLLM's plain-text success line; they are off unless the
server is started with `--allow-runtime-lora-updating` (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING), and answer 404
naming that flag otherwise.
"""

from __future__ import annotations

from typing import Any

from gpt2.inference.lora_batch import AdapterSet, DuplicateAdapterError, UnknownAdapterError
from gpt2.serve.protocol import APIError, bad_request, now
from gpt2.weights.adapters import LoRAAdapter

RUNTIME_FLAG = "--allow-runtime-lora-updating"


class ServedModels:
    """The base model's name and the adapters of `adapters` (loaded at start, or at run time when allowed)."""

    def __init__(self, base: str, adapters: AdapterSet, *, max_model_len: int, runtime_updates: bool) -> None:
        self.base = base
        self.adapters = adapters
        self.max_model_len = max_model_len
        self.runtime_updates = runtime_updates
        if base in adapters:
            raise ValueError(f"an adapter is named {base!r}, the served model's name; give it another name")
        self._created = {name: now() for name in [base, *adapters.names]}

    def resolve(self, name: object) -> LoRAAdapter | None:
        """The adapter a request's `model` names (None: the base model); a 404 naming the served ones otherwise."""
        if name == self.base:
            return None
        try:
            if isinstance(name, str):
                return self.adapters.get(name)
        except UnknownAdapterError:
            pass
        served = ", ".join(repr(served) for served in [self.base, *self.adapters.names])
        raise APIError(404, f"the model {name!r} does not exist; this server serves {served}", param="model",
                       code="model_not_found")  # fmt: skip

    def cards(self) -> list[dict[str, Any]]:
        return [self.card(name) for name in [self.base, *self.adapters.names]]

    def card(self, name: str) -> dict[str, Any]:
        """vLLM's model card: an adapter has the base as its parent and its folder as its root."""
        adapter = self.resolve(name)
        return {
            "id": name,
            "object": "model",
            "created": self._created.get(name, 0),
            "owned_by": "gpt2",
            "root": self.base if adapter is None else str(adapter.source),
            "parent": None if adapter is None else self.base,
            "max_model_len": self.max_model_len,
        }

    def load(self, body: Any) -> str:
        """POST /v1/load_lora_adapter: read the adapter in `lora_path` as `lora_name` (reads files: call it off the
        event loop). 400 for a name in use or an adapter that does not fit the base, 404 for a missing folder."""
        name, path = self._fields(body, ("lora_name", "lora_path"))
        if name == self.base:
            raise bad_request(f"{name!r} is the base model's name; pick another lora_name", "lora_name")
        try:
            self.adapters.add(name, path)
        except FileNotFoundError as err:
            raise APIError(404, str(err), param="lora_path", code="not_found") from err
        except DuplicateAdapterError as err:
            raise bad_request(str(err), "lora_name") from err
        except ValueError as err:  # an adapter for another base, a broken folder
            raise bad_request(str(err), "lora_path") from err
        self._created[name] = now()
        return f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: Any) -> str:
        """POST /v1/unload_lora_adapter: forget `lora_name` (requests running with it keep it to their end)."""
        (name,) = self._fields(body, ("lora_name",))
        try:
            self.adapters.remove(name)
        except UnknownAdapterError as err:
            raise APIError(404, str(err), param="lora_name", code="not_found") from err
        self._created.pop(name, None)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def _fields(self, body: Any, names: tuple[str, ...]) -> list[str]:
        """The body's string fields `names`, after checking run-time updates are on and nothing else is sent."""
        if not self.runtime_updates:
            raise APIError(404, f"loading and unloading LoRA adapters at run time is off; start the server with "
                           f"{RUNTIME_FLAG} to allow it", code="not_found")  # fmt: skip
        if not isinstance(body, dict):
            raise bad_request(f"the body must be a JSON object with {', '.join(names)}")
        unknown = [key for key in body if key not in names]
        if unknown:
            raise bad_request(f"unknown field {unknown[0]!r}; this endpoint takes {', '.join(names)}", unknown[0])
        values = []
        for name in names:
            value = body.get(name)
            if not isinstance(value, str) or not value:
                raise bad_request(f"{name} must be a non-empty string", name)
            values.append(value)
        return values
