"""`gpt2 sample`: continue a prompt with a trained or released model, streaming the text as it comes.

    gpt2 sample --model out/run1 --prompt "To be, or not" --max-new-tokens 200 --top-k 40 --seed 0
    echo "Once upon a time" | gpt2 sample --model gpt2 -n 3 --temperature 0.8

The model is a HF-format directory (what `gpt2 train` writes, or `save_pretrained`) or a Hub name. The
tokenizer is read from the model directory when it holds one (`gpt2 train` saves it there), else from
`--tokenizer`.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from gpt2.cli.common import load_model_and_tokenizer
from gpt2.inference import optimize_for_inference, quantize_int8
from gpt2.runtime.device import DTYPES, resolve_device

SAMPLE_SEPARATOR = "\n" + "-" * 40 + "\n"
INT8 = "int8"  # weight-only int8 with bfloat16 activations (gpt2.inference); fastest on CPU


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sample",
        help="generate text from a model, streamed to the terminal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, help="HF-format model directory or Hub name")
    parser.add_argument("--tokenizer", help="tokenizer directory or Hub name (default: the model directory)")
    parser.add_argument("--prompt", help="text to continue; read from stdin when absent or '-'")
    parser.add_argument("-n", "--num-samples", type=int, default=1, help="samples to draw (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens per sample at most (default 256)")
    parser.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    parser.add_argument("--top-k", type=int, help="sample from the k most likely tokens only")
    parser.add_argument("--top-p", type=float, help="sample from the nucleus of this probability mass, in (0, 1]")
    parser.add_argument("--seed", type=int, help="make the samples reproducible")
    parser.add_argument(
        "--stop-token-id", type=int, action="append", default=None,
        help="stop a sample at this token id (repeatable; end-of-text always stops)",
    )
    parser.add_argument("--truncate", choices=["left"], help="cut a prompt longer than the context from the left")
    parser.add_argument("--slide-by", type=int, help="window shift past the context (default block_size // 4)")
    parser.add_argument(
        "--dtype", choices=[*sorted(DTYPES), INT8], default="float32",
        help="weights' precision (default float32; int8 = int8 weights, bfloat16 activations)",
    )
    parser.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda', ...")
    parser.add_argument("--compile", action="store_true", help="torch.compile the decode step (GPU)")
    parser.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpt2.inference.generate import stream_text

    if args.num_samples < 1:
        raise ValueError(f"-n/--num-samples must be >= 1, got {args.num_samples}")
    prompt = args.prompt
    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    if not prompt:
        raise ValueError("the prompt is empty; pass --prompt TEXT or pipe text on stdin")
    device = resolve_device(args.device)
    if args.dtype == "float16" and device.type == "cpu":
        raise ValueError("--dtype float16 is slow or unsupported on CPU; use --dtype bfloat16 or int8 there")

    model, tokenizer = load_model_and_tokenizer(args.model, args.tokenizer, device)
    model.eval()
    if args.dtype == INT8:
        quantize_int8(model)
    elif args.dtype == "float32":
        optimize_for_inference(model)  # the split-weight layout: same logits, all cores stream the weights
    else:
        model.to(DTYPES[args.dtype])
    stop_ids = [tokenizer.eot_token, *(args.stop_token_id or [])]
    if tokenizer.eot_token >= model.config.vocab_size:
        stop_ids = stop_ids[1:]
    generator = torch.Generator(device=device).manual_seed(args.seed) if args.seed is not None else None
    options = dict(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator,
        stop_token_ids=stop_ids, truncate=args.truncate, slide_by=args.slide_by, compile=args.compile,
    )
    for sample in range(args.num_samples):
        if sample:
            sys.stdout.write(SAMPLE_SEPARATOR)
        if not args.no_echo:
            sys.stdout.write(prompt)
        for piece in stream_text(model, tokenizer, prompt, args.max_new_tokens, **options):
            sys.stdout.write(piece)
            sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0
