"""What RL trains on: the prompts (a JSONL file, or a built-in task's) and the reward function that scores their
completions (a function in the user's own Python file, or a built-in task's).

A prompts file has one JSON object per line with a `prompt` (a text, or a conversation as a list of {role,
content} messages, rendered in the chat template with the assistant's turn opened) and any other fields, which
reach the reward function by name, one value per completion, as TRL passes dataset columns:

    def reward(prompts, completions, **columns) -> list[float]:
        return [1.0 if c.strip() == answer else 0.0 for c, answer in zip(completions, columns["answer"])]

It also receives `completion_ids` (each completion's token ids). For conversation prompts, prompts are the
conversations and each completion is [{"role": "assistant", "content": text}], as TRL gives them. A None (or NaN)
reward marks a completion the function cannot score: it takes no part in its group's mean and gets advantage 0.

`--reward FILE.py:FUNCTION` runs the named function of the user's file (their own code, named by them on the
command line, as TRL takes reward functions); `builtin:NAME` names one of `BUILTIN_TASKS`, whose prompts are
`builtin:NAME` (its train split) and `builtin:NAME:test` (held out).
"""

from __future__ import annotations

import importlib.util
import json
import math
import numbers
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt2.tokenizer.chat import encode_chat
from gpt2.tokenizer.protocol import TextTokenizer

RewardFunction = Callable[..., Sequence[float | None]]
BUILTIN = "builtin:"


@dataclass(frozen=True)
class PromptRow:
    """One prompt: what the reward function sees as the prompt, its token ids, and its other fields."""

    prompt: str | list[dict[str, str]]
    ids: list[int]
    columns: dict[str, Any]

    @property
    def conversational(self) -> bool:
        return isinstance(self.prompt, list)


