"""The names a request's `model` field may take: the base model's, and each LoRA adapter's loaded on it (vLLM's
multi-LoRA serving). A request naming an adapter decodes with it, in the same batch as every other request
(gpt2.inference.lora_batch: the base's products once, each row's low-rank update added); the engine's sequence
holds the adapter itself, so an adapter unloaded meanwhile stays with the requests that started with it.

`/v1/models` lists the base and each adapter, the base as each adapter's `parent` (vLLM's model cards). vLLM's
`POST /v1/load_lora_adapter` {"lora_name", "lora_path"} and `POST /v1/unload_lora_adapter` {"lora_name"} add and
remove adapters while the server runs, answered with vLLM's plain-text success line; they are off unless the
server is started with `--allow-runtime-lora-updating` (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING), and answer 404
naming that flag otherwise.

An adapter is registered only once everything about it is checked (its name, where it lies, the caps, its files:
gpt2.weights.adapters.read_lora_adapter), so a refused load leaves nothing behind. The caps are vLLM's: at most
`max_cpu_loras` adapters held, none of a rank above `max_lora_rank`; with `lora_roots`, a run-time `lora_path` must
resolve into one of those folders. Answers name paths only as the client or the command line gave them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt2.inference.lora_batch import AdapterSet, DuplicateAdapterError, TooManyAdaptersError, UnknownAdapterError
from gpt2.serve.config import ServerConfig
from gpt2.serve.protocol import APIError, bad_request, now
from gpt2.weights.adapters import LoRAAdapter

RUNTIME_FLAG = "--allow-runtime-lora-updating"


class ServedModels:
    """The base model's name and the adapters of `adapters` (loaded at start, or at run time when allowed), held
    within `config`'s caps (a ValueError at start names the one the `--lora` adapters break)."""

    def __init__(self, adapters: AdapterSet, config: ServerConfig, *, max_model_len: int) -> None:
        self.base = config.model_name
        self.adapters = adapters
        self.max_model_len = max_model_len
        self.runtime_updates = config.runtime_lora_updating
        self.max_loaded = config.max_cpu_loras
        self.max_rank = config.max_lora_rank
        for name in adapters.names:
            if not _encodable(name):
                raise ValueError(f"the adapter name {name!r} is not valid UTF-8 text; give it another name")
            rank = adapters.get(name).config.rank
            if rank > self.max_rank:
                raise ValueError(f"the adapter {name!r} has rank {rank}, above --max-lora-rank {self.max_rank}; "
                                 "raise the limit or leave the adapter out")  # fmt: skip
        if len(adapters) > self.max_loaded:
            raise ValueError(f"{len(adapters)} adapters given with --lora, more than --max-cpu-loras "
                             f"{self.max_loaded}; raise the limit or load fewer")  # fmt: skip
        self.roots = [_root(folder) for folder in config.lora_roots]
        if self.base in adapters:
            raise ValueError(f"an adapter is named {self.base!r}, the served model's name; give it another name")
        self._created = {name: now() for name in [self.base, *adapters.names]}

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
        """vLLM's model card: an adapter has the base as its parent and its folder, as given, as its root."""
        adapter = self.resolve(name)
        return {
            "id": name,
            "object": "model",
            "created": self._created.get(name, 0),
            "owned_by": "gpt2",
            "root": self.base if adapter is None else adapter.given,
            "parent": None if adapter is None else self.base,
            "max_model_len": self.max_model_len,
        }

    def load(self, body: Any) -> str:
        """POST /v1/load_lora_adapter: read the adapter in `lora_path` as `lora_name` (reads files: call it off the
        event loop). 400 for a name in use, a path outside the roots, a cap reached, or an adapter that does not
        fit the base; 404 for a missing folder. Nothing is registered unless every check passes."""
        name, path = self._fields(body, ("lora_name", "lora_path"))
        if name == self.base:
            raise bad_request(f"{name!r} is the base model's name; pick another lora_name", "lora_name")
        self._check_inside_roots(path)
        try:
            self.adapters.add(name, path, max_rank=self.max_rank, max_loaded=self.max_loaded)
        except FileNotFoundError as err:
            raise APIError(404, str(err), param="lora_path", code="not_found") from err
        except (DuplicateAdapterError, TooManyAdaptersError) as err:
            raise bad_request(str(err), "lora_name") from err
        except ValueError as err:  # an adapter for another base, a broken folder, a rank past the cap
            raise bad_request(str(err), "lora_path") from err
        except OSError as err:  # a path the system refuses (too long, not searchable)
            raise bad_request(
                f"lora_path {path!r} cannot be read ({err.strerror}); check the path", "lora_path"
            ) from err
        self._created[name] = now()
        return f"Success: LoRA adapter '{name}' added successfully."

    def _check_inside_roots(self, path: str) -> None:
        """A 400 unless `path`, symlinks and `..` resolved, lies in one of the roots (any path when there are none).
        The message names the path as sent, never the roots: they are the server's."""
        if not self.roots:
            return
        try:
            resolved = Path(path).expanduser().resolve()
        except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (its message names resolved paths)
            raise bad_request(f"lora_path {path!r} cannot be resolved (a symlink loop or an unreadable folder); "
                              "check the path", "lora_path") from err  # fmt: skip
        if not any(resolved.is_relative_to(root) for root in self.roots):
            raise bad_request(f"lora_path {path!r} lies outside the folders this server loads adapters from "
                              "(its --lora-root); put the adapter in one of them", "lora_path")  # fmt: skip

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
            if not _encodable(value):  # a lone surrogate (JSON's \ud800) fits no answer, path or log line
                raise bad_request(f"{name} must be valid UTF-8 text; it holds a lone surrogate", name)
            values.append(value)
        return values


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _root(folder: str) -> Path:
    """A --lora-root folder, symlinks resolved; a ValueError unless it is an existing folder."""
    resolved = Path(folder).expanduser().resolve()
    if not resolved.is_dir():
        raise ValueError(f"--lora-root {folder} is not a folder; create it or name another")
    return resolved
