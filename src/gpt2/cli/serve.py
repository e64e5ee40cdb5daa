"""`gpt2 serve`: an OpenAI-compatible HTTP server (completions, chat, models, a playground at /).

    gpt2 serve --model out/run1
    gpt2 serve --model gpt2 --dtype int8 --port 8000 --api-key "$KEY"
    gpt2 serve --model gpt2-medium --draft distilgpt2     # speculative decoding for a lone request
    curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
        -d '{"model": "gpt2", "prompt": "Hello", "max_tokens": 20}'

Listens on 127.0.0.1 (this machine only) unless --host says otherwise. Concurrent requests are decoded together
(continuous batching); SIGTERM or Ctrl-C lets requests in flight finish for --drain-seconds, then exits.
The API key may also come from the GPT2_SERVE_API_KEY environment variable (kept out of the process list).
"""

from __future__ import annotations

import argparse
import os
from functools import partial
from typing import Any

from gpt2.cli.common import add_model_arguments, add_speculation_arguments, load_speculative_llm
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
    add_model_arguments(parser, inference=True)
    parser.add_argument("--served-model-name", help="the model's name in the API (default: --model)")
    parser.add_argument("--host", default=defaults.host, help=f"interface to listen on (default {defaults.host})")
    parser.add_argument("--port", type=int, default=defaults.port, help=f"TCP port (default {defaults.port})")
    parser.add_argument(
        "--api-key", default=os.environ.get(API_KEY_ENV), help=f"require this bearer key (default: ${API_KEY_ENV})"
    )
    parser.add_argument("--max-batch", type=int, default=defaults.max_batch, help="sequences decoded together at most")
    parser.add_argument(
        "--max-queue", type=int, default=defaults.max_queue, help="sequences waiting at most (then 429)"
    )
    parser.add_argument(
        "--drain-seconds",
        type=int,
        default=defaults.drain_seconds,
        help="on SIGTERM, how long requests in flight may take to finish",
    )
    parser.add_argument(
        "--no-prefix-cache",
        dest="prefix_cache",
        action="store_false",
        help="prefill every prompt in full (default: reuse the keys and values of earlier prompts' prefixes)",
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=defaults.prefix_cache_mb,
        help=f"memory for the prefix cache, allocated at start, in MiB (default {defaults.prefix_cache_mb})",
    )
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        default=defaults.prefill_chunk,
        help="prompt tokens prefilled between two decode steps at most; longer prompts go in chunks "
        f"(default {defaults.prefill_chunk})",
    )
    add_speculation_arguments(parser)  # used for a request decoding alone (gpt2.serve.engine)
    parser.add_argument(
        "--sae", action="append", default=[], metavar="NAME=DIR", help="an SAE requests' steering may name"
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
    )


def run(args: argparse.Namespace) -> int:
    config = server_config(args)  # every setting is checked before the model loads
    try:
        from gpt2.serve.server import serve
    except ModuleNotFoundError as err:
        raise ValueError(f"gpt2 serve needs the package {err.name!r}: pip install 'gpt2-faithful[serve]'") from err
    saes = load_saes(args.sae)
    serve(partial(load_speculative_llm, args), config, log_level=args.log_level, saes=saes)
    return 0
