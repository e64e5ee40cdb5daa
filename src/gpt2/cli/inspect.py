"""`gpt2 inspect attention | logit-lens`: pictures of what a model does with a prompt (gpt2.inspect).

    gpt2 inspect attention --model out/run1 --prompt "The cat sat on the mat" --layer 3 --out att.png
    gpt2 inspect attention --model gpt2 --prompt "When Mary and John went to the store" --out att.html
    gpt2 inspect logit-lens --model gpt2 --prompt "The Eiffel Tower is in the city of" --out lens.png

attention: a heatmap per head (queries down, keys across) with the tokens as labels; every layer and head
unless --layer / --head pick one. `.png` is a static figure; `.html` one self-contained interactive page (no
network needed to open it). logit-lens: the top next token at every layer and position, as a `.png` table.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpt2.cli.common import add_model_arguments


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="pictures of a model's internals: attention patterns, logit lens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    views = parser.add_subparsers(dest="view", metavar="VIEW", required=True)

    common = argparse.ArgumentParser(add_help=False)
    add_model_arguments(common)
    common.add_argument("--prompt", required=True, help="the text to look at")
    common.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda', ...")

    attention = views.add_parser(
        "attention", parents=[common], help="attention heatmaps per head, as .png or interactive .html"
    )
    attention.add_argument("--layer", type=int, help="only this layer (default: all)")
    attention.add_argument("--head", type=int, help="only this head (default: all)")
    attention.add_argument("--out", required=True, help="FILE.png or FILE.html")
    attention.set_defaults(func=run_attention)

    lens = views.add_parser("logit-lens", parents=[common], help="top next token per layer and position, as .png")
    lens.add_argument("--out", required=True, help="FILE.png")
    lens.set_defaults(func=run_logit_lens)


def run_attention(args: argparse.Namespace) -> int:
    from gpt2.inspect.pictures import attention_picture

    llm = _load(args)
    path = attention_picture(llm.model, llm.tokenizer, args.prompt, args.out, layer=args.layer, head=args.head)
    print(f"wrote {path}")
    return 0


def run_logit_lens(args: argparse.Namespace) -> int:
    from gpt2.inspect.pictures import logit_lens_picture

    llm = _load(args)
    path = logit_lens_picture(llm.model, llm.tokenizer, args.prompt, args.out)
    print(f"wrote {path}")
    return 0


def _load(args: argparse.Namespace) -> Any:
    from gpt2.api import LLM

    return LLM.load(args.model, tokenizer=args.tokenizer, device=args.device)
