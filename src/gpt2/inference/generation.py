"""Text generation: prefill the prompt once, then decode one token per step from a preallocated KV cache.

Notation: B = batch size, T = prompt length (columns, padding included), V = vocab_size, W = window length.

The public entry points share one decode loop (`stream`):

- `stream(model, idx, params, processors=..., attention_mask=..., options=...)` yields the (B,) tokens of each
  step as soon as they exist; `params` (SamplingParams) says what to draw, `options` (DecodeOptions) how the loop
  runs (padding id, window, native step, compile);
- `generate(model, idx, max_new_tokens, **fields)` -> (B, T + steps) token ids, the fields being SamplingParams'
  and DecodeOptions' (num_beams > 1: the best beam, gpt2.inference.beam);
- `stream_text(model, tokenizer, prompt, params)` yields text pieces, never half a character;
  `generate_texts(model, tokenizer, prompts, params)` decodes many prompts in one left-padded batch;
- `left_pad(list_of_token_lists, pad_token_id=...)` builds a left-padded batch and its attention mask.

Each step: the logits processors `build_processors` makes from params (penalties, bans, bias, minimum length,
a vocabulary limit; gpt2.inference.processors), then the caller's, then the one sampler
(gpt2.inference.sampling.sample_next_token): below GREEDY_BELOW_TEMPERATURE greedy (argmax); otherwise
logits / temperature, then top-k, then top-p (nucleus), then one draw. Both filters keep ties together (see
`filter_top_k`, `filter_top_p`), so the kept set never depends on how a sort orders equal values.

Rows of a batch are independent: each stops on its own stop token or stop sequence, after which it receives
`pad_token_id` and stops changing; the loop ends when every row has stopped or after `max_new_tokens` steps.

Context window. GPT-2 has absolute position embeddings for positions [0, block_size), so a cache cannot simply
drop its oldest entry: every cached key was computed at its old position. When the cache is full (block_size
columns) and another token must be fed, the loop re-prefills the last W = block_size - k columns (the newest
token included) at positions [0, W) and goes on decoding from the cache; the next re-prefill comes k tokens
later. k is `slide_by` (default block_size // 4). Each token beyond the window sees between W and block_size
tokens of context. Cost: one W-token prefill per k new tokens; for GPT-2 with the default k = 256, a 768-token
prefill every 256 tokens (on CPU roughly the time of another ~100-250 decode steps, i.e. 40-100% more per
token past the window). slide_by=0 re-prefills the full window at every step: exactly the plain "crop to the
last block_size tokens and recompute" loop, at the cost of a block_size-token prefill per token.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from gpt2.cpu.decoder import native_decoder
from gpt2.inference.beam import beam_search
from gpt2.inference.processors import LogitsProcessor, apply_processors, build_processors, with_end_of_text
from gpt2.inference.prompt import DecodeOptions, Truncate, check_id_list, check_prompt, prefill, truncated_prompt
from gpt2.inference.sampling import Generators, SamplingParams, sample_next_token
from gpt2.inference.structured import structured_processor
from gpt2.inference.text import TextAssembler
from gpt2.tokenizer.protocol import TextTokenizer

if TYPE_CHECKING:
    from gpt2.model import GPT

__all__ = [
    "DecodeOptions",
    "Truncate",
    "generate",
    "generate_texts",
    "left_pad",
    "stream",
    "stream_text",
    "text_pieces",
]

DEFAULT_SLIDE_FRACTION = 4  # slide_by defaults to block_size // 4 (see the module docstring for the cost)


# ------------------------------------------------------------------------------------------ batching
def left_pad(
    sequences: Sequence[Sequence[int]], *, pad_token_id: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of prompts of different lengths as (idx, attention_mask), both (B, T) with T the longest length.

    Padding goes on the left so that every row's last column is its last real token (where generation
    continues); the mask is 1 on real tokens and 0 on padding.

    >>> idx, mask = left_pad([[5, 6, 7], [8]], pad_token_id=0)
    >>> idx.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    if len(sequences) == 0:
        raise ValueError("left_pad needs at least one sequence, got an empty list")
    lengths = [len(sequence) for sequence in sequences]
    if min(lengths) == 0:
        raise ValueError(f"sequence {lengths.index(0)} is empty; every prompt needs at least one token")
    T = max(lengths)
    idx = torch.full((len(sequences), T), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), T), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        idx[row, T - len(sequence) :] = torch.as_tensor(list(sequence), dtype=torch.long)
        mask[row, T - len(sequence) :] = 1
    return idx.to(device), mask.to(device)


# ------------------------------------------------------------------------------------------ decoding
_STREAM_KEYWORDS = ("processors", "attention_mask", "generator")
_PARAMS_FIELDS = frozenset(field.name for field in dataclasses.fields(SamplingParams)) - {"max_tokens"}
_OPTION_FIELDS = frozenset(field.name for field in dataclasses.fields(DecodeOptions))


def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, **options: Any) -> torch.Tensor:
    """Continue each row of `idx` (B, T) by up to `max_new_tokens` tokens; returns (B, T + steps).

    steps is max_new_tokens, or fewer when every row has stopped earlier. Options, by keyword: any SamplingParams
    field (temperature, top_k, repetition_penalty, ...; num_beams > 1 runs beam search and returns its best
    beam per row), any DecodeOptions field, and `stream`'s processors, attention_mask, generator.

    >>> from gpt2.config import GPTConfig
    >>> from gpt2.model import GPT
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> generate(model, torch.tensor([[1, 2, 3]]), 8, temperature=0).shape
    torch.Size([1, 11])
    """
    unknown = set(options) - _PARAMS_FIELDS - _OPTION_FIELDS - set(_STREAM_KEYWORDS)
    if unknown:
        raise ValueError(f"unknown generation option(s) {sorted(unknown)}: see SamplingParams and DecodeOptions")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    params = SamplingParams(max_tokens=max_new_tokens, **{k: v for k, v in options.items() if k in _PARAMS_FIELDS})
    decode = DecodeOptions(**{k: v for k, v in options.items() if k in _OPTION_FIELDS})
    keywords = {k: v for k, v in options.items() if k in _STREAM_KEYWORDS}
    prompt = truncated_prompt(model, idx, decode.truncate).to(model.transformer.wte.weight.device)
    if params.num_beams > 1:
        if keywords.get("generator") is not None:
            raise ValueError("beam search is deterministic: it takes no generator")
        beams = beam_search(
            model, idx, params.replace(n=1), processors=keywords.get("processors", ()),
            attention_mask=keywords.get("attention_mask"), options=decode,
        )  # fmt: skip
        return beams.sequences
    steps = list(stream(model, idx, params, options=decode, **keywords))
    if not steps:
        return prompt.clone()
    return torch.cat([prompt.long(), torch.stack(steps, dim=1)], dim=1)


@torch.no_grad()
def stream(
    model: GPT,
    idx: torch.Tensor,
    params: SamplingParams,
    *,
    processors: Sequence[LogitsProcessor] = (),
    attention_mask: torch.Tensor | None = None,
    generator: Generators = None,
    options: DecodeOptions | None = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row, (B,) long, one step at a time, up to params.max_tokens steps.

    idx: (B, T) prompts; left-padded batches pass `attention_mask` (B, T), 1 = token, 0 = padding (see
    `left_pad`). params: what to draw (temperature, top-k, top-p, the decoding rules, which become logits
    processors, see gpt2.inference.processors); `processors` run after those (a grammar, ...). params.seed or
    `generator` (one, or one per row): reproducible draws. A row stops after emitting one of
    params.stop_token_ids (or a stop sequence, see DecodeOptions), then gets the pad token, and the loop ends
    when every row has stopped. params.n and stop texts are the text layer's (stream_text, LLM).

    Call `model.eval()` first: dropout in training mode would make the samples noisy.
    """
    config = model.config
    options = options or DecodeOptions()
    if params.num_beams > 1:
        raise ValueError("num_beams > 1 is beam search, which returns whole beams: call generate or beam_search")
    if params.seed is not None and generator is not None:
        raise ValueError("pass either seed or generator, not both (a seed makes a fresh generator)")
    check_prompt(model, idx, attention_mask, options.truncate)
    slide_by = config.block_size // DEFAULT_SLIDE_FRACTION if options.slide_by is None else options.slide_by
    if isinstance(slide_by, bool) or not isinstance(slide_by, int) or not 0 <= slide_by < config.block_size:
        raise ValueError(f"slide_by must be an integer in [0, block_size={config.block_size}), got {slide_by!r}")
    stop_ids = check_id_list("stop_token_ids", params.stop_token_ids, config.vocab_size)
    stop_seqs = [check_id_list("stop_sequences", sequence, config.vocab_size) for sequence in options.stop_sequences]
    stopping = bool(stop_ids or stop_seqs)
    pad_token_id = options.pad_token_id
    if pad_token_id is None:
        pad_token_id = stop_ids[0] if stop_ids else 0
    check_id_list("pad_token_id", [pad_token_id], config.vocab_size)
    max_new_tokens = params.max_tokens
    if max_new_tokens == 0:
        return

    device = model.transformer.wte.weight.device
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    idx = truncated_prompt(model, idx, options.truncate).to(device)
    if attention_mask is not None:
        attention_mask = attention_mask[:, -idx.size(1) :].to(device)
        if bool(attention_mask.all()):
            attention_mask = None  # no padding: the plain causal fast path, no mask built per step
    B, T = idx.shape
    padding = (1 - attention_mask).sum(dim=1) if attention_mask is not None else None  # (B,) pad columns
    rules = build_processors(
        params, prompt_length=T, vocab_size=config.vocab_size, vocab_limit=options.vocab_limit, padding=padding
    )
    rules.extend(processors)

    # Every column so far (prompt + generated) and, with padding, its mask: the re-prefill reads its window here.
    tokens = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=device)
    tokens[:, :T] = idx
    mask = None
    if attention_mask is not None:
        mask = torch.ones(B, T + max_new_tokens, dtype=torch.long, device=device)  # generated tokens are real
        mask[:, :T] = attention_mask
    stop_ids_tensor = torch.tensor(stop_ids, dtype=torch.long, device=device)
    stop_seq_tensors = [torch.tensor(sequence, dtype=torch.long, device=device) for sequence in stop_seqs]
    finished = torch.zeros(B, dtype=torch.bool, device=device)

    cache = model.new_kv_cache(B, max_len=min(config.block_size, T + max_new_tokens))
    decode_step: Callable[..., Any] = model.forward
    if options.compile:
        decode_step = torch.compile(model.forward, dynamic=True)
    decoder = native_decoder(model) if options.native is not False and not options.compile else None
    if options.native and decoder is None:
        raise ValueError(
            "native decoding cannot run this model (it needs a CPU model in eval mode with float32/bfloat16 "
            "nn.Linear or NativeLinear layers, and the native kernels built); pass native=None or False"
        )
    if options.native is None and decoder is not None and not decoder.takes(B):
        decoder = None  # this many rows step faster through the model (FLOAT32_MAX_ROWS)

    # prefill: the whole prompt (at most block_size columns) in one pass
    logits = prefill(model, tokens, mask, start=0, end=T, cache=cache)
    window_start = 0  # the cache holds columns [window_start, window_start + cache.length)
    positions = mask[:, :T].sum(dim=1, keepdim=True) if mask is not None else None  # (B, 1): next position
    n = T  # columns filled
    for step in range(max_new_tokens):
        if rules:
            logits = apply_processors(rules, tokens[:, :n], logits.float())  # logits is this step's own (B, V)
        next_token = sample_next_token(
            logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, generator=generator
        )
        if stopping:
            next_token = next_token.masked_fill(finished, pad_token_id)
        tokens[:, n] = next_token
        n += 1
        if stopping:
            finished |= torch.isin(next_token, stop_ids_tensor)
            for sequence in stop_seq_tensors:
                if n >= len(sequence):
                    finished |= (tokens[:, n - len(sequence) : n] == sequence).all(dim=1)
        yield next_token
        if step == max_new_tokens - 1 or (stopping and bool(finished.all())):
            return
        if cache.length == cache.max_len:
            # Full window: re-prefill the last W columns at positions [0, W) (module docstring).
            window_start = n - (config.block_size - slide_by)
            cache.reset()
            logits = prefill(model, tokens, mask, start=window_start, end=n, cache=cache)
            if mask is not None:
                positions = mask[:, window_start:n].sum(dim=1, keepdim=True)
            continue
        # decode: feed the token just drawn at the next position; (B, 1, V) -> last logits (B, V)
        step_mask = mask[:, window_start:n] if mask is not None else None
        if decoder is not None:
            step_positions = positions.view(B) if positions is not None else None
            logits = decoder.step(tokens[:, n - 1], cache, positions=step_positions, key_mask=step_mask)
        else:
            logits = decode_step(
                tokens[:, n - 1 : n], attention_mask=step_mask, position_ids=positions, kv_cache=cache, validate=False
            ).logits[:, -1]
        if positions is not None:
            positions = positions + 1


