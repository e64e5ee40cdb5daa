"""vLLM's /tokenize and /detokenize and OpenAI's /v1/embeddings: their bodies in (checked field by field, a 400
naming the field otherwise), their answers out. The embedding itself is gpt2.inference.embedding's (last-token
pooling of the final hidden state, L2-normalized)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gpt2.serve.chat import parse_messages
from gpt2.serve.protocol import bad_request
from gpt2.tokenizer.chat import encode_chat
from gpt2.tokenizer.protocol import TextTokenizer

TOKENIZE_FIELDS = frozenset({"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"})
DETOKENIZE_FIELDS = frozenset({"model", "tokens"})
EMBEDDING_FIELDS = frozenset({"model", "input", "encoding_format", "user"})
MAX_EMBEDDING_INPUTS = 64


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_known(body: Any, known: frozenset[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_describe(body)}")
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(f"unknown field {unknown[0]!r}: this server does not apply it; drop it", unknown[0])
    return body


def requested_model(body: Any) -> str | None:
    """The body's `model`: None when absent (the server's model), a 400 when it is not a string. The app resolves
    the name, as for completions."""
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and not isinstance(model, str):
        raise bad_request(f"model must be a string, a name /v1/models lists; got {_describe(model)}", "model")
    return model


def tokenize(body: Any, tokenizer: TextTokenizer, max_model_len: int) -> dict[str, Any]:
    """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} -> {"count", "max_model_len", "tokens"}.
    Special-token text is the special token, as in completion prompts."""
    body = _check_known(body, TOKENIZE_FIELDS)
    if ("prompt" in body) == ("messages" in body):
        raise bad_request("pass either prompt (a text) or messages (a chat)", "prompt")
    # vLLM's add_special_tokens prepends a BOS token; GPT-2 has none, so either value encodes alike
    if not isinstance(body.get("add_special_tokens", True), bool):
        raise bad_request(
            f"add_special_tokens must be true or false, got {_describe(body['add_special_tokens'])}",
            "add_special_tokens",
        )
    if "prompt" in body:
        if not isinstance(body["prompt"], str):
            raise bad_request(f"prompt must be a string, got {_describe(body['prompt'])}", "prompt")
        tokens = tokenizer.encode(body["prompt"], allowed_special="all")
    else:
        generation_prompt = body.get("add_generation_prompt", True)
        if not isinstance(generation_prompt, bool):
            raise bad_request("add_generation_prompt must be true or false", "add_generation_prompt")
        try:
            messages = [message.as_dict() for message in parse_messages(body["messages"])]
            tokens, _ = encode_chat(messages, tokenizer, add_generation_prompt=generation_prompt)
        except ValueError as err:
            raise bad_request(str(err), "messages") from err
    return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": None}


def detokenize(body: Any, tokenizer: TextTokenizer) -> dict[str, Any]:
    """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
    body = _check_known(body, DETOKENIZE_FIELDS)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t < len(tokenizer) for t in tokens):
        raise bad_request(f"tokens must be a list of token ids in [0, {len(tokenizer)})", "tokens")
    return {"prompt": tokenizer.decode(tokens)}


def embedding_inputs(body: Any, tokenizer: TextTokenizer, max_model_len: int) -> list[list[int]]:
    """OpenAI's embeddings input: a text, a list of texts, a list of ids or a list of lists of ids -> ids each."""
    body = _check_known(body, EMBEDDING_FIELDS)
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise bad_request("encoding_format must be float or base64", "encoding_format")
    given = body.get("input")
    if isinstance(given, str):
        given = [given]
    if isinstance(given, list) and given and all(_is_int(item) for item in given):
        given = [given]
    if not isinstance(given, list) or not given or len(given) > MAX_EMBEDDING_INPUTS:
        raise bad_request(
            f"input must be a text, a list of at most {MAX_EMBEDDING_INPUTS} texts, or token ids", "input"
        )
    inputs = []
    for item in given:
        if isinstance(item, str):
            ids = tokenizer.encode(item, allowed_special="all")
        elif isinstance(item, list) and all(_is_int(t) and 0 <= t < len(tokenizer) for t in item):
            ids = list(item)
        else:
            raise bad_request(f"input items must be texts or lists of token ids, got {_describe(item)}", "input")
        if not ids or len(ids) > max_model_len:
            raise bad_request(f"each input must have 1 to {max_model_len} tokens, got {len(ids)}", "input")
        inputs.append(ids)
    return inputs


def embedding_response(
    vectors: torch.Tensor, inputs: Sequence[Sequence[int]], model: str, encoding_format: str
) -> dict[str, Any]:
    """OpenAI's embeddings answer for vectors (N, C); base64 is the float32 little-endian bytes, as OpenAI's."""
    data = []
    for index, vector in enumerate(vectors):
        if encoding_format == "base64":
            values: Any = base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
        else:
            values = np.asarray(vector, dtype=np.float32).tolist()
        data.append({"object": "embedding", "index": index, "embedding": values})
    tokens = sum(len(ids) for ids in inputs)
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
