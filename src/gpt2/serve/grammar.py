"""Structured requests' grammars compiled off the engine's path: each on a worker thread, within a limit of compile
work.

xgrammar compiles a deep JSON schema slowly (a 300-deep nested object takes it seconds of a core). Compiled
on the event loop or in `Engine.submit`, it would stall every other request; here the HTTP handler awaits the
compilation on a worker thread (xgrammar releases the GIL while it works), so other requests are served meanwhile,
and past the limit the request is answered 400. The limit is CPU time of the compiling thread (Linux and macOS;
wall time elsewhere), which compiles alone (gpt2.inference.structured.GrammarCompiler): time spent waiting for a core
on a busy machine, or for a free worker, is not compile work, so a schema that compiles at once on an idle machine
never fails on a busy one. Compiled grammars are cached by schema (or regex): the same one sent again is ready at
once. A compilation past its limit runs on to its end (a thread cannot be stopped) on a daemon thread, and lands in
that cache too.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpt2.inference.sampling import SamplingParams
from gpt2.inference.structured import GrammarCompiler

GRAMMAR_TIMEOUT = 10.0
"""CPU seconds a request's grammar may take to compile before the request is refused (`gpt2 serve --grammar-timeout`).
Schemas of everyday depth compile in well under a second; a schema nested hundreds deep takes seconds (5 s for 300
levels of objects on a Zen 5 core)."""
GRAMMAR_WORKERS = 2
"""Grammars compiled at once at most; another structured request waits for a worker, within its own limit."""
GRAMMAR_NICENESS = 19
"""The compiling threads' Linux niceness: below the engine's threads, so a long compilation takes the cores the
decoding leaves idle instead of slowing every running request (the model's threads wait on each other, so one
core shared evenly slows a whole step: at 10 a 5-token request beside a 300-deep schema's compilation takes 1.09x
its time alone, at 19 0.99x). Re-derived with `python benchmarks/serve/grammar_stall.py` at each value."""


class GrammarTooComplex(ValueError):
    """A grammar did not compile within the server's limit."""


class GrammarCompilations:
    """Compiles requests' grammars on worker threads for the event loop (module docstring).

    compiler: returns the one GrammarCompiler of the model's vocabulary (built on first use; the engine's, so a
    grammar compiled here is the one the engine would compile). timeout: CPU seconds per grammar (GRAMMAR_TIMEOUT)."""

    def __init__(self, compiler: Callable[[], GrammarCompiler], timeout: float, workers: int = GRAMMAR_WORKERS) -> None:
        self._compiler = compiler
        self.timeout = timeout
        self._slots = threading.BoundedSemaphore(workers)

    async def compile(self, params: SamplingParams) -> Any | None:
        """The compiled grammar of params' regex / json_schema (None: neither is set). A ValueError for an invalid
        grammar; GrammarTooComplex (a ValueError) when compiling it takes more than `timeout` CPU seconds."""
        if params.regex is None and params.json_schema is None:
            return None
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()

        def deliver(value: Any, error: BaseException | None) -> None:  # on the event loop
            if result.done():  # the request gave up waiting
                return
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(value)

        def work() -> None:  # on the worker thread
            _lower_priority()
            compiled, error = None, None
            with self._slots:
                try:
                    compiled = self._compiler().compile(regex=params.regex, json_schema=params.json_schema)
                except Exception as err:  # an invalid grammar (ValueError), or the library's own failure
                    error = err
            try:
                loop.call_soon_threadsafe(deliver, compiled, error)
            except RuntimeError:  # the loop has closed (shutdown): nobody waits; the cache holds the grammar
                pass

        worker = threading.Thread(target=work, name="gpt2-grammar", daemon=True)
        worker.start()
        try:
            return await _within_cpu_time(result, worker, self.timeout)
        except asyncio.TimeoutError:  # TimeoutError from Python 3.11 on
            what = "regex" if params.regex is not None else "json_schema"
            raise GrammarTooComplex(
                f"the {what} is too complex to compile within {self.timeout:g} s of CPU time (the server's "
                "--grammar-timeout); simplify it (fewer nesting levels)"
            ) from None
        finally:
            result.cancel()  # no effect once it is done; else the worker's late answer is dropped (`deliver`)


async def _within_cpu_time(result: asyncio.Future[Any], worker: threading.Thread, seconds: float) -> Any:
    """`result` once it is done; TimeoutError once `worker` has used `seconds` of CPU time (wall time where the
    platform has no per-thread clock). A thread's CPU time grows no faster than the wall clock, so waiting for what
    is left of the budget in wall time, then reading the clock again, never gives up early."""
    used = 0.0
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(result), seconds - used)
        except asyncio.TimeoutError:
            if not hasattr(time, "pthread_getcpuclockid") or worker.ident is None:
                raise
            try:
                used = time.clock_gettime(time.pthread_getcpuclockid(worker.ident))
            except OSError:  # the thread has ended: it handed its answer to the loop first
                return await result
            if used >= seconds:
                raise


def _lower_priority() -> None:
    """This thread at GRAMMAR_NICENESS (Linux, where a thread's niceness is its own); elsewhere nothing."""
    if sys.platform == "linux":
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), GRAMMAR_NICENESS)
        except OSError:  # not allowed here: the thread keeps the process's priority
            pass
