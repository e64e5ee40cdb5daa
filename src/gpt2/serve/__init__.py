"""An OpenAI-compatible HTTP server with continuous batching (`gpt2 serve`).

Where each thing lives:

- `batch`: the running batch over one shared KV cache: sequences join and leave at step boundaries; a long
  prompt is prefilled in chunks beside it (`ChunkedPrefill`) and joins when complete;
- `prefix_cache`: earlier prompts' keys and values in blocks, reused by prompts that start with the same tokens;
- `engine`: the thread that owns the model and decodes every running sequence in one batched step;
- `protocol`: OpenAI's request bodies (checked) and response shapes; `chat`: chat messages read into the roles
  of GPT-2's chat template (`gpt2.tokenizer.chat`);
- `app`: the FastAPI routes; `server`: uvicorn around them; `config`: the settings and limits;
- `playground`: the web page at `/`.

>>> from gpt2.api import LLM                                                        # doctest: +SKIP
>>> serve(LLM.load("gpt2"), ServerConfig(model_name="gpt2", port=8000))             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from gpt2.serve.batch import DecodeBatch
from gpt2.serve.chat import ChatMessage
from gpt2.serve.config import ServerConfig
from gpt2.serve.engine import Engine
from gpt2.serve.prefix_cache import PrefixCache
from gpt2.serve.sequence import (
    EngineError,
    EngineFailed,
    EngineStopped,
    QueueFull,
    SequenceFailed,
    SequenceOutput,
    SequenceRequest,
    SequenceStatus,
    TokenLogprob,
)

# The HTTP parts need the `serve` extra (fastapi, uvicorn): imported on first use, so the engine and the CLI's
# help work without it.
_HTTP_NAMES = {"create_app": "gpt2.serve.app", "serve": "gpt2.serve.server", "uvicorn_server": "gpt2.serve.server"}


def __getattr__(name: str) -> Any:
    if name in _HTTP_NAMES:
        import importlib

        return getattr(importlib.import_module(_HTTP_NAMES[name]), name)
    raise AttributeError(f"module 'gpt2.serve' has no attribute {name!r}")


__all__ = [
    "ChatMessage",
    "DecodeBatch",
    "Engine",
    "EngineError",
    "EngineFailed",
    "EngineStopped",
    "PrefixCache",
    "QueueFull",
    "SequenceFailed",
    "SequenceOutput",
    "SequenceRequest",
    "SequenceStatus",
    "ServerConfig",
    "TokenLogprob",
    "create_app",
    "serve",
    "uvicorn_server",
]
