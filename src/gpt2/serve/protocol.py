"""The OpenAI wire format: request bodies in (checked field by field), response bodies and stream chunks out.

Requests are plain JSON objects read here, not pydantic models, so that every mistake becomes one OpenAI-shaped
error (`APIError` -> `{"error": {"message", "type", "param", "code"}}`, status 400) naming the field, and so that
the sampling fields are checked where they are defined: `SamplingParams` is built from the body and its
ValueError becomes the 400. Fields the API has and this server lacks (`suffix`, `best_of` other than n, tools)
are refused, and so is any field the server does not know (a 400 naming it, as OpenAI answers an unrecognized
argument): a request is never answered while part of it was ignored. Structured output comes as OpenAI's
response_format or under vLLM's names (guided_regex, guided_json, guided_choice, regex, structured_outputs),
through the same grammar path as SamplingParams' regex / json_schema.

Completions (`/v1/completions`) and chat (`/v1/chat/completions`) share the sampling fields: max_tokens,
temperature, top_p, top_k (an extension, as in vLLM), n, stop, seed, presence_penalty, frequency_penalty,
logit_bias, stream, stream_options.include_usage; and, as extra body fields with transformers' names (as vLLM
accepts them): repetition_penalty, no_repeat_ngram_size, min_tokens, bad_words (texts or lists of token ids);
min_p as vLLM and llama-server take it.
All of them are SamplingParams fields, applied by the same logits processors as `LLM.generate`. Counts are bounded
by the model (`ModelLimits`): max_tokens (max_completion_tokens) and no_repeat_ngram_size by its context, top_k by
its vocabulary; an error message quotes at most ECHOED_DIGITS digits of a number the client sent. `steering` (a
list of interventions, gpt2.inference.steering) is read here as a list and checked against the model by the app.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpt2.config import is_integer, shown
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.structured import JSON_OBJECT
from gpt2.serve.chat import ChatMessage, parse_messages
from gpt2.serve.sequence import MAX_TOP_LOGPROBS, TokenLogprob
from gpt2.tokenizer.protocol import TextTokenizer

MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
MAX_STOP_TEXTS = 16
MAX_STOP_CHARS = 256
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # seeds are 64-bit, as a torch.Generator takes them
SAMPLING_FIELDS = (
    "max_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "seed", "n", "presence_penalty",
    "frequency_penalty", "logit_bias", "repetition_penalty", "no_repeat_ngram_size", "min_tokens", "bad_words",
    "num_beams", "min_p",
)  # fmt: skip
# Extra body fields (not OpenAI's) read as the SamplingParams fields of the same name.
EXTRA_SAMPLING_FIELDS = {
    "repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "min_tokens": 0, "num_beams": 1, "min_p": 0.0,
}  # fmt: skip


# Every body field the server reads and applies (or refuses with its own message); anything else is a 400 naming it.
GENERATION_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "best_of", "stop", "stop_token_ids",
    "seed", "presence_penalty", "frequency_penalty", "logit_bias", "stream", "stream_options", "user",
    "repetition_penalty", "no_repeat_ngram_size", "min_tokens", "bad_words", "num_beams", "response_format",
    "regex", "guided_regex", "guided_json", "guided_choice", "structured_outputs", "steering",
})  # fmt: skip
COMPLETION_FIELDS = GENERATION_FIELDS | {"prompt", "echo", "logprobs", "suffix"}
CHAT_FIELDS = GENERATION_FIELDS | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "functions", "tool_choice",
}  # fmt: skip
BEAM_FIELDS = ("use_beam_search", "length_penalty", "early_stopping")
# vLLM's names for structured output -> the SamplingParams field they fill (guided_choice becomes a regex)
STRUCTURED_FIELDS = ("response_format", "regex", "guided_regex", "guided_json", "guided_choice", "structured_outputs")


def check_fields(body: dict[str, Any], known: frozenset[str]) -> None:
    """A 400 naming the first field this server would not apply: beam search's (offline only) or unknown."""
    for name in BEAM_FIELDS:
        if name in body:
            raise bad_request(
                f"{name}: beam search is offline only in this server (LLM.generate or gpt2 sample --num-beams); "
                "drop the field",
                name,
            )
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(
            f"unknown field {unknown[0]!r}: this server does not apply it; drop it (fields: see the README's server "
            "section)",
            unknown[0],
        )


