"""Pretraining: `train(config)` prepares the tokenizer and data, builds a GPT, its optimizer and next-token
batch loaders, hands them to a `Trainer`, runs it, and samples from the result.

    >>> config = TrainConfig.from_name("stdlib", max_steps=10, out_dir="out/try")   # doctest: +SKIP
    >>> result = train(config)                                                       # doctest: +SKIP

Output directory layout (OUT = config.output.out_dir):

- OUT/config.json, OUT/model.safetensors and the tokenizer files: the latest weights, so `load_model(OUT)`
  and `gpt2 sample --model OUT` work during and after training.
- OUT/checkpoints/step_00000100/: the same model + tokenizer files plus `train_state.pt` (optimizer, step, RNG
  states, data position; plain tensors and containers, read back with `torch.load(weights_only=True)`) and
  `train_config.json`. Each is written into a hidden temporary folder and renamed into place, so a folder
  named step_* is always complete; the last `keep_checkpoints` are kept.
- OUT/metrics.jsonl (one JSON object per logged step or evaluation), OUT/loss.png (train and val curves).
- OUT/data/: the tokenized corpus and the tokenizer trained for it (reused by later runs with the same data).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import torch

from gpt2.api import LLM
from gpt2.config import GPTConfig
from gpt2.data import BatchLoader, TokenView, load_split
from gpt2.data.cache import DataSpec, prepare_data
from gpt2.eval import evaluate_hellaswag
from gpt2.inference import generate
from gpt2.model import GPT
from gpt2.runtime.device import resolve_device
from gpt2.tokenizer import TextTokenizer
from gpt2.train.checkpoint import previous_checkpoint
from gpt2.train.config import TrainConfig
from gpt2.train.distributed import Distributed, barrier, distributed_from_env, full_model, process_group, shard
from gpt2.train.optimizer import configure_optimizer
from gpt2.train.tracking import Tracking, require_trackers
from gpt2.train.trainer import (
    Evaluation,
    LoopOptions,
    Placement,
    Trainer,
    TrainingData,
    TrainResult,
    accumulation_steps,
)

DATA_DIR = "data"
EVAL_SEED_OFFSET = 1_000_003  # the val loader's seed is config.runtime.seed + this, so it never shares the train stream


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    stop_at_step: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Train as `config` says, writing checkpoints, metrics and the loss plot into config.output.out_dir.

    resume: continue from the latest checkpoint in out_dir (exactly: same losses and weights as an
    uninterrupted run on CPU). overwrite: start from scratch even though out_dir holds checkpoints of another
    run (they are deleted); without it that is a FileExistsError. stop_at_step: save and return after this
    step although the schedule runs to max_steps (to split a run into pieces). progress: show a progress bar.
    log: receives status lines. Under torchrun this runs data-parallel (config.runtime.parallel); only rank 0
    logs and writes. Raises TrainingDiverged on a non-finite loss (the last good checkpoint is left as it was).
    """
    dist = distributed_from_env()
    device = resolve_device(config.runtime.device, dist.local_rank)
    require_trackers(config.output.log_to)  # a missing extra is refused before anything is written
    with process_group(dist, device):
        say = log if (log is not None and dist.is_main) else (lambda message: None)
        out_dir = Path(config.output.out_dir)
        checkpoint = previous_checkpoint(out_dir, resume, overwrite, dist)

        # data: rank 0 tokenizes (once per out_dir), the others wait and then read the same folder
        pretrained = None
        if config.model.init_from:  # its tokenizer tokenizes the data: never a newly trained BPE
            pretrained = LLM.load(config.model.init_from, device="cpu")
            config = config.replace(tokenizer=_tokenizer_source(config.model.init_from))
        tokenizer, data_dir = _prepare_data(config, out_dir / DATA_DIR, dist, progress)
        if pretrained is not None and tokenizer.identity != pretrained.tokenizer.identity:
            raise ValueError(
                f"the data in {data_dir} was tokenized with {tokenizer.identity}, not the tokenizer of init_from "
                f"{config.model.init_from!r}; use another out_dir or data prepared with that tokenizer"
            )
        model_config = (
            config.model_config(tokenizer.vocab_size) if pretrained is None else _shape_from(pretrained.model, config)
        )
        B, T = config.data.batch_size, model_config.block_size
        train_tokens, val_tokens = _load_splits(config, data_dir, T)
        grad_accum = accumulation_steps(config, B * T, dist.world_size)
        evaluations = [hellaswag_evaluation(config, tokenizer, say)] if config.evaluation.hellaswag_file else []

        model = _build_model(config, model_config, pretrained.model if pretrained else None, device, dist)
        tracking = Tracking(config, enabled=dist.is_main)
        loader = functools.partial(BatchLoader, batch_size=B, block_size=T, rank=dist.rank, world_size=dist.world_size)
        data = TrainingData(
            loader(train_tokens, seed=config.runtime.seed),
            val_batches=lambda: loader(val_tokens, seed=config.runtime.seed + EVAL_SEED_OFFSET),
            tokenizer=tokenizer,
        )
        loop = LoopOptions(grad_accum_steps=grad_accum, end_step=stop_at_step, evaluations=evaluations,
                           callbacks=[tracking], log=say)  # fmt: skip
        optimizer = configure_optimizer(model, config.optimizer, device)
        trainer = Trainer(model, optimizer, config, data, Placement(device=device, dist=dist), loop)
        if checkpoint is not None:
            trainer.resume(checkpoint)
            if trainer.step >= config.schedule.max_steps:
                raise ValueError(
                    f"nothing to do: the checkpoint in {out_dir} is at step {trainer.step} and "
                    f"schedule.max_steps={config.schedule.max_steps}; raise schedule.max_steps to train further"
                )
        dtype_name = str(trainer.dtype).removeprefix("torch.")
        say(
            f"training {model.num_parameters():,} parameters on {device} ({dtype_name}), "
            f"world size {dist.world_size}: {len(train_tokens):,} train / {len(val_tokens):,} val tokens, "
            f"{B * T * grad_accum * dist.world_size:,} tokens per step (batch {B} x {T} x accum {grad_accum} x "
            f"{dist.world_size})" + (f"; resuming from {checkpoint}" if checkpoint is not None else "")
        )
        with tracking:
            result = trainer.fit(progress=progress)
            if config.evaluation.sample_tokens and not result.interrupted:
                sample_model = full_model(model) if trainer.sharded else model  # under FSDP every rank gathers
                if dist.is_main:
                    result.sample = sample_text(sample_model, tokenizer, config)
                    tracking.text("sample", result.sample)
        return result


