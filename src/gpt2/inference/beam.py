"""Beam search: the same beams and scores as transformers' `generate(num_beams=K, do_sample=False)`.

Notation: B = prompts, K = num_beams, V = vocab_size, T = prompt columns (left padding included), L = T +
max_tokens columns at most.

Each step, for every prompt: the K running beams' next-token log-probabilities (log_softmax, then the logits
processors, as transformers applies them to log-probabilities), plus each beam's running sum, give K * V
candidates; the best 2K (more with several stop ids) are kept, so that K of them can go on even when some end
here. A candidate ends when its token is a stop id or it reaches L columns: among the K best candidates, those
that end enter the finished set with the score sum(log p) / generated_length ** length_penalty, which keeps its
K best. The K best candidates that do not end are the next running beams (the KV cache rows are reordered to
match). The search stops when, per prompt, no running beam can beat the finished set (`early_stopping`: True
stops as soon as K beams have finished; False estimates the best a running beam can reach at its current length;
"never" at the longest length when length_penalty > 0), or when every candidate ends.

The prompt is prefilled once per prompt and its cache copied to the K beams; the decode steps run K rows per
prompt through the same step as `stream` (the native decoder where it can run the model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

from gpt2.cpu.decoder import native_decoder
from gpt2.inference.processors import LogitsProcessor, apply_processors, build_processors
from gpt2.inference.prompt import DecodeOptions, check_id_list, check_prompt, prefill, truncated_prompt
from gpt2.inference.sampling import SamplingParams

if TYPE_CHECKING:
    from gpt2.model import GPT, KVCache

# transformers' stand-in for "impossible" in beam scores: added to a score it keeps the arithmetic finite
EXCLUDED = -1.0e9


class BeamOutput(NamedTuple):
    """The n best finished beams of every prompt, best first: sequences (B * n, T + steps) long, prompt included,
    padded after a beam's end; scores (B * n,) float32, sum(log p) / generated_length ** length_penalty."""

    sequences: torch.Tensor
    scores: torch.Tensor


