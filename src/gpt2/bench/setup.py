"""What every benchmark area shares: the settings of a run and the model it measures.

The built-in model is a random GPT-2 of a preset's shape (default "gpt2", the 124M shape), seeded, so no download
is needed; `model` names a directory (or anything `gpt2.weights.load_model` reads) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.device import resolve_device
from gpt2.tokenizer import load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights import load_model, save_pretrained

SEED = 0
END_OF_TEXT = 50256


@dataclass(frozen=True)
class BenchSettings:
    """The options every `gpt2 bench` area takes."""

    model: str | None = None
    """A model directory (HF layout) or file; None: a random model of `preset`'s shape."""
    preset: str = "gpt2"
    tokenizer: str | None = None
    """A tokenizer directory, Hub name or 'bytes'; None: the model directory's, else GPT-2's ('gpt2')."""
    device: str = "cpu"
    repetitions: int = 3
    """Timed runs of each measurement (ours and the peer's interleaved); the record keeps each and the median."""
    warmup: int = 1
    """Untimed runs before them (allocator, oneDNN kernels, compilation)."""

    def __post_init__(self) -> None:
        if self.repetitions < 1:
            raise ValueError(f"repetitions must be at least 1, got {self.repetitions}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {self.warmup}")
        GPTConfig.from_name(self.preset)  # an unknown preset fails here, naming the choices

    @property
    def torch_device(self) -> torch.device:
        return resolve_device(self.device)

    def model_params(self) -> dict[str, str]:
        """How the record's params name the model."""
        return {"model": self.model} if self.model else {"model": f"random {self.preset}"}


def bench_model(settings: BenchSettings) -> GPT:
    """The model to measure, in eval mode on the CPU (each area moves or converts its own copy)."""
    if settings.model:
        return load_model(settings.model).eval()
    torch.manual_seed(SEED)
    return GPT(GPTConfig.from_name(settings.preset)).eval()


def bench_tokenizer(settings: BenchSettings) -> TextTokenizer:
    if settings.tokenizer:
        return load_tokenizer(settings.tokenizer)
    if settings.model and Path(settings.model).is_dir():
        return load_tokenizer(settings.model)
    return load_tokenizer("gpt2")


def save_model_directory(settings: BenchSettings, directory: Path) -> Path:
    """The benchmark's model with its tokenizer in HF layout at `directory` (what `gpt2 serve --model` reads)."""
    save_pretrained(bench_model(settings), directory)
    bench_tokenizer(settings).save(directory)
    return directory


def write_adapters(base: Path, out: Path, count: int, rank: int) -> list[Path]:
    """`count` LoRA adapters of `rank` on c_attn for the model saved at `base`, in PEFT's format (what `gpt2
    finetune --method lora` writes) under out/adapter0, out/adapter1, ...: seeded random A and B (B non-zero, so each
    changes the text)."""
    from gpt2.finetune.lora import LoRAConfig, LoRALinear, add_lora, save_adapter

    config = LoRAConfig(rank=rank, alpha=2 * rank, target_modules=("c_attn",))
    folders = []
    for index in range(count):
        torch.manual_seed(SEED + 100 + index)
        model = add_lora(load_model(base), config)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, LoRALinear):
                    module.lora_B.normal_(std=0.02)
        folders.append(save_adapter(model, config, out / f"adapter{index}"))
    return folders


def copy_model(model: GPT) -> GPT:
    """The same weights in a model of their own (preparing for inference packs layers in place)."""
    copy = GPT(model.config).eval()
    copy.load_state_dict(model.state_dict())
    return copy


def prompt_ids(batch_size: int, length: int, vocab_size: int) -> torch.Tensor:
    """(B, T) seeded random token ids below the end-of-text id (so no prompt holds a special token)."""
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, min(vocab_size, END_OF_TEXT), (batch_size, length), generator=generator)
