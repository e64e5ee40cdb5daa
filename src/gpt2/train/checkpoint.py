"""Training-state checkpoints: a run's folder of resumable states, written so a crash never leaves half of one.

OUT/checkpoints/step_00000100/ holds the model (HF format, `gpt2.weights.load_model` reads it) and tokenizer files,
`train_state.pt` (optimizer, step, RNG states, data position: plain tensors and containers, read back with
`torch.load(weights_only=True)`, so a crafted pickle is refused, never run) and `train_config.json`. Each is
written into a hidden temporary folder and renamed into place, so a folder named step_* is always complete.
A model that is more than a plain GPT (e.g. a GPTForSequenceClassification, whose `score` head GPT-2's LM layout
has no place for) also gets `model_state.safetensors`, its whole state_dict, which resuming loads instead.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from safetensors.torch import load_model, save_file, save_model

from gpt2.model import GPT
from gpt2.runtime.files import atomic_copy_file
from gpt2.tokenizer import TextTokenizer
from gpt2.train.config import TrainConfig
from gpt2.train.distributed import Distributed, barrier
from gpt2.weights import config_from_hf, load_hf_state_dict, read_hf_state_dict, save_pretrained

TRAIN_STATE_FILE = "train_state.pt"
TRAIN_CONFIG_FILE = "train_config.json"
MODEL_STATE_FILE = "model_state.safetensors"
TRAINABLE_FILE = "trainable.safetensors"
TRAIN_STATE_FORMAT = "gpt2-train-state"
TRAIN_STATE_VERSION = 1
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_PREFIX = "step_"


def checkpoint_dirs(out_dir: str | os.PathLike[str]) -> list[Path]:
    """The complete checkpoint folders of a run, oldest first (a temporary folder is never listed)."""
    root = Path(out_dir) / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)]
    return sorted(found, key=lambda p: int(p.name[len(CHECKPOINT_PREFIX) :]))


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder of a run, or None."""
    found = checkpoint_dirs(out_dir)
    return found[-1] if found else None


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: GPT,
    tokenizer: TextTokenizer | None,
    state: dict[str, Any],
    config: TrainConfig,
    keep: int,
) -> Path:
    """Write OUT/checkpoints/step_N atomically (a temporary folder renamed into place), drop all but the last
    `keep`, then copy the model and tokenizer files to OUT's top level. `state` holds plain tensors and containers."""

    def write_model(folder: Path) -> None:
        save_pretrained(model, folder)
        if type(model) is not GPT:  # a subclass's extra weights: the full state_dict (tied tensors saved once)
            save_model(model, str(folder / MODEL_STATE_FILE))
        if tokenizer is not None:
            tokenizer.save(folder)

    final = write_checkpoint(out_dir, step, write_model, state, config, keep)
    # The latest model and tokenizer at the top level too, for `gpt2 sample --model OUT`: copied from the
    # checkpoint just written (the weights are serialized once per save), each file atomically.
    for file in sorted(final.iterdir()):
        if file.name not in (TRAIN_STATE_FILE, TRAIN_CONFIG_FILE, MODEL_STATE_FILE):
            atomic_copy_file(file, out_dir / file.name)
    return final


def save_trainable_checkpoint(
    out_dir: Path, step: int, model: nn.Module, state: dict[str, Any], config: TrainConfig, keep: int
) -> Path:
    """A checkpoint of only the parameters that train (TRAINABLE_FILE): for fine-tuning, whose frozen weights
    come from the pretrained model and whose output model is written at the end. Atomic as `save_checkpoint`."""

    def write_trainable(folder: Path) -> None:
        save_file(trainable_state(model), str(folder / TRAINABLE_FILE))

    return write_checkpoint(out_dir, step, write_trainable, state, config, keep)


