"""OpenAI's `POST /v1/completions`: prompts (texts or token ids) in, one choice per prompt and sample out, plain or
streamed, with logprobs and echo as OpenAI's API has them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from gpt2.serve import SequenceOutput
from gpt2.serve.protocol import CompletionRequest, new_id, now, parse_completion_request, usage
from gpt2.serve.service import Service, Submission
from gpt2.serve.streaming import chunk_head, raise_engine_error, stream_chunks, stream_response


def add_routes(app: FastAPI, service: Service, authorized: list[Any]) -> None:
    @app.post("/v1/completions", dependencies=authorized)
    async def completions_route(request: Request) -> Response:
        return await completions(service, request)


async def completions(service: Service, request: Request) -> Response:
    parsed = parse_completion_request(
        await service.read_json(request), max_prompts=service.config.max_prompts, limits=service.limits
    )
    adapter = service.models.resolve(parsed.model)  # an unknown model is a 404 before anything else
    service.check_choices(len(parsed.prompts) * parsed.params.n)
    prompts = await run_in_threadpool(lambda: [service.encode(prompt, "prompt") for prompt in parsed.prompts])
    n = parsed.params.n
    scoring = parsed.echo and parsed.logprobs is not None
    submission = await service.submit(
        service.sequences(parsed, prompts, adapter, prompt_logprobs=scoring), parsed.structured_field
    )
    choices = [SequenceOutput(index) for index in range(len(prompts) * n)]
    prompt_of = [prompts[index // n] for index in range(len(choices))]
    prompt_tokens = sum(len(prompt) for prompt in prompts)
    response_id, created = new_id("cmpl"), now()
    if parsed.stream:
        head = chunk_head(response_id, "text_completion", created, parsed.model)
        chunks = completion_chunks(service, parsed, submission, choices, prompt_of, prompt_tokens, head)
        return await stream_response(chunks, submission, request)
    await submission.collect(request, choices)
    raise_engine_error(choices)
    return JSONResponse(
        {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": parsed.model,
            "choices": [completion_choice(service, parsed, choice, prompt_of[choice.index]) for choice in choices],
            "usage": usage(prompt_tokens, sum(choice.completion_tokens for choice in choices)),
        }
    )


def completion_choice(
    service: Service, parsed: CompletionRequest, choice: SequenceOutput, prompt: list[int]
) -> dict[str, Any]:
    prompt_text = service.tokenizer.decode(prompt) if parsed.echo else ""
    logprobs = None
    if parsed.logprobs is not None:
        if parsed.echo:
            assert choice.prompt_logprobs is not None
            logprobs = service.logprobs.completion(
                [*prompt, *choice.token_ids], [*choice.prompt_logprobs, *choice.logprobs]
            )
        else:
            offset = len(service.tokenizer.decode(prompt))
            logprobs = service.logprobs.completion(choice.token_ids, choice.logprobs, offset=offset)
    return {
        "index": choice.index,
        "text": prompt_text + choice.text,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
    }


def completion_chunks(
    service: Service,
    parsed: CompletionRequest,
    submission: Submission,
    choices: list[SequenceOutput],
    prompt_of: list[list[int]],
    prompt_tokens: int,
    head: dict[str, Any],
) -> AsyncIterator[dict[str, Any]]:
    offsets = [len(service.tokenizer.decode(prompt)) for prompt in prompt_of]
    echoed = [not parsed.echo] * len(choices)

    def render(output: SequenceOutput, finish: str | None) -> dict[str, Any] | None:
        text, token_ids, logprobs = output.text, list(output.token_ids), list(output.logprobs)
        prompt_logprobs: list[Any] = []
        if not echoed[output.index]:  # the first chunk of a choice carries its prompt
            echoed[output.index] = True
            text = service.tokenizer.decode(prompt_of[output.index]) + text
            if parsed.logprobs is not None:
                prompt_logprobs = list(output.prompt_logprobs or [])
                token_ids = [*prompt_of[output.index], *token_ids]
                offsets[output.index] = 0
        if not text and not token_ids and finish is None:
            return None
        chunk_logprobs = None
        if parsed.logprobs is not None:
            chunk_logprobs = service.logprobs.completion(
                token_ids, [*prompt_logprobs, *logprobs], offset=offsets[output.index]
            )
            offsets[output.index] += sum(len(token) for token in chunk_logprobs["tokens"])
        return {"index": output.index, "text": text, "logprobs": chunk_logprobs, "finish_reason": finish}

    usage_of = prompt_tokens if parsed.include_usage else None
    return stream_chunks(submission, choices, head, render, usage_of)
