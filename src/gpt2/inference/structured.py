"""Structured output: a logits processor that masks every token a grammar (a JSON schema, any JSON object, a
regex) does not allow next, so the continuation is always a valid prefix of the language and can only end
(end-of-text) where the grammar accepts.

The grammar engine is xgrammar (`pip install 'gpt2-faithful[structured]'`). Why it: among the three well-kept libraries
(xgrammar, llguidance, outlines-core) it installs from PyPI on a plain CPU machine and reads a vocabulary given
as raw token bytes (`VocabType.RAW`), which is exactly GPT-2's byte-level BPE (`decode_bytes([id])`), with no
transformers tokenizer object; and its per-token mask is precomputed per grammar state (adaptive token mask
cache), so a step costs a bitmask fill of V / 32 words plus one masked fill in C++, measured in
benchmarks/inference/structured.py against a decode step.

A schema's properties come in the schema's order (as OpenAI's structured outputs return them). Numbers are bounded
as llama.cpp's JSON-schema grammar bounds them (common/json-schema-to-grammar.cpp: an integral part of at most
16 digits, a fraction of at most 16), so a sampled integer cannot run on until max_tokens: an integer or number
with one bound gets the other at 16 nines (xgrammar then writes a bounded digit grammar), and the grammar of
unbounded numbers is rewritten with those limits (`bounded_ebnf`).

Usage: `structured_processor(params, tokenizer)` gives the processor for `params.json_schema` / `params.regex`
(None when neither is set); a `GrammarCompiler` kept beside a tokenizer reuses its vocabulary tables and compiled
grammars across requests (the server should hold one).
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from gpt2.tokenizer.protocol import TextTokenizer

INSTALL_HINT = "structured output needs xgrammar: pip install 'gpt2-faithful[structured]'"
JSON_OBJECT: dict[str, Any] = {"type": "object"}
"""The schema of OpenAI's response_format {"type": "json_object"}: any JSON object."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as err:
        raise ValueError(INSTALL_HINT) from err
    return xgrammar


def _reason(err: Exception) -> str:
    """xgrammar's message on one line, without its '[time] file.cc:line:' prefix."""
    text = " ".join(str(err).split())
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", text)


GRAMMAR_CACHE = 256  # compiled grammars a GrammarCompiler keeps (a deep schema's is a few MB at most)
NUMBER_DIGITS = 16  # llama.cpp's integral-part [0] | [1-9] [0-9]{0,15} and decimal-part [0-9]{1,16}
LARGEST_BOUNDED = 10**NUMBER_DIGITS - 1
# xgrammar's rules for a number with no bounds (and any JSON value's numbers): (rule, unbounded, bounded)
_UNBOUNDED_RULES = (
    ("basic_integer", "[1-9] [0-9]*", f"[1-9] [0-9]{{0, {NUMBER_DIGITS - 1}}}"),
    ("basic_number_2", "[1-9] [0-9]*", f"[1-9] [0-9]{{0, {NUMBER_DIGITS - 1}}}"),
    ("basic_number_3", "basic_number_digits{1, -1}", f"basic_number_digits{{1, {NUMBER_DIGITS}}}"),
    ("basic_number_5", "basic_number_digits{1, -1}", f"basic_number_digits{{1, {NUMBER_DIGITS}}}"),
)
_NOT_SCHEMAS = ("const", "enum", "default", "examples")  # values that are data, never subschemas


def bounded_schema(schema: Any) -> Any:
    """A copy of a JSON schema where every integer or number with exactly one bound (minimum / exclusiveMinimum,
    maximum / exclusiveMaximum) gets the other at +-(10**16 - 1), as far as llama.cpp lets its digits run. Walked
    with a stack of its own, not recursion, so a schema nested hundreds deep is copied like any other."""
    root = [schema]
    pending: list[tuple[Any, Any]] = [(root, 0)]  # (container, key) whose value is still the caller's
    while pending:
        container, key = pending.pop()
        value = container[key]
        if isinstance(value, list):
            container[key] = value = list(value)
            pending.extend((value, index) for index in range(len(value)))
        elif isinstance(value, Mapping):
            container[key] = value = dict(value)
            pending.extend((value, name) for name in value if name not in _NOT_SCHEMAS)
            if value.get("type") in ("integer", "number"):
                low = "minimum" in value or "exclusiveMinimum" in value
                high = "maximum" in value or "exclusiveMaximum" in value
                if low and not high:
                    value["maximum"] = LARGEST_BOUNDED
                elif high and not low:
                    value["minimum"] = -LARGEST_BOUNDED
    return root[0]


