"""One record per measurement, the same for every area, as JSON lines or a markdown table.

A record: area ("decode", "serve", ...), name (what was measured, e.g. "decode tokens/s"), params (the grid point:
precision, batch size, clients, ...), value (the median over the repetitions) and values (each repetition), unit,
the peer's name and figure measured in the same run (interleaved with ours), ratio, and where it ran: machine,
torch version, commit, date, and the command that reproduces it.

ratio > 1 always means ours is better: value / peer_value for rates, peer_value / value for times (units in
`LOWER_IS_BETTER`).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

LOWER_IS_BETTER = frozenset({"s", "ms", "MiB", "steps"})


@dataclass(frozen=True)
class Environment:
    """Where and when a run happened, the same for all its records."""

    machine: str
    torch: str
    commit: str
    date: str
    command: str


@dataclass
class Record:
    area: str
    name: str
    params: dict[str, Any]
    value: float
    unit: str
    values: list[float] = field(default_factory=list)
    peer: str | None = None
    peer_value: float | None = None
    peer_values: list[float] = field(default_factory=list)
    ratio: float | None = None
    machine: str = ""
    torch: str = ""
    commit: str = ""
    date: str = ""
    command: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)


def environment_here(argv: Sequence[str], device: torch.device) -> Environment:
    """This machine, torch, commit and date, with the `gpt2 ...` command of `argv`."""
    return Environment(
        machine=machine_name(device),
        torch=torch.__version__,
        commit=git_commit(),
        date=datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        command=shlex.join(["gpt2", *argv]),
    )


def machine_name(device: torch.device) -> str:
    """The accelerator's name, or the CPU's model and the threads torch uses."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model}, {torch.get_num_threads()} threads"


def git_commit() -> str:
    """The short commit of the checkout this package runs from, or "unknown" outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def ratio_of(value: float, peer_value: float | None, unit: str) -> float | None:
    if peer_value is None or value == 0 or peer_value == 0:
        return None
    return round(peer_value / value if unit in LOWER_IS_BETTER else value / peer_value, 3)


class Recorder:
    """Collects records and writes them as they come (json), at the end (md), and to a JSON-lines file."""

    def __init__(self, environment: Environment, output: str = "json", save: Path | None = None) -> None:
        if output not in ("json", "md"):
            raise ValueError(f"output {output!r} is not one of json, md")
        self.environment = environment
        self.output = output
        self.save = save
        self.records: list[Record] = []
        if save is not None:  # a file that cannot be written fails now, not after the whole run
            try:
                save.parent.mkdir(parents=True, exist_ok=True)
                existed = save.exists()
                with open(save, "a", encoding="utf-8"):
                    pass
                if not existed:  # written with the first record; a run that ends before one leaves nothing
                    save.unlink()
            except OSError as error:
                raise ValueError(
                    f"--save {save}: cannot write there ({error.strerror}); pass a writable path"
                ) from error

    def add(
        self,
        area: str,
        name: str,
        params: dict[str, Any],
        values: Sequence[float],
        unit: str,
        peer: tuple[str, Sequence[float]] | None = None,
    ) -> Record:
        """One measurement: its repetitions `values`, and the peer's (name, repetitions) of the same run."""
        value = round(statistics.median(values), 4)
        peer_value = round(statistics.median(peer[1]), 4) if peer and peer[1] else None
        record = Record(
            area=area,
            name=name,
            params=params,
            value=value,
            unit=unit,
            values=[round(v, 4) for v in values],
            peer=peer[0] if peer else None,
            peer_value=peer_value,
            peer_values=[round(v, 4) for v in peer[1]] if peer else [],
            ratio=ratio_of(value, peer_value, unit),
            **asdict(self.environment),
        )
        self.records.append(record)
        if self.output == "json":
            print(record.to_json(), flush=True)
        if self.save is not None:
            with open(self.save, "a", encoding="utf-8") as file:
                file.write(record.to_json() + "\n")
        return record

    def finish(self) -> None:
        if self.output == "md":
            print(markdown_table(self.records))


def markdown_table(records: Sequence[Record]) -> str:
    """Records as one markdown table: ours, the peer's figure of the same run, the ratio, the run's range."""
    lines = [
        "| area | measurement | params | ours | peer | peer's | ratio | ours (range) | unit |",
        "|---|---|---|---:|---|---:|---:|---|---|",
    ]
    for r in records:
        params = ", ".join(f"{key}={value}" for key, value in r.params.items())
        spread = f"{min(r.values):.4g}-{max(r.values):.4g}" if r.values else ""
        peer_value = f"{r.peer_value:.4g}" if r.peer_value is not None else ""
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else ""
        lines.append(
            f"| {r.area} | {r.name} | {params} | {r.value:.4g} | {r.peer or ''} | {peer_value} | {ratio} | "
            f"{spread} | {r.unit} |"
        )
    if records:
        first = records[0]
        lines.append(f"\n{first.machine}; torch {first.torch}; commit {first.commit}; {first.date}; `{first.command}`")
    return "\n".join(lines)


def env_threads(threads: int | None) -> None:
    """Use `threads` torch threads (and tell child processes through OMP_NUM_THREADS)."""
    if threads:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)
