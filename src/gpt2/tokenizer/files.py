"""The tokenizer files on disk: readers and writers for every layout, and the checks of what they hold.

A tokenizer directory holds one of:

- OpenAI's `encoder.json` ({symbol: id}) + `vocab.bpe` (one merge "left right" per line after a `#version`
  header), as GPT-2 was released;
- Hugging Face's `vocab.json` + `merges.txt`: the same two formats under other names;
- a Hugging Face `tokenizer.json` (byte-level BPE only: vocabulary, merges and added tokens in one file);
- `byte_tokenizer.json`: the description a saved `ByteTokenizer` writes.

Symbols are spelled in GPT-2's printable byte alphabet (`gpt2.tokenizer.reference.bytes_to_unicode`).
Every reader raises FileNotFoundError or ValueError naming the file and what is wrong with it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from gpt2.config import is_integer
from gpt2.runtime.files import atomic_write_text

MERGES_HEADER = "#version: 0.2"
OPENAI_FILES = ("encoder.json", "vocab.bpe")
HF_FILES = ("vocab.json", "merges.txt")
TOKENIZER_JSON = "tokenizer.json"
BYTE_TOKENIZER_FILE = "byte_tokenizer.json"
TOKENIZER_FILES = (*OPENAI_FILES, *HF_FILES, TOKENIZER_JSON, BYTE_TOKENIZER_FILE)  # every name above


def read_text(path: Path) -> str:
    """The UTF-8 text of a vocabulary file."""
    if not path.is_file():
        raise FileNotFoundError(f"vocabulary file {str(path)!r} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); the file is corrupt") from err


def read_json(path: Path) -> object:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: not valid JSON ({err.msg} at line {err.lineno} column {err.colno}); "
            "the file is corrupt or truncated, fetch it again"
        ) from err


def read_vocab(path: Path) -> dict[str, int]:
    """encoder.json / vocab.json: a non-empty JSON object {symbol: integer id}."""
    data = read_json(path)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a non-empty JSON object {{symbol: id}}, got {type(data).__name__}")
    for symbol, token_id in data.items():
        if not is_integer(token_id):
            raise ValueError(f"{path}: the id of {symbol!r} is {token_id!r}; ids must be integers")
    return data


def parse_merges(lines: Iterable[str], where: str) -> list[tuple[str, str]]:
    """Merge lines "left right" -> pairs; a first line starting with '#version' and empty lines are skipped."""
    merges = []
    for number, line in enumerate(lines, start=1):
        if (number == 1 and line.startswith("#version")) or not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{where} line {number}: expected two symbols separated by one space, got {line!r}")
        merges.append((parts[0], parts[1]))
    return merges


def read_merges(path: Path) -> list[tuple[str, str]]:
    """vocab.bpe / merges.txt: the merges in rank order."""
    return parse_merges(read_text(path).split("\n"), str(path))


def read_tokenizer_json(path: Path) -> tuple[dict[str, int], list[tuple[str, str]], set[str]]:
    """A Hugging Face tokenizer.json of GPT-2 style byte-level BPE -> (vocab, merges, added token texts)."""
    data = read_json(path)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise ValueError(f"{path}: model type is {kind!r}; only byte-level BPE (GPT-2 style) is supported")
    pre = data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    byte_level = [step for step in steps if step.get("type") == "ByteLevel"]
    if not byte_level:
        raise ValueError(
            f"{path}: the pre-tokenizer is {pre.get('type')!r}, not ByteLevel; only GPT-2 style "
            "byte-level BPE is supported"
        )
    if byte_level[0].get("add_prefix_space"):
        raise ValueError(f"{path}: ByteLevel add_prefix_space=true is not GPT-2's behaviour; set it to false")
    vocab = dict(model.get("vocab") or {})
    raw_merges = model.get("merges") or []
    # tokenizers < 0.20 writes merges as "a b" strings, newer versions as ["a", "b"] pairs
    lines = [merge if isinstance(merge, str) else " ".join(merge) for merge in raw_merges]
    merges = parse_merges(lines, f"{path} model.merges entry")
    specials = set()
    for added in data.get("added_tokens") or []:
        vocab.setdefault(added["content"], added["id"])
        specials.add(added["content"])
    return vocab, merges, specials


def write_vocab_and_merges(directory: Path, vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> None:
    """Write encoder.json + vocab.bpe (OpenAI) and vocab.json + merges.txt (Hugging Face), same content, each
    file atomically; the vocabulary is written in id order."""
    vocab_text = json.dumps(dict(sorted(vocab.items(), key=lambda item: item[1])), ensure_ascii=False)
    merges_text = "\n".join([MERGES_HEADER, *(f"{left} {right}" for left, right in merges)]) + "\n"
    for vocab_name, merges_name in (OPENAI_FILES, HF_FILES):
        atomic_write_text(directory / vocab_name, vocab_text)
        atomic_write_text(directory / merges_name, merges_text)


def check_byte_tokenizer_file(path: Path, expected: dict[str, object]) -> None:
    """Check that the byte_tokenizer.json at `path` holds exactly `expected` (ByteTokenizer's description)."""
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist; save a ByteTokenizer there first")
    data = read_json(path)
    if data != expected:
        raise ValueError(f"{path}: describes {data!r}, expected {expected!r}; the file is corrupt or newer")


def write_byte_tokenizer_file(directory: Path, description: dict[str, object]) -> None:
    """Write byte_tokenizer.json (atomically): the description `check_byte_tokenizer_file` reads back."""
    atomic_write_text(directory / BYTE_TOKENIZER_FILE, json.dumps(description, indent=2) + "\n")