def _gather(tensor: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """tensor (B, N, ...) rows chosen per prompt by index (B, M) -> (B, M, ...)."""
    while index.dim() < tensor.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(tensor, index, dim=1)


@torch.no_grad()
def beam_search(
    model: GPT,
    idx: torch.Tensor,
    params: SamplingParams,
    *,
    processors: Sequence[LogitsProcessor] = (),
    attention_mask: torch.Tensor | None = None,
    options: DecodeOptions | None = None,
) -> BeamOutput:
    """The params.n best of params.num_beams beams for every prompt row of idx (B, T) (module docstring).

    Stop ids are params.stop_token_ids (what transformers calls eos_token_id); the decoding rules of params and
    `processors` apply to every beam. Prompt + max_tokens must fit the context (no sliding window here).

    >>> from gpt2.config import GPTConfig
    >>> from gpt2.model import GPT
    >>> model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=100)).eval()
    >>> params = SamplingParams(max_tokens=5, temperature=0, num_beams=3, n=2)
    >>> out = beam_search(model, torch.tensor([[1, 2, 3]]), params)
    >>> out.sequences.shape, out.scores.shape
    (torch.Size([2, 8]), torch.Size([2]))
    """
    config = model.config
    options = options or DecodeOptions()
    K, n = params.num_beams, params.n
    check_prompt(model, idx, attention_mask, options.truncate)
    stop_ids = check_id_list("stop_token_ids", params.stop_token_ids, config.vocab_size)
    device = model.transformer.wte.weight.device
    idx = truncated_prompt(model, idx, options.truncate).to(device)
    B, T = idx.shape
    L = T + params.max_tokens
    if L > config.block_size:
        raise ValueError(
            f"beam search needs prompt + max_tokens <= block_size={config.block_size}, got {T} + {params.max_tokens}; "
            "lower max_tokens"
        )
    fill = options.pad_token_id or (stop_ids[0] if stop_ids else 0)  # transformers': pad, else the first stop id
    if params.max_tokens == 0:
        sequences = idx.repeat_interleave(n, dim=0)
        return BeamOutput(sequences, torch.zeros(B * n, device=device))

    mask = None  # (B * K, L) with left padding, 1 on every generated column
    if attention_mask is not None and not bool(attention_mask[:, -T:].all()):
        mask = torch.ones(B * K, L, dtype=torch.long, device=device)
        mask[:, :T] = attention_mask[:, -T:].to(device).repeat_interleave(K, dim=0)
    padding = (1 - mask[:, :T]).sum(dim=1) if mask is not None else None
    rules = build_processors(
        params, prompt_length=T, vocab_size=config.vocab_size, vocab_limit=options.vocab_limit, padding=padding
    )
    rules.extend(processors)
    cache, logits = _prefill_beams(model, idx, mask, K, L)  # logits (B * K, V)
    positions = mask[:, :T].sum(dim=1) if mask is not None else None  # (B * K,): the next position of each row
    decoder = native_decoder(model) if options.native is not False else None
    if options.native is None and decoder is not None and not decoder.takes(B * K):
        decoder = None  # this many rows step faster through the model (FLOAT32_MAX_ROWS)

    beams = _Beams.start(idx, K, L, fill, stop_ids)
    batch_offset = torch.arange(B, device=device)[:, None] * K  # (B, 1): row of a prompt's first beam
    length = T  # columns filled in every running beam
    while True:
        log_probs = F.log_softmax(logits, dim=-1)
        log_probs = apply_processors(rules, beams.running.view(B * K, L)[:, :length], log_probs)
        parents, ends = beams.advance(log_probs, length, T, params)
        length += 1
        if not beams.can_go_on(length, T, params) or bool(ends.all()):
            break
        rows = (parents + batch_offset).view(B * K)  # the cache row each running beam continues
        if not bool((rows == torch.arange(B * K, device=device)).all()):
            cache.k[:, :, :, : length - 1] = cache.k[:, rows, :, : length - 1]
            cache.v[:, :, :, : length - 1] = cache.v[:, rows, :, : length - 1]
        logits = _decode(model, decoder, beams.running.view(B * K, L)[:, length - 1], cache, mask, positions, length)
        if positions is not None:
            positions = positions + 1

    count = int(beams.finished_lengths[:, :n].max())
    sequences = beams.finished[:, :n, : T + count].reshape(B * n, T + count)
    return BeamOutput(sequences, beams.finished_scores[:, :n].reshape(B * n))


def _prefill_beams(
    model: GPT, idx: torch.Tensor, mask: torch.Tensor | None, K: int, L: int
) -> tuple[KVCache, torch.Tensor]:
    """The prompt run once per prompt row, its cache then copied to the prompt's K beams: the beams' cache (B * K
    rows, room for L columns) and their first logits (B * K, V) float32."""
    B, T = idx.shape
    prompt_cache = model.new_kv_cache(B, max_len=L)
    prompt_mask = mask[::K, :T] if mask is not None else None
    first = prefill(model, idx, prompt_mask, start=0, end=T, cache=prompt_cache)  # (B, V)
    cache = model.new_kv_cache(B * K, max_len=L)
    cache.k[:, :, :, :T] = prompt_cache.k[:, :, :, :T].repeat_interleave(K, dim=1)
    cache.v[:, :, :, :T] = prompt_cache.v[:, :, :, :T].repeat_interleave(K, dim=1)
    cache.length = T
    return cache, first.float().repeat_interleave(K, dim=0)


@dataclass
class _Beams:
    """The search's state, per prompt: K running beams (sequences (B, K, L) and score sums) and the K best
    finished ones (sequences, length-penalized scores, generated lengths, which slots hold a beam), and whether
    a running beam can still beat the finished set."""

    running: torch.Tensor
    running_scores: torch.Tensor
    finished: torch.Tensor
    finished_scores: torch.Tensor
    finished_lengths: torch.Tensor
    is_finished: torch.Tensor
    improvable: torch.Tensor
    stop_ids: torch.Tensor
    keep: int
    """Candidates kept per prompt and step, so that K can go on when some end."""

    @classmethod
    def start(cls, idx: torch.Tensor, K: int, L: int, fill: int, stop_ids: list[int]) -> _Beams:
        B, T = idx.shape
        device = idx.device
        running = torch.full((B, K, L), fill, dtype=torch.long, device=device)
        running[:, :, :T] = idx[:, None, :]
        running_scores = torch.zeros(B, K, device=device)
        running_scores[:, 1:] = EXCLUDED  # the K beams start equal: only the first may spread at the first step
        return cls(
            running=running,
            running_scores=running_scores,
            finished=running.clone(),
            finished_scores=torch.full((B, K), EXCLUDED, device=device),
            finished_lengths=torch.zeros(B, K, dtype=torch.long, device=device),
            is_finished=torch.zeros(B, K, dtype=torch.bool, device=device),
            improvable=torch.ones(B, 1, dtype=torch.bool, device=device),
            stop_ids=torch.tensor(stop_ids, dtype=torch.long, device=device),
            keep=max(2, 1 + len(stop_ids)) * K,
        )

    def advance(
        self, log_probs: torch.Tensor, length: int, T: int, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from the running beams' next-token log_probs (B * K, V) at column `length`: the new running
        beams, and the finished set updated. Returns the beam each new running beam extends (B, K) and which of
        the kept candidates ended (B, keep)."""
        B, K, L = self.running.shape
        V = log_probs.size(-1)
        totals = (log_probs.view(B, K, V) + self.running_scores[:, :, None]).view(B, K * V)
        top_scores, top_index = torch.topk(totals, self.keep)  # (B, keep)
        source = top_index // V  # (B, keep): the beam each candidate extends
        candidates = _gather(self.running, source)  # (B, keep, L)
        candidates[:, :, length] = top_index % V
        ends = torch.isin(candidates[:, :, length], self.stop_ids) | (length + 1 >= L)  # (B, keep)

        # the next running beams: the K best candidates that do not end
        going_on = top_scores + ends.float() * EXCLUDED
        chosen = torch.topk(going_on, K).indices  # (B, K)
        self.running = _gather(candidates, chosen)
        self.running_scores = _gather(going_on, chosen)

        # the finished set: its K best among what it held and the top-K candidates that end now
        generated = length + 1 - T
        in_top_k = torch.arange(self.keep, device=ends.device) < K  # (keep,): only the K best candidates may finish
        ended_now = ends & in_top_k[None, :]
        scores = top_scores / (generated**params.length_penalty)
        all_done = self.is_finished.all(dim=-1, keepdim=True) & (params.early_stopping is True)
        scores = scores + all_done.float() * EXCLUDED + (~self.improvable).float() * EXCLUDED + (~ended_now) * EXCLUDED
        merged_scores = torch.cat((self.finished_scores, scores), dim=1)
        best = torch.topk(merged_scores, K).indices
        self.finished = _gather(torch.cat((self.finished, candidates), dim=1), best)
        self.finished_scores = _gather(merged_scores, best)
        new_lengths = torch.full_like(ended_now, generated, dtype=torch.long)
        self.finished_lengths = _gather(torch.cat((self.finished_lengths, new_lengths), dim=1), best)
        self.is_finished = _gather(torch.cat((self.is_finished, ended_now), dim=1), best)
        return _gather(source, chosen), ends

    def can_go_on(self, length: int, T: int, params: SamplingParams) -> bool:
        """Whether some prompt's best running beam (now `length` columns long) can still beat its finished set."""
        penalty, early = params.length_penalty, params.early_stopping
        L = self.running.size(-1)
        best_length = L - T if early == "never" and penalty > 0.0 else length - T
        best_running = self.running_scores[:, :1] / (best_length**penalty)
        worst_finished = torch.where(self.is_finished, self.finished_scores.min(dim=1, keepdim=True).values, EXCLUDED)
        self.improvable = self.improvable & (best_running > worst_finished).any(dim=-1, keepdim=True)
        return bool(self.improvable.any()) and not (early is True and bool(self.is_finished.all()))


def _decode(
    model: GPT,
    decoder: Any,
    tokens: torch.Tensor,
    cache: Any,
    mask: torch.Tensor | None,
    positions: torch.Tensor | None,
    length: int,
) -> torch.Tensor:
    """One decode step for every beam: tokens (B * K,) at column length - 1 -> logits (B * K, V) float32."""
    step_mask = mask[:, :length] if mask is not None else None
    if decoder is not None:
        return decoder.step(tokens, cache, positions=positions, key_mask=step_mask).float()
    position_ids = positions[:, None] if positions is not None else None
    out = model(tokens[:, None], attention_mask=step_mask, position_ids=position_ids, kv_cache=cache, validate=False)
    return out.logits[:, -1].float()