def _build_model(
    config: TrainConfig, shape: GPTConfig, pretrained: GPT | None, device: torch.device, dist: Distributed
) -> GPT:
    """The GPT this run trains, on its device (sharded under FSDP): weights drawn from config.runtime.seed (the
    same on every rank), or init_from's, its position table cut to block_size."""
    torch.manual_seed(config.runtime.seed)
    model = GPT(shape)
    if pretrained is not None:
        model.load_state_dict(_cropped_state(pretrained, shape))
    model = model.to(device)
    model.activation_checkpointing = config.runtime.activation_checkpointing
    if dist.enabled and config.runtime.parallel == "fsdp":
        shard(model)
    return model


def sample_text(model: GPT, tokenizer: TextTokenizer, config: TrainConfig) -> str:
    """Continue sample_prompt by sample_tokens tokens (config.evaluation; seeded) and decode prompt + continuation."""
    ids = tokenizer.encode(config.evaluation.sample_prompt) or [tokenizer.eot_token]
    idx = torch.tensor([ids], dtype=torch.long, device=next(model.parameters()).device)
    model.eval()
    out = generate(model, idx, config.evaluation.sample_tokens, temperature=config.evaluation.sample_temperature,
                   top_k=config.evaluation.sample_top_k, seed=config.runtime.seed)  # fmt: skip
    return tokenizer.decode(out[0].tolist())


