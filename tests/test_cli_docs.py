"""Specification: every precision a command accepts is documented in README's "Precisions" tables, read from
the parsers themselves (a new choice that the README does not explain fails here)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gpt2.cli import build_parser
from gpt2.export import FORMATS

README = Path(__file__).resolve().parents[1] / "README.md"


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    """Every leaf parser by its command line ('sample', 'eval perplexity', ...)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        children = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not children:
            found[prefix.strip()] = parser
        for action in children:
            for name, child in action.choices.items():
                walk(child, f"{prefix} {name}")

    walk(build_parser(), "")
    return found


def dtype_choices() -> dict[str, tuple[str, ...]]:
    """The commands whose --dtype has fixed choices, and those choices."""
    result = {}
    for command, parser in subcommand_parsers().items():
        for action in parser._actions:
            if "--dtype" in action.option_strings and action.choices:
                result[command] = tuple(action.choices)
    return result


def readme_table_rows(heading: str) -> list[list[str]]:
    section = README.read_text(encoding="utf-8").split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_the_inference_commands_take_dtype() -> None:
    assert {"sample", "serve", "eval perplexity"} <= set(dtype_choices())


@pytest.mark.parametrize("command", sorted(dtype_choices()))
def test_every_inference_dtype_is_a_row_of_the_precisions_table(command: str) -> None:
    documented = {re.sub(r"[`*]| \(default\)", "", row[0]) for row in readme_table_rows("Precisions (`--dtype`)")}
    assert set(dtype_choices()[command]) <= documented


def test_every_export_dtype_is_documented_with_its_format() -> None:
    rows = {row[0].strip("`"): row[1] for row in readme_table_rows("Precisions (`--dtype`)") if row[0].startswith("`")}
    for name, export_format in FORMATS.items():
        documented = re.findall(r"`([^`]+)`", rows[name])
        assert documented == list(export_format.dtypes), name  # all of them, the default first
