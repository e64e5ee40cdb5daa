"""Faults of single rows in a batched forward: what lets one row's failure end that row alone.

A row's own computation inside a shared forward (its steering, its LoRA adapter's update) may raise: a sparse
autoencoder whose width is not the model's, a tensor on the wrong device. Given a `RowFaults`, those parts record
the exception against the rows it belongs to and leave those rows' activations as they were, so the forward
finishes for every row; the caller (the server's runner) then ends the recorded rows with their reason, while the
rows beside them, computed apart from them (every product, norm and attention of a forward is row by row), go on
exactly as they would alone. Without a `RowFaults` the exception propagates, as in any forward.
"""

from __future__ import annotations

from collections.abc import Iterable


class RowFaults:
    """The rows of one forward whose own part raised, each with a one-line reason (the first fault of a row)."""

    def __init__(self) -> None:
        self.reasons: dict[int, str] = {}

    def record(self, rows: Iterable[int], part: str, error: Exception) -> None:
        """Rows whose `part` ("its steering at blocks.3.hook_resid_pre", ...) raised `error`."""
        for row in rows:
            self.reasons.setdefault(row, fault_reason(part, error))

    def __contains__(self, row: object) -> bool:
        return row in self.reasons

    def __bool__(self) -> bool:
        return bool(self.reasons)


def fault_reason(part: str, error: Exception) -> str:
    """One line saying which part of a row failed and how: "its steering at ... failed: RuntimeError: ..."."""
    return f"{part} failed: {type(error).__name__}: {error}".splitlines()[0]