def structured_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The regex / json_schema a body asks for, under OpenAI's response_format or vLLM's names (guided_regex,
    guided_json, guided_choice, regex, and the newer structured_outputs object with json, regex, choice,
    json_object); at most one of them. {} for none."""
    given = [name for name in STRUCTURED_FIELDS if _get(body, name) is not None]
    if len(given) > 1:
        raise bad_request(f"pass one of {', '.join(given)}, not several", given[1])
    if not given:
        return {}
    name = given[0]
    if name == "response_format":
        schema = _response_schema(body)
        return {} if schema is None else {"json_schema": schema}
    if name == "structured_outputs":
        return _structured_outputs(body[name])
    kind = {"regex": "regex", "guided_regex": "regex", "guided_json": "json", "guided_choice": "choice"}[name]
    return _structured_value(kind, body[name], name)


def _structured_outputs(options: Any) -> dict[str, Any]:
    """vLLM's structured_outputs object: exactly one of json, regex, choice, json_object: true."""
    if not isinstance(options, dict):
        raise bad_request(f"structured_outputs must be an object, got {_describe(options)}", "structured_outputs")
    for name in options:
        if name not in ("json", "regex", "choice", "json_object"):
            raise bad_request(
                f"structured_outputs.{name} is not supported; use json, regex, choice or json_object",
                f"structured_outputs.{name}",
            )
    given = [name for name, value in options.items() if value is not None and value is not False]
    if len(given) != 1:
        raise bad_request(
            "structured_outputs takes exactly one of json, regex, choice, json_object", "structured_outputs"
        )
    kind = given[0]
    if kind == "json_object":
        return {"json_schema": dict(JSON_OBJECT)}
    return _structured_value(kind, options[kind], f"structured_outputs.{kind}")


def _structured_value(kind: str, value: Any, param: str) -> dict[str, Any]:
    if kind == "json":
        if not isinstance(value, (dict, str)):
            raise bad_request(
                f"{param} must be a JSON schema (an object or its JSON text), got {_describe(value)}", param
            )
        return {"json_schema": value}
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise bad_request(f"{param} must be a non-empty string, got {_describe(value)}", param)
        return {"regex": value}
    if not isinstance(value, list) or not value or not all(isinstance(item, str) and item for item in value):
        raise bad_request(f"{param} must be a list of non-empty strings, got {_describe(value)}", param)
    return {"regex": "|".join(f"({re.escape(item)})" for item in value)}  # one of the choices, as vLLM builds it


class APIError(Exception):
    """An error answered to the client in OpenAI's shape, with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 with `message`, every run of digits past ECHOED_DIGITS in it cut (a client's 400-digit number is not
    echoed back whole, whichever check quoted it)."""
    return APIError(400, _LONG_NUMBER.sub(lambda match: match[0][:ECHOED_DIGITS] + "...", message), param=param,
                    code=code)  # fmt: skip


ECHOED_DIGITS = 20  # a 64-bit integer's 19 digits and a sign fit
_LONG_NUMBER = re.compile(rf"\d{{{ECHOED_DIGITS + 1},}}")


# ------------------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class ModelLimits:
    """What bounds a request's counts: no completion is longer than the context, no top-k wider than the vocabulary,
    no n-gram rule longer than the context."""

    context: int
    vocab_size: int


@dataclass(frozen=True)
class GenerationRequest:
    """What both endpoints ask for, checked."""

    model: str
    params: SamplingParams
    logprobs: int | None = None
    """Alternatives per generated token (0: only the token's own log-probability); None: no logprobs."""
    stream: bool = False
    include_usage: bool = False
    steering: tuple[Any, ...] = ()
    """The `steering` field's interventions as sent (plain data); the app checks them against the model."""
    structured_field: str | None = None
    """The body field that asked for structured output (response_format, guided_regex, ...): what a grammar that
    fails to compile is reported against."""


