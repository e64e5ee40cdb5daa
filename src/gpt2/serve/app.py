"""The HTTP application: OpenAI's routes on FastAPI, in front of the engine.

Routes: `GET /v1/models` (and `/v1/models/{id}`), `POST /v1/completions`, `POST /v1/chat/completions`,
`POST /v1/embeddings` (OpenAI's body; last-token pooling, gpt2.inference.embedding), vLLM's `POST /tokenize` and
`POST /detokenize` (gpt2.serve.tokens), vLLM's `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`
(gpt2.serve.adapters: a request's `model` picks the base or a LoRA adapter), `GET /health`, and the playground
at `GET /`. Streaming answers are server-sent events in OpenAI's chunk format, ending with `data: [DONE]`.

Every error is OpenAI-shaped JSON, `{"error": {"message", "type", "param", "code"}}`: 400 for a bad field or a
malformed body, 401 without the API key (when one is set), 404 for an unknown model or route, 413 for a body
over the size limit, 429 with Retry-After when the queue is full, 503 while shutting down. A client's input
never causes a 500: bodies are checked field by field (gpt2.serve.protocol) before anything runs. A request
whose own computation fails in the engine (its logits not finite under its steering or adapter, its steering,
adapter or rules raising: gpt2.serve.runner) ends alone, answered 400; a stream answers so too when that happens
before its first token (it starts only with the first output), and after it ends that choice with an error chunk,
`data: {"error": {...}}`, as vLLM's streams do (the openai client raises it as an APIError).

A request's sequences go to the engine (one per prompt and choice) and come back through an asyncio queue. A
client that disconnects cancels them: a stream when its response is closed, a plain request through a watcher
of the connection; the engine frees their rows at the next step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gpt2.api import LLM
from gpt2.inference.embedding import embed
from gpt2.inference.steering import FeatureDictionary, check_feature_dictionary, parse_steering
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
from gpt2.serve.chat import ChatMessage
from gpt2.serve.config import MEGABYTE, ServerConfig
from gpt2.serve.grammar import GrammarCompilations
from gpt2.serve.metrics import ServerMetrics
from gpt2.serve.playground import PLAYGROUND_HTML
from gpt2.serve.prefix_cache import PrefixCache
from gpt2.serve.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    LogprobFormatter,
    ModelLimits,
    bad_request,
    field_named,
    new_id,
    now,
    parse_chat_request,
    parse_completion_request,
    reject_constant,
    usage,
)
from gpt2.serve.tokens import detokenize, embedding_inputs, embedding_response, requested_model, tokenize
from gpt2.tokenizer.chat import encode_chat
from gpt2.weights.adapters import LoRAAdapter

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"


def create_app(llm: LLM, config: ServerConfig, *, saes: Mapping[str, FeatureDictionary] | None = None) -> FastAPI:
    """The server for `llm` with `config`'s limits; `saes` by name, for requests' steering to clamp features of. The
    engine thread starts with the app (or at the first request) and stops when the app shuts down: in-flight
    work is cancelled then (the HTTP server drains first, see gpt2.serve.server). An SAE steering cannot use on
    this model (another width, a hook it lacks) is a ValueError here, at start, not a 400 on every request."""
    for name, sae in (saes or {}).items():
        check_feature_dictionary(sae, llm.model, f"the SAE {name!r}")
    prefix_cache = PrefixCache(config.prefix_cache_mb * MEGABYTE) if config.prefix_cache else None
    engine = Engine(
        llm.model,
        llm.tokenizer,
        max_batch=config.max_batch,
        max_queue=config.max_queue,
        prefix_cache=prefix_cache,
        prefill_chunk=config.prefill_chunk,
        drafter=llm.new_drafter(),  # speculative steps for a lone sequence when the LLM has a draft / lookup
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        await run_in_threadpool(engine.stop, 0.0)

    app = FastAPI(title="gpt2", summary="OpenAI-compatible GPT-2", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.config = config
    _add_error_handlers(app)
    service = _Service(llm, engine, config, saes or {})
    _add_service_routes(app, service)
    _add_api_routes(app, service)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI-shaped JSON (module docstring)."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError) -> Response:
        # ASCII JSON: a message or param may echo the client's text, lone surrogates ("\ud800") included,
        # which UTF-8 cannot carry but a JSON escape can
        body = json.dumps(error.body())
        return Response(body, status_code=error.status, headers=error.headers, media_type="application/json")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse(bad_request(f"malformed request: {error.errors()!s:.300}").body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if error.status_code == 404 else None
        body = APIError(error.status_code, str(error.detail), code=code).body()
        return JSONResponse(body, status_code=error.status_code, headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception) -> JSONResponse:
        logger.exception("unexpected error answering %s %s", request.method, request.url.path)
        body = APIError(500, "internal server error", type="server_error").body()
        return JSONResponse(body, status_code=500)


def _add_service_routes(app: FastAPI, service: _Service) -> None:
    """The routes around the API, open without a key: health, metrics, the playground."""

    @app.get("/health")
    async def health() -> JSONResponse:
        return service.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = service.metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/", response_class=HTMLResponse)
    async def playground() -> HTMLResponse:
        return HTMLResponse(PLAYGROUND_HTML)


def _add_api_routes(app: FastAPI, service: _Service) -> None:
    """OpenAI's routes, behind the API key when one is set."""
    authorized = [Depends(service.authorize)]

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": service.models.cards()}

    @app.get("/v1/models/{model:path}", dependencies=authorized)
    async def model(model: str) -> dict[str, Any]:
        return service.models.card(model)

    @app.post("/v1/load_lora_adapter", dependencies=authorized)
    async def load_lora_adapter(request: Request) -> PlainTextResponse:
        body = await service.read_json(request)
        return PlainTextResponse(await run_in_threadpool(service.models.load, body))

    @app.post("/v1/unload_lora_adapter", dependencies=authorized)
    async def unload_lora_adapter(request: Request) -> PlainTextResponse:
        return PlainTextResponse(service.models.unload(await service.read_json(request)))

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(request: Request) -> Response:
        return await service.completions(request)

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(request: Request) -> Response:
        return await service.chat(request)

    _add_token_routes(app, service, authorized)


