"""`gpt2 eval perplexity | hellaswag | lambada | choice`: the evaluation API (gpt2.eval) from the command line.

    gpt2 eval hellaswag --model gpt2 --num-fewshot 10      # shots from the train split, drawn as lm-eval draws them
    gpt2 eval choice --model gpt2 --data test.jsonl --fewshot-data train.jsonl --num-fewshot 5

Each prints a table of its metrics on stdout and, with `--out FILE`, writes them as JSON (with the model and
data they came from). The tokenizer comes from `--tokenizer`, else from the model directory (training
checkpoints save it alongside the weights).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpt2.cli.common import (
    MODEL_HELP,
    add_dtype_argument,
    add_renamed_argument,
    add_threads_argument,
    load_model_and_tokenizer,
)
from gpt2.eval import (
    DEFAULT_BATCH_SIZE,
    FEWSHOT_SEED,
    HELLASWAG_NUM_ENDINGS,
    HELLASWAG_STYLES,
    FewShot,
    evaluate_choice,
    evaluate_hellaswag,
    evaluate_lambada,
    evaluate_perplexity,
    fetch_dataset,
)
from gpt2.runtime.device import resolve_device
from gpt2.runtime.files import atomic_write_text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate a model: perplexity, HellaSwag, LAMBADA, your own multiple-choice questions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tasks = parser.add_subparsers(dest="task", metavar="TASK", required=True)
    common, shots = _shared_arguments()
    _add_perplexity(tasks, common)
    _add_hellaswag(tasks, common, shots)
    _add_lambada(tasks, common, shots)
    _add_choice(tasks, common, shots)


def _shared_arguments() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The parent parsers: the arguments of every task, and the few-shot ones of the tasks that take shots."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--model", required=True, help=MODEL_HELP)
    common.add_argument("--tokenizer", help="tokenizer directory or Hub name (default: the model's directory)")
    common.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1...")
    add_dtype_argument(
        common,
        default=None,
        help="score in this inference precision (as `gpt2 sample --dtype`); default: the float32 model as trained",
    )
    common.add_argument("--out", type=Path, help="also write the results to this JSON file")
    common.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_threads_argument(common)

    # Few-shot prompts as lm-evaluation-harness builds them (gpt2.eval.fewshot).
    shots = argparse.ArgumentParser(add_help=False)
    shots.add_argument(
        "--num-fewshot", type=int, default=0, help="solved examples in front of each question (default: 0, zero-shot)"
    )
    shots.add_argument(
        "--fewshot-seed", type=int, default=FEWSHOT_SEED, help=f"seed of the draws (default: {FEWSHOT_SEED}, lm-eval's)"
    )
    return common, shots


def _add_perplexity(tasks: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    ppl = tasks.add_parser(
        "perplexity",
        parents=[common],
        help="loss, perplexity and bits per byte of a text file or prepared token shards",
        description="Sliding-window perplexity: every token scored once, with up to --context-length tokens of "
        "context, windows advancing by --stride.",
    )
    ppl.add_argument("--data", required=True, type=Path, help="a UTF-8 text file, or a folder from `gpt2 prepare`")
    ppl.add_argument("--split", default="val", help="split of a prepared folder (default: val)")
    ppl.add_argument("--context-length", type=int, help="tokens per window (default: the model's block_size)")
    ppl.add_argument("--stride", type=int, help="tokens between windows (default: context length / 2)")
    ppl.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="windows per forward")
    add_renamed_argument(
        ppl, "--max-eval-tokens", "--max-tokens", type=int, metavar="N", help="evaluate only the first N tokens"
    )
    ppl.add_argument(
        "--no-eot-prefix",
        action="store_true",
        help="for a text file, do not put <|endoftext|> in front (then its first token is not scored)",
    )
    ppl.set_defaults(func=run_perplexity)


def _add_hellaswag(
    tasks: argparse._SubParsersAction, common: argparse.ArgumentParser, shots: argparse.ArgumentParser
) -> None:
    hellaswag = tasks.add_parser(
        "hellaswag",
        parents=[common, shots],
        help="HellaSwag accuracy, completion style (acc, acc_norm, acc_char_norm)",
        description="HellaSwag: each context with its four endings scored by the ending's log-likelihood; acc (the "
        "sum), acc_norm (per token, as nanoGPT / llm.c) and acc_char_norm (per character, as lm-eval). Fetches the "
        "val split unless --data names a file.",
    )
    hellaswag.add_argument("--data", type=Path, help="HellaSwag JSONL (official format); default: fetch the val split")
    hellaswag.add_argument("--limit", type=int, help="only the first N examples")
    hellaswag.add_argument(
        "--style",
        choices=HELLASWAG_STYLES,
        default="nanogpt",
        help="how the prompt is rendered: nanogpt (ctx + ' ' + ending, as nanoGPT/llm.c) or lm-eval (the harness's)",
    )
    hellaswag.add_argument(
        "--batch-size", type=int, default=4 * HELLASWAG_NUM_ENDINGS, help="rows (context + one ending) per forward"
    )
    hellaswag.add_argument(
        "--fewshot-data", type=Path, help="HellaSwag JSONL the shots are drawn from; default: fetch the train split"
    )
    hellaswag.add_argument("--cache-dir", type=Path, help="where fetched files go (default: $GPT2_CACHE/eval)")
    hellaswag.set_defaults(func=run_hellaswag)


def _add_lambada(
    tasks: argparse._SubParsersAction, common: argparse.ArgumentParser, shots: argparse.ArgumentParser
) -> None:
    lambada = tasks.add_parser(
        "lambada",
        parents=[common, shots],
        help="LAMBADA last-word accuracy and perplexity",
        description="LAMBADA: whether greedy decoding gives each passage's last word exactly, and the perplexity of "
        "that word. Fetches OpenAI's test set unless --data names a file.",
    )
    lambada.add_argument("--data", type=Path, help='LAMBADA JSONL ({"text": ...}); default: fetch OpenAI\'s test set')
    lambada.add_argument("--limit", type=int, help="only the first N passages")
    lambada.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="passages per forward")
    lambada.add_argument("--cache-dir", type=Path, help="where fetched files go (default: $GPT2_CACHE/eval)")
    lambada.set_defaults(func=run_lambada)


def _add_choice(
    tasks: argparse._SubParsersAction, common: argparse.ArgumentParser, shots: argparse.ArgumentParser
) -> None:
    choice = tasks.add_parser(
        "choice",
        parents=[common, shots],
        help="accuracy on your multiple-choice JSONL (acc, acc_norm)",
        description='One question per line: {"query": "...", "choices": ["...", ...], "label": <index>}. '
        "Each choice is scored after the query and a space, as lm-evaluation-harness scores a multiple_choice task.",
    )
    choice.add_argument("--data", required=True, type=Path, help="the questions (JSONL)")
    choice.add_argument(
        "--fewshot-data",
        type=Path,
        help="JSONL the shots are drawn from (e.g. a train split); default: --data, each question kept out of its own",
    )
    choice.add_argument("--limit", type=int, help="only the first N questions")
    choice.add_argument(
        "--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="rows (question + choice) per forward"
    )
    choice.set_defaults(func=run_choice)


# ------------------------------------------------------------------------------------------ helpers
def format_table(results: dict[str, Any]) -> str:
    """Two aligned columns, metric and value; floats with 4 decimals."""
    rows = [(k, f"{v:.4f}" if isinstance(v, float) else str(v)) for k, v in results.items() if v is not None]
    width = max(len("metric"), *(len(k) for k, _ in rows))
    value_width = max(len("value"), *(len(v) for _, v in rows))
    lines = [f"{'metric':<{width}}  {'value':>{value_width}}", f"{'-' * width}  {'-' * value_width}"]
    lines += [f"{k:<{width}}  {v:>{value_width}}" for k, v in rows]
    return "\n".join(lines)


def report(results: dict[str, Any], out: Path | None) -> int:
    """Print the table; write the JSON atomically when asked."""
    print(format_table(results))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(results, indent=2) + "\n")
    return 0


# ------------------------------------------------------------------------------------------ commands
def run_perplexity(args: argparse.Namespace) -> int:
    model, tokenizer = load_model_and_tokenizer(args.model, args.tokenizer, resolve_device(args.device), args.dtype)
    results = evaluate_perplexity(
        model,
        tokenizer,
        args.data,
        split=args.split,
        eot_prefix=not args.no_eot_prefix,
        max_tokens=args.max_eval_tokens,
        context_length=args.context_length,
        stride=args.stride,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    return report({"task": results["task"], "model": str(args.model), **results}, args.out)  # model second


def fewshot_of(args: argparse.Namespace) -> FewShot:
    """The few-shot setting the flags ask for (checked before the model is loaded)."""
    return FewShot(k=args.num_fewshot, seed=args.fewshot_seed)


def run_hellaswag(args: argparse.Namespace) -> int:
    fewshot = fewshot_of(args)
    model, tokenizer = load_model_and_tokenizer(args.model, args.tokenizer, resolve_device(args.device), args.dtype)
    data = args.data if args.data is not None else fetch_dataset("hellaswag", args.cache_dir)
    results = evaluate_hellaswag(
        model,
        tokenizer,
        data,
        limit=args.limit,
        style=args.style,
        fewshot=fewshot,
        fewshot_source=args.fewshot_data if args.fewshot_data is not None else _train_split(fewshot, args.cache_dir),
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    return report({**results, "model": str(args.model), "data": str(data)}, args.out)


def _train_split(fewshot: FewShot, cache_dir: Path | None) -> Path | None:
    return fetch_dataset("hellaswag_train", cache_dir) if fewshot.k else None


def run_lambada(args: argparse.Namespace) -> int:
    fewshot = fewshot_of(args)
    model, tokenizer = load_model_and_tokenizer(args.model, args.tokenizer, resolve_device(args.device), args.dtype)
    data = args.data if args.data is not None else fetch_dataset("lambada", args.cache_dir)
    results = evaluate_lambada(
        model,
        tokenizer,
        data,
        limit=args.limit,
        fewshot=fewshot,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    return report({**results, "model": str(args.model), "data": str(data)}, args.out)


def run_choice(args: argparse.Namespace) -> int:
    fewshot = fewshot_of(args)
    model, tokenizer = load_model_and_tokenizer(args.model, args.tokenizer, resolve_device(args.device), args.dtype)
    results = evaluate_choice(
        model,
        tokenizer,
        args.data,
        fewshot=fewshot,
        fewshot_source=args.fewshot_data,
        limit=args.limit,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    return report({**results, "model": str(args.model), "data": str(args.data)}, args.out)
