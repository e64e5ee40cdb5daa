"""Running the server: uvicorn in front of the app, with a drain on SIGTERM.

uvicorn handles SIGTERM and Ctrl-C: it stops accepting connections, lets the requests in flight finish for up
to `drain_seconds` (streams included: the engine keeps decoding them), cancels what is still running, and then
the app's shutdown stops the engine. uvicorn then raises the signal again for the previous handler; `serve`
installs one that ignores it, so a drained SIGTERM ends `gpt2 serve` with status 0 (Ctrl-C still ends as an
interrupt).

Threads. PyTorch's OpenMP gives every thread that runs a parallel op a team of worker threads, alive as long as
that thread. The model is loaded and the app built (its engine allocates the KV cache) on a thread that then ends
(`on_passing_thread`), so that the engine's thread is the only one left with workers. With a second team idle
on the event loop's thread, every decode step of the engine runs slower: on 2 cores one streamed request decodes
at about 0.8 of the speed of `LLM.stream` offline with it, about 0.95 without (`gpt2 bench serve --clients 1`
beside `gpt2 bench decode`).
The likely cause: libgomp spins less for its workers when it manages more threads than there are cores, so they
fall asleep between the step's parallel regions and must be woken for each.

Garbage collection. Loaded and built, the process holds ~350,000 objects the collector tracks (the model's
modules, the app, every imported module), and a full collection walks them all: ~190 ms on the 2-core VM, landing
on whichever request's allocations set it off (it can add ~200 ms to a first request's time to first token).
`serve` collects once and then freezes what is alive (`gc.freeze`), so later collections walk only what the
requests allocate; it unfreezes them when the server stops.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import signal
import threading
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any, TypeVar

import uvicorn

from gpt2.api import LLM
from gpt2.inference.steering import FeatureDictionary
from gpt2.serve.app import create_app
from gpt2.serve.config import ServerConfig

T = TypeVar("T")


def uvicorn_server(
    llm: LLM, config: ServerConfig, *, log_level: str = "info", saes: Mapping[str, FeatureDictionary] | None = None
) -> uvicorn.Server:
    """The uvicorn server for `llm` with `config` (not started: call `.run()`, or `.run(sockets=[...])` with a
    bound socket made with proto=IPPROTO_TCP, without which asyncio leaves Nagle's algorithm on); `saes` by name
    for requests' steering."""
    app = create_app(llm, config, saes=saes)
    http: Any = "auto"  # h11 where httptools is missing (no header deadline there)
    if _HeaderDeadlineProtocol is not None:
        http = functools.partial(_HeaderDeadlineProtocol, header_timeout=config.header_timeout_seconds)
    settings = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        timeout_graceful_shutdown=config.drain_seconds,  # then the requests still running are cancelled
        access_log=log_level == "debug",
        limit_concurrency=config.max_connections,  # slow clients cannot hold every socket (ServerConfig)
        timeout_keep_alive=config.keep_alive_seconds,
        http=http,
    )
    return uvicorn.Server(settings)


try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn serves with h11
    _HeaderDeadlineProtocol = None
else:

    class _HeaderDeadlineProtocol(HttpToolsProtocol):  # type: ignore[no-redef]
        """uvicorn's httptools protocol, closing a connection whose request headers are not all in `header_timeout`
        seconds after the connection opened or the request's first byte arrived (nginx's client_header_timeout):
        clients that send their headers slowly cannot hold connections, and with them the server's connection
        cap, forever. Idle keep-alive connections are uvicorn's timeout_keep_alive's."""

        def __init__(self, *args: Any, header_timeout: float, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timeout = header_timeout
            self._header_deadline: asyncio.TimerHandle | None = None

        def _arm_header_deadline(self) -> None:
            if self._header_deadline is None:
                self._header_deadline = self.loop.call_later(self._header_timeout, self._headers_too_slow)

        def _disarm_header_deadline(self) -> None:
            if self._header_deadline is not None:
                self._header_deadline.cancel()
                self._header_deadline = None

        def _headers_too_slow(self) -> None:
            self._header_deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_header_deadline()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_header_deadline()

        def on_headers_complete(self) -> None:
            self._disarm_header_deadline()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_deadline()
            super().connection_lost(exc)


def serve(
    llm: LLM | Callable[[], LLM],
    config: ServerConfig,
    *,
    log_level: str = "info",
    saes: Mapping[str, FeatureDictionary] | None = None,
) -> None:
    """Serve `llm` until SIGTERM or Ctrl-C. `llm` may be a function that loads it (what `gpt2 serve` passes):
    it is then called on a thread that ends, like the building of the app (module docstring). `saes`: by name,
    for requests' steering to clamp features of."""
    load = (lambda: llm) if isinstance(llm, LLM) else llm
    server = on_passing_thread(lambda: uvicorn_server(load(), config, log_level=log_level, saes=saes))
    gc.collect()
    gc.freeze()  # the loaded process out of every later collection (module docstring)
    try:
        if threading.current_thread() is not threading.main_thread():  # no signals there: uvicorn installs none
            server.run()
            return
        previous = signal.signal(signal.SIGTERM, _drained)
        try:
            server.run()
        finally:
            signal.signal(signal.SIGTERM, previous)
    finally:
        # collectable again: the interpreter's last collection at exit frees their cycles (extensions built with
        # nanobind, which torch imports, report what is left then as leaks)
        gc.unfreeze()


def _drained(signum: int, frame: FrameType | None) -> None:
    """What uvicorn's re-raised SIGTERM reaches once the server has drained and stopped: nothing left to do."""


def on_passing_thread(function: Callable[[], T]) -> T:
    """`function()` computed on a new thread that ends with it; its exception, if any, is raised here. Its PyTorch
    work leaves no OpenMP workers behind (module docstring).

    >>> on_passing_thread(lambda: threading.current_thread() is threading.main_thread())
    False
    """
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(function())
        except BaseException as error:  # handed to the caller, whatever it is
            errors.append(error)

    thread = threading.Thread(target=run, name="gpt2-serve-load", daemon=True)  # Ctrl-C meanwhile ends the process
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]
