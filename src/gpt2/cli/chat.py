"""`gpt2 chat --model DIR`: an interactive chat in the terminal, streamed, in GPT-2's chat template.

Reads one user message per line from stdin (so it can be piped: `printf 'Hi\\n' | gpt2 chat --model DIR`) and
prints each reply while it is generated. An empty line or end of input ends the chat.
"""

from __future__ import annotations

import argparse
import sys

from gpt2.cli.common import MODEL_HELP, add_sampling_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat", help="chat with a fine-tuned model in the terminal (streams replies)")
    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--tokenizer", help="tokenizer directory (default: the model's)")
    parser.add_argument("--adapter", help="a LoRA adapter directory (PEFT's format) to merge into the model")
    parser.add_argument("--system", help="a system message that starts the conversation")
    parser.add_argument("--device", default="auto")
    add_sampling_arguments(parser, max_tokens=200)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpt2.api import LLM
    from gpt2.cli.common import sampling_params
    from gpt2.finetune.chat import ChatSession
    from gpt2.finetune.lora import apply_adapter

    llm = LLM.load(args.model, tokenizer=args.tokenizer, device=args.device)
    if args.adapter:
        apply_adapter(llm.model, args.adapter)
    session = ChatSession(llm.model, llm.tokenizer, sampling_params(args), system=args.system)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or not line.strip():
            break
        print("assistant> ", end="", flush=True)
        for piece in session.reply(line.rstrip("\n")):
            print(piece, end="", flush=True)
        print()
    return 0
