"""`gpt2 classify`: the label and its probability for each text, from a sequence-classification model.

    gpt2 classify --model out/sentiment "a wonderful film" "a waste of two hours"

The model directory holds a classifier (ours, or one transformers' GPT2ForSequenceClassification saved) and
its tokenizer. Output: one line per text, `LABEL<TAB>PROBABILITY<TAB>TEXT`.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpt2.finetune.classify import classify_texts


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "classify",
        help="label texts with a sequence-classification model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model", required=True, help="classifier directory (config.json, model.safetensors, tokenizer)"
    )
    parser.add_argument("texts", nargs="+", metavar="TEXT", help="texts to classify")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for prediction in classify_texts(args.model, args.texts):
        print(f"{prediction.label}\t{prediction.probability:.4f}\t{prediction.text}")
    return 0
