"""What several subcommands share: the sampling flags, built from the one SamplingParams dataclass; the flags
that mean the same in every command that takes them (--model, --dtype, --adapter, --threads); old spellings of
renamed flags."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from gpt2.api import LLM
from gpt2.cpu.layouts import PRECISIONS
from gpt2.export.formats import DTYPE_ALIASES
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


def add_model_arguments(parser: argparse.ArgumentParser, *, inference: bool = False, required: bool = True) -> None:
    """--model and --tokenizer (what `LLM.load` reads); with `inference`, also --dtype and --device. required=False
    for a command that also takes the model as a positional argument."""
    parser.add_argument("--model", required=required, help=MODEL_HELP)
    parser.add_argument("--tokenizer", help="tokenizer directory or Hub name (default: the one saved with the model)")
    if inference:
        add_dtype_argument(parser, default="float32", help=DTYPE_HELP)
        parser.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda', ...")


def add_dtype_argument(parser: argparse.ArgumentParser, *, default: str | None, help: str) -> None:
    """--dtype of an inference command: one of PRECISIONS, in any spelling `gpt2 export --dtype` takes too."""
    parser.add_argument("--dtype", type=precision_name, choices=PRECISIONS, default=default, help=help)


def precision_name(text: str) -> str:
    """A precision in the spelling PRECISIONS uses, from any spelling of it the export formats take (one table of
    names, gpt2.export.DTYPE_ALIASES); an unknown name comes back as given, for argparse's choices to refuse.

    >>> precision_name("f16"), precision_name("BF16"), precision_name("fp32"), precision_name("int8")
    ('float16', 'bfloat16', 'float32', 'int8')
    """
    short = DTYPE_ALIASES.get(text.lower(), text.lower())
    long_names = {alias: name for name, alias in DTYPE_ALIASES.items() if name in PRECISIONS}
    return long_names.get(short, short)


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
    """`LLM.load` of --model / --tokenizer / --device / --dtype with the speculation flags' draft or lookup, and
    the LoRA adapters of --lora (NAME=DIR pairs), when the command has it."""
    adapters: dict[str, str] = {}
    for name, directory in getattr(args, "lora", None) or []:
        if name in adapters:
            raise ValueError(f"--lora names two adapters {name!r}; give each its own name")
        adapters[name] = directory
    return LLM.load(
        args.model,
        tokenizer=args.tokenizer,
        device=args.device,
        precision=args.dtype,
        draft=args.draft,
        prompt_lookup=args.prompt_lookup,
        adapters=adapters,
    )


ADAPTER_HELP = (
    "[NAME=]DIR: a LoRA adapter's folder (PEFT's format, or a LoRA `gpt2 finetune` output folder, which holds it in "
    "adapter/), named NAME (default: the folder's name)"
)


def add_adapter_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--adapter [NAME=]DIR, as every command that takes one adapter reads it (args.adapter: (name, folder))."""
    parser.add_argument("--adapter", metavar="[NAME=]DIR", type=adapter_spec, help=f"{what}. {ADAPTER_HELP}")


