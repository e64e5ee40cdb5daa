"""OpenAI's `POST /v1/chat/completions`: the messages rendered by the model's chat template
(gpt2.tokenizer.chat), one reply per choice, plain or streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpt2.serve import SequenceOutput
from gpt2.serve.chat import ChatMessage
from gpt2.serve.protocol import ChatRequest, bad_request, new_id, now, parse_chat_request, usage
from gpt2.serve.service import Service, Submission
from gpt2.serve.streaming import chunk_head, raise_engine_error, stream_chunks, stream_response
from gpt2.tokenizer.chat import encode_chat as encode_conversation


def add_routes(app: FastAPI, service: Service, authorized: list[Any]) -> None:
    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_route(request: Request) -> Response:
        return await chat(service, request)


def encode_chat(service: Service, messages: Sequence[ChatMessage]) -> list[int]:
    """The chat prompt's token ids: the conversation in the chat template, then the assistant's header."""
    try:
        ids, _ = encode_conversation(
            [message.as_dict() for message in messages], service.tokenizer, add_generation_prompt=True
        )
    except ValueError as err:  # e.g. a lone surrogate in a content
        raise bad_request(f"the messages are not valid Unicode text: {err}", "messages") from err
    return service.encode(ids, "messages")


async def chat(service: Service, request: Request) -> Response:
    parsed = parse_chat_request(await service.read_json(request), limits=service.limits)
    adapter = service.models.resolve(parsed.model)
    service.check_choices(parsed.params.n)
    prompt = await run_in_threadpool(partial(encode_chat, service), parsed.messages)
    submission = await service.submit(service.sequences(parsed, [prompt], adapter), parsed.structured_field)
    choices = [SequenceOutput(index) for index in range(parsed.params.n)]
    response_id, created = new_id("chatcmpl"), now()
    if parsed.stream:
        head = chunk_head(response_id, "chat.completion.chunk", created, parsed.model)
        chunks = chat_chunks(service, parsed, submission, choices, len(prompt), head)
        return await stream_response(chunks, submission, request)
    await submission.collect(request, choices)
    raise_engine_error(choices)
    body_choices = []
    for choice in choices:
        logprobs = service.logprobs.chat(choice.logprobs) if parsed.logprobs is not None else None
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


def chat_chunks(
    service: Service,
    parsed: ChatRequest,
    submission: Submission,
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
        logprobs = service.logprobs.chat(output.logprobs) if parsed.logprobs is not None else None
        delta = {"content": output.text} if output.text or finish is None else {}
        return {"index": output.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    usage_of = prompt_tokens if parsed.include_usage else None
    return stream_chunks(submission, choices, head, render, usage_of, opening)
