"""Experiment tracking: what metrics.jsonl gets, also sent to TensorBoard and/or Weights & Biases.

`log_to` in the TrainConfig names the trackers ("tensorboard", "wandb"; none by default). `Tracking` is a
Trainer callback: every metrics.jsonl line (a step's loss, lr, grad_norm, dt_ms, tokens_per_s, mfu; a val loss;
an evaluation's figures) goes to each tracker at its step, through the project's own library, plus the run's
config at the start and the sample at the end. TensorBoard's event files go to OUT/tensorboard; wandb runs in
offline mode (no account, nothing sent) in OUT/wandb (`wandb sync` uploads it later). Each library is an extra:
without it, `require_trackers` raises one line naming the extra to install.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from gpt2.train.config import TrainConfig
from gpt2.train.trainer import Trainer, TrainerCallback

DISTRIBUTION = "gpt2-faithful"
TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_PROJECT = "gpt2"
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb"}  # log_to name -> the module its extra installs


class Tracker(Protocol):
    def scalars(self, step: int, values: dict[str, float]) -> None: ...

    def text(self, step: int, name: str, text: str) -> None: ...

    def close(self) -> None: ...


def require_trackers(names: Sequence[str]) -> None:
    """A ValueError naming the extra to install for the first tracker whose library is missing (checked before
    a run writes anything)."""
    for name in names:
        if importlib.util.find_spec(_MODULES[name]) is None:
            raise ValueError(f"output.log_to={name} needs the {name} package: pip install '{DISTRIBUTION}[{name}]'")


class TensorBoardTracker:
    """Scalars and text in TensorBoard event files (torch's SummaryWriter) in `directory`."""

    def __init__(self, directory: Path, config: TrainConfig) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(directory))
        self.writer.add_text("config", "```toml\n" + config.to_toml() + "```", 0)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def text(self, step: int, name: str, text: str) -> None:
        self.writer.add_text(name, text, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """An offline wandb run in `directory`/wandb: history rows of scalars, the config, the sample in the summary."""

    def __init__(self, directory: Path, config: TrainConfig) -> None:
        import wandb

        directory.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(mode="offline", silent=True, console="off", x_disable_stats=True)
        self.run = wandb.init(project=WANDB_PROJECT, dir=str(directory), config=config.to_flat(), settings=settings,
                              name=Path(config.output.out_dir).name, reinit="create_new")  # fmt: skip

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def text(self, step: int, name: str, text: str) -> None:
        self.run.summary[name] = text

    def close(self) -> None:
        self.run.finish()


class Tracking(TrainerCallback):
    """The trackers of `config.output.log_to`, fed every metrics.jsonl line; `close` (or the with-block) ends them.
    enabled=False (ranks other than 0) opens none."""

    def __init__(self, config: TrainConfig, *, enabled: bool = True) -> None:
        require_trackers(config.output.log_to)
        out = Path(config.output.out_dir)
        makers: dict[str, Callable[[], Tracker]] = {
            "tensorboard": lambda: TensorBoardTracker(out / TENSORBOARD_DIR, config),
            "wandb": lambda: WandbTracker(out / WANDB_DIR, config),
        }
        self.trackers: list[Tracker] = [makers[name]() for name in config.output.log_to] if enabled else []
        self.step = 0

    def on_metrics(self, trainer: Trainer, record: dict[str, Any]) -> None:
        self.step = int(record["step"])
        values = {key: float(value) for key, value in record.items()
                  if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)}  # fmt: skip
        for tracker in self.trackers:
            tracker.scalars(self.step, values)

    def text(self, name: str, text: str, step: int | None = None) -> None:
        """A text (e.g. the sample) at `step` (default: the last step logged)."""
        for tracker in self.trackers:
            tracker.text(self.step if step is None else step, name, text)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []

    def __enter__(self) -> Tracking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["TensorBoardTracker", "Tracker", "Tracking", "WandbTracker", "require_trackers"]