def hellaswag_evaluation(config: TrainConfig, tokenizer: TextTokenizer, say: Callable[[str], None]) -> Evaluation:
    """HellaSwag accuracy on config.evaluation.hellaswag_file, as a Trainer evaluation (every rank computes the same
    numbers; under FSDP every rank must take part in the forward passes)."""
    hellaswag_file = config.evaluation.hellaswag_file
    if hellaswag_file is None or not Path(hellaswag_file).is_file():
        raise FileNotFoundError(
            f"hellaswag_file {hellaswag_file!r} does not exist; pass a HellaSwag JSONL file or leave it unset"
        )

    def evaluate(model: torch.nn.Module, step: int) -> dict[str, float]:
        assert isinstance(model, GPT), "pretraining trains a GPT"
        result = evaluate_hellaswag(model, tokenizer, hellaswag_file, limit=config.evaluation.hellaswag_limit)
        say(f"step {step}: HellaSwag acc_norm {result['acc_norm']:.4f} ({result['num_examples']} examples)")
        return {"hellaswag_acc": result["acc"], "hellaswag_acc_norm": result["acc_norm"]}

    return evaluate


def _tokenizer_source(init_from: str) -> str:
    """Where the tokenizer of `init_from` is read from: the model directory (or Hub name), or an llm.c file's folder."""
    path = Path(init_from).expanduser()
    return str(path.parent) if path.is_file() else init_from


def _shape_from(pretrained: GPT, config: TrainConfig) -> GPTConfig:
    """The pretrained model's shape, with the run's block_size (at most its context) and dropout when set."""
    context = pretrained.config.block_size
    block_size = config.model.block_size or context
    if block_size > context:
        raise ValueError(
            f"block_size={block_size} exceeds the context of init_from {config.model.init_from!r} ({context} "
            "positions); "
            f"set block_size <= {context}"
        )
    dropout = pretrained.config.dropout if config.model.dropout is None else config.model.dropout
    return pretrained.config.replace(block_size=block_size, dropout=dropout, attn_impl="sdpa")


def _cropped_state(pretrained: GPT, config: GPTConfig) -> dict[str, torch.Tensor]:
    """The pretrained weights for a model of `config`: the position table keeps its first block_size rows."""
    state = pretrained.state_dict()
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"][: config.block_size]
    return state


def _prepare_data(
    config: TrainConfig, cache_dir: Path, dist: Distributed, progress: bool
) -> tuple[TextTokenizer, Path]:
    """The run's tokenizer and data folder: rank 0 prepares it, then the other ranks read what it made."""
    spec = DataSpec(data=config.data.source, tokenizer=config.data.tokenizer, vocab_size=config.data.vocab_size,
                    max_corpus_bytes=config.data.max_corpus_bytes, val_fraction=config.data.val_fraction)  # fmt: skip
    if dist.is_main:
        prepared = prepare_data(spec, cache_dir, progress=progress)
    barrier(dist)
    if not dist.is_main:
        prepared = prepare_data(spec, cache_dir, progress=False)
    return prepared


def _load_splits(config: TrainConfig, data_dir: Path, block_size: int) -> tuple[TokenView, TokenView]:
    """The train and val token streams (memory-mapped shards: memory does not grow with the corpus), refusing a
    split too short for one block (val only when evaluated)."""
    train_tokens, val_tokens = load_split(data_dir, "train"), load_split(data_dir, "val")
    for split, tokens in (("train", train_tokens), ("val", val_tokens)):
        if len(tokens) < block_size + 1 and (split == "train" or config.evaluation.eval_interval > 0):
            raise ValueError(
                f"the {split} split of {config.data.source!r} has {len(tokens)} tokens, fewer than block_size + 1 = "
                f"{block_size + 1}: give more text or set a smaller block_size"
                + ("" if split == "train" else " (or eval_interval=0 to skip evaluation)")
            )
    return train_tokens, val_tokens
