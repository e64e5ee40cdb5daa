"""vLLM's `POST /tokenize` and `POST /detokenize`, OpenAI's `POST /v1/embeddings` (gpt2.serve.tokens reads and
writes their bodies; embeddings pool the last token, gpt2.inference.embedding)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool

from gpt2.inference.embedding import embed
from gpt2.serve.service import Service
from gpt2.serve.tokens import detokenize, embedding_inputs, embedding_response, tokenize


def add_routes(app: FastAPI, service: Service, authorized: list[Any]) -> None:
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
