"""`gpt2 serve`: an OpenAI-compatible HTTP server (completions, chat, models, a playground at /).

    gpt2 serve gpt2                                       # the model may also be given as --model gpt2
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "gpt2", "prompt": "Hello", "max_tokens": 20}'
    gpt2 serve out/run1 --dtype int8 --port 8001 --api-key "$KEY" --threads 4
    gpt2 serve gpt2-medium --draft distilgpt2             # speculative decoding for a lone request
    gpt2 serve gpt2 --lora poems=out/poems sql=out/sql    # "model": "poems" picks an adapter, per request

Listens on 127.0.0.1 (this machine only) unless --host says otherwise. Concurrent requests are decoded together
(continuous batching); SIGTERM or Ctrl-C lets requests in flight finish for --drain-seconds, then exits.
The API key may also come from the GPT2_SERVE_API_KEY environment variable (kept out of the process list).
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from typing import Any

from gpt2.cli.common import (
    MODEL_HELP,
    adapter_spec,
    add_flags,
    add_model_arguments,
    add_speculation_arguments,
    add_threads_argument,
    load_speculative_llm,
)
from gpt2.cli.sample import load_saes
from gpt2.serve.config import ServerConfig

API_KEY_ENV = "GPT2_SERVE_API_KEY"


def register(subparsers: Any) -> None:
    defaults = ServerConfig()
    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model_path", nargs="?", metavar="MODEL", help=f"the model to serve, as --model: {MODEL_HELP}")
    add_model_arguments(parser, inference=True, required=False)
    add_threads_argument(parser)
    add_flags(parser, [
        (("--served-model-name",), "the model's name in the API (default: --model)", {}),
        (("--host",), f"interface to listen on (default {defaults.host})", {"default": defaults.host}),
        (("--port",), f"TCP port (default {defaults.port})", {"type": int, "default": defaults.port}),
        (("--api-key",), f"require this bearer key (default: ${API_KEY_ENV})",
         {"default": os.environ.get(API_KEY_ENV)}),
        (("--max-batch",), "sequences decoded together at most", {"type": int, "default": defaults.max_batch}),
        (("--max-queue",), "sequences waiting at most (then 429)", {"type": int, "default": defaults.max_queue}),
        (("--drain-seconds",), "on SIGTERM, how long requests in flight may take to finish",
         {"type": int, "default": defaults.drain_seconds}),
        (("--no-prefix-cache",), "prefill every prompt in full (default: reuse the keys and values of earlier "
         "prompts' prefixes)", {"dest": "prefix_cache", "action": "store_false"}),
        (("--prefix-cache-mb",), "memory for the prefix cache, allocated at start, in MiB (default "
         f"{defaults.prefix_cache_mb})", {"type": int, "default": defaults.prefix_cache_mb}),
        (("--prefill-chunk",), "prompt tokens prefilled between two decode steps at most; longer prompts go in chunks "
         f"(default {defaults.prefill_chunk})", {"type": int, "default": defaults.prefill_chunk}),
        (("--grammar-timeout",), "CPU seconds a request's json_schema or regex may take to compile (then 400; other "
         f"requests run meanwhile; default {defaults.grammar_timeout:g})",
         {"type": float, "default": defaults.grammar_timeout, "metavar": "S"}),
        (("--max-connections",), "connections open at once at most; past it a request gets 503 (default "
         f"{defaults.max_connections})", {"type": int, "default": defaults.max_connections}),
        (("--header-timeout",), "seconds a client may take to send a request's headers, then its connection is "
         f"closed (default {defaults.header_timeout_seconds})",
         {"type": int, "default": defaults.header_timeout_seconds, "metavar": "S"}),
    ])  # fmt: skip
    add_speculation_arguments(parser)  # used for a request decoding alone (gpt2.serve.engine)
    parser.add_argument(
        "--sae",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="an SAE requests' steering may name (SAELens' format; one that does not fit the model, or reads a hook "
        "steering does not use, is refused at start)",
    )
    parser.add_argument(
        "--lora",
        "--lora-modules",
        nargs="+",
        action="extend",
        type=adapter_spec,
        default=[],
        metavar="NAME=DIR",
        help="LoRA adapters (PEFT's format, or LoRA `gpt2 finetune` output folders) a request's `model` may name",
    )
    parser.add_argument(
        "--allow-runtime-lora-updating",
        action="store_true",
        help="let POST /v1/load_lora_adapter and /v1/unload_lora_adapter change the adapters while serving",
    )
    parser.add_argument(
        "--max-cpu-loras",
        type=int,
        default=defaults.max_cpu_loras,
        metavar="N",
        help=f"LoRA adapters held at once at most, --lora's included; a run-time load past it is a 400 (default "
        f"{defaults.max_cpu_loras}: at rank {defaults.max_lora_rank} on every layer of GPT-2 small, about 600 MB)",
    )
    parser.add_argument(
        "--max-lora-rank",
        type=int,
        default=defaults.max_lora_rank,
        metavar="R",
        help=f"the largest rank an adapter may have (default {defaults.max_lora_rank}: PEFT's usual ranks, 8 to 64, "
        "fit; a larger rank is refused at start, or with a 400 at run time)",
    )
    parser.add_argument(
        "--lora-root",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder run-time loads may read adapters from (repeatable); with it, a lora_path outside every such "
        "folder, symlinks and '..' resolved, is a 400 (default: any folder the server can read)",
    )
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    parser.set_defaults(func=run)


def server_config(args: argparse.Namespace) -> ServerConfig:
    """The settings the flags give, checked (a ValueError names the bad one)."""
    return ServerConfig(
        model_name=args.served_model_name or str(args.model),
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        drain_seconds=args.drain_seconds,
        prefix_cache=args.prefix_cache,
        prefix_cache_mb=args.prefix_cache_mb,
        prefill_chunk=args.prefill_chunk,
        max_connections=args.max_connections,
        header_timeout_seconds=args.header_timeout,
        grammar_timeout=args.grammar_timeout,
        runtime_lora_updating=args.allow_runtime_lora_updating,
        max_cpu_loras=args.max_cpu_loras,
        max_lora_rank=args.max_lora_rank,
        lora_roots=tuple(args.lora_root),
    )


def choose_model(args: argparse.Namespace) -> None:
    """Set args.model from the positional MODEL or --model: exactly one of them."""
    if args.model_path is not None and args.model is not None and args.model_path != args.model:
        raise ValueError(f"two models given ({args.model_path} and --model {args.model}); pass one")
    args.model = args.model_path or args.model
    if args.model is None:
        raise ValueError("no model given: gpt2 serve MODEL (or --model MODEL), e.g. gpt2 serve gpt2")


def run(args: argparse.Namespace) -> int:
    choose_model(args)
    config = server_config(args)  # every setting is checked before the model loads
    try:
        from gpt2.serve.server import serve
    except ModuleNotFoundError as err:
        raise ValueError(f"gpt2 serve needs the package {err.name!r}: pip install 'gpt2-faithful[serve]'") from err
    saes = load_saes(args.sae)  # every SAE file read and checked before the model loads
    serve(partial(load_fitting, args, saes), config, log_level=args.log_level, saes=saes)
    return 0


def load_fitting(args: argparse.Namespace, saes: dict[str, Any]) -> Any:
    """The model of the flags, every --sae checked to fit it: a misfit is one line naming the --sae, at start."""
    from gpt2.inspect.sae import check_sae_config_fits

    llm = load_speculative_llm(args)
    for entry in args.sae:
        name, _, directory = entry.partition("=")
        try:
            check_sae_config_fits(llm.model.config, saes[name].config)
        except ValueError as err:
            raise ValueError(f"--sae {name}={directory}: {err}") from err
    return llm
