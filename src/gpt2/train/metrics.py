"""What a run reports: metrics.jsonl (one JSON object per logged step or evaluation), the loss plot, and the
model FLOPs utilization (MFU) figures behind it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch

from gpt2.config import GPTConfig
from gpt2.runtime.files import atomic_write_bytes, atomic_write_text

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"

# Peak dense bf16/fp16 tensor-core FLOP/s per device (vendor datasheets, no sparsity), for MFU. Matched by
# substring of torch.cuda.get_device_name(); the first match wins, so longer names come first.
PEAK_FLOPS_BF16: dict[str, float] = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "A10G": 70e12,  # 140e12 with sparsity
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,  # fp16 (no bf16 on Volta)
    "T4": 65e12,  # fp16
}


class Metrics:
    """metrics.jsonl plus the records in memory for the loss plot. The file is started (emptied, or cut back to
    the checkpoint a run resumes from) by `start`, or by the first `write`. Disabled on all ranks but rank 0."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = path
        self.enabled = enabled
        self.records: list[dict[str, Any]] = []
        self.started = False

    def start(self, resume_step: int | None = None) -> None:
        """Begin this run's file: a fresh run (resume_step None) empties it; a resumed run keeps the lines up to
        resume_step, since later ones belong to the run being replaced."""
        self.started = True
        self.records = []
        if not self.enabled:
            return
        if resume_step is not None and self.path.is_file():
            for line in self.path.read_text().splitlines():
                record = json.loads(line)
                if record["step"] <= resume_step:  # an evaluation at resume_step ran before its checkpoint
                    self.records.append(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if not self.started:
            self.start()
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")

    def plot(self, path: Path) -> None:
        if self.enabled:
            write_loss_plot(self.records, path)


def write_loss_plot(records: list[dict[str, Any]], path: Path) -> None:
    """A PNG of train loss per step and val loss per evaluation."""
    write_step_plot(records, path, ("loss", "train"), ("val_loss", "val"), "loss (nats/token)")


def write_step_plot(
    records: list[dict[str, Any]], path: Path, steps: tuple[str, str], evaluations: tuple[str, str], ylabel: str
) -> None:
    """A PNG of one metrics.jsonl key per step (`steps`: key, label) as a thin line and one per evaluation
    (`evaluations`) as dots, against the step (matplotlib's Agg canvas: no display needed); written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    styles: list[dict[str, Any]] = [
        dict(color="tab:blue", alpha=0.6, linewidth=1),
        dict(color="tab:orange", linewidth=1.5, markersize=4, marker="o"),
    ]
    for (key, label), style in zip((steps, evaluations), styles, strict=True):
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            axes.plot(*zip(*points, strict=True), label=label, **style)
    axes.set_xlabel("step")
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())


def flops_per_token(config: GPTConfig) -> float:
    """Training FLOPs per token, forward + backward (PaLM appendix B, as nanoGPT's MFU): 6 per parameter
    (2 forward, 4 backward) plus the attention scores and weighted sums, 12 * n_layer * n_embd * block_size."""
    C, L, V, T = config.n_embd, config.n_layer, config.vocab_size, config.block_size
    # per block: attention 4C^2 + MLP 8C^2 weights, plus biases and LayerNorms (13C with bias, 2C without)
    per_block = 12 * C * C + (13 * C if config.bias else 2 * C)
    n_params = V * C + T * C + L * per_block + 2 * C  # tied embedding/head counted once, final LayerNorm
    return 6 * n_params + 12 * L * C * T


def peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of `device` from PEAK_FLOPS_BF16, or None when unknown (then no MFU is shown)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_FLOPS_BF16.items() if key in name), None)
