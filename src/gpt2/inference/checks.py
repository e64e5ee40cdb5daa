"""The checks every decoding path runs on what its caller passes, one policy each: the offline decoder (`stream`,
the text paths), beam search, speculative decoding and the server's engine refuse the same input in the same
words (a ValueError; the server answers it with a 400).

- prompt ids: integers of the vocabulary, at least one, no more than the context (unless the caller truncates);
- token id lists (stop ids, stop sequences, a pad id): integers of the vocabulary. A stop id outside it is a
  mistake (no draw can ever produce it, so the request would silently never stop there): it is refused, never
  dropped.

The tensor form of a prompt is checked by `gpt2.model.check_token_ids` (the model's own check).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpt2.config import is_integer


def check_ids(name: str, ids: Iterable[Any] | None, vocab_size: int) -> list[int]:
    """ids as a list, each checked to be a token id in [0, vocab_size); an error names `name` and the value.

    >>> check_ids("stop_token_ids", [3, 300], 257)
    Traceback (most recent call last):
    ...
    ValueError: stop_token_ids holds 300, which is not a token id in [0, 257): pass ids the model's vocabulary has
    """
    values = [] if ids is None else list(ids)
    for value in values:
        if not is_integer(value) or not 0 <= value < vocab_size:
            raise ValueError(
                f"{name} holds {value!r}, which is not a token id in [0, {vocab_size}): pass ids the model's "
                "vocabulary has"
            )
    return values


def check_stop_ids(ids: Iterable[Any], vocab_size: int) -> list[int]:
    """A request's stop_token_ids, each a token id of the model's vocabulary (module docstring: never dropped)."""
    return check_ids("stop_token_ids", ids, vocab_size)


def check_prompt_ids(ids: Sequence[Any], vocab_size: int, block_size: int | None = None) -> list[int]:
    """A prompt's token ids: at least one, each in [0, vocab_size), and at most `block_size` of them (None: any
    length, for a caller that truncates).

    >>> check_prompt_ids([], 257)
    Traceback (most recent call last):
    ...
    ValueError: the prompt has no tokens; send some text, or the end-of-text token to start afresh
    """
    if len(ids) == 0:
        raise ValueError("the prompt has no tokens; send some text, or the end-of-text token to start afresh")
    if block_size is not None and len(ids) > block_size:
        raise ValueError(f"the prompt has {len(ids)} tokens but the model's context is {block_size}; shorten it")
    for token in ids:
        if not is_integer(token) or not 0 <= token < vocab_size:
            raise ValueError(f"prompt token {token!r} is not a token id in [0, {vocab_size}); check the tokenizer")
    return list(ids)