# ------------------------------------------------------------------------------------------ text
def stream_text(
    model: GPT,
    tokenizer: TextTokenizer,
    prompt: str | Sequence[int],
    params: SamplingParams,
    **engine_options: Any,
) -> Iterator[str]:
    """Yield the continuation of `prompt` (a text, or token ids such as a chat template's) as text pieces while
    it is generated, as `params` says.

    Pieces go through the tokenizer's streaming decoder, which holds back the bytes of a character split over
    several tokens, so no piece ends in half a character. The continuation ends at end-of-text, at one of
    `params.stop_token_ids`, at one of the `params.stop` texts (which is not returned: text that could be the
    start of a stop text is held back until it is known not to be), or after `params.max_tokens` tokens.
    Without stops, the concatenated pieces equal `tokenizer.decode(new_tokens)`. Never draws an id the tokenizer
    does not have (a padded vocabulary). `engine_options` go to `stream` (truncate, slide_by, compile, ...).

    >>> from gpt2.config import GPTConfig
    >>> from gpt2.model import GPT
    >>> from gpt2.tokenizer import ByteTokenizer
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=ByteTokenizer.vocab_size)).eval()
    >>> params = SamplingParams(max_tokens=50, top_k=40, stop=["\\n\\n"], seed=0)
    >>> pieces = list(stream_text(model, ByteTokenizer(), "Once upon a time", params))
    >>> "".join(pieces) == "".join(stream_text(model, ByteTokenizer(), "Once upon a time", params))
    True
    """
    ids = _prompt_ids(tokenizer, prompt)
    params, stop_ids = _text_params(model, tokenizer, params)
    device = model.transformer.wte.weight.device
    options = DecodeOptions(vocab_limit=len(tokenizer), **engine_options)
    grammar = structured_processor(params, tokenizer)  # regex / json_schema: a grammar mask, else None
    tokens = stream(model, torch.tensor([ids], device=device), params, options=options, processors=_some(grammar))
    yield from text_pieces(tokenizer, (int(token[0]) for token in tokens), stop_ids, params.stop)