def _add_token_routes(app: FastAPI, service: _Service, authorized: list[Any]) -> None:
    """vLLM's /tokenize and /detokenize, OpenAI's /v1/embeddings (gpt2.serve.tokens reads and writes the bodies)."""

    @app.post("/tokenize", dependencies=authorized)
    async def tokenize_text(request: Request) -> dict[str, Any]:
        body = await service.read_json(request)
        answer = tokenize(body, service.tokenizer, service.engine.block_size)
        service.models.resolve(service.model_name(body))  # every adapter shares the tokenizer: a check only
        return answer

    @app.post("/detokenize", dependencies=authorized)
    async def detokenize_tokens(request: Request) -> dict[str, Any]:
        body = await service.read_json(request)
        answer = detokenize(body, service.tokenizer)
        service.models.resolve(service.model_name(body))
        return answer

    @app.post("/v1/embeddings", dependencies=authorized)
    async def embeddings(request: Request) -> dict[str, Any]:
        body = await service.read_json(request)
        inputs = embedding_inputs(body, service.tokenizer, service.engine.block_size)
        name = service.model_name(body)
        model = service.llm.adapters.model_for(service.models.resolve(name))
        vectors = await run_in_threadpool(embed, model, inputs)
        return embedding_response(vectors, inputs, name, body.get("encoding_format", "float"))


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


class _Submission:
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


