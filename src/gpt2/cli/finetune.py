"""`gpt2 finetune --model DIR_OR_NAME --data PATH --out DIR [--task lm|classification] [--method full|lora]
[--set KEY=VALUE ...] [--resume | --overwrite]`.

Fine-tunes a pretrained model with its own tokenizer on a text file or folder, JSONL (text, prompt/completion or
chat records) or CSV (--set text_column=NAME); writes an HF-format model + tokenizer into --out. With --task
classification: JSONL/CSV text + label records (--set text_field=NAME label_field=NAME); writes a
GPT2ForSequenceClassification directory that `gpt2 classify --model OUT TEXT` reads.
"""

from __future__ import annotations

import argparse
import sys

from gpt2.cli.common import OldSpelling


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune a pretrained model on your data (full or LoRA; language model or classifier)",
        description=(
            "Fine-tune a pretrained GPT-2 (HF directory or Hub name) with its tokenizer. Data: a text file or folder "
            "(documents separated by <|endoftext|>), .jsonl with a text field, prompt/completion pairs (loss on "
            "the completion) or chat `messages` (loss on assistant turns), or .csv (--set text_column=NAME). "
            "Defaults: LR 1e-4 (1e-3 with --method lora), 10 warmup steps, 10% val split, the best checkpoint by val "
            "loss is the output. --task classification: .jsonl/.csv text + label records (--set text_field=... "
            "--set label_field=...), a score head on the last token, val accuracy at each evaluation. The memory "
            "estimate is printed first and a run that cannot fit memory_budget is refused (--set batch_size=auto "
            "picks the micro-batch; --set activation_checkpointing=true). Settings: see "
            "gpt2.finetune.FinetuneConfig (--set KEY=VALUE)."
        ),
    )
    parser.add_argument("--model", required=True, help="pretrained model: HF directory or Hub name (e.g. gpt2)")
    parser.add_argument("--data", required=True, help="text file or folder, .jsonl or .csv")
    parser.add_argument("--out", required=True, help="output directory (a run's checkpoints there need --resume or "
                        "--overwrite)")  # fmt: skip
    parser.add_argument("--task", choices=("lm", "classification"), default=None,
                        help="lm (default): next-token fine-tuning; classification: text + label records")  # fmt: skip
    parser.add_argument("--method", choices=("full", "lora"), default="full",
                        help="full (default): train every weight; lora: LoRA adapters only (also saved in PEFT's "
                             "format)")  # fmt: skip
    parser.add_argument("--lora", dest="method", action=OldSpelling, new="--method lora", nargs=0, const="lora",
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="a fine-tuning or training setting (repeatable), read as gpt2 train reads --set, e.g. --set max_steps=500 "
             "--set lora_rank=16 --set patience=3 --set log_to=tensorboard",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    parser.add_argument(
        "--overwrite", action="store_true",
        help="start from scratch, deleting the checkpoints of an earlier run in --out",
    )  # fmt: skip
    parser.add_argument("--stop-at-step", type=int, metavar="N",
                        help="save and stop after step N (the LR schedule still runs to max_steps)")  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from gpt2.cli.train import EXIT_INTERRUPTED
    from gpt2.finetune import FinetuneConfig, finetune
    from gpt2.runtime.files import disk_errors_named

    values: dict[str, object] = {"model": args.model, "data": args.data, "out_dir": args.out}
    if args.method == "lora":
        values["lora"] = True
    if args.task is not None:
        values["task"] = args.task
    config = FinetuneConfig.from_settings(args.overrides, **values)

    def log(message: str) -> None:
        tqdm.write(message, file=sys.stderr)

    with disk_errors_named(args.out):
        result = finetune(config, resume=args.resume, overwrite=args.overwrite, stop_at_step=args.stop_at_step,
                          progress=not args.no_progress, log=log)  # fmt: skip
    if result.interrupted:
        again = [a for a in sys.argv[2:] if a != "--overwrite"] if sys.argv[1:2] == ["finetune"] else []
        print(f"interrupted at step {result.step}; checkpoint saved in {result.out_dir}; continue with: "
              + " ".join(["gpt2 finetune", *again, *([] if "--resume" in again else ["--resume"])]))  # fmt: skip
        return EXIT_INTERRUPTED
    accuracy = f", val accuracy {result.best_val_accuracy:.3f}" if result.best_val_accuracy is not None else ""
    print(f"step {result.step}: best val loss {result.best_val_loss:.4f}{accuracy} at step {result.best_step} "
          f"(first {result.first_val_loss:.4f})" + ("; stopped early" if result.stopped_early else ""))  # fmt: skip
    if config.task == "classification":
        print(f"saved: {result.out_dir} (classifier + tokenizer; `gpt2 classify --model {result.out_dir} TEXT`), "
              "metrics.jsonl, loss.png")  # fmt: skip
        return 0
    print(f"saved: {result.out_dir} (model + tokenizer + chat_template.json), metrics.jsonl, loss.png"
          + (", adapter/ (PEFT)" if config.lora else ""))  # fmt: skip
    if result.sample is not None:
        print(f"sample:\n{result.sample}")
    return 0