def _some(processor: LogitsProcessor | None) -> list[LogitsProcessor]:
    return [] if processor is None else [processor]


def generate_texts(
    model: GPT,
    tokenizer: TextTokenizer,
    prompts: Sequence[str | Sequence[int]],
    params: SamplingParams,
    **engine_options: Any,
) -> list[list[str]]:
    """params.n continuations of each prompt (texts or token ids), decoded together in one left-padded batch;
    results in the prompts' order.

    Each row draws with its own generator (the i-th continuation of every prompt with seed + i), so a row's
    text is what `stream_text` gives for that prompt alone with params.for_sample(i) (greedy: exactly; sampled:
    unless the padding's float rounding moves a draw across a boundary). num_beams > 1: the n best beams of
    each prompt (`beam_search`), cut at stop ids and stop texts like the rest.
    """
    if isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError("generate_texts needs a list of prompts (texts or token id lists), got " + repr(prompts)[:40])
    ids = [_prompt_ids(tokenizer, prompt) for prompt in prompts]
    params, stop_ids = _text_params(model, tokenizer, params)
    device = model.transformer.wte.weight.device
    pad = stop_ids[0] if stop_ids else 0
    options = DecodeOptions(vocab_limit=len(tokenizer), pad_token_id=pad, **engine_options)
    n = params.n
    if params.num_beams > 1:
        idx, mask = left_pad(ids, pad_token_id=pad, device=device)
        sequences = beam_search(model, idx, params, attention_mask=mask, options=options).sequences
        rows = [row[idx.size(1) :] for row in sequences.tolist()]  # (B * n) generated parts, prompt-major
    else:
        idx, mask = left_pad([prompt for prompt in ids for _ in range(n)], pad_token_id=pad, device=device)
        generators = None
        if params.seed is not None:
            generators = [torch.Generator(device=device).manual_seed(params.seed + i) for _ in ids for i in range(n)]
        grammar = structured_processor(params, tokenizer)  # one mask, a matcher per row
        steps = list(stream(model, idx, params.replace(seed=None), attention_mask=mask, generator=generators,
                            options=options, processors=_some(grammar)))  # fmt: skip
        rows = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(idx.size(0))]
    texts = ["".join(text_pieces(tokenizer, iter(row), stop_ids, params.stop)) for row in rows]
    return [texts[i * n : (i + 1) * n] for i in range(len(ids))]


