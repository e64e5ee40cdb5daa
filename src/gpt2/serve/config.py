"""The server's settings: where it listens, who may call it, and the limits that keep it responsive."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2.config import is_integer
from gpt2.serve.engine import PREFILL_CHUNK
from gpt2.serve.grammar import GRAMMAR_TIMEOUT

LOOPBACK = "127.0.0.1"
MEGABYTE = 1 << 20  # what --prefix-cache-mb counts in (MiB)


@dataclass(frozen=True)
class ServerConfig:
    """Validated at construction; `gpt2 serve` builds one from its flags.

    >>> ServerConfig(port=0).host
    '127.0.0.1'
    >>> ServerConfig(max_batch=0)
    Traceback (most recent call last):
    ...
    ValueError: max_batch must be an integer >= 1, got 0
    """

    model_name: str = "gpt2"
    """The name /v1/models lists and requests must use (`--served-model-name`; default: `--model`)."""
    host: str = LOOPBACK
    """Interface to listen on: loopback only unless told otherwise (e.g. 0.0.0.0 for every interface)."""
    port: int = 8000
    """TCP port; 0 picks a free one."""
    api_key: str | None = None
    """When set, every /v1 request must carry `Authorization: Bearer <api_key>` (401 otherwise)."""
    max_batch: int = 16
    """Sequences decoded together at most (rows of the shared KV cache)."""
    max_queue: int = 64
    """Sequences waiting for a row at most; beyond it requests get 429 with Retry-After."""
    max_body_bytes: int = 1 << 20
    """Request bodies larger than this get 413."""
    max_prompts: int = 64
    """Prompts in one /v1/completions request at most."""
    retry_after_seconds: int = 1
    """What the Retry-After header of a 429 says."""
    drain_seconds: int = 30
    """On SIGTERM / Ctrl-C: how long in-flight requests may take to finish before they are cancelled."""
    prefix_cache: bool = True
    """Reuse the keys and values of earlier prompts' prefixes (gpt2.serve.prefix_cache; `--no-prefix-cache`)."""
    prefix_cache_mb: int = 256
    """The prefix cache's memory, in MiB, on the model's device (`--prefix-cache-mb`), allocated when the server
    starts (one pool of blocks). 256 MiB hold about 3,600 tokens of GPT-2 small in float32 (72 KiB of keys and
    values a token), 1,350 of GPT-2 medium."""
    prefill_chunk: int = PREFILL_CHUNK
    """Prompt tokens prefilled between two decode steps at most (`--prefill-chunk`): a longer prompt is prefilled in
    chunks of this many, so running streams wait for one chunk, not the whole prompt (gpt2.serve.engine)."""
    grammar_timeout: float = GRAMMAR_TIMEOUT
    """CPU seconds a structured request's grammar (json_schema, regex) may take to compile, on a worker thread
    while other requests run (`--grammar-timeout`); past it the request is answered 400 (gpt2.serve.grammar)."""

    runtime_lora_updating: bool = False
    """Whether POST /v1/load_lora_adapter and /v1/unload_lora_adapter may change the adapters while the server runs
    (`--allow-runtime-lora-updating`; vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING); off, they answer 404."""
    max_cpu_loras: int = 16
    """LoRA adapters held at once at most, `--lora`'s included (`--max-cpu-loras`, vLLM's name): a run-time load
    past it is a 400. 16 adapters of rank 64 on every layer of GPT-2 small hold about 600 MB (38 MB each)."""
    max_lora_rank: int = 64
    """The largest rank an adapter may have (`--max-lora-rank`, vLLM's name; a larger one is refused, at start or
    with a 400): 64 admits PEFT's usual ranks (8 to 64) and bounds what one adapter holds."""
    lora_roots: tuple[str, ...] = ()
    """Folders a run-time `lora_path` must lie in, after symlinks and `..` are resolved (`--lora-root`, repeatable;
    empty: anywhere the server can read). `--lora` adapters, given by the operator, may lie anywhere."""

    max_connections: int = 256
    """Connections open at once at most (uvicorn's limit_concurrency): past it a request gets 503, so clients that
    open connections and send slowly cannot hold every socket the process has."""
    keep_alive_seconds: int = 5
    """An idle keep-alive connection is closed after this many seconds (uvicorn's timeout_keep_alive)."""
    header_timeout_seconds: int = 20
    """A connection whose request headers are not all in this many seconds is closed (`--header-timeout`; nginx's
    client_header_timeout, Apache's RequestReadTimeout header=20)."""

    def __post_init__(self) -> None:
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name must be a non-empty string, got {self.model_name!r}")
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be an address such as {LOOPBACK}, got {self.host!r}")
        if not is_integer(self.port) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an integer in [0, 65535] (0: any free port), got {self.port!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("api_key must be a non-empty string, or None for no authentication")
        if not is_integer(self.drain_seconds) or self.drain_seconds < 0:
            raise ValueError(f"drain_seconds must be a whole number of seconds >= 0, got {self.drain_seconds!r}")
        for flag in ("prefix_cache", "runtime_lora_updating"):
            if not isinstance(getattr(self, flag), bool):
                raise ValueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        if not is_integer(self.prefix_cache_mb) or self.prefix_cache_mb < 1:
            raise ValueError(
                f"prefix_cache_mb must be a whole number of MiB >= 1, got {self.prefix_cache_mb!r} "
                "(to turn the cache off: --no-prefix-cache)"
            )
        if not isinstance(self.lora_roots, tuple) or not all(isinstance(r, str) and r for r in self.lora_roots):
            raise ValueError(f"lora_roots must be a tuple of folder paths, got {self.lora_roots!r}")
        timeout = self.grammar_timeout
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
            raise ValueError(f"grammar_timeout must be a number of seconds > 0, got {timeout!r}")
        for name in ("max_batch", "max_queue", "max_body_bytes", "max_prompts", "retry_after_seconds", "prefill_chunk",
                     "max_connections", "keep_alive_seconds", "header_timeout_seconds", "max_cpu_loras",
                     "max_lora_rank"):  # fmt: skip
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