def bounded_ebnf(ebnf: str) -> str:
    """xgrammar's EBNF of a JSON schema with its unbounded number rules limited to llama.cpp's digit counts.
    A rule not found as expected (another xgrammar) is a RuntimeError, never a silently unbounded grammar."""
    lines = ebnf.splitlines()
    for rule, unbounded, bounded in _UNBOUNDED_RULES:
        for index, line in enumerate(lines):
            if line.startswith(f"{rule} ::= "):
                if unbounded not in line:
                    raise RuntimeError(f"xgrammar's rule {line!r} has changed; update _UNBOUNDED_RULES")
                lines[index] = line.replace(unbounded, bounded)
    return "\n".join(lines) + "\n"


def schema_text(json_schema: Mapping[str, Any] | str) -> str:
    """A JSON schema (dict or JSON text) as JSON text, its keys in their order (properties keep the order the
    schema gives them); a ValueError when it is not JSON."""
    if isinstance(json_schema, str):
        try:
            json_schema = json.loads(json_schema)
        except json.JSONDecodeError as err:
            raise ValueError(f"json_schema is not valid JSON: {err}") from err
    if not isinstance(json_schema, Mapping):
        raise ValueError(f"json_schema must be a JSON object (a dict), got {type(json_schema).__name__}")
    return json.dumps(json_schema)


def check_structured(regex: str | None, json_schema: Mapping[str, Any] | str | None) -> None:
    """Raise a one-line ValueError when the grammar fields are malformed: both given, an empty regex, a schema
    that is not a JSON object (what SamplingParams calls at construction). Cheap on purpose: whether the grammar
    itself is valid is found when it is compiled (`GrammarCompiler.compile`), as parsing a deep schema can take
    as long as compiling it."""
    if regex is not None and json_schema is not None:
        raise ValueError("pass either regex or json_schema, not both")
    if regex is not None and (not isinstance(regex, str) or not regex):
        raise ValueError(f"regex must be a non-empty string, got {regex!r}")
    if json_schema is not None:
        schema_text(json_schema)


class GrammarCompiler:
    """A tokenizer's vocabulary in xgrammar's form and a cache of the grammars compiled for it.

    vocab_size: the model's (its logits' width), which may exceed the tokenizer's (a padded vocabulary: the
    padding ids are never allowed). cache_size: compiled grammars kept, by regex or by schema (its JSON text), the
    least recently used dropped first. A grammar compiles on its caller's thread alone (xgrammar with one thread),
    so its compile work is that thread's CPU time, which the server limits (gpt2.serve.grammar)."""

    def __init__(
        self, tokenizer: TextTokenizer, vocab_size: int | None = None, cache_size: int = GRAMMAR_CACHE
    ) -> None:
        xgr = _xgrammar()
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        eot = tokenizer.eot_token
        # Raw bytes of every token; end-of-text is a stop token, never the text '<|endoftext|>'.
        vocab = [b"" if token == eot else tokenizer.decode_bytes([token]) for token in range(len(tokenizer))]
        info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=self.vocab_size, stop_token_ids=[eot])
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # our cache, below
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0  # grammars compiled (not taken from the cache)

    def compile(self, *, regex: str | None = None, json_schema: Mapping[str, Any] | str | None = None) -> Any:
        """The compiled grammar of a regex or a JSON schema, from the cache when it holds it; a one-line ValueError
        with the library's reason when the grammar is invalid. Thread-safe; xgrammar releases the GIL while it
        compiles, so a compile on a worker thread leaves the others running."""
        check_structured(regex, json_schema)
        key = ("regex", regex) if regex is not None else ("json_schema", schema_text(json_schema or {}))
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        compiled = self._compile(regex, key[1] if regex is None else None)  # outside the lock: others go on
        with self._lock:
            self.compiled += 1
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, regex: str | None, text: str | None) -> Any:
        """regex, or the schema's JSON text, compiled by xgrammar."""
        try:
            if regex is not None:
                return self._compiler.compile_regex(regex)
            assert text is not None, "pass regex or json_schema"
            schema = bounded_schema(json.loads(text))
            # no free whitespace: a model could otherwise pad the JSON with spaces until max_tokens
            grammar = self._xgr.Grammar.from_json_schema(schema_text(schema), any_whitespace=False)
            return self._compiler.compile_grammar(bounded_ebnf(str(grammar)))
        except RuntimeError as err:  # xgrammar's parse errors
            what = "regex" if regex is not None else "json_schema"
            raise ValueError(f"invalid {what}: {_reason(err)}") from err


