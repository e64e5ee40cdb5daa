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

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpt2.api import LLM
from gpt2.inference.steering import FeatureDictionary, check_feature_dictionary
from gpt2.serve import Engine, serving_chat, serving_completions, serving_models, serving_tokens
from gpt2.serve.config import MEGABYTE, ServerConfig
from gpt2.serve.playground import PLAYGROUND_HTML
from gpt2.serve.prefix_cache import PrefixCache
from gpt2.serve.protocol import APIError, bad_request
from gpt2.serve.service import ENGINE_ERRORS, Service, engine_error

__all__ = ["ENGINE_ERRORS", "create_app", "engine_error"]

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
    service = Service(llm, engine, config, saes or {})
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


def _add_service_routes(app: FastAPI, service: Service) -> None:
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


def _add_api_routes(app: FastAPI, service: Service) -> None:
    """OpenAI's and vLLM's routes, by family, behind the API key when one is set."""
    authorized = [Depends(service.authorize)]
    for family in (serving_models, serving_completions, serving_chat, serving_tokens):
        family.add_routes(app, service, authorized)
