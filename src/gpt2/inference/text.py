"""Tokens in, text out for one sequence: whole characters only, and stop texts cut off.

Used by `stream_text` (offline) and by the server's engine (one sequence inside a batch), so both produce the
same text: the tokenizer's streaming decoder holds back the bytes of a split character, and text that could be
the start of a stop text is held back until it is known not to be one. The stop text itself is never returned.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpt2.tokenizer.protocol import TextTokenizer


class TextAssembler:
    """Feed token ids with `push`; it returns the text that is now safe to show, and whether a stop text ended
    the sequence. `finish` returns what was held back once the sequence ends for another reason.

    >>> from gpt2.tokenizer import ByteTokenizer
    >>> text = TextAssembler(ByteTokenizer(), stop=["\\n\\n"])
    >>> [text.push(token) for token in b"hi\\n"], text.push(ord("\\n"))
    ([('', False), ('h', False), ('i', False)], ('', True))
    """

    def __init__(self, tokenizer: TextTokenizer, stop: Sequence[str] = ()) -> None:
        self._decoder = tokenizer.stream_decoder()
        self._stop = tuple(stop)
        self._longest_stop = max((len(text) for text in self._stop), default=0)
        self._held = ""  # decoded text not yet returned: it might be the start of a stop text
        self.stopped = False

    def push(self, token_id: int) -> tuple[str, bool]:
        """Add one generated token; (text now safe to return, True when a stop text was reached)."""
        assert not self.stopped, "the sequence already ended at a stop text"
        self._held += self._decoder.push(token_id)
        if not self._stop:
            text, self._held = self._held, ""
            return text, False
        cut = first_stop(self._held, self._stop)
        if cut is not None:
            self.stopped = True
            text, self._held = self._held[:cut], ""
            return text, True
        # everything but the last (longest stop - 1) characters can no longer become part of a stop text
        safe = max(0, len(self._held) - (self._longest_stop - 1))
        text, self._held = self._held[:safe], self._held[safe:]
        return text, False

    def finish(self) -> str:
        """The sequence ended (length, end-of-text): the rest of the text, up to a stop text in it."""
        if self.stopped:
            return ""
        held = self._held + self._decoder.flush()
        self._held = ""
        cut = first_stop(held, self._stop)
        if cut is not None:
            self.stopped = True
            return held[:cut]
        return held


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the earliest stop text starts in `text`, or None."""
    found = [position for position in (text.find(stop) for stop in stops) if position >= 0]
    return min(found) if found else None
