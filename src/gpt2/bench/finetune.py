"""Fine-tuning throughput and memory: ours (the `Trainer` step `gpt2 finetune` runs, full or LoRA) against
transformers (a plain loop: forward with labels, backward, clip, the same fused AdamW, zero) and PEFT's LoRA
(opt-in), float32.

Each case runs in a process of its own (spawned), so its peak resident memory is its own; the memory figure is
the peak minus the resident memory after the model is loaded (what training adds: gradients, optimizer state,
activations).
"""

from __future__ import annotations

import multiprocessing
import resource
import tempfile
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt2.bench.record import Recorder
from gpt2.bench.setup import SEED, BenchSettings, bench_model
from gpt2.bench.timing import interleaved, timed

LORA_RANK, LORA_ALPHA = 8, 16
METHODS = ("full", "lora")


@dataclass(frozen=True)
class FinetuneWork:
    methods: tuple[str, ...] = METHODS
    batch_size: int = 2
    block_size: int = 128
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if any(peer not in ("transformers", "peft") for peer in self.peers):
            raise ValueError(f"finetune peers: transformers (full) and peft (lora), got {', '.join(self.peers)}")
        if not self.methods or any(method not in METHODS for method in self.methods):
            raise ValueError(f"--methods: {', '.join(METHODS)}, got {', '.join(self.methods) or 'none'}")


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB; ru_maxrss where there is no /proc."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * resource.getpagesize() / 2**20


def ours_case(case: str, model_dir: str, work: FinetuneWork, x: torch.Tensor, y: torch.Tensor) -> Callable[[], object]:
    """One `Trainer.train_step` of `gpt2 finetune` (full, or LoRA on the attention's c_attn)."""
    from gpt2.finetune.data import RowBatches, Rows
    from gpt2.finetune.lora import LoRAConfig, add_lora
    from gpt2.train import Trainer, TrainingData, configure_optimizer
    from gpt2.train.config import TrainConfig
    from gpt2.weights import load_model

    model = load_model(model_dir).train()
    if case == "ours lora":
        add_lora(model, LoRAConfig(rank=LORA_RANK, alpha=float(LORA_ALPHA), dropout=0.0))
    config = TrainConfig.from_dict(dict(tokenizer="bytes", block_size=work.block_size, batch_size=work.batch_size,
                                        max_steps=10**6, warmup_steps=1, weight_decay=0.0, eval_interval=0,
                                        device="cpu", dtype="float32", log_interval=10**9,
                                        out_dir=tempfile.mkdtemp()))  # fmt: skip
    trainer = Trainer(model, configure_optimizer(model, config.optimizer, torch.device("cpu")), config,
                      TrainingData(RowBatches(Rows(x, y), work.batch_size)))  # fmt: skip
    return trainer.train_step


def transformers_case(case: str, model_dir: str, x: torch.Tensor, y: torch.Tensor) -> Callable[[], object]:
    """A plain transformers loop (PEFT's LoRA on c_attn for "peft lora"): forward with labels, backward, clip,
    fused AdamW, zero."""
    from transformers import GPT2LMHeadModel

    model: Any = GPT2LMHeadModel.from_pretrained(model_dir, attn_implementation="sdpa").train()
    if case == "peft lora":
        import peft

        lora = peft.LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0, target_modules=["c_attn"],
                               fan_in_fan_out=True)  # fmt: skip
        model = peft.get_peft_model(model, lora)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.0, fused=True)
    labels = torch.cat([x[:, :1], y[:, :-1]], 1)  # transformers shifts labels itself

    def step() -> None:
        model(input_ids=x, labels=labels).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def run_case(case: str, model_dir: str, work: FinetuneWork, steps: int, threads: int) -> tuple[list[float], float]:
    """In the child: (seconds of each timed step, MiB training added at its peak)."""
    torch.set_num_threads(threads)
    torch.manual_seed(SEED)
    x = torch.randint(0, 50000, (work.batch_size, work.block_size))
    y = torch.randint(0, 50000, (work.batch_size, work.block_size))
    step = (
        ours_case(case, model_dir, work, x, y) if case.startswith("ours") else transformers_case(case, model_dir, x, y)
    )
    before = rss_mib()
    # the warm-up step allocates the gradients and optimizer state, which the memory figure counts
    seconds = interleaved({case: lambda: timed(step)}, warmup=1, repetitions=steps)[case]
    return seconds, peak_rss_mib() - before


def run_finetune(settings: BenchSettings, work: FinetuneWork, recorder: Recorder) -> None:
    """`gpt2 bench finetune`: tokens/s and added peak memory per method, each case in a spawned process."""
    from gpt2.weights import save_pretrained

    peers = {"full": "transformers", "lora": "peft"}
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gpt2-bench-finetune-") as folder:
        save_pretrained(bench_model(settings), folder)
        for method in work.methods:
            cases = [f"ours {method}"] + ([f"{peers[method]} {method}"] if peers[method] in work.peers else [])
            results = {}
            for case in cases:
                with ProcessPoolExecutor(1, mp_context=context) as pool:
                    results[case] = pool.submit(run_case, case, folder, work, settings.repetitions,
                                                torch.get_num_threads()).result()  # fmt: skip
            tokens = work.batch_size * work.block_size
            rates = {case: [tokens / s for s in seconds] for case, (seconds, _) in results.items()}
            params = {"method": method, "batch": work.batch_size, "block": work.block_size, "dtype": "float32",
                      **settings.model_params()}  # fmt: skip
            peer = cases[1] if len(cases) > 1 else None
            recorder.add("finetune", "tokens/s", params, rates[cases[0]], "tokens/s",
                         (peer, rates[peer]) if peer else None)  # fmt: skip
            recorder.add("finetune", "added peak memory", params, [results[cases[0]][1]], "MiB",
                         (peer, [results[peer][1]]) if peer else None)  # fmt: skip
