"""`gpt2 chat --model DIR`: an interactive chat in the terminal, streamed, in GPT-2's chat template.

Reads one user message per line from stdin (so it can be piped: `printf 'Hi\\n' | gpt2 chat --model DIR`) and
prints each reply while it is generated. An empty line or end of input ends the chat.

    gpt2 chat --model out/chat --system "You are terse."
    gpt2 chat --model gpt2 --adapter out/chat-lora      # the adapter `gpt2 finetune --method lora` wrote (OUT/adapter)
"""

from __future__ import annotations

import argparse
import sys

from gpt2.cli.common import add_adapter_argument, add_model_arguments, add_sampling_arguments, add_threads_argument


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "chat",
        help="chat with a fine-tuned model in the terminal (streams replies)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser, inference=True)
    add_adapter_argument(parser, "a LoRA adapter to merge into --model")
    parser.add_argument("--system", help="a system message that starts the conversation")
    add_threads_argument(parser)
    add_sampling_arguments(parser, max_tokens=200, samples=False, beams=False)  # one streamed reply a turn
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpt2.api import LLM
    from gpt2.cli.common import sampling_params
    from gpt2.cpu.layouts import prepare_for_inference
    from gpt2.finetune.chat import ChatSession
    from gpt2.finetune.lora import apply_adapter, find_adapter

    params = sampling_params(args)  # every flag is checked before anything loads
    adapter = find_adapter(args.adapter[1], args.model) if args.adapter else None
    llm = LLM.load(args.model, tokenizer=args.tokenizer, device=args.device)
    if adapter is not None:
        apply_adapter(llm.model, adapter)  # merged into the float32 weights, then cast
    prepare_for_inference(llm.model, args.dtype)
    session = ChatSession(llm.model, llm.tokenizer, params, system=args.system)
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