@dataclass(frozen=True)
class CompletionRequest(GenerationRequest):
    prompts: tuple[str | tuple[int, ...], ...] = ()
    """Each prompt is a text or token ids; a request for n continuations of k prompts has k * n choices."""
    echo: bool = False


@dataclass(frozen=True)
class ChatRequest(GenerationRequest):
    messages: tuple[ChatMessage, ...] = ()


def parse_completion_request(body: Any, *, max_prompts: int, limits: ModelLimits) -> CompletionRequest:
    """A /v1/completions body -> CompletionRequest; APIError (400) naming the field otherwise."""
    body = _object(body)
    check_fields(body, COMPLETION_FIELDS)
    if _get(body, "suffix") is not None:
        raise bad_request("suffix is not supported by this model", "suffix")
    logprobs = _get(body, "logprobs")
    if logprobs is not None and (not is_integer(logprobs) or not 0 <= logprobs <= MAX_TOP_LOGPROBS):
        raise bad_request(
            f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}] or null, got {logprobs!r}", "logprobs"
        )
    common = _generation_fields(body, limits, default_max_tokens=SamplingParams().max_tokens)
    return CompletionRequest(
        **common,
        logprobs=logprobs,
        prompts=_prompts(_get(body, "prompt"), max_prompts),
        echo=_bool(body, "echo"),
    )


