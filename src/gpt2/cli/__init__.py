"""The `gpt2` console script: one subcommand per job, each defined in its own module of this package.

Each subcommand module has `register(subparsers)` which adds its parser and sets `func` (a callable taking the
parsed arguments and returning an exit status). Errors a user can fix (ValueError, FileNotFoundError) become one
clear line on stderr and exit status 2, never a traceback; so does a disk that refuses a write (full, read-only,
not ours: `gpt2.runtime.files.describe_write_error`), with exit status 1.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys
from collections.abc import Sequence

from gpt2.cli.common import set_threads
from gpt2.runtime.files import describe_write_error

DISTRIBUTION = "gpt2-faithful"

# module names under gpt2.cli, in the order they appear in `gpt2 --help`
SUBCOMMAND_MODULES = (
    "train", "finetune", "rl", "chat", "prepare", "sample", "serve", "tokenizer", "eval", "inspect", "export",
    "classify", "bench",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpt2", description="GPT-2: train, load, sample and evaluate.")
    parser.add_argument("--version", action="version", version=f"gpt2 {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(f"gpt2.cli.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"gpt2.cli.{name}":
                raise
            continue
        module.register(subparsers)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        set_threads(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("gpt2: interrupted", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError) as err:
        print(f"gpt2 {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        message = describe_write_error(err)
        if message is None:
            raise
        print(f"gpt2 {args.command}: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
