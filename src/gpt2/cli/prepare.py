"""`gpt2 prepare`: text files, directories, globs, JSONL (or a Hugging Face dataset) -> token shards.

    gpt2 prepare input.txt --out data/shakespeare --tokenizer gpt2             # GPT-2 BPE, 10% val
    gpt2 prepare input.txt --out data/shakespeare_bytes --tokenizer bytes      # one id per byte
    gpt2 prepare 'corpus/**/*.jsonl' --out data/web --jsonl-field content --val-fraction 0.005
    gpt2 prepare --dataset roneneldan/TinyStories --out data/tinystories       # needs `datasets`, online
    gpt2 prepare --dataset HuggingFaceFW/fineweb --dataset-config sample-10BT --out data/fineweb10B \
        --tokenizer gpt2 --val-fraction 0.01 --expected-tokens 10e9             # see docs/reproduce-gpt2-124m.md

Writes train_NNNNNN.bin / val_NNNNNN.bin and manifest.json (format: see gpt2.data). Interrupted or crashed, the
same command again resumes after the last finished shard-sized piece of the stream, with the same result.
"""

from __future__ import annotations

import argparse
import os
import sys

from gpt2.cli.tokenizer import TOKENIZER_ENV
from gpt2.data import DEFAULT_CHUNK_CHARS, DEFAULT_SHARD_TOKENS
from gpt2.tokenizer import BYTE_TOKENIZER_NAMES, load_tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "prepare",
        help="tokenize a corpus into train/val token shards",
        description="Tokenize text into train/val token shards plus manifest.json. Each document (a text file "
        "or a JSONL record) is preceded by <|endoftext|>; the last --val-fraction of the stream is the val split. "
        "Interrupted, the same command again resumes after the last finished --shard-tokens piece of the stream.",
    )
    parser.add_argument(
        "sources",
        nargs="*",
        help="text files, .jsonl files, directories (searched recursively for .txt .text .md .rst .jsonl) or "
        "quoted globs such as 'web/**/*.html'",
    )
    parser.add_argument("--out", required=True, help="directory to write the shards and manifest.json into")
    parser.add_argument(
        "--tokenizer",
        default=None,
        help=f"tokenizer directory, a Hub name such as 'gpt2', or '{BYTE_TOKENIZER_NAMES[0]}' for the byte "
        f"tokenizer; default: ${TOKENIZER_ENV}, else 'gpt2'",
    )
    parser.add_argument("--jsonl-field", default="text", help="field holding the text in JSONL / dataset records")
    parser.add_argument("--val-fraction", type=float, default=0.1, help="tail of the stream kept for val (default 0.1)")
    parser.add_argument("--shard-tokens", type=int, default=DEFAULT_SHARD_TOKENS, help="tokens per shard file at most")
    parser.add_argument(
        "--chunk-chars",
        type=int,
        default=DEFAULT_CHUNK_CHARS,
        help="characters tokenized at a time (bounds memory; only a word longer than this is cut inside)",
    )
    parser.add_argument(
        "--dataset", default=None, help="Hugging Face dataset name or local dataset folder, streamed with `datasets`"
    )
    parser.add_argument("--dataset-config", default=None, help="configuration of --dataset, e.g. 'sample-10BT'")
    parser.add_argument("--dataset-split", default="train", help="split of --dataset to read (default 'train')")
    parser.add_argument(
        "--expected-tokens",
        type=float,
        default=None,
        metavar="N",
        help="about how many tokens the input holds (e.g. 10e9), for the time left when it cannot be estimated "
        "from file sizes (a --dataset)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace data already prepared in --out")
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no status lines")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpt2.data import PrepareOptions, prepare

    if not args.sources and args.dataset is None:
        raise ValueError("nothing to prepare: pass files, directories or globs, or --dataset NAME")
    tokenizer = load_tokenizer(args.tokenizer or os.environ.get(TOKENIZER_ENV) or "gpt2")
    expected = None if args.expected_tokens is None else int(args.expected_tokens)
    options = PrepareOptions(
        jsonl_field=args.jsonl_field,
        val_fraction=args.val_fraction,
        shard_tokens=args.shard_tokens,
        chunk_chars=args.chunk_chars,
        dataset=args.dataset,
        dataset_split=args.dataset_split,
        dataset_config=args.dataset_config,
        expected_tokens=expected,
    )
    manifest = prepare(
        args.sources,
        args.out,
        tokenizer,
        options,
        overwrite=args.overwrite,
        progress=not args.quiet,
        log=None if args.quiet else (lambda message: print(message, file=sys.stderr)),
    )
    splits = manifest["splits"]
    notes = []
    if manifest["empty_files"]["count"]:
        notes.append(f"{manifest['empty_files']['count']} empty file(s) skipped")
    if manifest["invalid_utf8"]["files"]:
        notes.append(f"{manifest['invalid_utf8']['files']} file(s) with invalid UTF-8 repaired")
    if manifest["forced_splits"]:
        notes.append(f"{manifest['forced_splits']} word(s) longer than --chunk-chars cut")
    print(
        f"prepared {manifest['documents']} document(s): train {splits['train']:,} tokens, val {splits['val']:,} "
        f"tokens ({manifest['dtype']}, {len(manifest['shards'])} shard(s)) in {args.out}"
        + (f"; {'; '.join(notes)}" if notes else "")
    )
    return 0
