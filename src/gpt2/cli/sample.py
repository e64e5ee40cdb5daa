"""`gpt2 sample`: continue a prompt with a trained or released model, streaming the text as it comes.

    gpt2 sample --model out/run1 --prompt "To be, or not" --max-new-tokens 200 --top-k 40 --seed 0
    echo "Once upon a time" | gpt2 sample --model gpt2 -n 3 --temperature 0.8
    gpt2 sample --model gpt2 --prompt "The city" --repetition-penalty 1.3 --no-repeat-ngram-size 3
    gpt2 sample --model gpt2 --prompt "The city" --temperature 0 --num-beams 4 -n 2
    gpt2 sample --model gpt2 --adapter poems=out/poems/adapter --prompt "The sea"   # a LoRA adapter (PEFT's format)
    gpt2 sample --model gpt2 --prompt "I think" --steer steer.json --sae res8=saes/blocks.8.hook_resid_pre

The model is a HF-format directory (what `gpt2 train` writes, or `save_pretrained`) or a Hub name. The
tokenizer is read from the model directory when it holds one (`gpt2 train` saves it there), else from
`--tokenizer`. --steer FILE.json holds a list of interventions applied while generating, as the server's
`steering` field (gpt2.inference.steering): {"hook": "blocks.6.hook_resid_pre", "vector": [...], "scale": 4}
or {"hook": ..., "sae": NAME, "feature": 123, "value": 8} with the SAE given as --sae NAME=DIR.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

from gpt2.cli.common import (
    add_adapter_argument,
    add_model_arguments,
    add_sampling_arguments,
    add_speculation_arguments,
    add_threads_argument,
    load_speculative_llm,
    sampling_params,
)

SAMPLE_SEPARATOR = "\n" + "-" * 40 + "\n"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sample",
        help="generate text from a model, streamed to the terminal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser, inference=True)
    parser.add_argument("--prompt", help="text to continue; read from stdin when absent or '-'")
    add_sampling_arguments(parser)
    parser.add_argument("--truncate", choices=["left"], help="cut a prompt longer than the context from the left")
    parser.add_argument("--slide-by", type=int, help="window shift past the context (default block_size // 4)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the decode step (GPU)")
    add_speculation_arguments(parser)
    add_adapter_argument(parser, "decode with this LoRA adapter on the model")
    parser.add_argument("--no-echo", action="store_true", help="print only the continuation, not the prompt")
    add_threads_argument(parser)
    parser.add_argument("--steer", metavar="FILE", help="JSON list of steering interventions (see above)")
    parser.add_argument(
        "--sae", action="append", default=[], metavar="NAME=DIR", help="an SAE (SAELens folder) --steer may name"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)  # every sampling flag is checked before anything is loaded or printed
    prompt = args.prompt
    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    if not prompt:
        raise ValueError("the prompt is empty; pass --prompt TEXT or pipe text on stdin")
    llm = load_speculative_llm(args)
    adapter = None
    if args.adapter is not None:
        adapter = args.adapter[0]
        llm.adapters.add(*args.adapter)
    steering = read_steering(args.steer, args.sae, llm.model)
    engine = dict(truncate=args.truncate, slide_by=args.slide_by, compile=args.compile)
    if params.num_beams > 1:  # beams are whole sequences: printed once found, best first
        beams = llm.generate(prompt, params, adapter=adapter, steering=steering)
        sys.stdout.write(SAMPLE_SEPARATOR.join(("" if args.no_echo else prompt) + beam for beam in beams) + "\n")
        sys.stdout.flush()
        return 0
    for sample in range(params.n):
        if sample:
            sys.stdout.write(SAMPLE_SEPARATOR)
        pieces = llm.stream(prompt, params.for_sample(sample), adapter=adapter, steering=steering, **engine)
        first = next(pieces, "")  # a prompt the model refuses (too long, bad ids) fails here, before any echo
        if not args.no_echo:
            sys.stdout.write(prompt)
        for piece in itertools.chain([first], pieces):
            sys.stdout.write(piece)
            sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()
    return 0


def read_steering(path: str | None, saes: list[str], model: Any) -> list[Any]:
    """The interventions in `path` (a JSON list), SAE names replaced by the SAEs given as NAME=DIR, each checked
    to fit `model` and moved to its device."""
    import json

    if path is None:
        if saes:
            raise ValueError("--sae is only used by --steer; pass --steer FILE.json too")
        return []
    try:
        items = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise FileNotFoundError(f"cannot read --steer {path!r}: {err.strerror}") from err
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"--steer {path!r} is not JSON ({err})") from err
    if not isinstance(items, list):
        raise ValueError(f"--steer {path!r} must hold a JSON list of interventions")
    loaded = load_saes(saes, model)
    return [
        {**item, "sae": loaded[item["sae"]]}
        if isinstance(item, dict) and isinstance(item.get("sae"), str) and item["sae"] in loaded
        else item
        for item in items
    ]


def load_saes(entries: list[str], model: Any = None) -> dict[str, Any]:
    """The SAEs of --sae NAME=DIR options, by name; with `model` (a GPT), each checked to fit it (gpt2.inspect.sae
    .load_sae) and moved to its device."""
    from gpt2.inspect.sae import load_sae

    loaded = {}
    for entry in entries:
        name, separator, directory = entry.partition("=")
        if not separator or not name or not directory:
            raise ValueError(f"--sae {entry!r} must be NAME=DIR (a name, '=', the SAE's folder)")
        if name in loaded:
            raise ValueError(f"--sae names two SAEs {name!r}; give each its own name")
        if model is None:
            loaded[name] = load_sae(directory)
        else:
            loaded[name] = load_sae(directory, model.config).to(model.transformer.wte.weight.device)
    return loaded