def parse_chat_request(body: Any, *, limits: ModelLimits) -> ChatRequest:
    """A /v1/chat/completions body -> ChatRequest; APIError (400) naming the field otherwise.

    max_tokens (or max_completion_tokens) defaults to the rest of the context. logprobs is a boolean here,
    top_logprobs the number of alternatives."""
    body = _object(body)
    check_fields(body, CHAT_FIELDS)
    for unsupported in ("tools", "functions", "tool_choice"):
        if _get(body, unsupported) is not None:
            raise bad_request(f"{unsupported} is not supported by this model", unsupported)
    logprobs = _bool(body, "logprobs")
    top = _get(body, "top_logprobs")
    if top is not None and (not is_integer(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise bad_request(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}", "top_logprobs")
    if top is not None and not logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    if _get(body, "max_tokens") is None and _get(body, "max_completion_tokens") is not None:
        _check_count(body, "max_completion_tokens", limits.context, "the model's context")
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    common = _generation_fields(body, limits, default_max_tokens=None)
    try:
        messages = parse_messages(_get(body, "messages"))
    except ValueError as err:
        raise bad_request(str(err), "messages") from err
    return ChatRequest(**common, logprobs=(top or 0) if logprobs else None, messages=messages)


def _generation_fields(body: dict[str, Any], limits: ModelLimits, *, default_max_tokens: int | None) -> dict[str, Any]:
    model = _get(body, "model")
    if not isinstance(model, str) or not model:
        raise bad_request("model is required: the name /v1/models lists", "model")
    _check_count(body, "max_tokens", limits.context, "the model's context")
    _check_count(body, "top_k", limits.vocab_size, "the vocabulary")
    _check_count(body, "no_repeat_ngram_size", limits.context, "the model's context")
    max_tokens = _get(body, "max_tokens")
    if max_tokens is None:
        # None: as many as fit (the engine caps every completion at the context anyway)
        max_tokens = default_max_tokens if default_max_tokens is not None else INT64_MAX
    temperature = _get(body, "temperature", 1.0)
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature > MAX_TEMPERATURE:
        raise bad_request(f"temperature must be in [0, {MAX_TEMPERATURE}], got {temperature!r}", "temperature")
    top_k = _get(body, "top_k")
    if top_k == -1 or top_k == 0:
        top_k = None  # vLLM's and others' spelling of "no top-k"
    stop = _get(body, "stop", ())
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(text, str) for text in stop):
        raise bad_request(f"stop must be a string or a list of strings, got {_describe(stop)}", "stop")
    if len(stop) > MAX_STOP_TEXTS or any(len(text) > MAX_STOP_CHARS for text in stop):
        raise bad_request(f"stop takes at most {MAX_STOP_TEXTS} texts of at most {MAX_STOP_CHARS} characters", "stop")
    n = _get(body, "n", 1)
    best_of = _get(body, "best_of")
    if best_of is not None and best_of != n:
        raise bad_request("best_of is not supported (other than equal to n)", "best_of")
    seed = _get(body, "seed")
    if is_integer(seed) and not INT64_MIN <= seed <= INT64_MAX:  # choice i uses seed + i: still a torch seed
        raise bad_request(f"seed must be a 64-bit integer, got {seed}", "seed")
    stream = _bool(body, "stream")
    options = _get(body, "stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise bad_request("stream_options must be an object, and only with stream: true", "stream_options")
    include_usage = bool(options and _bool(options, "include_usage", param="stream_options.include_usage"))
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=_get(body, "top_p", 1.0),
            top_k=top_k,
            stop=tuple(stop),
            stop_token_ids=tuple(_list(body, "stop_token_ids")),
            seed=seed,
            n=n,
            presence_penalty=_get(body, "presence_penalty", 0.0),
            frequency_penalty=_get(body, "frequency_penalty", 0.0),
            logit_bias=_logit_bias(body),
            bad_words=_bad_words(body),
            **{name: _get(body, name, default) for name, default in EXTRA_SAMPLING_FIELDS.items()},
        )
    except ValueError as err:
        raise bad_request(str(err), field_named(str(err))) from err
    structured = structured_fields(body)
    structured_field = next((name for name in STRUCTURED_FIELDS if _get(body, name) is not None), None)
    if structured:
        try:
            params = params.replace(**structured)
        except ValueError as err:  # a malformed schema or regex
            raise bad_request(str(err), structured_field) from err
    steering = _get(body, "steering", ())
    if not isinstance(steering, list | tuple):
        raise bad_request(f"steering must be a list of interventions, got {_describe(steering)}", "steering")
    return dict(
        model=model,
        params=params,
        stream=stream,
        include_usage=include_usage,
        steering=tuple(steering),
        structured_field=structured_field,
    )


def _response_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """OpenAI's response_format: {"type": "text"} (the default), {"type": "json_object"} (any JSON object) or
    {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} -> the JSON schema to follow, or None."""
    response_format = _get(body, "response_format")
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(JSON_OBJECT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request(
                'response_format json_schema needs {"json_schema": {"name": ..., "schema": {...}}}', "response_format"
            )
        return schema
    raise bad_request(
        f"response_format must have type text, json_object or json_schema, got {_describe(response_format)}",
        "response_format",
    )


def _logit_bias(body: dict[str, Any]) -> dict[int, Any]:
    """OpenAI's logit_bias: an object of token ids written as strings -> bias."""
    bias = _get(body, "logit_bias", {})
    if not isinstance(bias, dict):
        raise bad_request(f"logit_bias must be an object of token id -> bias, got {_describe(bias)}", "logit_bias")
    token_bias: dict[int, Any] = {}
    for key, value in bias.items():
        if not isinstance(key, str) or not (key.isascii() and key.isdigit()) or len(key) > 12:
            raise bad_request(f'logit_bias keys must be token ids such as "50256", got {key!r}', "logit_bias")
        token_bias[int(key)] = value
    return token_bias


def _bad_words(body: dict[str, Any]) -> tuple[Any, ...]:
    """bad_words: texts, or lists of token ids (transformers' bad_words_ids)."""
    words = _list(body, "bad_words")
    if not all(isinstance(word, str) or isinstance(word, list) for word in words):
        raise bad_request("bad_words must be a list of texts or of lists of token ids", "bad_words")
    return tuple(word if isinstance(word, str) else tuple(word) for word in words)


def _prompts(prompt: Any, max_prompts: int) -> tuple[str | tuple[int, ...], ...]:
    """prompt: a string, a list of strings, a list of token ids, or a list of lists of token ids. Missing: the
    end-of-text token (a new document), as in OpenAI's API."""
    if prompt is None:
        return ((),)  # the app turns an empty token prompt into <|endoftext|>
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(item, str) for item in prompt):
            prompts: tuple[str | tuple[int, ...], ...] = tuple(prompt)
        elif all(is_integer(item) for item in prompt):
            prompts = (tuple(prompt),)
        elif all(isinstance(item, list) and all(is_integer(token) for token in item) for item in prompt):
            prompts = tuple(tuple(item) for item in prompt)
        else:
            prompts = ()
        if prompts and len(prompts) > max_prompts:
            raise bad_request(f"at most {max_prompts} prompts per request, got {len(prompts)}", "prompt")
        if prompts:
            return prompts
    raise bad_request(
        "prompt must be a string, a list of strings, a list of token ids or a list of such lists, got "
        f"{_describe(prompt)}",
        "prompt",
    )


# ------------------------------------------------------------------------------------------ field readers
def _check_count(body: dict[str, Any], name: str, bound: int, what: str) -> None:
    """A 400 naming `name` when it is an integer above `bound` (its type and lower bound are SamplingParams')."""
    value = body.get(name)
    if is_integer(value) and value > bound:
        raise bad_request(f"{name} must be at most {bound} ({what}), got {shown(value)}", name)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_describe(body)}")
    return body


