"""Running the server: uvicorn in front of the app, with a drain on SIGTERM.

uvicorn handles SIGTERM and Ctrl-C: it stops accepting connections, lets the requests in flight finish for up
to `drain_seconds` (streams included: the engine keeps decoding them), cancels what is still running, and then
the app's shutdown stops the engine. uvicorn then raises the signal again for the previous handler; `serve`
installs one that ignores it, so a drained SIGTERM ends `gpt2 serve` with status 0 (Ctrl-C still ends as an
interrupt).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import uvicorn

from gpt2.api import LLM
from gpt2.serve.app import create_app
from gpt2.serve.config import ServerConfig


def uvicorn_server(llm: LLM, config: ServerConfig, *, log_level: str = "info") -> uvicorn.Server:
    """The uvicorn server for `llm` with `config` (not started: call `.run()`, or `.run(sockets=[...])` with a
    bound socket made with proto=IPPROTO_TCP, without which asyncio leaves Nagle's algorithm on)."""
    app = create_app(llm, config)
    settings = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        timeout_graceful_shutdown=config.drain_seconds,  # then the requests still running are cancelled
        access_log=log_level == "debug",
    )
    return uvicorn.Server(settings)


def serve(llm: LLM, config: ServerConfig, *, log_level: str = "info") -> None:
    """Serve `llm` until SIGTERM or Ctrl-C (what `gpt2 serve` calls)."""
    server = uvicorn_server(llm, config, log_level=log_level)
    if threading.current_thread() is not threading.main_thread():  # no signals there: uvicorn installs none
        server.run()
        return
    previous = signal.signal(signal.SIGTERM, _drained)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _drained(signum: int, frame: FrameType | None) -> None:
    """What uvicorn's re-raised SIGTERM reaches once the server has drained and stopped: nothing left to do."""
