"""`gpt2 train [PRESET | CONFIG.toml] [--set KEY=VALUE ...] [--resume]`: train a GPT-2 model.

With no arguments it runs the "stdlib" preset: a small GPT-2 trained on this Python's standard library source
with its own BPE tokenizer, in a few minutes on a CPU, writing into out/stdlib. Under torchrun it trains
data-parallel on every process (`torchrun --nproc_per_node N -m gpt2.cli train ...`).
"""

from __future__ import annotations

import argparse
import sys

EXIT_INTERRUPTED = 130  # the shell's convention for a run ended by Ctrl-C (here: after saving a checkpoint)
EXIT_DIVERGED = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    from gpt2.cli.common import add_renamed_argument
    from gpt2.train.config import PRESETS

    parser = subparsers.add_parser(
        "train",
        help="train a model (default: the built-in 'stdlib' preset, a few CPU minutes)",
        description=(
            "Train a GPT-2 model. CONFIG is a preset name or a TOML file of [section] tables of training config "
            'keys (`preset = "NAME"` starts from a preset). --set SECTION.FIELD=VALUE overrides any key '
            '(schedule.max_steps=200); the value is read as TOML (200, 3e-4, true, "text") or else as a plain '
            "string (cpu, out/run1). The flat keys (max_steps) are aliases, noted on stderr when used. "
            f"Presets: {', '.join(PRESETS)}. Keys: see --print-config and docs/training.md."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", nargs="?", default="stdlib", metavar="CONFIG",
                        help="preset name or TOML file (default: stdlib)")  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (repeatable), e.g. --set schedule.max_steps=200 --set runtime.device=cpu",
    )  # fmt: skip
    add_renamed_argument(
        parser, "--out", "--out-dir", metavar="DIR", help="output directory (same as --set output.out_dir=DIR)"
    )
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the out dir")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="start from scratch, deleting the checkpoints of an earlier run in the out dir",
    )  # fmt: skip
    parser.add_argument("--stop-at-step", type=int, metavar="N",
                        help="save and stop after step N (the LR schedule still runs to max_steps)")  # fmt: skip
    parser.add_argument("--print-config", action="store_true", help="print the resolved config as TOML and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpt2.runtime.files import disk_errors_named
    from gpt2.train import TrainingDiverged, distributed_from_env, train
    from gpt2.train.config import ConfigError, load_config

    is_main = distributed_from_env().is_main
    overrides = list(args.overrides)
    if args.out:
        overrides.append(f"output.out_dir={args.out}")

    def notice(line: str) -> None:
        if is_main:  # once per run, not once per torchrun process
            print(f"gpt2 train: {line}", file=sys.stderr)

    try:
        config = load_config(args.config, overrides, notice=notice)
    except ConfigError as err:  # one line per problem, each under the command's name
        for problem in err.problems:
            print(f"gpt2 train: error: {problem}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_toml(), end="")
        return 0

    def log(message: str) -> None:
        from tqdm.auto import tqdm

        tqdm.write(message, file=sys.stderr)

    try:
        with disk_errors_named(config.output.out_dir):
            result = train(config, resume=args.resume, overwrite=args.overwrite, stop_at_step=args.stop_at_step,
                           progress=not args.no_progress, log=log)  # fmt: skip
    except TrainingDiverged as err:
        if is_main:
            print(f"gpt2 train: stopped: {err}", file=sys.stderr)
        return EXIT_DIVERGED
    if not is_main:
        return 0
    final_val = result.val_losses.get(result.step)
    summary = f"step {result.step}: train loss {result.losses[-1]:.4f}" if result.losses else f"step {result.step}"
    if final_val is not None:
        summary += f", val loss {final_val:.4f}"
    print(f"{summary}; {result.tokens_per_second:,.0f} tokens/s; {result.seconds:.0f} s")
    print(f"saved: {result.out_dir} (model + tokenizer), {result.checkpoint}, "
          f"{result.out_dir / 'metrics.jsonl'}, {result.out_dir / 'loss.png'}")  # fmt: skip
    if result.interrupted:
        print(f"interrupted; continue with: gpt2 train {args.config} --resume" +
              "".join(f" --set {item}" for item in overrides))  # fmt: skip
        return EXIT_INTERRUPTED
    if result.sample is not None:
        sampling = config.evaluation
        print(f"sample ({sampling.sample_tokens} tokens after {sampling.sample_prompt!r}):\n{result.sample}")
    return 0
