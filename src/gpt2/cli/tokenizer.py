"""`gpt2 tokenize` (text -> ids or a token count) and `gpt2 tokenizer train` (text files -> a new BPE vocabulary).

    gpt2 tokenize notes.txt --tokenizer ./gpt2-vocab          # ids, space-separated, one line
    echo "Hello world" | gpt2 tokenize --count               # uses $GPT2_TOKENIZER
    gpt2 tokenizer train Lib/ --pattern '*.py' --vocab-size 8192 --out ./pylib-tokenizer

The tokenizer is read by `gpt2.tokenizer.load_tokenizer` (a directory, a Hub name, or 'bytes').
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpt2.tokenizer import load_tokenizer

TOKENIZER_ENV = "GPT2_TOKENIZER"  # the tokenizer `gpt2 tokenize` and `gpt2 prepare` use when none is passed


def register(subparsers: argparse._SubParsersAction) -> None:
    tokenize = subparsers.add_parser(
        "tokenize",
        help="turn text into token ids (or count them)",
        description="Turn text into GPT-2 token ids, printed space-separated on one line (--count: how many).\n\n"
        "    gpt2 tokenize notes.txt --tokenizer gpt2\n    echo 'Hello world' | gpt2 tokenize --count",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tokenize.add_argument("file", nargs="?", default="-", help="UTF-8 text file; '-' or nothing reads stdin")
    tokenize.add_argument(
        "--tokenizer",
        default=None,
        help=f"tokenizer directory (encoder.json + vocab.bpe, vocab.json + merges.txt, tokenizer.json, or a saved "
        f"byte tokenizer) or a Hub name such as 'gpt2'; default: ${TOKENIZER_ENV}",
    )
    tokenize.add_argument("--count", action="store_true", help="print only the number of tokens")
    tokenize.add_argument(
        "--allow-special", action="store_true", help="turn <|endoftext|> in the text into its id instead of text"
    )
    tokenize.set_defaults(func=run_tokenize)

    tokenizer = subparsers.add_parser(
        "tokenizer",
        help="tokenizer tools: train",
        description="Tokenizer tools. `gpt2 tokenizer train`: a byte-level BPE vocabulary (vocab.json, merges.txt) "
        "learnt from your own text.\n\n    gpt2 tokenizer train Lib/ --pattern '*.py' --vocab-size 8192 --out tok",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tokenizer.set_defaults(func=lambda args: _print_help(tokenizer))
    actions = tokenizer.add_subparsers(dest="action", metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="train a byte-level BPE tokenizer on your own text",
        description="Train a byte-level BPE tokenizer (GPT-2's split pattern) on text files and write vocab.json and "
        "merges.txt into --out.",
    )
    train.add_argument("inputs", nargs="+", type=Path, help="text files, or directories searched recursively")
    train.add_argument("--vocab-size", type=int, required=True, help="ids in the result, <|endoftext|> included")
    train.add_argument("--out", type=Path, required=True, help="directory to write the vocabulary files into")
    train.add_argument("--pattern", default="*", help="file name pattern inside directories (default: '*')")
    train.add_argument("--min-frequency", type=int, default=2, help="merge only pairs seen this often (default: 2)")
    train.set_defaults(func=run_train)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _read_input(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"input file {name!r} does not exist")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{name} is not UTF-8 text ({err.reason} at byte {err.start})") from err


def run_tokenize(args: argparse.Namespace) -> int:

    source = args.tokenizer or os.environ.get(TOKENIZER_ENV)
    if not source:
        raise ValueError(
            "no tokenizer given: pass --tokenizer DIR (a folder with encoder.json + vocab.bpe, vocab.json + "
            f"merges.txt or tokenizer.json) or a Hub name such as 'gpt2', or set {TOKENIZER_ENV}"
        )
    tokenizer = load_tokenizer(source)
    text = _read_input(args.file)
    ids = tokenizer.encode(text, allowed_special="all" if args.allow_special else frozenset())
    print(len(ids) if args.count else " ".join(map(str, ids)))
    return 0


def run_train(args: argparse.Namespace) -> int:
    from gpt2.tokenizer import train_tokenizer

    started = time.perf_counter()
    tokenizer = train_tokenizer(
        args.inputs, args.vocab_size, min_frequency=args.min_frequency, file_pattern=args.pattern
    )
    tokenizer.save(args.out)
    print(
        f"trained byte-level BPE: vocab_size={tokenizer.vocab_size} eot_token={tokenizer.eot_token} "
        f"in {time.perf_counter() - started:.1f}s; wrote {args.out} ({tokenizer.identity})"
    )
    return 0