# ------------------------------------------------------------------------------------------- prompts
def read_prompts(source: str, tokenizer: TextTokenizer, max_prompt_tokens: int) -> list[PromptRow]:
    """The prompts of a JSONL file, or of a built-in task (`builtin:NAME`), encoded; ValueError naming the line
    for a row without a usable prompt or one longer than max_prompt_tokens."""
    if source.startswith(BUILTIN):
        task, split = builtin_task(source)
        records, where = task.prompts(split), source
        lines = [(f"{where} row {i + 1}", record) for i, record in enumerate(records)]
    else:
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f'prompts file {path} does not exist; pass a JSONL file of {{"prompt": ...}} rows')
        lines = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                lines.append((f"{path}:{number}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not JSON ({err.msg}); write one object per line") from None
    rows = [_prompt_row(where, record, tokenizer, max_prompt_tokens) for where, record in lines]
    if not rows:
        raise ValueError(f'{source} holds no prompts; write one {{"prompt": ...}} object per line')
    return rows


def _prompt_row(where: str, record: Any, tokenizer: TextTokenizer, max_prompt_tokens: int) -> PromptRow:
    if not isinstance(record, dict) or "prompt" not in record:
        raise ValueError(f"{where}: each row must be an object with a 'prompt' field")
    prompt = record["prompt"]
    if isinstance(prompt, str) and prompt:
        ids = tokenizer.encode(prompt)
    elif isinstance(prompt, list):
        ids, _ = encode_chat(prompt, tokenizer, add_generation_prompt=True, where=where)
    else:
        raise ValueError(f"{where}: 'prompt' must be a non-empty text or a list of chat messages")
    if len(ids) > max_prompt_tokens:
        raise ValueError(f"{where}: the prompt has {len(ids)} tokens, more than the {max_prompt_tokens} that leave "
                         "room for max_completion_length in the model's context; shorten it or lower "
                         "max_completion_length")  # fmt: skip
    columns = {key: value for key, value in record.items() if key != "prompt"}
    return PromptRow(prompt, ids, columns)


# ------------------------------------------------------------------------------------------- rewards
def load_reward(spec: str) -> RewardFunction:
    """The reward function `FILE.py:FUNCTION` names (the file is imported: it is the user's own code), or a built-in
    task's (`builtin:NAME`). ValueError / FileNotFoundError in one line for a spec that names nothing usable."""
    if spec.startswith(BUILTIN):
        return builtin_task(spec)[0].reward
    file, colon, name = spec.rpartition(":")
    if not colon or not file or not name.isidentifier():
        raise ValueError(f"--reward {spec!r} is not FILE.py:FUNCTION or {BUILTIN}NAME "
                         f"(built-in: {', '.join(BUILTIN_TASKS)})")  # fmt: skip
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"--reward: {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"gpt2_rl_reward_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"--reward: {path} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:
        raise ValueError(f"--reward: importing {path} failed: {type(err).__name__}: {err}") from err
    function = getattr(module, name, None)
    if not callable(function):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ValueError(f"--reward: {path} has no function {name!r} (functions: {', '.join(found) or 'none'})")
    return function


def score(reward: RewardFunction, rows: Sequence[PromptRow], completions: Sequence[str],
          completion_ids: Sequence[list[int]]) -> list[float]:  # fmt: skip
    """The reward of each completion (row i's prompt, completion i), NaN where the function returned None; ValueError
    when it returns anything but one number (or None) per completion."""
    columns: dict[str, list[Any]] = {}
    for key in sorted({key for row in rows for key in row.columns}):
        columns[key] = [row.columns.get(key) for row in rows]
    conversational = any(row.conversational for row in rows)
    given = [[{"role": "assistant", "content": text}] for text in completions] if conversational else list(completions)
    values = reward(prompts=[row.prompt for row in rows], completions=given, completion_ids=list(completion_ids),
                    **columns)  # fmt: skip
    name = getattr(reward, "__name__", "the reward function")
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise ValueError(f"{name} must return a list of {len(rows)} rewards (one per completion), got "
                         f"{type(values).__name__}")  # fmt: skip
    values = list(values)  # a list, a tuple, a NumPy array
    if len(values) != len(rows):
        raise ValueError(f"{name} must return a list of {len(rows)} rewards (one per completion), got {len(values)}")
    rewards = []
    for value in values:
        if value is None:
            rewards.append(math.nan)
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            rewards.append(float(value))
        else:
            raise ValueError(f"{name} returned {value!r}; each reward must be a number (or None: unscorable)")
    return rewards


# ------------------------------------------------------------------------------------ built-in tasks
@dataclass(frozen=True)
class Task:
    """A verifiable task: its prompts by split ("train", "test": disjoint) and its reward."""

    prompts: Callable[[str], list[dict[str, Any]]]
    reward: RewardFunction
    description: str


ADDITION_DIGITS = 2
ADDITION_SPLITS = {"train": 2000, "test": 500}  # prompts per split
ADDITION_SEED = 0


def addition_prompts(
    split: str = "train", digits: int = ADDITION_DIGITS, seed: int = ADDITION_SEED
) -> list[dict[str, Any]]:
    """The sums a+b of two numbers below 10**digits as {"prompt": "12+34=", "answer": "46"} rows: every pair,
    shuffled (seeded), the first ADDITION_SPLITS["train"] the train split and the next ADDITION_SPLITS["test"] the
    test split, so no test sum is trained on.

    >>> addition_prompts("test")[:2]
    [{'prompt': '12+45=', 'answer': '57'}, {'prompt': '70+57=', 'answer': '127'}]
    """
    if split not in ADDITION_SPLITS:
        raise ValueError(f"the addition task's splits are {', '.join(ADDITION_SPLITS)}, got {split!r}")
    pairs = [(a, b) for a in range(10**digits) for b in range(10**digits)]
    random.Random(seed).shuffle(pairs)
    start = 0 if split == "train" else ADDITION_SPLITS["train"]
    chosen = pairs[start : start + ADDITION_SPLITS[split]]
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in chosen]


_LEADING_NUMBER = re.compile(r"\s*(-?\d+)")


def exact_answer(prompts: Sequence[Any], completions: Sequence[Any], answer: Sequence[str], **_: Any) -> list[float]:
    """1.0 where the completion starts with the number `answer` (after optional spaces; the number must end there),
    else 0.0: exact match on the first number, the verifiable reward of the arithmetic task."""
    rewards = []
    for completion, expected in zip(completions, answer, strict=True):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        match = _LEADING_NUMBER.match(text)
        rewards.append(1.0 if match is not None and match.group(1) == str(expected) else 0.0)
    return rewards


BUILTIN_TASKS: dict[str, Task] = {
    "addition": Task(addition_prompts, exact_answer, "sums of two 2-digit numbers 'a+b=', 1 for the exact answer"),
}


def builtin_task(spec: str) -> tuple[Task, str]:
    """The task and split `builtin:NAME[:SPLIT]` names (the split: train by default)."""
    name, _, split = spec.removeprefix(BUILTIN).partition(":")
    if name not in BUILTIN_TASKS:
        raise ValueError(f"unknown built-in task {name!r}; choose one of: "
                         + ", ".join(f"{BUILTIN}{n}" for n in BUILTIN_TASKS))  # fmt: skip
    return BUILTIN_TASKS[name], split or "train"


__all__ = ["BUILTIN_TASKS", "PromptRow", "Task", "addition_prompts", "exact_answer", "load_reward", "read_prompts",
           "score"]  # fmt: skip
