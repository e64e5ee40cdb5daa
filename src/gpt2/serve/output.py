"""Output assembly: a token the runner drew becomes a `SequenceOutput` (its text piece, its log-probabilities,
stops and the finish), delivered to the sequence's sink (vLLM v1's output processor).

The sink is called on the engine thread (or on the canceller's), so it must be quick and thread-safe (the
server's puts onto an asyncio queue with `loop.call_soon_threadsafe`). Every sequence ends with exactly one final
output (finish_reason 'stop', 'length' or 'cancelled', or an error), so a consumer always knows when to stop
listening.
"""

from __future__ import annotations

import logging

import torch

from gpt2.serve.sequence import EngineError, SequenceOutput, SequenceState, SequenceStatus, TokenLogprob

logger = logging.getLogger(__name__)


def token_logprob(logprobs: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """logprobs (V,) of one position -> the token's own and the `top` most likely alternatives."""
    alternatives: tuple[tuple[int, float], ...] = ()
    if top:
        values, ids = torch.topk(logprobs, top)
        alternatives = tuple(zip(ids.tolist(), values.tolist(), strict=True))
    return TokenLogprob(token, float(logprobs[token]), alternatives)


def commit(sequence: SequenceState, token: int, logprobs: torch.Tensor | None, eot_token: int) -> None:
    """Record a drawn token (logprobs (V,): the model's log-probabilities at its position, when asked): its text
    goes to the sink, and the sequence ends when it should (end-of-text, a stop, the length). A sequence already
    finished takes nothing (the tokens a speculative step drew past a stop)."""
    if sequence.done:
        return
    sequence.generated += 1
    sequence.pending = token
    sequence.tokens.append(token)
    if sequence.token_ids is not None:
        sequence.token_ids[0, len(sequence.tokens) - 1] = token
    output = SequenceOutput(sequence.index, completion_tokens=sequence.generated)
    if sequence.generated == 1 and sequence.request.prompt_logprobs:
        output.prompt_logprobs = sequence.prompt_logprobs
    reason = None
    if token == eot_token or token in sequence.stop_ids:
        reason = "stop"
    else:
        output.token_ids.append(token)
        if logprobs is not None:
            output.logprobs.append(token_logprob(logprobs, token, sequence.request.logprobs or 0))
        output.text, stopped = sequence.text.push(token)
        if stopped:
            reason = "stop"
    if reason is None and sequence.generated >= sequence.max_new:
        reason = "length"
    if reason is not None:
        output.text += sequence.text.finish()
        finish(sequence, reason=reason, output=output)
    else:
        emit(sequence, output)


def finish(
    sequence: SequenceState,
    *,
    reason: str | None = None,
    error: EngineError | None = None,
    output: SequenceOutput | None = None,
) -> None:
    """The sequence's final output (once: a finished sequence takes no more). The runner frees its row."""
    if sequence.done:
        return
    sequence.status = SequenceStatus.FINISHED if error is None else SequenceStatus.FAILED
    output = output or SequenceOutput(sequence.index, completion_tokens=sequence.generated)
    output.finish_reason = None if error else reason
    output.error = error
    if sequence.request.prompt_logprobs and sequence.generated == 0 and reason == "length" and error is None:
        output.prompt_logprobs = sequence.prompt_logprobs  # a scored prompt with nothing to generate
    emit(sequence, output)


def emit(sequence: SequenceState, output: SequenceOutput) -> None:
    try:
        sequence.sink(output)
    except Exception:  # a consumer that went away must not stop the engine
        logger.warning("could not deliver an output of sequence %d", sequence.index, exc_info=True)
