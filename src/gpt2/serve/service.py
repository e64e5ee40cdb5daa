"""What every route of the server shares: the `Service` (the engine, the served models, the limits; reading a
body, encoding a prompt, building a request's sequences) and a request's `Submission` to the engine, whose outputs
come back on the event loop. The routes live beside it by family: serving_completions, serving_chat,
serving_tokens (tokenize, detokenize, embeddings), serving_models (models and adapters)."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect

from gpt2.api import LLM
from gpt2.inference.steering import FeatureDictionary, parse_steering
from gpt2.serve import (
    Engine,
    EngineError,
    EngineFailed,
    EngineStopped,
    QueueFull,
    SequenceFailed,
    SequenceOutput,
    SequenceRequest,
)
from gpt2.serve.adapters import ServedModels
from gpt2.serve.config import ServerConfig
from gpt2.serve.grammar import GrammarCompilations
from gpt2.serve.metrics import ServerMetrics
from gpt2.serve.protocol import (
    APIError,
    GenerationRequest,
    LogprobFormatter,
    ModelLimits,
    bad_request,
    field_named,
    reject_constant,
)
from gpt2.serve.tokens import requested_model
from gpt2.weights.adapters import LoRAAdapter

# The engine's errors as HTTP answers, by type (never by message): status, OpenAI error type, code.
ENGINE_ERRORS: dict[type[EngineError], tuple[int, str, str | None]] = {
    QueueFull: (429, "rate_limit_error", "queue_full"),
    EngineStopped: (503, "server_error", "shutting_down"),
    EngineFailed: (500, "server_error", None),
    SequenceFailed: (400, "invalid_request_error", None),  # the request's own steering, adapter or rules
}


def engine_error(error: EngineError, *, retry_after: int | None = None) -> APIError:
    """The APIError that answers `error` (a QueueFull says when to retry)."""
    status, kind, code = ENGINE_ERRORS.get(type(error), (500, "server_error", None))
    message, headers = str(error), {}
    if isinstance(error, QueueFull) and retry_after is not None:
        message, headers = f"{error}; retry in {retry_after} s", {"Retry-After": str(retry_after)}
    return APIError(status, message, type=kind, code=code, headers=headers)


class Submission:
    """A request's sequences in the engine, their outputs arriving on this event loop's queue."""

    def __init__(
        self, engine: Engine, requests: Sequence[SequenceRequest], retry_after: int, metrics: ServerMetrics
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[SequenceOutput] = asyncio.Queue()
        try:
            self._ticket = engine.submit(requests, self._deliver)
        except EngineError as err:
            raise engine_error(err, retry_after=retry_after) from err
        except ValueError as err:
            raise bad_request(str(err), field_named(str(err))) from err
        self._remaining = len(requests)
        self._metrics = metrics
        self._submitted = time.perf_counter()
        self._last_token: dict[int, float] = {}  # sequence index -> when its latest token arrived
        self._held: list[SequenceOutput] = []  # an output `first` took, still to be yielded
        metrics.submitted(sum(len(request.prompt) for request in requests))

    def _deliver(self, output: SequenceOutput) -> None:  # called on the engine's thread
        self._loop.call_soon_threadsafe(self._queue.put_nowait, output)

    async def outputs(self) -> AsyncIterator[SequenceOutput]:
        """Every output of every sequence, as they come, until each sequence has ended."""
        while self._remaining:
            output = self._held.pop() if self._held else await self._queue.get()
            arrived = time.perf_counter()
            previous = self._last_token.get(output.index)
            self._metrics.observe(
                output,
                since_submission=arrived - self._submitted,
                since_previous=None if previous is None else arrived - previous,
            )
            if output.token_ids:
                self._last_token[output.index] = arrived
            if output.final:
                self._remaining -= 1
            yield output

    def cancel(self) -> None:
        self._ticket.cancel()

    async def first(self, request: Request) -> None:
        """Wait for the first output before a stream begins: one that is an error (a sequence that failed before
        its first token) answers the request with the error's status, never a 200 stream holding only an error
        chunk. Otherwise the output is held for `outputs`."""
        watcher = self.watch(request)
        try:
            output = await self._queue.get()
        finally:
            watcher.cancel()
        if output.error:
            self.cancel()
            raise engine_error(output.error)
        self._held.append(output)

    async def collect(self, request: Request, choices: list[SequenceOutput]) -> None:
        """Gather every output into `choices`, cancelling the sequences if the client goes away meanwhile."""
        watcher = self.watch(request)
        try:
            async for output in self.outputs():
                choices[output.index].add(output)
        finally:
            watcher.cancel()
            self.cancel()  # nothing left to cancel on success; frees the rows on an error or cancellation

    def watch(self, request: Request) -> asyncio.Task[None]:
        """Cancel the sequences as soon as the client disconnects (the caller cancels the returned task when done).
        Streams need it too: a send to a closed socket fails only with the next token, which may never come."""
        return asyncio.create_task(self._cancel_on_disconnect(request))

    async def _cancel_on_disconnect(self, request: Request) -> None:
        while True:
            message = await request.receive()  # the body is read: the next message is the disconnect
            if message["type"] == "http.disconnect":
                self.cancel()
                return


class Service:
    """What the routes do; one per app."""

    def __init__(self, llm: LLM, engine: Engine, config: ServerConfig, saes: Mapping[str, FeatureDictionary]) -> None:
        self.llm = llm
        self.saes = saes
        self.tokenizer = llm.tokenizer
        self.engine = engine
        self.config = config
        self.logprobs = LogprobFormatter(llm.tokenizer)
        self.metrics = ServerMetrics(engine, llm.adapters)
        self.grammars = GrammarCompilations(engine.grammar_compiler, config.grammar_timeout)
        self.models = ServedModels(llm.adapters, config, max_model_len=engine.block_size)
        self.limits = ModelLimits(context=engine.block_size, vocab_size=engine.vocab_size)

    async def submit(self, requests: Sequence[SequenceRequest], grammar_field: str | None = None) -> Submission:
        """Hand sequences to the engine (an APIError when it refuses them), counted in the metrics. Their grammar,
        if any (every sequence of a request has the same), is compiled first on a worker thread, within the
        server's limit (gpt2.serve.grammar): the engine and the other requests go on meanwhile."""
        params = requests[0].params
        try:
            grammar = await self.grammars.compile(params)
        except ValueError as err:  # invalid, or past the limit
            raise bad_request(str(err), grammar_field or "response_format") from err
        if grammar is not None:
            requests = [dataclasses.replace(request, grammar=grammar) for request in requests]
        return Submission(self.engine, requests, self.config.retry_after_seconds, self.metrics)

    def authorize(self, request: Request) -> None:
        key = self.config.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                type="authentication_error",
                code="invalid_api_key",
            )

    def health(self) -> JSONResponse:
        engine = self.engine
        # no model name: it may be a filesystem path, and /health answers without the API key
        status = {
            "status": "ok",
            "active": engine.active,
            "waiting": engine.waiting,
            "max_batch": engine.max_batch,
            "max_queue": engine.max_queue,
        }
        return JSONResponse(status)

    def model_name(self, body: Any) -> str:
        """The model a /tokenize, /detokenize or /v1/embeddings body names (a 400 for a non-string); absent: the
        served base model, as vLLM answers these routes."""
        name = requested_model(body)
        return self.models.base if name is None else name

    def check_choices(self, count: int) -> None:
        """A request's sequences (prompts times n) must fit the queue at once."""
        if count > self.engine.max_queue:
            raise bad_request(
                f"{count} choices (prompts times n) is more than this server queues at once ({self.engine.max_queue})",
                "n",
            )

    async def read_json(self, request: Request) -> Any:
        """The body as JSON, refusing more than max_body_bytes (413) and anything that is not JSON (400)."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length", "")
        too_large = APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > limit:
                    raise too_large
        except ClientDisconnect:  # the client went away mid-body: nobody to answer, nothing to log
            raise APIError(400, "the client disconnected before sending the whole body") from None
        try:
            return json.loads(bytes(body), parse_constant=reject_constant)
        except APIError:
            raise
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise bad_request(f"the request body is not valid JSON: {str(err)[:200]}") from err

    def encode(self, prompt: str | Sequence[int], param: str) -> list[int]:
        """A prompt's token ids: a text is encoded with special-token texts read as the special tokens
        ('<|endoftext|>' is id 50256, as vLLM reads it); an empty prompt is <|endoftext|>, the start of a new
        document, as in OpenAI's API."""
        try:
            ids = self.tokenizer.encode(prompt, allowed_special="all") if isinstance(prompt, str) else list(prompt)
        except ValueError as err:  # e.g. a lone surrogate ("\ud800" is valid JSON but not encodable text)
            raise bad_request(f"the {param} is not valid Unicode text: {err}", param) from err
        ids = ids or [self.tokenizer.eot_token]
        if len(ids) > self.engine.block_size:
            raise bad_request(
                f"the prompt has {len(ids)} tokens but the model's context is {self.engine.block_size} tokens; "
                "shorten it",
                param,
                code="context_length_exceeded",
            )
        return ids  # its ids are checked once, where the engine takes it (a ValueError there is a 400)

    def sequences(
        self,
        parsed: GenerationRequest,
        prompts: Sequence[list[int]],
        adapter: LoRAAdapter | None,
        *,
        prompt_logprobs: bool = False,
    ) -> list[SequenceRequest]:
        """One sequence per prompt and choice: choice index = prompt index * n + i, the i-th with seed + i; each
        with the adapter the request's `model` names (`ServedModels.resolve`; None: the base model)."""
        params = parsed.params
        try:
            steering = tuple(parse_steering(parsed.steering, self.llm.model, self.saes))
        except ValueError as err:
            raise bad_request(str(err), "steering") from err
        return [
            SequenceRequest(
                prompt,
                params.for_sample(i).replace(n=1),
                parsed.logprobs,
                prompt_logprobs,
                steering=steering,
                adapter=adapter,
            )
            for prompt in prompts
            for i in range(params.n)
        ]