class GrammarMask:
    """The logits processor of one grammar: each row (sequence) has its own matcher, which accepts the tokens
    appended since the last call, then every id the grammar does not allow next gets -inf. End-of-text is
    allowed only where the grammar accepts; a row whose grammar has ended is left alone (its decoder stops it).

    Stateful: one instance per generation (rows are counted from the first call)."""

    def __init__(self, compiled: Any) -> None:
        self._xgr = _xgrammar()
        self._compiled = compiled
        self._matchers: list[Any] = []
        self._seen = 0  # columns of token_ids already accepted
        self._bitmask: torch.Tensor | None = None

    def __call__(self, token_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        B, T = token_ids.shape
        V = logits.size(-1)
        if self._bitmask is None:
            # first call: the columns so far are the prompt, which the grammar does not constrain
            self._matchers = [self._xgr.GrammarMatcher(self._compiled) for _ in range(B)]
            self._bitmask = self._xgr.allocate_token_bitmask(B, V)
        else:
            new = token_ids[:, self._seen : T].tolist()  # (B, T - seen)
            for matcher, tokens in zip(self._matchers, new, strict=True):
                for token in tokens:
                    if not matcher.is_terminated():
                        matcher.accept_token(token)  # False for a token past the end (padding): ignored
        self._seen = T
        bitmask = self._bitmask
        bitmask.fill_(-1)  # every id allowed, for rows whose grammar has ended
        for row, matcher in enumerate(self._matchers):
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, row)
        on_cpu = logits.device.type == "cpu"
        work = logits if on_cpu and logits.dtype == torch.float32 else logits.float().cpu()
        self._xgr.apply_token_bitmask_inplace(work, bitmask, vocab_size=V)
        return logits if work is logits else work.to(logits.device, logits.dtype)


class GrammarFields(Protocol):
    """What structured output reads of a SamplingParams (not imported: sampling.py validates with this module)."""

    @property
    def regex(self) -> str | None: ...

    @property
    def json_schema(self) -> Mapping[str, Any] | str | None: ...


def structured_processor(
    params: GrammarFields, tokenizer: TextTokenizer, *, compiler: GrammarCompiler | None = None
) -> GrammarMask | None:
    """The grammar mask `params.regex` or `params.json_schema` asks for, or None. Pass a `compiler` kept for
    `tokenizer` to skip rebuilding its vocabulary tables (~0.1-0.5 s for GPT-2's 50257 tokens) per call.

    >>> from gpt2.inference.sampling import SamplingParams
    >>> from gpt2.tokenizer import load_tokenizer
    >>> type(structured_processor(SamplingParams(regex="[0-9]{3}"), load_tokenizer(gpt2_files))).__name__
    'GrammarMask'
    """
    regex, json_schema = params.regex, params.json_schema
    if regex is None and json_schema is None:
        return None
    compiler = compiler if compiler is not None else GrammarCompiler(tokenizer)
    return GrammarMask(compiler.compile(regex=regex, json_schema=json_schema))