def adapter_spec(text: str) -> tuple[str, str]:
    """NAME=DIR (or DIR alone, named after its folder) -> (name, directory)."""
    name, separator, directory = text.partition("=")
    if not separator:
        directory = text
        name = Path(text.rstrip("/")).name
    if not name or not directory:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=DIR (a name, '=', the adapter's folder)")
    return name, directory


class OldSpelling(argparse.Action):
    """A renamed flag's old spelling, kept working: it stores what the new one does and says once, on stderr, that
    it is the old spelling."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **keywords: Any) -> None:
        super().__init__(option_strings, dest, **keywords)
        self.new = new
        self.said = False

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        if not self.said:
            print(f"gpt2: {option_string} is the old spelling of {self.new}; use {self.new}", file=sys.stderr)
            self.said = True
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)  # a switch stands for a value


def add_renamed_argument(parser: argparse.ArgumentParser, new: str, old: str, **keywords: Any) -> None:
    """The flag `new` (add_argument's `keywords`) and its old spelling `old`, hidden from --help (OldSpelling)."""
    action = parser.add_argument(new, **keywords)
    parser.add_argument(old, dest=action.dest, action=OldSpelling, new=new, type=keywords.get("type", str),
                        metavar=action.metavar, help=argparse.SUPPRESS)  # fmt: skip


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """--threads N: the CPU threads torch computes with (llama-server's -t); `set_threads(args)` applies it."""
    parser.add_argument(
        "--threads", "-t", type=int, metavar="N", help="CPU threads to compute with (default: torch's, one per core)"
    )


def set_threads(args: argparse.Namespace) -> None:
    """torch.set_num_threads(--threads), when given; a count below 1 is a ValueError."""
    threads = getattr(args, "threads", None)
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    torch.set_num_threads(threads)


def add_flags(parser: Any, flags: Sequence[tuple[tuple[str, ...], str, dict[str, Any]]]) -> None:
    """Add each (names, help, keywords of add_argument) of a table of flags to a parser or argument group."""
    for names, help_text, keywords in flags:
        parser.add_argument(*names, help=help_text, **keywords)


def add_sampling_arguments(
    parser: argparse.ArgumentParser, *, max_tokens: int = 256, samples: bool = True, beams: bool = True
) -> None:
    """--max-new-tokens, --temperature, --top-p, --top-k, --min-p, --stop, --stop-token-id, --seed, -n and the
    generation controls: one flag per SamplingParams field, with its default; `sampling_params(args)` builds (and so
    validates) the dataclass. samples=False leaves out -n and beams=False the beam-search flags, for a command that
    draws one reply."""
    defaults = SamplingParams()
    add_flags(parser, [
        (("--max-new-tokens", "--max-tokens"), f"tokens per sample at most (default {max_tokens})",
         {"dest": "max_tokens", "type": int, "default": max_tokens}),
        (("--temperature",), "0 = greedy (default 1.0)", {"type": float, "default": defaults.temperature}),
        (("--top-p",), "sample from the nucleus of this probability mass, in (0, 1] (default 1.0: off)",
         {"type": float, "default": defaults.top_p}),
        (("--top-k",), "sample from the k most likely tokens only", {"type": int, "default": defaults.top_k}),
        (("--min-p",), "drop tokens less than this times as probable as the best one, in [0, 1] (default 0: off)",
         {"type": float, "default": defaults.min_p}),
        (("--stop",), "stop when this text appears (repeatable)", _repeatable()),
        (("--stop-token-id",), "stop a sample at this token id (repeatable; end-of-text always stops)",
         _repeatable(dest="stop_token_ids", type=int)),
        (("--seed",), "make the samples reproducible (sample i uses seed + i)",
         {"type": int, "default": defaults.seed}),
    ])  # fmt: skip
    if samples:
        parser.add_argument("-n", "--num-samples", dest="n", type=int, default=defaults.n, help="samples to draw")
    rules = parser.add_argument_group("generation controls (transformers' GenerationConfig meanings)")
    add_flags(rules, [
        (("--repetition-penalty",), "divide the logits of tokens already present (> 1 discourages repeats; default "
         "1.0: off)", {"type": float, "default": defaults.repetition_penalty}),
        (("--no-repeat-ngram-size",), "never repeat an n-gram of this size (default 0: off)",
         {"type": int, "default": defaults.no_repeat_ngram_size}),
        (("--min-tokens", "--min-new-tokens"), "no end-of-text or stop token before this many tokens (default 0)",
         {"dest": "min_tokens", "type": int, "default": defaults.min_tokens}),
        (("--bad-words",), "never produce this text (also with a leading space; repeatable)", _repeatable()),
        (("--logit-bias",), "add BIAS in [-100, 100] to a token's logit (repeatable)",
         _repeatable(metavar="TOKEN_ID=BIAS")),
        (("--presence-penalty",), "lower the logit of tokens already generated, in [-2, 2] (OpenAI's)",
         {"type": float, "default": defaults.presence_penalty}),
        (("--frequency-penalty",), "lower a token's logit per time it was generated, in [-2, 2] (OpenAI's)",
         {"type": float, "default": defaults.frequency_penalty}),
    ])  # fmt: skip
    if beams:
        add_flags(rules, _beam_flags(defaults))


def _beam_flags(defaults: SamplingParams) -> list[tuple[tuple[str, ...], str, dict[str, Any]]]:
    """Beam search's flags (a command that streams one reply leaves them out)."""
    return [
        (("--num-beams",), "beam search with this many beams (needs --temperature 0; -n best beams are printed)",
         {"type": int, "default": defaults.num_beams}),
        (("--length-penalty",), "beam score = sum(log p) / length ** this (default 1.0)",
         {"type": float, "default": defaults.length_penalty}),
        (("--early-stopping",), "beam search stop rule (transformers': true, false = heuristic, never = exact)",
         {"choices": ["true", "false", "never"], "default": "false"}),
    ]  # fmt: skip


def _repeatable(**keywords: Any) -> dict[str, Any]:
    """add_argument's keywords of a flag that may be given several times (each its own list)."""
    return {"action": "append", "default": [], **keywords}


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    """The SamplingParams the flags of `add_sampling_arguments` describe; a bad value is a ValueError."""
    defaults = SamplingParams()
    return SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        stop=tuple(args.stop),
        stop_token_ids=tuple(args.stop_token_ids),
        seed=args.seed,
        n=getattr(args, "n", defaults.n),
        repetition_penalty=args.repetition_penalty,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        min_tokens=args.min_tokens,
        bad_words=tuple(args.bad_words),
        logit_bias=dict(_token_bias(text) for text in args.logit_bias),
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        num_beams=getattr(args, "num_beams", defaults.num_beams),
        length_penalty=getattr(args, "length_penalty", defaults.length_penalty),
        early_stopping=_early_stopping(getattr(args, "early_stopping", "false")),
    )


def _early_stopping(text: str) -> bool | Literal["never"]:
    return "never" if text == "never" else text == "true"


def _token_bias(text: str) -> tuple[int, float]:
    """'TOKEN_ID=BIAS' -> (token id, bias)."""
    token, _, bias = text.partition("=")
    try:
        return int(token), float(bias)
    except ValueError:
        raise ValueError(f"--logit-bias takes TOKEN_ID=BIAS (e.g. 50256=-100), got {text!r}") from None