class _Service:
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

    async def submit(self, requests: Sequence[SequenceRequest], grammar_field: str | None = None) -> _Submission:
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
        return _Submission(self.engine, requests, self.config.retry_after_seconds, self.metrics)

    # ------------------------------------------------------------------------------------ plumbing
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

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The chat prompt's token ids: the conversation in the chat template, then the assistant's header."""
        try:
            ids, _ = encode_chat(
                [message.as_dict() for message in messages], self.tokenizer, add_generation_prompt=True
            )
        except ValueError as err:  # e.g. a lone surrogate in a content
            raise bad_request(f"the messages are not valid Unicode text: {err}", "messages") from err
        return self.encode(ids, "messages")

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

    # ------------------------------------------------------------------------------------ completions
    async def completions(self, request: Request) -> Response:
        parsed = parse_completion_request(
            await self.read_json(request), max_prompts=self.config.max_prompts, limits=self.limits
        )
        adapter = self.models.resolve(parsed.model)  # an unknown model is a 404 before anything else
        self.check_choices(len(parsed.prompts) * parsed.params.n)
        prompts = await run_in_threadpool(lambda: [self.encode(prompt, "prompt") for prompt in parsed.prompts])
        n = parsed.params.n
        scoring = parsed.echo and parsed.logprobs is not None
        submission = await self.submit(
            self.sequences(parsed, prompts, adapter, prompt_logprobs=scoring), parsed.structured_field
        )
        choices = [SequenceOutput(index) for index in range(len(prompts) * n)]
        prompt_of = [prompts[index // n] for index in range(len(choices))]
        prompt_tokens = sum(len(prompt) for prompt in prompts)
        response_id, created = new_id("cmpl"), now()
        if parsed.stream:
            head = self._head(response_id, "text_completion", created, parsed.model)
            chunks = self._completion_chunks(parsed, submission, choices, prompt_of, prompt_tokens, head)
            await submission.first(request)
            return StreamingResponse(
                _sse(chunks, submission, request), media_type="text/event-stream", headers=SSE_HEADERS
            )
        await submission.collect(request, choices)
        _raise_engine_error(choices)
        return JSONResponse(
            {
                "id": response_id,
                "object": "text_completion",
                "created": created,
                "model": parsed.model,
                "choices": [self._completion_choice(parsed, choice, prompt_of[choice.index]) for choice in choices],
                "usage": usage(prompt_tokens, sum(choice.completion_tokens for choice in choices)),
            }
        )

    def _completion_choice(
        self, parsed: CompletionRequest, choice: SequenceOutput, prompt: list[int]
    ) -> dict[str, Any]:
        prompt_text = self.tokenizer.decode(prompt) if parsed.echo else ""
        logprobs = None
        if parsed.logprobs is not None:
            if parsed.echo:
                assert choice.prompt_logprobs is not None
                logprobs = self.logprobs.completion(
                    [*prompt, *choice.token_ids], [*choice.prompt_logprobs, *choice.logprobs]
                )
            else:
                offset = len(self.tokenizer.decode(prompt))
                logprobs = self.logprobs.completion(choice.token_ids, choice.logprobs, offset=offset)
        return {
            "index": choice.index,
            "text": prompt_text + choice.text,
            "logprobs": logprobs,
            "finish_reason": choice.finish_reason,
        }

    def _completion_chunks(
        self,
        parsed: CompletionRequest,
        submission: _Submission,
        choices: list[SequenceOutput],
        prompt_of: list[list[int]],
        prompt_tokens: int,
        head: dict[str, Any],
    ) -> AsyncIterator[dict[str, Any]]:
        offsets = [len(self.tokenizer.decode(prompt)) for prompt in prompt_of]
        echoed = [not parsed.echo] * len(choices)

        def render(output: SequenceOutput, finish: str | None) -> dict[str, Any] | None:
            text, token_ids, logprobs = output.text, list(output.token_ids), list(output.logprobs)
            prompt_logprobs: list[Any] = []
            if not echoed[output.index]:  # the first chunk of a choice carries its prompt
                echoed[output.index] = True
                text = self.tokenizer.decode(prompt_of[output.index]) + text
                if parsed.logprobs is not None:
                    prompt_logprobs = list(output.prompt_logprobs or [])
                    token_ids = [*prompt_of[output.index], *token_ids]
                    offsets[output.index] = 0
            if not text and not token_ids and finish is None:
                return None
            chunk_logprobs = None
            if parsed.logprobs is not None:
                chunk_logprobs = self.logprobs.completion(
                    token_ids, [*prompt_logprobs, *logprobs], offset=offsets[output.index]
                )
                offsets[output.index] += sum(len(token) for token in chunk_logprobs["tokens"])
            return {"index": output.index, "text": text, "logprobs": chunk_logprobs, "finish_reason": finish}

        usage_of = prompt_tokens if parsed.include_usage else None
        return _chunks(submission, choices, head, render, usage_of)

    # ------------------------------------------------------------------------------------ chat
    async def chat(self, request: Request) -> Response:
        parsed = parse_chat_request(await self.read_json(request), limits=self.limits)
        adapter = self.models.resolve(parsed.model)
        self.check_choices(parsed.params.n)
        prompt = await run_in_threadpool(self.encode_chat, parsed.messages)
        submission = await self.submit(self.sequences(parsed, [prompt], adapter), parsed.structured_field)
        choices = [SequenceOutput(index) for index in range(parsed.params.n)]
        response_id, created = new_id("chatcmpl"), now()
        if parsed.stream:
            head = self._head(response_id, "chat.completion.chunk", created, parsed.model)
            chunks = self._chat_chunks(parsed, submission, choices, len(prompt), head)
            await submission.first(request)
            return StreamingResponse(
                _sse(chunks, submission, request), media_type="text/event-stream", headers=SSE_HEADERS
            )
        await submission.collect(request, choices)
        _raise_engine_error(choices)
        body_choices = []
        for choice in choices:
            logprobs = self.logprobs.chat(choice.logprobs) if parsed.logprobs is not None else None
            body_choices.append(
                {
                    "index": choice.index,
                    "message": {"role": "assistant", "content": choice.text},
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                }
            )
        return JSONResponse(
            {
                "id": response_id,
                "object": "chat.completion",
                "created": created,
                "model": parsed.model,
                "choices": body_choices,
                "usage": usage(len(prompt), sum(choice.completion_tokens for choice in choices)),
            }
        )

    def _chat_chunks(
        self,
        parsed: ChatRequest,
        submission: _Submission,
        choices: list[SequenceOutput],
        prompt_tokens: int,
        head: dict[str, Any],
    ) -> AsyncIterator[dict[str, Any]]:
        # OpenAI opens each choice with the role
        opening = [
            {
                "index": choice.index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for choice in choices
        ]

        def render(output: SequenceOutput, finish: str | None) -> dict[str, Any] | None:
            if not output.text and not output.logprobs and finish is None:
                return None
            logprobs = self.logprobs.chat(output.logprobs) if parsed.logprobs is not None else None
            delta = {"content": output.text} if output.text or finish is None else {}
            return {"index": output.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

        usage_of = prompt_tokens if parsed.include_usage else None
        return _chunks(submission, choices, head, render, usage_of, opening)

    def _head(self, response_id: str, kind: str, created: int, model: str) -> dict[str, Any]:
        """The fields every chunk of a stream repeats."""
        return {"id": response_id, "object": kind, "created": created, "model": model}


async def _chunks(
    submission: _Submission,
    choices: list[SequenceOutput],
    head: dict[str, Any],
    render: Callable[[SequenceOutput, str | None], dict[str, Any] | None],
    usage_of: int | None,
    opening: Sequence[dict[str, Any]] = (),
) -> AsyncIterator[dict[str, Any]]:
    """The stream of a completion or a chat: the `opening` choice bodies, then each output gathered into its choice
    and rendered as one choice body (`render(output, finish_reason)`, None: nothing to send), an error as an error
    chunk, and the usage at the end when asked (`usage_of`: the prompt's tokens)."""
    for body in opening:
        yield {**head, "choices": [body]}
    async for output in submission.outputs():
        if output.error:
            yield _stream_error(output.error)
            continue
        choices[output.index].add(output)
        finish = "stop" if output.finish_reason == "cancelled" else output.finish_reason
        rendered = render(output, finish)
        if rendered is not None:
            yield {**head, "choices": [rendered]}
    if usage_of is not None:
        yield {**head, "choices": [], "usage": usage(usage_of, sum(choice.completion_tokens for choice in choices))}


def _raise_engine_error(choices: list[SequenceOutput]) -> None:
    errors = [choice.error for choice in choices if choice.error]
    if errors:
        raise engine_error(errors[0])


def _stream_error(error: EngineError) -> dict[str, Any]:
    return engine_error(error).body()


async def _sse(chunks: AsyncIterator[dict[str, Any]], submission: _Submission, request: Request) -> AsyncIterator[str]:
    """Server-sent events: each chunk as `data: <json>`, then `data: [DONE]`. The sequences are cancelled when
    the client disconnects, or the stream ends early for any other reason (Starlette closes this generator)."""
    watcher = submission.watch(request)
    try:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        yield DONE
    finally:
        watcher.cancel()
        submission.cancel()