def text_pieces(
    tokenizer: TextTokenizer, tokens: Iterator[int], stop_ids: Sequence[int], stop: Sequence[str]
) -> Iterator[str]:
    """The text of generated token ids, piece by piece: it ends before the first stop id, and before a stop
    text (held back until it is known not to be one); never half a character."""
    text = TextAssembler(tokenizer, stop)
    for token_id in tokens:
        if token_id in stop_ids:
            break  # the bytes held back of an incomplete character still come out (as U+FFFD), as in decode
        piece, stopped = text.push(token_id)
        if piece:
            yield piece
        if stopped:
            return
    rest = text.finish()
    if rest:
        yield rest


def _prompt_ids(tokenizer: TextTokenizer, prompt: str | Sequence[int]) -> list[int]:
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens; pass some text (or use the end-of-text token as a start)")
    return ids


def _text_params(model: GPT, tokenizer: TextTokenizer, params: SamplingParams) -> tuple[SamplingParams, list[int]]:
    """params as the text paths decode with (end-of-text first among the stop ids, bad-word texts as ids), and
    those stop ids the model can produce."""
    params = with_end_of_text(params, tokenizer)
    stop_ids = [token for token in params.stop_token_ids if token < model.config.vocab_size]
    return params.replace(stop_token_ids=tuple(stop_ids)), stop_ids