def write_checkpoint(
    out_dir: Path,
    step: int,
    write_model: Callable[[Path], None],
    state: dict[str, Any],
    config: TrainConfig,
    keep: int,
) -> Path:
    """OUT/checkpoints/step_N: `write_model(folder)` fills a hidden temporary folder, the training state and
    config go beside it, and the folder is renamed into place; then all but the last `keep` are dropped."""
    root = out_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{CHECKPOINT_PREFIX}{step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        write_model(tmp)
        (tmp / TRAIN_CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=1) + "\n")
        with open(tmp / TRAIN_STATE_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # the same step saved again (e.g. interrupted right after a scheduled save)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in root.iterdir():  # temporary folders of killed runs
        if stale.name.startswith(".tmp-") and stale != tmp:
            shutil.rmtree(stale, ignore_errors=True)
    for old in checkpoint_dirs(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (all of them for a full fine-tune, the adapters for LoRA), by name."""
    return {name: p.detach().contiguous() for name, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: nn.Module, checkpoint_dir: Path) -> None:
    """Copy a `save_trainable_checkpoint` folder's parameters into `model`, refusing names it does not have."""
    path = Path(checkpoint_dir) / TRAINABLE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {checkpoint_dir} is not a fine-tuning checkpoint")
    device = str(next(model.parameters()).device)
    missing, unexpected = load_model(model, str(path), strict=False, device=device)
    trained = set(trainable_state(model))
    if unexpected or trained & set(missing):
        raise ValueError(f"cannot resume from {checkpoint_dir}: its {TRAINABLE_FILE} does not match this model "
                         f"(missing {sorted(trained & set(missing))[:8]}, unexpected {unexpected[:8]}); resume with "
                         "the settings that wrote it")  # fmt: skip


def previous_checkpoint(out_dir: Path, resume: bool, overwrite: bool, dist: Distributed) -> Path | None:
    """The checkpoint a run continues from (None for a fresh run): --resume needs one; without --resume a folder
    holding checkpoints is refused unless --overwrite (which deletes them). A folder without a checkpoint (a run
    killed before its first one) is started over in place."""
    latest = latest_checkpoint(out_dir)
    if resume:
        if latest is None:
            raise FileNotFoundError(f"--resume: no checkpoint in {out_dir / CHECKPOINTS_DIR}; start without --resume")
        return latest
    if latest is not None:
        if not overwrite:
            raise FileExistsError(
                f"{out_dir} already holds a run (latest checkpoint {latest.name}); pass --resume "
                "to continue it, --overwrite to start again from scratch, or another out_dir"
            )
        if dist.is_main:
            shutil.rmtree(out_dir / CHECKPOINTS_DIR)
        barrier(dist)
    return None


def load_train_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The training state of a checkpoint folder, read with weights_only=True: only tensors and plain
    containers are rebuilt; anything else in the pickle is refused, never executed."""
    path = Path(checkpoint_dir) / TRAIN_STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: {checkpoint_dir} is not a complete training checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # UnpicklingError for a disallowed global, or a corrupt file
        raise ValueError(
            f"{path} is not a plain training state and was refused (nothing in it was run): {err}"
        ) from err
    if not isinstance(state, dict) or state.get("format") != TRAIN_STATE_FORMAT:
        raise ValueError(f"{path} is not a {TRAIN_STATE_FORMAT} file")
    if state.get("version") != TRAIN_STATE_VERSION:
        raise ValueError(f"{path} has version {state.get('version')!r}; this gpt2 reads {TRAIN_STATE_VERSION}")
    return state


def load_checkpoint_weights(model: GPT, checkpoint_dir: Path) -> None:
    """Copy the checkpoint's model.safetensors into `model`, refusing a different model shape."""
    saved = config_from_hf(json.loads((checkpoint_dir / "config.json").read_text()))
    ours = model.config
    for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
        if getattr(saved, name) != getattr(ours, name):
            raise ValueError(
                f"cannot resume from {checkpoint_dir}: it has {name}={getattr(saved, name)} but this run has "
                f"{name}={getattr(ours, name)}; resume with the same model settings or use another out_dir"
            )
    full_state = checkpoint_dir / MODEL_STATE_FILE
    if type(model) is GPT:
        load_hf_state_dict(model, read_hf_state_dict(checkpoint_dir))
    elif full_state.is_file():
        device = str(next(model.parameters()).device)
        missing, unexpected = load_model(model, str(full_state), strict=False, device=device)
        if missing or unexpected:
            raise ValueError(
                f"cannot resume from {checkpoint_dir}: its {MODEL_STATE_FILE} does not match this "
                f"{type(model).__name__} (missing {missing[:8]}, unexpected {unexpected[:8]})"
            )
    else:
        raise ValueError(f"cannot resume a {type(model).__name__} from {checkpoint_dir}: it has no {MODEL_STATE_FILE} "
                         "(it was saved from a plain GPT); resume with the model that wrote it")  # fmt: skip


def rng_state(device: torch.device) -> dict[str, Any]:
    """The global torch generators (CPU, and `device`'s on CUDA), for `set_rng_state`."""
    state: dict[str, Any] = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)
