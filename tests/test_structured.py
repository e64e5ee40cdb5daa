"""Structured output: every continuation of a random model under a JSON schema parses and validates with
`jsonschema`; under json_object it is a JSON object; under a regex it fullmatches; end-of-text only where the
grammar accepts; invalid schemas and regexes are one-line ValueErrors with the library's reason."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest
import torch

from conftest import shared_file
from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.inference.sampling import SamplingParams
from gpt2.inference.structured import JSON_OBJECT, GrammarCompiler, GrammarMask, bounded_schema, structured_processor
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer

pytest.importorskip("xgrammar")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["ada", "grace", "linus"]},
        "admin": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    },
    "required": ["name", "admin", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return load_tokenizer(Path(shared_file("gpt2-bpe/encoder.json")).parent)


@pytest.fixture(scope="module")
def llm(tokenizer: TextTokenizer) -> LLM:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, vocab_size=len(tokenizer), block_size=256)).eval()
    return LLM(model, tokenizer, torch.device("cpu"))


@pytest.mark.slow
def test_every_output_under_a_json_schema_validates(llm: LLM) -> None:
    params = SamplingParams(max_tokens=120, json_schema=SCHEMA, seed=0, n=8)
    for text in llm.generate("The user:", params):
        jsonschema.validate(json.loads(text), SCHEMA)


def test_a_schema_given_as_json_text_works_the_same(llm: LLM) -> None:
    params = SamplingParams(max_tokens=120, json_schema=json.dumps(SCHEMA), temperature=0)
    jsonschema.validate(json.loads(llm.generate("x", params)[0]), SCHEMA)


@pytest.mark.slow
def test_json_object_output_is_an_object(llm: LLM) -> None:
    params = SamplingParams(max_tokens=80, json_schema=JSON_OBJECT, seed=3, n=4)
    for text in llm.generate("{", params):
        if text.endswith("}"):  # a free-form object may be cut by max_tokens; a finished one must parse
            assert isinstance(json.loads(text), dict)
        else:
            assert text.startswith("{")


@pytest.mark.slow
def test_regex_outputs_fullmatch(llm: LLM) -> None:
    pattern = r"(yes|no), [0-9]{2,4}!"
    for text in llm.generate("Answer:", SamplingParams(max_tokens=30, regex=pattern, seed=1, n=8)):
        assert re.fullmatch(pattern, text), text


def test_batched_prompts_each_follow_the_grammar(llm: LLM) -> None:
    pattern = r"[a-c]{3}"
    outputs = llm.generate(["one", "two prompts"], SamplingParams(max_tokens=10, regex=pattern, seed=2))
    assert all(re.fullmatch(pattern, texts[0]) for texts in outputs)


def test_end_of_text_is_allowed_only_where_the_grammar_accepts(tokenizer: TextTokenizer) -> None:
    compiler = GrammarCompiler(tokenizer)
    mask = GrammarMask(compiler.compile(regex="ab"))
    V, eot = len(tokenizer), tokenizer.eot_token
    prompt = torch.tensor([[1, 2]])
    assert mask(prompt, torch.zeros(1, V))[0, eot] == float("-inf")  # nothing yet: "ab" is not done
    a = tokenizer.encode("a")
    allowed = mask(torch.tensor([[1, 2, *a]]), torch.zeros(1, V))[0]
    assert allowed[eot] == float("-inf") and allowed[tokenizer.encode("b")[0]] == 0
    done = mask(torch.tensor([[1, 2, *a, *tokenizer.encode("b")]]), torch.zeros(1, V))[0]
    assert done[eot] == 0 and torch.isinf(done).sum() == V - 1  # only end-of-text is left


def test_no_grammar_asked_for_is_no_processor(tokenizer: TextTokenizer) -> None:
    assert structured_processor(SamplingParams(), tokenizer) is None


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"regex": "a(b"}, "invalid regex: .*parenthesis"),
        ({"json_schema": {"type": "foo"}}, 'invalid json_schema: .*"foo"'),
        ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
        ({"json_schema": [1]}, "must be a JSON object"),
        ({"regex": "a", "json_schema": {}}, "either regex or json_schema"),
    ],
)
def test_invalid_grammars_are_one_line_value_errors(tokenizer: TextTokenizer, fields: dict, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as caught:
        structured_processor(SamplingParams(**fields), tokenizer)  # malformed: at construction; invalid: compiling
    assert "\n" not in str(caught.value)


# ------------------------------------------------------------------------------------ the server
@pytest.mark.slow
def test_the_openai_clients_response_format_works_against_gpt2_serve(llm: LLM) -> None:
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    from test_serve import MODEL, running

    seeded = SamplingParams(max_tokens=120, seed=1, json_schema=SCHEMA)
    expected = llm.generate("The user:", seeded)[0]  # before the server's engine thread takes the model
    with running(llm) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        schema_format = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
        for seed in range(3):
            chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Who?"}],
                                                  max_tokens=120, seed=seed, response_format=schema_format)  # fmt: skip
            jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)
        streamed = client.completions.create(model=MODEL, prompt="{", max_tokens=80, seed=3, stream=True,
                                             extra_body={"response_format": {"type": "json_object"}})  # fmt: skip
        chunks = [chunk.choices[0] for chunk in streamed if chunk.choices]
        text, finish = "".join(chunk.text for chunk in chunks), chunks[-1].finish_reason
        assert isinstance(json.loads(text), dict) if finish == "stop" else text.startswith("{")  # or cut by max_tokens
        served = client.completions.create(model=MODEL, prompt="The user:", max_tokens=120, seed=1,
                                           extra_body={"response_format": schema_format})  # fmt: skip
        assert served.choices[0].text == expected  # the server draws what LLM.generate draws
        invalid = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}
        refused = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "response_format": invalid,
                             "messages": [{"role": "user", "content": "x"}]}, timeout=60)  # fmt: skip
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_format"
        assert "json_schema" in refused.json()["error"]["message"]


def deep_schema(depth: int) -> dict:
    """An object nested `depth` deep around an integer: xgrammar's compile time grows fast with the depth."""
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


