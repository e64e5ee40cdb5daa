"""Streamed answers: OpenAI's chunks of a completion or a chat as server-sent events (`data: <json>`, then
`data: [DONE]`), an error after the first chunk as an error chunk (as vLLM's streams end)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from gpt2.serve import EngineError, SequenceOutput
from gpt2.serve.protocol import usage
from gpt2.serve.service import Submission, engine_error

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = "data: [DONE]\n\n"


def chunk_head(response_id: str, kind: str, created: int, model: str) -> dict[str, Any]:
    """The fields every chunk of a stream repeats."""
    return {"id": response_id, "object": kind, "created": created, "model": model}


async def stream_response(
    chunks: AsyncIterator[dict[str, Any]], submission: Submission, request: Request
) -> StreamingResponse:
    """The stream's response, begun only once its first output came (a request failing before its first token is
    answered with the error's status: `Submission.first`)."""
    await submission.first(request)
    return StreamingResponse(_sse(chunks, submission, request), media_type="text/event-stream", headers=SSE_HEADERS)


async def stream_chunks(
    submission: Submission,
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


def raise_engine_error(choices: list[SequenceOutput]) -> None:
    """A non-streamed answer whose sequences failed: the first failure's error."""
    errors = [choice.error for choice in choices if choice.error]
    if errors:
        raise engine_error(errors[0])


def _stream_error(error: EngineError) -> dict[str, Any]:
    return engine_error(error).body()


async def _sse(chunks: AsyncIterator[dict[str, Any]], submission: Submission, request: Request) -> AsyncIterator[str]:
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
