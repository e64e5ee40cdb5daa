"""User-facing notices: one clean line on stderr, as the errors are (never Python's warning format, which shows
a source path and echoes a line of our code)."""

from __future__ import annotations

import sys

PREFIX = "gpt2: note: "


def notice(message: str) -> None:
    """Tell the user something worth knowing that is not an error: `gpt2: note: MESSAGE` on stderr, one line."""
    print(PREFIX + " ".join(message.split()), file=sys.stderr, flush=True)