@pytest.mark.slow
def test_a_short_request_completes_while_another_requests_grammar_compiles(
    llm: LLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    httpx = pytest.importorskip("httpx")
    from test_serve import MODEL, WAIT_SECONDS, running

    compiling, short_done = threading.Event(), threading.Event()
    compile_grammar = GrammarCompiler.compile

    def compile_after_the_short_request(self: GrammarCompiler, **grammar: object) -> object:
        compiling.set()
        short_done.wait(WAIT_SECONDS)  # a compile that blocked the server would keep it from ever being set
        return compile_grammar(self, **grammar)  # type: ignore[arg-type]

    monkeypatch.setattr(GrammarCompiler, "compile", compile_after_the_short_request)
    schema_format = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA}}
    with running(llm) as url, ThreadPoolExecutor(1) as pool:
        body = {"model": MODEL, "prompt": "The user:", "max_tokens": 120, "seed": 1, "response_format": schema_format}
        structured = pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=WAIT_SECONDS)
        assert compiling.wait(WAIT_SECONDS)
        short = httpx.post(f"{url}/v1/completions", timeout=WAIT_SECONDS,
                           json={"model": MODEL, "prompt": "x", "max_tokens": 5, "temperature": 0})  # fmt: skip
        finished_first = not structured.done()
        short_done.set()
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] == 5
        assert finished_first  # the short request finished while the grammar was still waiting to compile
        answer = structured.result()
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["text"] == llm.generate("The user:", SamplingParams(
        max_tokens=120, seed=1, json_schema=SCHEMA))[0]  # fmt: skip


