"""The running batch of continuous batching: sequences join and leave at step boundaries, and every step feeds
one token of each through the model in a single forward.

Notation: R = rows the cache was made for, B = active rows, L = the batch's width (cache columns in use), P = a
joining prompt's length, V = vocab_size.

Layout. One preallocated KV cache (n_layer, R, nh, block_size, hs). Active sequences occupy rows [0, B), so the
active part is a view (a leaving row's place is taken by the last row). All rows share the columns: row i's n_i
cached tokens sit right-aligned in columns [L - n_i, L), and the columns before them are padding that the
attention mask hides. Each row feeds its own position ids (0, 1, ... over its own tokens), so a token's keys and
values do not depend on the column they sit in: every row computes what its sequence computes alone (tested), up
to the rounding of the batched reductions.

- join: the prompt is prefilled alone (B=1) straight into its row's columns [L - P, L); when P > L, the rows
  already there first move right by P - L. join_many: several prompts in one left-padded prefill, likewise.
- Prefix cache (optional, gpt2.serve.prefix_cache): before a prefill, each prompt's longest cached prefix of at
  most P - 1 tokens (one token at least is prefilled, for the logits) is copied into the row's first columns, and
  only the rest is fed, with that prefix as its past (positions go on from the prefix's length); afterwards the
  prompt's blocks are stored. In a join_many the rows feed equally many tokens (the most any row has left,
  r): a row with fewer left recomputes some of its cached tokens (it reuses P_i - r of them). A join that wants
  every position's logits (prompt scoring) uses no cached prefix, since it needs a prefill of every token.
- Views: a prefill or step may run a view over the model's weights instead of the model itself (`model=`: the
  rows' LoRA adapters added, gpt2.inference.lora_batch), writing the same cache; such prompts' blocks go in the
  prefix cache under their adapter's namespace, as their keys and values are the adapter's.
- Chunked prefill (ChunkedPrefill, from start_prefill): a long prompt is prefilled a chunk at a time in a cache of
  its own, outside the batch, so the rows can step between its chunks (the engine decides how much each turn
  feeds); join_prefilled then seats it like a join, copying its keys and values in (no forward). Outside the batch,
  it is untouched by the rows' moves; the copy costs far less than the prefill it follows.
- step: one forward of the B pending tokens (B, 1), each with its row's mask and position (in the native decoder,
  gpt2.cpu.decoder, where it can run the model).
- extend / rollback: a lone row feeds several tokens in one forward and drops the rejected ones again (the
  engine's speculative decoding at batch 1).
- Room: a step needs column L free. When L reaches block_size, or the padding every row shares grows past a
  quarter of the width, all rows move left by that shared padding (one copy of the active cache, which costs
  about as much as the attention of a step or two reads anyway).

A sequence of n_i cached tokens can take another step only while n_i < block_size: the caller caps prompt +
completion at the context (gpt2.serve.engine) and makes every sequence leave when it reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpt2.config import is_integer
from gpt2.cpu.decoder import native_decoder
from gpt2.inference.speculative import NATIVE_SPAN
from gpt2.model import GPT, KVCache
from gpt2.serve.prefix_cache import CachedPrefix, PrefixCache

# Move the rows left when the padding all of them share reaches this fraction of the width (see the docstring).
COMPACT_FRACTION = 4


class DecodeBatch:
    """Up to `max_rows` sequences decoding together over one KV cache (module docstring).

    >>> from gpt2 import GPT, GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257)).eval()
    >>> batch = DecodeBatch(model, max_rows=4)
    >>> first = batch.join([72, 105]).argmax()  # (V,) logits after the prompt
    >>> batch.step(first.view(1)).shape  # (B, V): a token per row
    torch.Size([1, 257])
    """

    def __init__(self, model: GPT, max_rows: int, *, prefix_cache: PrefixCache | None = None) -> None:
        if not is_integer(max_rows) or max_rows < 1:
            raise ValueError(f"max_rows must be an integer >= 1, got {max_rows!r}")
        self.model = model
        self.decoder = native_decoder(model)  # None: steps run the model
        self.block_size = model.config.block_size
        storage = model.new_kv_cache(max_rows, max_len=self.block_size)
        self._k, self._v = storage.k, storage.v  # (n_layer, R, nh, block_size, hs)
        device = self._k.device
        self._mask = torch.zeros(max_rows, self.block_size, dtype=torch.long, device=device)  # 1 = a real token
        self._lengths = [0] * max_rows  # n_i: cached tokens of row i (a list: the step reads it on every token)
        self.size = 0  # B: active rows
        self.width = 0  # L: columns in use
        self.max_rows = max_rows
        self.prefix_cache = prefix_cache  # None: every prompt is prefilled in full
        if prefix_cache is not None:  # its pool, now: no prompt pays for allocating it (gpt2.serve.prefix_cache)
            n_layer, _, n_head, _, head_size = self._k.shape
            prefix_cache.reserve(n_layer, n_head, head_size, dtype=self._k.dtype, device=device)
        self.prefilled = 0  # prompt tokens join / join_many fed through the model (cached prefixes not counted)

    @property
    def lengths(self) -> list[int]:
        """Cached tokens of each active row (its next token's position)."""
        return self._lengths[: self.size]

    @torch.no_grad()
    def join(
        self,
        prompt: Sequence[int],
        *,
        all_logits: bool = False,
        cached: bool = True,
        namespace: bytes = b"",
        model: GPT | None = None,
    ) -> torch.Tensor:
        """Add a sequence as row B (returned by `size - 1` afterwards); its prompt goes into the cache.

        Returns the logits of the token after the prompt (V,), or with all_logits every prompt position's
        logits (P, V) (row t predicts token t + 1). The prompt must be ids of the model's vocabulary and leave
        room for a token: 1 <= P < block_size. cached=False: the prefix cache is neither read nor written (a
        steered prompt's keys and values are not an unsteered one's, nor the reverse); `namespace`: the prefix
        cache's namespace of the prompt (a LoRA adapter's key). `model`: the forward to prefill with, a view over
        the batch model's weights (an adapted one, gpt2.inference.lora_batch); by default the batch's model.
        """
        return self._prefill([prompt], all_logits=all_logits, cached=cached, namespaces=[namespace], model=model)[0]

    @torch.no_grad()
    def join_many(
        self, prompts: Sequence[Sequence[int]], *, namespaces: Sequence[bytes] | None = None, model: GPT | None = None
    ) -> torch.Tensor:
        """Add several sequences as rows B, B + 1, ... with one batched prefill; returns the logits of the token
        after each prompt (n, V). What joining them one by one gives, up to the rounding of the batched matmuls:
        each prompt is left-padded to the longest (n, P_max) with its own mask and positions, so it lands
        right-aligned in its row's columns like a lone join. One forward over n * P_max rows runs faster than n
        small ones (far faster where matmuls over many rows have fast kernels: bf16, int8 prefills).
        `namespaces` (one per prompt) and `model` as in `join`."""
        return self._prefill(prompts, namespaces=namespaces or [b""] * len(prompts), model=model)

    def _prefill(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        namespaces: Sequence[bytes],
        all_logits: bool = False,
        cached: bool = True,
        model: GPT | None = None,
    ) -> torch.Tensor:
        """join / join_many: seat the prompts, copy their cached prefixes, prefill the rest (module docstring).
        Returns (n, V), or with all_logits (one prompt only) (1, P, V)."""
        assert not all_logits or len(prompts) == 1, "all_logits is for a lone join"
        model = model or self.model
        n, lengths = len(prompts), [len(prompt) for prompt in prompts]
        first = self.size
        L, longest = self._seat(lengths), max(lengths)
        prefix_cache = self.prefix_cache if cached else None
        prefixes = [
            reusable_prefix(prefix_cache, prompt, all_logits=all_logits, namespace=namespace)
            for prompt, namespace in zip(prompts, namespaces, strict=True)
        ]
        r = max(P - prefix.length for P, prefix in zip(lengths, prefixes, strict=True))  # tokens each row feeds
        reused = [max(P - r, 0) for P in lengths]  # <= each prefix's length, as P - r <= P - (P - length)
        for row, (P, prefix, count) in enumerate(zip(lengths, prefixes, reused, strict=True), start=first):
            if count > 0:  # into the row's columns, (n_layer, nh, count, hs)
                prefix.copy_into(self._k[:, row, :, L - P : L - P + count], self._v[:, row, :, L - P : L - P + count])
        ids = torch.zeros(n, r, dtype=torch.long, device=self._k.device)  # (n, r), left-padded
        for i, (prompt, count) in enumerate(zip(prompts, reused, strict=True)):
            ids[i, r - (lengths[i] - count) :] = torch.tensor(list(prompt[count:]), dtype=torch.long)
        self.prefilled += sum(P - count for P, count in zip(lengths, reused, strict=True))
        rows = slice(first, first + n)
        # The rows' columns [L - P_max, L): the first P_max - r hold the reused prefixes (the past), the prefill
        # writes the last r.
        view = KVCache(self._k[:, rows, :, L - longest :], self._v[:, rows, :, L - longest :], length=longest - r)
        mask = positions = None  # one row: no padding, positions go on from the past
        if n > 1:
            mask = self._mask[rows, L - longest : L]  # (n, P_max): what _seat marked, each prompt right-aligned
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, longest - r :]  # (n, r): each prompt's own
        hidden = model.hidden_states(
            ids, attention_mask=mask, position_ids=positions, kv_cache=view, validate=False
        )  # (n, r, C)
        if prefix_cache is not None:
            stored = zip(prompts, lengths, reused, namespaces, strict=True)
            for row, (prompt, P, count, namespace) in enumerate(stored, start=first):
                prefix_cache.insert(prompt, self._k[:, row, :, L - P : L], self._v[:, row, :, L - P : L], namespace)
                if not all_logits:  # a scored prompt was not looked up
                    prefix_cache.record(queried=P, reused=count)
        self.size += n
        return model.lm_head(hidden if all_logits else hidden[:, -1])

    def start_prefill(
        self, prompt: Sequence[int], *, all_logits: bool = False, cached: bool = True, namespace: bytes = b""
    ) -> ChunkedPrefill:
        """A prompt to prefill a chunk at a time outside the batch (ChunkedPrefill), with this batch's model and
        prefix cache (cached=False: without it; `namespace` as in `join`); `join_prefilled` seats it once every
        token is in."""
        prefix_cache = self.prefix_cache if cached else None
        return ChunkedPrefill(self.model, prompt, prefix_cache=prefix_cache, all_logits=all_logits, namespace=namespace)

    @torch.no_grad()
    def join_prefilled(self, prefill: ChunkedPrefill) -> None:
        """Add a sequence whose prompt was prefilled in chunks as row B, as `join` would seat it: its keys and
        values are copied into the row's columns [L - P, L). Its logits came from its last chunk."""
        assert prefill.remaining == 0, f"{prefill.remaining} prompt tokens are not prefilled yet"
        P = len(prefill.prompt)
        L, row = self._seat([P]), self.size
        k, v = prefill.keys_values()  # (n_layer, nh, P, hs)
        self._k[:, row, :, L - P : L] = k
        self._v[:, row, :, L - P : L] = v
        self.size += 1

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, *, model: GPT | None = None) -> torch.Tensor:
        """Feed each active row its next token, tokens (B,) -> next-token logits (B, V). `model`: run this
        model's own forward (a view over the batch model's weights, or the batch's model itself when steering's
        hooks must run) instead of the native decoder (which runs the batch's model where it can)."""
        B = self.size
        assert tokens.shape == (B,) and B > 0, f"step wants one token per active row ({B}), got {tuple(tokens.shape)}"
        self._make_room()
        L, lengths = self.width, self._lengths[:B]
        assert L < self.block_size, "a sequence reached the context; the caller must end it first"
        self._mask[:B, L] = 1
        cache = KVCache(self._k[:, :B], self._v[:, :B], length=L)
        positions = torch.tensor(lengths, device=self._k.device)  # (B,): each row's next position
        # no padding at all (every row fills every column): the plain causal path, as a lone sequence
        key_mask = None if min(lengths) == L else self._mask[:B, : L + 1]  # (B, L + 1)
        if model is None and self.decoder is not None and self.decoder.takes(B):
            logits = self.decoder.step(tokens, cache, positions=positions, key_mask=key_mask)  # (B, V)
        else:
            logits = (model or self.model)(
                tokens.view(B, 1).to(self._k.device),
                attention_mask=key_mask,
                position_ids=positions.view(B, 1),
                kv_cache=cache,
                validate=False,
            ).logits[:, -1]  # (B, V)
        self._lengths[:B] = [n + 1 for n in lengths]
        self.width = L + 1
        return logits

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed the lone active row T tokens at once (a speculative verification), tokens (T,) -> the logits after
        each (T, V). The row first drops its padding, so its columns are its positions and the span attends
        causally with no mask (the native decoder's `extend` where it can run it). Needs width + T <= block_size
        once the padding is gone (the caller checks against `lengths`)."""
        assert self.size == 1, "extend feeds the lone row of a batch of one"
        padding = self.width - self._lengths[0]
        if padding:
            self._shift(-padding)  # now columns [0, n) hold the row's n tokens
        L, T = self.width, tokens.shape[0]
        assert L + T <= self.block_size, "the span does not fit in the context"
        cache = KVCache(self._k[:, :1], self._v[:, :1], length=L)
        if self.decoder is not None and T <= NATIVE_SPAN and self.decoder.takes(T):
            logits = self.decoder.extend(tokens, cache)  # (T, V)
        else:
            hidden = self.model.hidden_states(tokens.view(1, T).to(self._k.device), kv_cache=cache, validate=False)
            logits = self.model.lm_head(hidden[0])  # (T, V)
        self._mask[0, L : L + T] = 1
        self._lengths[0] += T
        self.width = L + T
        return logits

    def rollback(self, count: int) -> None:
        """Forget the lone row's last `count` tokens (rejected drafts): their columns are free again."""
        assert self.size == 1 and 0 <= count <= self._lengths[0], "rollback drops fed tokens of the lone row"
        L = self.width
        self._mask[0, L - count : L] = 0
        self._lengths[0] -= count
        self.width = L - count

    def leave(self, row: int, *, scrub: bool = False) -> int | None:
        """Remove active row `row`. The last row moves into its place: returns the index it had (so the caller
        can renumber it), or None when the removed row was the last one. scrub=True: its keys and values are zeroed
        first, every column (a row whose forward overflowed: a NaN or infinity left there would reach the next
        sequence seated in it through the padding columns its mask hides, as 0 x NaN in the attention's sum)."""
        if not 0 <= row < self.size:
            raise ValueError(f"row {row} is not active (rows 0..{self.size - 1})")
        if scrub:
            self._k[:, row].zero_()
            self._v[:, row].zero_()
        last = self.size - 1
        self.size = last
        if row == last:
            return None
        L = self.width
        self._k[:, row, :, :L] = self._k[:, last, :, :L]
        self._v[:, row, :, :L] = self._v[:, last, :, :L]
        self._mask[row] = self._mask[last]
        self._lengths[row] = self._lengths[last]
        return last

    def clear(self) -> None:
        """Remove every row."""
        self.size = 0
        self.width = 0

    # ------------------------------------------------------------------------------------------ room
    def _seat(self, lengths: list[int]) -> int:
        """Rows B, B + 1, ... for prompts of these lengths: checked, right-aligned at the width L (the others move
        right when a prompt is longer), masks and lengths set. Returns L; the caller prefills, then counts them."""
        if self.size + len(lengths) > self.max_rows:
            raise ValueError(
                f"the batch is full: {len(lengths)} sequence(s) do not fit in {self.max_rows - self.size} free rows; "
                "wait for a sequence to leave"
            )
        if not all(0 < P < self.block_size for P in lengths):
            raise ValueError(f"a prompt must hold 1 to {self.block_size - 1} tokens to be continued, got {lengths}")
        if self.size == 0:
            self.width = 0
        if max(lengths) > self.width:
            self._shift(max(lengths) - self.width)  # make room on the left: the others move right
        L = self.width
        for row, P in enumerate(lengths, start=self.size):
            self._mask[row].zero_()
            self._mask[row, L - P : L] = 1
            self._lengths[row] = P
        return L

    def _make_room(self) -> None:
        """Drop the padding columns every active row shares when the cache is full or they are many."""
        B, L = self.size, self.width
        shared_padding = L - max(self._lengths[:B])
        if shared_padding > 0 and (L == self.block_size or shared_padding * COMPACT_FRACTION >= L):
            self._shift(-shared_padding)

    def _shift(self, by: int) -> None:
        """Move the active rows' columns [0, L) right (by > 0) or left (by < 0); the width follows."""
        B, L = self.size, self.width
        new_width = L + by
        assert 0 <= new_width <= self.block_size
        if B > 0 and L > 0:
            kept = L if by > 0 else new_width  # columns that carry data after the move
            source = slice(0, kept) if by > 0 else slice(-by, L)
            target = slice(by, by + kept) if by > 0 else slice(0, new_width)
            for cache in (self._k, self._v):
                cache[:, :B, :, target] = cache[:, :B, :, source].clone()
            self._mask[:B, target] = self._mask[:B, source].clone()
            if by > 0:
                self._mask[:B, :by] = 0
        self.width = new_width


class ChunkedPrefill:
    """A prompt prefilled a chunk at a time into a KV cache of its own, (n_layer, 1, nh, P, hs), outside the batch,
    so that the running rows can step between its chunks; `DecodeBatch.join_prefilled` seats it once every token is
    in (module docstring).

    Each chunk is one forward with the chunks before it as its past, positions going on from there, as a prompt
    that reuses a cached prefix is fed: the same keys, values and logits as one prefill of the whole prompt, to
    float rounding (tested). With a prefix cache, the prompt's longest cached prefix (at most P - 1 tokens, none
    when every position's logits are wanted) is copied in first, and its blocks are stored once its last
    token is in. A prompt of up to block_size tokens may be prefilled (only scored, it need not leave room).

    >>> from gpt2 import GPT, GPTConfig
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257)).eval()
    >>> prefill = ChunkedPrefill(model, list(range(100)))
    >>> prefill.advance(64).shape, prefill.remaining  # the last position's logits (1, V)
    (torch.Size([1, 257]), 36)
    """

    def __init__(
        self,
        model: GPT,
        prompt: Sequence[int],
        *,
        prefix_cache: PrefixCache | None = None,
        all_logits: bool = False,
        namespace: bytes = b"",
    ) -> None:
        P, block_size = len(prompt), model.config.block_size
        if not 0 < P <= block_size:
            raise ValueError(f"a prompt must hold 1 to {block_size} tokens to be prefilled, got {P}")
        self.model = model
        self.prompt = tuple(prompt)
        self.all_logits = all_logits
        self.prefix_cache = prefix_cache
        self.namespace = namespace
        self._cache = model.new_kv_cache(1, max_len=P)  # its length: the tokens whose keys and values are in
        prefix = reusable_prefix(prefix_cache, prompt, all_logits=all_logits, namespace=namespace)
        if prefix.length > 0:  # (n_layer, nh, length, hs)
            prefix.copy_into(self._cache.k[:, 0, :, : prefix.length], self._cache.v[:, 0, :, : prefix.length])
            self._cache.length = prefix.length
        if prefix_cache is not None and not all_logits:  # a scored prompt is not looked up
            prefix_cache.record(queried=P, reused=prefix.length)

    @property
    def done(self) -> int:
        """Prompt tokens whose keys and values are in (a cached prefix's included)."""
        return self._cache.length

    @property
    def remaining(self) -> int:
        """Prompt tokens still to prefill."""
        return len(self.prompt) - self._cache.length

    @torch.no_grad()
    def advance(self, tokens: int, model: GPT | None = None) -> torch.Tensor:
        """Prefill the next `tokens` prompt tokens (1 to `remaining`), with `model` (a view over the same weights,
        as in `DecodeBatch.join`; by default the prefill's model). Returns logits of the positions fed: every
        one with all_logits (tokens, V) (row t predicts the token after position done + t), else the last (1, V)
        (after the prompt's last token: the first token's logits)."""
        model = model or self.model
        assert 0 < tokens <= self.remaining, f"{tokens} tokens asked of a prompt with {self.remaining} left"
        start = self._cache.length
        ids = torch.tensor([self.prompt[start : start + tokens]], dtype=torch.long, device=self._cache.k.device)
        hidden = model.hidden_states(ids, kv_cache=self._cache, validate=False)[0]  # (tokens, C)
        if self.remaining == 0 and self.prefix_cache is not None:
            self.prefix_cache.insert(self.prompt, *self.keys_values(), self.namespace)
        return model.lm_head(hidden if self.all_logits else hidden[-1:])

    def keys_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the tokens prefilled so far, each (n_layer, nh, done, hs)."""
        done = self._cache.length
        return self._cache.k[:, 0, :, :done], self._cache.v[:, 0, :, :done]


def reusable_prefix(
    prefix_cache: PrefixCache | None, prompt: Sequence[int], *, all_logits: bool, namespace: bytes = b""
) -> CachedPrefix:
    """The cached prefix a prompt may reuse (in the prefix cache's `namespace`): at most P - 1 tokens (the last
    is prefilled for its logits); none without a cache or when every position's logits are wanted (they need a
    prefill of every token)."""
    if prefix_cache is None or all_logits:
        return CachedPrefix()
    return prefix_cache.lookup(prompt[:-1], namespace)
