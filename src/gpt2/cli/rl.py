"""`gpt2 rl --model DIR --prompts FILE.jsonl --reward FILE.py:FUNCTION --out DIR [--set KEY=VALUE ...]
[--resume | --overwrite]`.

Reinforcement learning with verifiable rewards (GRPO, as TRL's GRPOTrainer defines it), completions drawn by the
server's batching engine from the policy's own weights; writes the trained model + tokenizer into --out.
"""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "rl",
        help="reinforcement learning with verifiable rewards (GRPO): sample, score, reinforce",
        description=(
            "Train a model with GRPO (TRL's GRPOTrainer's objective, names and defaults): each step samples "
            "num_generations completions of batch_prompts prompts with the serving engine from the current weights, "
            "scores them with the reward function, and reinforces those above their group's mean. Prompts: a JSONL "
            "file with a 'prompt' (text, or chat messages) and any other fields, which reach the reward function "
            "by name: def reward(prompts, completions, **columns) -> list[float]. Built-in tasks: "
            "--prompts builtin:addition --reward builtin:addition. Settings: see gpt2.rl.RLConfig "
            "(--set num_generations=8 --set beta=0.04 --set loss_type=grpo --set max_steps=200 ...)."
        ),
    )
    parser.add_argument("--model", required=True, help="the policy to start from: HF directory or Hub name")
    parser.add_argument("--prompts", required=True, help='JSONL file of {"prompt": ...} rows, or builtin:NAME')
    parser.add_argument("--reward", required=True, help="FILE.py:FUNCTION (your own code) or builtin:NAME")
    parser.add_argument("--out", required=True, help="output directory (a run's checkpoints there need --resume or "
                        "--overwrite)")  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="an RL or training setting (repeatable), e.g. --set num_generations=8 --set learning_rate=1e-5 "
             "--set log_to=tensorboard",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="start from scratch, deleting the checkpoints of an earlier run in --out")  # fmt: skip
    parser.add_argument("--stop-at-step", type=int, metavar="N", help="save and stop after step N")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from gpt2.cli.train import EXIT_INTERRUPTED
    from gpt2.rl import RLConfig, rl
    from gpt2.runtime.files import disk_errors_named

    config = RLConfig.from_settings(args.overrides, model=args.model, prompts=args.prompts, reward=args.reward,
                                    out_dir=args.out)  # fmt: skip

    def log(message: str) -> None:
        tqdm.write(message, file=sys.stderr)

    with disk_errors_named(args.out):
        result = rl(config, resume=args.resume, overwrite=args.overwrite, stop_at_step=args.stop_at_step,
                    progress=not args.no_progress, log=log)  # fmt: skip
    if result.interrupted:
        print(f"interrupted at step {result.step}; checkpoint saved in {result.out_dir}; continue with --resume")
        return EXIT_INTERRUPTED
    held_out = ""
    if result.eval_rewards:
        steps = sorted(result.eval_rewards)
        held_out = f"; eval_reward {result.eval_rewards[steps[-1]]:.3f} (step {steps[0]}: " \
                   f"{result.eval_rewards[steps[0]]:.3f})"  # fmt: skip
    print(f"step {result.step}: reward {result.last_reward:.3f} (first {result.first_reward:.3f}){held_out}")
    print(f"saved: {result.out_dir} (model + tokenizer), metrics.jsonl, loss.png, reward.png")
    return 0