@pytest.mark.slow
def test_a_grammar_past_the_compile_limit_is_a_400_naming_the_limit(llm: LLM) -> None:
    httpx = pytest.importorskip("httpx")
    from test_serve import MODEL, WAIT_SECONDS, running

    too_deep = {"type": "json_schema", "json_schema": {"name": "deep", "schema": deep_schema(60)}}
    with running(llm, grammar_timeout=0.01) as url:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 5, "response_format": too_deep}
        refused = httpx.post(f"{url}/v1/completions", json=body, timeout=WAIT_SECONDS)
        served = httpx.post(f"{url}/v1/completions", timeout=WAIT_SECONDS,
                            json={"model": MODEL, "prompt": "x", "max_tokens": 5})  # fmt: skip
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == "response_format"
    assert "json_schema is too complex to compile within 0.01 s" in error["message"]
    assert "--grammar-timeout" in error["message"]
    assert served.status_code == 200  # the server goes on serving


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_the_server_compiles_grammars_at_the_lowest_priority(llm: LLM) -> None:
    """A long compilation takes the cores decoding leaves idle (benchmarks/serve/grammar_stall.py measures it)."""
    from gpt2.serve.grammar import GRAMMAR_NICENESS, GrammarCompilations

    compiler, niceness = GrammarCompiler(llm.tokenizer, llm.model.config.vocab_size), []

    class Recording:
        def compile(self, **grammar: object) -> object:
            niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
            return compiler.compile(**grammar)  # type: ignore[arg-type]

    compilations = GrammarCompilations(lambda: Recording(), timeout=60)  # type: ignore[arg-type,return-value]
    assert asyncio.run(compilations.compile(SamplingParams(json_schema=SCHEMA))) is not None
    assert niceness == [GRAMMAR_NICENESS] and GRAMMAR_NICENESS > os.getpriority(os.PRIO_PROCESS, 0)


def test_a_schema_compiles_once_and_comes_from_the_cache_after(llm: LLM) -> None:
    compiler = GrammarCompiler(llm.tokenizer, llm.model.config.vocab_size)
    first = compiler.compile(json_schema=SCHEMA)
    as_text = compiler.compile(json_schema=json.dumps(SCHEMA, indent=2))  # the same schema, written otherwise
    assert as_text is first and compiler.compiled == 1
    assert compiler.compile(regex="[a-z]+") is compiler.compile(regex="[a-z]+") and compiler.compiled == 2
    reordered = {**SCHEMA, "properties": dict(reversed(SCHEMA["properties"].items()))}
    assert compiler.compile(json_schema=reordered) is not first  # another order of properties: another grammar


class Stalled:
    """A compiler whose thread spends `waiting` seconds without a core (asleep), then `working` CPU seconds."""

    def __init__(self, waiting: float, working: float) -> None:
        self.waiting, self.working = waiting, working

    def compile(self, **grammar: object) -> str:
        time.sleep(self.waiting)
        start = time.thread_time()
        while time.thread_time() - start < self.working:
            pass
        return "compiled"


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"), reason="no per-thread CPU clock here")
def test_the_compile_limit_counts_the_compiling_threads_cpu_time_not_its_wait_for_a_core() -> None:
    from gpt2.serve.grammar import GrammarCompilations, GrammarTooComplex

    params = SamplingParams(json_schema=SCHEMA)
    waits = GrammarCompilations(lambda: Stalled(waiting=0.5, working=0.01), timeout=0.1)  # type: ignore[arg-type,return-value]
    assert asyncio.run(waits.compile(params)) == "compiled"  # 0.5 s late, a hundredth of a second of work
    works = GrammarCompilations(lambda: Stalled(waiting=0.0, working=0.5), timeout=0.1)  # type: ignore[arg-type,return-value]
    with pytest.raises(GrammarTooComplex, match="within 0.1 s of CPU time"):
        asyncio.run(works.compile(params))


def test_a_schema_nested_300_deep_is_read_without_recursion() -> None:
    schema = deep_schema(300)
    copy = bounded_schema(schema)  # no number with one bound: an equal copy, not a RecursionError
    assert copy is not schema and json.dumps(copy) == json.dumps(schema)
