"""What several subcommands share: the sampling flags, built from the one SamplingParams dataclass."""

from __future__ import annotations

import argparse
from typing import Any

import torch

from gpt2.api import LLM
from gpt2.cpu.layouts import PRECISIONS
from gpt2.inference.sampling import SamplingParams

# What --model reads (gpt2.weights.load_model), for every command that loads one.
MODEL_HELP = "model directory, Hub name, OpenAI TF release, llm.c .bin or GGUF file (llama.cpp's; its tokenizer too)"
# What --dtype does, in one line for every command that takes it (README's "Precisions" table has the detail).
DTYPE_HELP = (
    "inference precision (default float32: the logits of the trained model). bfloat16 / int8 / int4 store 2 / 1 /"
    " ~0.6 bytes a weight (int8 one scale per row, int4 groups of 32); on the native CPU kernels decode steps"
    " quantize activations to int16 blocks for int8/int4 and prefills multiply by the dequantized weights in"
    " bfloat16 (CPUs with AMX or AMD AVX512-BF16) or float32; float16 is GPU only"
)


def load_model_and_tokenizer(
    model_name: str, tokenizer_name: str | None, device: torch.device, precision: str | None = None
) -> tuple[Any, Any]:
    """The model on `device` (in `precision`'s inference layout, if given) and its tokenizer, through the facade
    (`gpt2.api.LLM.load`)."""
    llm = LLM.load(model_name, tokenizer=tokenizer_name, device=device, precision=precision)
    return llm.model, llm.tokenizer


def add_model_arguments(parser: argparse.ArgumentParser, *, inference: bool = False) -> None:
    """--model and --tokenizer (what `LLM.load` reads); with `inference`, also --dtype and --device."""
    parser.add_argument("--model", required=True, help=MODEL_HELP)
    parser.add_argument("--tokenizer", help="tokenizer directory or Hub name (default: the one saved with the model)")
    if inference:
        parser.add_argument(
            "--dtype",
            choices=PRECISIONS,
            default="float32",
            help=DTYPE_HELP,
        )
        parser.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda', ...")


def add_speculation_arguments(parser: argparse.ArgumentParser) -> None:
    """--draft DIR | --prompt-lookup [N]: speculative decoding (LLM.load's draft / prompt_lookup)."""
    speculation = parser.add_mutually_exclusive_group()
    speculation.add_argument("--draft", metavar="DIR", help="speculative decoding: a smaller model, same tokenizer")
    speculation.add_argument(
        "--prompt-lookup",
        type=int,
        nargs="?",
        const=10,
        metavar="N",
        help="speculative decoding with n-gram drafts of up to N tokens from the text so far (default 10)",
    )


def load_speculative_llm(args: argparse.Namespace) -> LLM:
    """`LLM.load` of --model / --tokenizer / --device / --dtype with the speculation flags' draft or lookup."""
    return LLM.load(
        args.model,
        tokenizer=args.tokenizer,
        device=args.device,
        precision=args.dtype,
        draft=args.draft,
        prompt_lookup=args.prompt_lookup,
    )


def add_sampling_arguments(parser: argparse.ArgumentParser, *, max_tokens: int = 256) -> None:
    """--max-new-tokens, --temperature, --top-p, --top-k, --stop, --stop-token-id, --seed, -n: one flag per
    SamplingParams field, with its default; `sampling_params(args)` builds (and so validates) the dataclass."""
    defaults = SamplingParams()
    parser.add_argument(
        "--max-new-tokens",
        "--max-tokens",
        dest="max_tokens",
        type=int,
        default=max_tokens,
        help=f"tokens per sample at most (default {max_tokens})",
    )
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0 = greedy (default 1.0)")
    parser.add_argument(
        "--top-p",
        type=float,
        default=defaults.top_p,
        help="sample from the nucleus of this probability mass, in (0, 1] (default 1.0: off)",
    )
    parser.add_argument("--top-k", type=int, default=defaults.top_k, help="sample from the k most likely tokens only")
    parser.add_argument("--stop", action="append", default=[], help="stop when this text appears (repeatable)")
    parser.add_argument(
        "--stop-token-id",
        dest="stop_token_ids",
        type=int,
        action="append",
        default=[],
        help="stop a sample at this token id (repeatable; end-of-text always stops)",
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, help="make the samples reproducible (sample i uses seed + i)"
    )
    parser.add_argument("-n", "--num-samples", dest="n", type=int, default=defaults.n, help="samples to draw")
    rules = parser.add_argument_group("generation controls (transformers' GenerationConfig meanings)")
    rules.add_argument(
        "--repetition-penalty",
        type=float,
        default=defaults.repetition_penalty,
        help="divide the logits of tokens already present (> 1 discourages repeats; default 1.0: off)",
    )
    rules.add_argument(
        "--no-repeat-ngram-size",
        type=int,
        default=defaults.no_repeat_ngram_size,
        help="never repeat an n-gram of this size (default 0: off)",
    )
    rules.add_argument(
        "--min-tokens",
        "--min-new-tokens",
        dest="min_tokens",
        type=int,
        default=defaults.min_tokens,
        help="no end-of-text or stop token before this many tokens (default 0)",
    )
    rules.add_argument(
        "--bad-words",
        dest="bad_words",
        action="append",
        default=[],
        help="never produce this text (also with a leading space; repeatable)",
    )
    rules.add_argument(
        "--logit-bias",
        dest="logit_bias",
        action="append",
        default=[],
        metavar="TOKEN_ID=BIAS",
        help="add BIAS in [-100, 100] to a token's logit (repeatable)",
    )
    rules.add_argument(
        "--presence-penalty",
        type=float,
        default=defaults.presence_penalty,
        help="lower the logit of tokens already generated, in [-2, 2] (OpenAI's)",
    )
    rules.add_argument(
        "--frequency-penalty",
        type=float,
        default=defaults.frequency_penalty,
        help="lower a token's logit per time it was generated, in [-2, 2] (OpenAI's)",
    )
    rules.add_argument(
        "--num-beams",
        type=int,
        default=defaults.num_beams,
        help="beam search with this many beams (needs --temperature 0; -n best beams are printed)",
    )
    rules.add_argument(
        "--length-penalty",
        type=float,
        default=defaults.length_penalty,
        help="beam score = sum(log p) / length ** this (default 1.0)",
    )
    rules.add_argument(
        "--early-stopping",
        choices=["true", "false", "never"],
        default="false",
        help="beam search stop rule (transformers': true, false = heuristic, never = exact)",
    )


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the flags of `add_sampling_arguments` describe; a bad value is a ValueError."""
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        stop=tuple(args.stop),
        stop_token_ids=tuple(args.stop_token_ids),
        seed=args.seed,
        n=args.n,
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        min_tokens=args.min_tokens,
        bad_words=tuple(args.bad_words),
        logit_bias=dict(_token_bias(text) for text in args.logit_bias),
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        num_beams=args.num_beams,
        length_penalty=args.length_penalty,
        early_stopping={"true": True, "false": False}.get(args.early_stopping, args.early_stopping),
    )


def _token_bias(text: str) -> tuple[int, float]:
    """'TOKEN_ID=BIAS' -> (token id, bias)."""
    token, _, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise ValueError(f"--logit-bias takes TOKEN_ID=BIAS (e.g. 50256=-100), got {text!r}") from None
