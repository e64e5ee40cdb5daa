"""Few-shot prompts built as lm-evaluation-harness builds them, so the same model gets the same numbers.

The harness's default few-shot sampler (`lm_eval.api.samplers.ContextSampler`) holds one `random.Random` seeded
with the run's fewshot seed (1234 unless told otherwise) and draws the shots of every evaluated document from it
in document order: `rng.sample(pool, k)`. Where the harness treats the few-shot pool as the evaluated split it
draws k + 1 and drops the document itself (`exclude=`). Each shot is rendered as
`query + target_delimiter + answer + fewshot_delimiter` and the evaluated query follows the last one:

    "Q1 A1\\n\\nQ2 A2\\n\\nQ"        (k = 2; target_delimiter " ", fewshot_delimiter "\\n\\n")

The continuation scored after it is what the task scores zero-shot, so k = 0 is the zero-shot prompt unchanged.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpt2.config import is_integer

FEWSHOT_SEED = 1234  # lm-eval's fewshot_random_seed default (lm_eval.defaults.DEFAULT_OTHER_SEED)
FEWSHOT_DELIMITER = "\n\n"  # between shots (TaskConfig.fewshot_delimiter)
TARGET_DELIMITER = " "  # between a shot's query and its answer (TaskConfig.target_delimiter)

Doc = TypeVar("Doc")


@dataclass(frozen=True)
class FewShot:
    """How many solved examples go before each question, and how they are drawn and joined.

    >>> FewShot(k=-1)
    Traceback (most recent call last):
    ...
    ValueError: --num-fewshot must be an integer >= 0 (0 = zero-shot), got -1
    """

    k: int = 0
    """Shots per question; 0 is zero-shot."""
    seed: int = FEWSHOT_SEED
    """Seeds the one generator every question's shots are drawn from, in question order."""
    target_delimiter: str = TARGET_DELIMITER
    fewshot_delimiter: str = FEWSHOT_DELIMITER

    def __post_init__(self) -> None:
        if not is_integer(self.k) or self.k < 0:
            raise ValueError(f"--num-fewshot must be an integer >= 0 (0 = zero-shot), got {self.k!r}")


class FewShotSampler(Generic[Doc]):
    """lm-eval's default sampler: shots drawn from `pool` by one `random.Random(seed)`, call after call.

    >>> sampler = FewShotSampler(["a", "b", "c", "d"], seed=1234)
    >>> sampler.sample(2), sampler.sample(2, exclude="d")
    (['d', 'a'], ['a', 'c'])
    """

    def __init__(self, pool: Sequence[Doc], seed: int = FEWSHOT_SEED) -> None:
        self.pool = list(pool)
        self.rng = random.Random(seed)

    def sample(self, k: int, exclude: Doc | None = None) -> list[Doc]:
        """k documents of the pool. With `exclude`, k + 1 are drawn and every copy of `exclude` is dropped (the
        harness's way to keep a question out of its own shots); if that leaves fewer than k, k are drawn again
        from the pool without it."""
        if k == 0:
            return []
        if exclude is None:
            return self._draw(self.pool, k, f"--num-fewshot {k}")
        needed = f"--num-fewshot {k} (drawn as {k} + 1, the question itself then dropped, as the harness does)"
        shots = [doc for doc in self._draw(self.pool, k + 1, needed) if doc != exclude][:k]
        if len(shots) < k:
            shots = self._draw([doc for doc in self.pool if doc != exclude], k, needed)
        return shots

    def _draw(self, pool: list[Doc], k: int, needed: str) -> list[Doc]:
        if k > len(pool):
            raise ValueError(
                f"{needed} needs more examples than the few-shot pool holds ({len(pool)}); "
                "lower --num-fewshot or give a larger few-shot file"
            )
        return self.rng.sample(pool, k)


def fewshot_contexts(
    docs: Sequence[Doc],
    render: Callable[[Doc], tuple[str, str]],
    pool: Sequence[Doc],
    fewshot: FewShot,
    *,
    exclude_self: bool = False,
) -> list[str]:
    """The context of each doc in `docs`: k shots from `pool`, then the doc's own query.

    render(doc) -> (query, answer): the doc's question as the model sees it and the right answer's text without
    the target delimiter. exclude_self: keep each doc out of its own shots (see `FewShotSampler.sample`); the
    harness does so when its few-shot split is the evaluated one (and for tasks without a test split, such as
    HellaSwag).
    """
    if fewshot.k == 0:
        return [render(doc)[0] for doc in docs]
    sampler = FewShotSampler(pool, fewshot.seed)
    contexts = []
    for doc in docs:
        shots = sampler.sample(fewshot.k, exclude=doc if exclude_self else None)
        prefix = "".join(
            query + fewshot.target_delimiter + answer + fewshot.fewshot_delimiter
            for query, answer in map(render, shots)
        )
        contexts.append(prefix + render(doc)[0])
    return contexts
