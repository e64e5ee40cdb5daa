"""OpenAI's `GET /v1/models` (and `/v1/models/{id}`), vLLM's `POST /v1/load_lora_adapter` and
`/v1/unload_lora_adapter`: the base model and its LoRA adapters (gpt2.serve.adapters), which a request's `model`
picks from."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from gpt2.serve.service import Service


def add_routes(app: FastAPI, service: Service, authorized: list[Any]) -> None:
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