def _get(body: dict[str, Any], name: str, default: Any = None) -> Any:
    value = body.get(name)
    return default if value is None else value


def _bool(body: dict[str, Any], name: str, default: bool = False, *, param: str | None = None) -> bool:
    value = _get(body, name, default)
    if not isinstance(value, bool):
        raise bad_request(f"{param or name} must be true or false, got {_describe(value)}", param or name)
    return value


def _list(body: dict[str, Any], name: str) -> list[Any]:
    value = _get(body, name, [])
    if not isinstance(value, list):
        raise bad_request(f"{name} must be a list, got {_describe(value)}", name)
    return value


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def field_named(message: str) -> str | None:
    """The request field a validation message starts with (SamplingParams and the engine name them), if any."""
    first = message.split(" ", 1)[0]
    named = (*SAMPLING_FIELDS, "presence_penalty", "frequency_penalty", "logit_bias", "prompt")
    return first if first in named else None


def reject_constant(name: str) -> float:
    """For json.loads(parse_constant=...): NaN and Infinity are not JSON numbers a client may send."""
    raise bad_request(f"{name} is not a valid JSON number")


# ------------------------------------------------------------------------------------------ responses
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class LogprobFormatter:
    """Token ids and TokenLogprobs in the two shapes OpenAI uses: the completions API's parallel lists
    (tokens, token_logprobs, top_logprobs, text_offset) and the chat API's list of token objects."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer

    def token_text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def completion(
        self,
        tokens: Sequence[int],
        logprobs: Sequence[TokenLogprob | None],
        *,
        offset: int = 0,
    ) -> dict[str, list[Any]]:
        """The `logprobs` object of a completion choice (or chunk): one entry per token; a None (the first
        prompt token) has null log-probabilities."""
        texts = [self.token_text(token) for token in tokens]
        offsets = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [None if item is None else _finite(item.logprob) for item in logprobs],
            "top_logprobs": [
                None if item is None else {self.token_text(t): _finite(lp) for t, lp in item.top} for item in logprobs
            ],
            "text_offset": offsets,
        }

    def chat(self, logprobs: Sequence[TokenLogprob]) -> dict[str, list[dict[str, Any]]]:
        """The `logprobs` object of a chat choice (or chunk)."""
        return {
            "content": [
                {
                    **self._token(item.token, item.logprob),
                    "top_logprobs": [self._token(token, logprob) for token, logprob in item.top],
                }
                for item in logprobs
            ]
        }

    def _token(self, token: int, logprob: float) -> dict[str, Any]:
        return {
            "token": self.token_text(token),
            "logprob": _finite(logprob),
            "bytes": list(self.tokenizer.decode_bytes([token])),
        }


# the log-probability of an impossible token (a padded id, a -inf logit) is -inf, which JSON cannot carry
LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else LOGPROB_FLOOR
