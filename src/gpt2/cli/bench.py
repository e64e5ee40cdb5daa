"""`gpt2 bench AREA`: measure speed over a grid, with repetitions, against peers in the same run.

Every measurement is one record (area, name, params, value, unit, peer, peer_value, ratio, machine, torch, commit,
date, command): `-o json` prints one JSON line per record as it is measured, `-o md` a table at the end, and
`--save FILE` appends the JSON lines to FILE. The model is a random GPT-2 of --preset's shape (124M by default, no
download) unless --model names one. Peers are opt-in: --peer transformers|onnxruntime|tiktoken|peft, llama.cpp's
binaries by path (--llama-bench, --llama-server), nanoGPT by the path of its checkout (--nanogpt).

    gpt2 bench decode --precisions float32,int8 --batch-sizes 1,8 --peer transformers -o md
    gpt2 bench serve --clients 1,4,16,64 --llama-server ~/llama.cpp/build/bin/llama-server
    gpt2 bench gpu-profile --device cuda --save gpu-profile.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gpt2.bench.record import Recorder, env_threads, environment_here
from gpt2.bench.setup import BenchSettings

AREAS = ("decode", "prefill", "serve", "train", "tokenizer", "eval", "finetune", "rl", "gpu-profile", "all")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure speed against peers", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    areas = parser.add_subparsers(dest="area", metavar="AREA", required=True)
    adders = {"decode": add_decode, "prefill": add_prefill, "serve": add_serve, "train": add_train,
              "tokenizer": add_tokenizer, "eval": add_eval, "finetune": add_finetune, "rl": add_rl,
              "gpu-profile": add_profile, "all": add_all}  # fmt: skip
    helps = {
        "decode": "decode tokens/s per precision and batch size; at batch 1 the weight GB/s against the read bandwidth",
        "prefill": "prompt processing tokens/s per precision and prompt length",
        "serve": "the server under 1..N concurrent clients: tokens/s, TTFT, ITL",
        "train": "training step time, tokens/s, MFU; time to a target loss",
        "tokenizer": "encode MB/s, BPE training time",
        "eval": "sliding-window perplexity tokens/s",
        "finetune": "fine-tuning tokens/s and memory, full and LoRA",
        "rl": "RL rollout completions/s (GRPO groups) against TRL's generate",
        "gpu-profile": "the prepared GPU profile (train, decode, serve) into a JSON-lines file",
        "all": "a whole profile (--profile gpu)",
    }
    for area in AREAS:
        sub = areas.add_parser(area, help=helps[area], description=helps[area])
        add_common(sub)
        adders[area](sub)
        sub.set_defaults(func=run, bench_parser=sub)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", help="model directory or file (default: a random model of --preset's shape)")
    parser.add_argument("--preset", default="gpt2", help="shape of the random model (default gpt2: 124M)")
    parser.add_argument("--tokenizer", help="tokenizer directory, Hub name or 'bytes' (default: the model's, gpt2)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, auto (default cpu)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--repetitions", type=int, default=3, help="timed runs of each measurement (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument("-o", "--output", choices=["json", "md"], default="json", help="JSON lines or a table")
    parser.add_argument("--save", type=Path, help="also append the records to this JSON-lines file")


def add_decode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precisions", default="float32,bfloat16,int8,int4", help="comma-separated")
    parser.add_argument("--batch-sizes", default="1", help="comma-separated (default 1)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    add_decode_peers(parser)


def add_prefill(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--precisions", default="float32,bfloat16,int8,int4", help="comma-separated")
    parser.add_argument("--prompt-tokens", default="128,512", help="prompt lengths, comma-separated")
    add_decode_peers(parser)


def add_decode_peers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peer", action="append", default=[], choices=["transformers", "onnxruntime"])
    parser.add_argument("--llama-bench", type=Path, help="llama.cpp's llama-bench binary: llama.cpp as a peer")


def add_serve(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clients", default="1,4,16,64", help="concurrent clients, comma-separated")
    parser.add_argument("--requests", type=int, default=2, help="requests per client, one after the other")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="float32", help="the served precision (default float32)")
    parser.add_argument("--max-batch", type=int, default=16, help="sequences at once (llama-server: slots)")
    parser.add_argument("--url", help="measure this running server instead of starting `gpt2 serve`")
    parser.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary: it as a peer")
    parser.add_argument(
        "--adapters",
        type=int,
        default=0,
        help="spread the clients over this many LoRA adapters, against the base model alone",
    )
    parser.add_argument("--adapter-rank", type=int, default=8, help="the adapters' rank (default 8)")


def add_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--optimizers", default="adamw", help="adamw, muon, comma-separated")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 (autocast)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (both sides)")
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout: its model.py as the peer")
    parser.add_argument("--target-loss", type=float, help="also the time to this training loss on --data")
    parser.add_argument("--data", type=Path, help="a text file for --target-loss")
    parser.add_argument("--max-steps", type=int, default=2000, help="give up on --target-loss after this many")


def add_tokenizer(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--text", type=Path, help="text to encode (default: Python's stdlib source)")
    parser.add_argument("--text-mb", type=float, default=3.0, help="MB of stdlib source without --text")
    parser.add_argument("--peer", action="append", default=[], choices=["tiktoken"])
    parser.add_argument("--train-vocab", type=int, default=0, help="also train a BPE of this vocabulary")


def add_eval(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokens", type=int, default=1537, help="length of the random token stream")
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--peer", action="append", default=[], choices=["transformers"])


def add_finetune(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--methods", default="full,lora", help="full, lora, comma-separated")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=128)
    parser.add_argument("--peer", action="append", default=[], choices=["transformers", "peft"])


def add_rl(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=8, help="prompts per batch (default 8)")
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt, G (default 8)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion at most")
    parser.add_argument("--max-batch", type=int, help="sequences our engine decodes at once (default: all)")
    parser.add_argument("--peer", action="append", default=[], choices=["trl"])


PROFILE_FILE = Path("gpu-profile.jsonl")


def add_profile(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="the same steps, tiny model, CPU, seconds")
    parser.set_defaults(profile="gpu", save=PROFILE_FILE)  # the records always go to a file too
    for action in parser._actions:
        if action.dest == "save":
            action.help = f"append the records to this JSON-lines file (default {PROFILE_FILE})"


def add_all(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", required=True, choices=["gpu"], help="which profile")
    add_profile(parser)


def command_of(args: argparse.Namespace) -> list[str]:
    """The `gpt2 bench` arguments that reproduce this run: the area and every option not at its default."""
    parser: argparse.ArgumentParser = args.bench_parser
    argv = ["bench", args.area]
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or action.dest == "help" or value == action.default:
            continue
        flag = max(action.option_strings, key=len)
        if action.nargs == 0:
            argv.append(flag)
        else:
            for item in value if isinstance(value, list) else [value]:
                argv += [flag, str(item)]
    return argv


def names(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def run(args: argparse.Namespace) -> int:
    from gpt2.bench import decode, evaluate, finetune, profile, rl, serve, tokenizer, train
    from gpt2.bench.decode import parse_ints

    env_threads(args.threads)
    settings = BenchSettings(model=args.model, preset=args.preset, tokenizer=args.tokenizer, device=args.device,
                             repetitions=args.repetitions, warmup=args.warmup)  # fmt: skip
    recorder = Recorder(environment_here(command_of(args), settings.torch_device), args.output, args.save)
    area = args.area
    if area in ("decode", "prefill"):
        grid = decode.DecodeGrid(
            precisions=names(args.precisions), peers=tuple(args.peer), llama_bench=args.llama_bench,
            **({"prefill_tokens": parse_ints(args.prompt_tokens)} if area == "prefill" else
               {"batch_sizes": parse_ints(args.batch_sizes), "prompt_tokens": args.prompt_tokens,
                "new_tokens": args.new_tokens}),
        )  # fmt: skip
        decode.run_decode(settings, grid, recorder, prefill=area == "prefill")
    elif area == "serve":
        load = serve.ServeLoad(clients=parse_ints(args.clients), requests=args.requests,
                               prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens, dtype=args.dtype,
                               max_batch=args.max_batch, url=args.url, llama_server=args.llama_server,
                               adapters=args.adapters, adapter_rank=args.adapter_rank)  # fmt: skip
        serve.run_serve(settings, load, recorder)
    elif area == "train":
        grid_train = train.TrainGrid(optimizers=names(args.optimizers), batch_size=args.batch_size,
                                     block_size=args.block_size, dtype=args.dtype, compile=args.compile,
                                     nanogpt=args.nanogpt, target_loss=args.target_loss, data=args.data,
                                     max_steps=args.max_steps)  # fmt: skip
        train.run_train(settings, grid_train, recorder)
    elif area == "tokenizer":
        work = tokenizer.TokenizerWork(text=args.text, text_mb=args.text_mb, peers=tuple(args.peer),
                                       train_vocab=args.train_vocab)  # fmt: skip
        tokenizer.run_tokenizer(settings, work, recorder)
    elif area == "eval":
        evaluate.run_eval(
            settings,
            evaluate.EvalWork(
                tokens=args.tokens, stride=args.stride, batch_size=args.batch_size, peers=tuple(args.peer)
            ),
            recorder,
        )
    elif area == "finetune":
        finetune.run_finetune(settings, finetune.FinetuneWork(methods=names(args.methods), batch_size=args.batch_size,
                                                              block_size=args.block_size, peers=tuple(args.peer)),
                              recorder)  # fmt: skip
    elif area == "rl":
        rl.run_rl(settings, rl.RolloutWork(prompts=args.prompts, generations=args.generations,
                                           prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                                           max_batch=args.max_batch, peers=tuple(args.peer)), recorder)  # fmt: skip
    else:  # gpu-profile, all --profile gpu
        profile.run_gpu_profile(settings, recorder, dry_run=args.dry_run)
    recorder.finish()
    return 0
