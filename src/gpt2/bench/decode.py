"""Decoding and prompt processing: ours as `gpt2 sample --dtype X` runs it, against peers in the same run.

Decode tokens/s counts the steps after the first new token (the first comes with the prefill), greedy, B rows at
once; prefill tokens/s is one prompt into the KV cache with the logits of its last position (what generation needs
and what llama.cpp computes). Ours and the peers take turns in every repetition (`gpt2.bench.timing.interleaved`),
so load from other processes falls on all alike.

On a CPU every row names the variant of the native kernels that ran (`isa`: avx512, avx2, neon, portable; pytorch
where inference runs on the PyTorch layouts). Decode at batch 1 adds a "weight GB/s" row: the bytes of weights a
step reads (`gpt2.bench.bandwidth.decode_step_bytes`) x steps/s, with as its ratio the fraction of the read
bandwidth that read-only passes over a large buffer reach with the same threads, one in each round of the same
repetitions (`read_pass`; all of a run's passes make its "read bandwidth GB/s" row): how close the step runs to
the speed of memory.

Peers (opt-in): transformers (`GPT2LMHeadModel.generate` on the same weights; its decode rate is
(generate n tokens - generate 1 token) / (n - 1)), llama.cpp's `llama-bench` by path (batch 1, on the GGUF `gpt2
export --format gguf` writes from the same weights; int4 pairs with q4_0 made by `llama-quantize` beside it),
ONNX Runtime (the decoder-with-past graph `gpt2 export --format onnx` writes, its cache fed back each step).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpt2.bench.bandwidth import GB, READ_BUFFER_BYTES, decode_step_bytes, read_pass
from gpt2.bench.record import Recorder
from gpt2.bench.setup import BenchSettings, bench_model, bench_tokenizer, copy_model, prompt_ids
from gpt2.bench.timing import interleaved, timed
from gpt2.cpu import prepare_for_inference
from gpt2.cpu.kernels import active_isa
from gpt2.inference import SamplingParams, stream
from gpt2.model import GPT

# ours at a precision -> the GGUF type of the same precision for llama.cpp
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "int8": "q8_0", "int4": "q4_0"}
ONNX_FILES = {"float32": "model.onnx", "int8": "model_quantized.onnx"}
PEERS = ("transformers", "onnxruntime")
PRECISIONS = ("float32", "bfloat16", "float16", "int8", "int4")  # what prepare_for_inference takes
OURS = "ours"  # our engine's name among the peers' in one interleaved measurement
READ = "read bandwidth"  # the read pass's, among them at batch 1


@dataclass(frozen=True)
class DecodeGrid:
    """What `gpt2 bench decode` and `gpt2 bench prefill` run over."""

    precisions: tuple[str, ...] = ("float32", "bfloat16", "int8", "int4")
    batch_sizes: tuple[int, ...] = (1,)
    prompt_tokens: int = 32
    new_tokens: int = 64
    prefill_tokens: tuple[int, ...] = (128, 512)
    peers: tuple[str, ...] = ()
    llama_bench: Path | None = None
    """llama.cpp's llama-bench binary (its build/bin folder may also hold llama-quantize, for q4_0)."""

    def __post_init__(self) -> None:
        if not self.precisions:
            raise ValueError(f"--precisions names no precision; give one or more of {', '.join(PRECISIONS)}")
        for precision in self.precisions:
            if precision not in PRECISIONS:
                raise ValueError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
        if not self.batch_sizes or min(self.batch_sizes) < 1 or min(self.prefill_tokens, default=0) < 1:
            raise ValueError("batch sizes and prompt lengths must be at least 1")
        for peer in self.peers:
            if peer not in PEERS:
                raise ValueError(f"decode peer {peer!r} is not one of {', '.join(PEERS)} (llama.cpp: --llama-bench)")
        if self.llama_bench is not None and not Path(self.llama_bench).is_file():
            raise FileNotFoundError(f"no llama-bench binary at {self.llama_bench}; build llama.cpp, pass its path")
        if self.new_tokens < 2:
            raise ValueError(f"new_tokens must be at least 2 (the first comes with the prefill), got {self.new_tokens}")


# ------------------------------------------------------------------------------------ ours
@torch.no_grad()
def ours_decode(model: GPT, prompt: torch.Tensor, new_tokens: int) -> float:
    """Tokens/s (all rows) of the decode steps after the first new token; prompt (B, T) on the model's device."""
    tokens = stream(model, prompt, SamplingParams(max_tokens=new_tokens, temperature=0))
    next(tokens)
    device = prompt.device
    seconds = timed(lambda: sum(1 for _ in tokens), device)
    return prompt.size(0) * (new_tokens - 1) / seconds


@torch.no_grad()
def ours_prefill(model: GPT, prompt: torch.Tensor) -> float:
    """Prompt tokens/s of one prefill: the cache filled, the last position's logits."""
    cache = model.new_kv_cache(prompt.size(0), max_len=prompt.size(1))

    def run() -> None:
        hidden = model.hidden_states(prompt, kv_cache=cache, validate=False)
        model.lm_head(hidden[:, -1])

    return prompt.numel() / timed(run, prompt.device)


# ------------------------------------------------------------------------------------ transformers
def transformers_model(model: GPT, precision: str, device: torch.device) -> Any:
    """transformers' GPT2LMHeadModel with our weights, at float32 or bfloat16 (None for other precisions)."""
    if precision not in ("float32", "bfloat16"):
        return None
    from transformers import GPT2LMHeadModel

    from gpt2.weights import save_pretrained

    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, folder)
        theirs: Any = GPT2LMHeadModel.from_pretrained(folder, torch_dtype=getattr(torch, precision))
    theirs.to(device)
    return theirs.eval()


@torch.no_grad()
def transformers_decode(theirs: Any, prompt: torch.Tensor, new_tokens: int) -> float:
    def generate(count: int) -> Callable[[], object]:
        return lambda: theirs.generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=count,
            min_new_tokens=count, pad_token_id=0,
        )  # fmt: skip

    first = timed(generate(1), prompt.device)
    whole = timed(generate(new_tokens), prompt.device)
    return prompt.size(0) * (new_tokens - 1) / max(whole - first, 1e-9)


@torch.no_grad()
def transformers_prefill(theirs: Any, prompt: torch.Tensor) -> float:
    return prompt.numel() / timed(lambda: theirs(prompt, logits_to_keep=1, use_cache=True), prompt.device)


# ------------------------------------------------------------------------------------ llama.cpp
def export_llama_files(model: GPT, settings: BenchSettings, grid: DecodeGrid, folder: Path) -> dict[str, Path]:
    """GGUF files of the model at each precision llama.cpp has (q4_0 only where llama-quantize is beside
    llama-bench)."""
    from gpt2.export import export_gguf

    tokenizer = bench_tokenizer(settings)
    files: dict[str, Path] = {}
    quantize = Path(grid.llama_bench).with_name("llama-quantize") if grid.llama_bench else None
    for precision in grid.precisions:
        name = GGUF_TYPES.get(precision)
        path = folder / f"model-{name}.gguf"
        if name == "q4_0":
            if quantize is None or not quantize.is_file():
                continue
            source = export_gguf(model, tokenizer, folder / "model-f32.gguf", dtype="f32")
            subprocess.run([str(quantize), str(source), str(path), "q4_0"], check=True, capture_output=True)
        elif name is not None:
            export_gguf(model, tokenizer, path, dtype=name)
        files[precision] = path
    return files


def llama_bench(binary: Path, gguf: Path, *, prompt: int, generate: int, threads: int) -> float:
    """llama-bench's tokens/s for one test (-p prompt tokens, or -n generated tokens), one repetition."""
    command = [str(binary), "-m", str(gguf), "-p", str(prompt), "-n", str(generate), "-t", str(threads)]
    done = subprocess.run([*command, "-r", "1", "-o", "json"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed on {gguf.name}: {done.stderr.strip().splitlines()[-1:]}")
    return float(json.loads(done.stdout)[0]["avg_ts"])


# ------------------------------------------------------------------------------------ ONNX Runtime
def onnx_sessions(model: GPT, settings: BenchSettings, grid: DecodeGrid, folder: Path) -> dict[str, Any]:
    import onnxruntime as ort

    from gpt2.export import export_onnx

    wanted = [p for p in grid.precisions if p in ONNX_FILES]
    export_onnx(model, bench_tokenizer(settings), folder / "onnx", dtype="int8" if "int8" in wanted else "f32")
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    return {
        precision: ort.InferenceSession(str(folder / "onnx" / "onnx" / ONNX_FILES[precision]), options)
        for precision in wanted
    }


def onnx_decode(session: Any, model: GPT, prompt: torch.Tensor, new_tokens: int) -> float:
    """Tokens/s of ONNX Runtime's decode steps after the first, greedy, each call's present.* fed back as past."""
    from gpt2.export import onnx_input_names

    config = model.config
    B = prompt.size(0)
    past_names = onnx_input_names(config.n_layer)[3:]
    past = {name: np.zeros((B, config.n_head, 0, config.head_dim), np.float32) for name in past_names}
    ids, length, start = prompt.numpy(), 0, 0.0
    for step in range(new_tokens):
        if step == 1:
            start = time.perf_counter()
        T = ids.shape[1]
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones((B, length + T), np.int64),
            "position_ids": np.broadcast_to(np.arange(length, length + T, dtype=np.int64), (B, T)).copy(),
            **past,
        }
        logits, *present = session.run(None, feed)
        past = dict(zip(past_names, present, strict=True))
        length += T
        ids = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
    return B * (new_tokens - 1) / (time.perf_counter() - start)


# ------------------------------------------------------------------------------------ the runs
def prepared(reference: GPT, precision: str, device: torch.device) -> GPT | None:
    """Ours at `precision` as `gpt2 sample --dtype` runs it, or None where the device has no such layout."""
    try:
        return prepare_for_inference(copy_model(reference).to(device), precision)
    except ValueError as err:
        print(f"gpt2 bench: skipping {precision} on {device.type}: {err}", flush=True)
        return None


def peer_runs(model: GPT, settings: BenchSettings, grid: DecodeGrid, folder: Path) -> dict[str, dict[str, Any]]:
    """For each peer asked for, its engine per precision."""
    device = settings.torch_device
    engines: dict[str, dict[str, Any]] = {}
    if "transformers" in grid.peers:
        engines["transformers"] = {p: transformers_model(model, p, device) for p in grid.precisions}
    if "onnxruntime" in grid.peers and device.type == "cpu":
        engines["onnxruntime"] = onnx_sessions(model, settings, grid, folder)
    if grid.llama_bench is not None and device.type == "cpu":
        engines["llama.cpp"] = export_llama_files(model, settings, grid, folder)
    return engines


@dataclass
class DecodeRun:
    """What every grid point of one `gpt2 bench decode` / `prefill` run shares."""

    settings: BenchSettings
    grid: DecodeGrid
    recorder: Recorder
    reference: GPT
    """The model as loaded (float32); each precision prepares a copy."""
    engines: dict[str, dict[str, Any]]
    """Each peer's engine per precision (see peer_runs)."""
    prefill: bool
    read: Callable[[], float] | None = None
    """One read pass over memory (bandwidth.read_pass, GB/s), taken in every round of a batch-1 decode's
    repetitions; None where the run has no batch-1 decode."""
    reads: list[float] = field(default_factory=list)
    """Every read pass's GB/s in this run, for its read bandwidth row."""


def run_decode(settings: BenchSettings, grid: DecodeGrid, recorder: Recorder, *, prefill: bool = False) -> None:
    """`gpt2 bench decode` (prefill=False) or `gpt2 bench prefill`: every precision and batch size (decode) or
    prompt length (prefill), against each peer asked for; decode at batch 1 also gives the weight GB/s beside the
    run's read bandwidth (module docstring)."""
    reference = bench_model(settings)
    device = settings.torch_device
    with tempfile.TemporaryDirectory(prefix="gpt2-bench-") as folder:
        engines = peer_runs(reference, settings, grid, Path(folder))
        run = DecodeRun(settings, grid, recorder, reference, engines, prefill)
        if not prefill and 1 in grid.batch_sizes:
            run.read = read_pass(device)
        for precision in grid.precisions:
            model = prepared(reference, precision, device)
            if model is None:
                continue
            for point in grid.prefill_tokens if prefill else grid.batch_sizes:
                measure_point(run, model, precision, point)
            del model
        if run.reads:
            params = {
                "buffer_mib": READ_BUFFER_BYTES // 2**20,
                "threads": torch.get_num_threads(),
                "device": device.type,
            }
            recorder.add("decode", "read bandwidth GB/s", params, run.reads, "GB/s")


def measure_point(run: DecodeRun, model: GPT, precision: str, point: int) -> None:
    """One grid point (a batch size, or a prompt length for prefill), ours and each peer with an engine for it
    interleaved; a record per peer (ours alone without one)."""
    settings, grid = run.settings, run.grid
    device = settings.torch_device
    vocab = run.reference.config.vocab_size
    if run.prefill:
        prompt = prompt_ids(1, point, vocab).to(device)
        ours: Callable[[], float] = lambda: ours_prefill(model, prompt)  # noqa: E731
        params = {"precision": precision, "prompt_tokens": point}
    else:
        prompt = prompt_ids(point, grid.prompt_tokens, vocab).to(device)
        ours = lambda: ours_decode(model, prompt, grid.new_tokens)  # noqa: E731
        params = {"precision": precision, "batch": point, "prompt_tokens": grid.prompt_tokens,
                  "new_tokens": grid.new_tokens}  # fmt: skip
    params |= settings.model_params() | {"device": device.type} | isa_params(device)
    area, name = ("prefill", "prefill tokens/s") if run.prefill else ("decode", "decode tokens/s")
    peers = peer_functions(run.engines, precision, prompt, grid, run.prefill, run.reference)
    reading = {READ: run.read} if run.read is not None and not run.prefill and point == 1 else {}
    rates = interleaved({OURS: ours, **peers, **reading}, warmup=settings.warmup, repetitions=settings.repetitions)
    mine, reads = rates.pop(OURS), rates.pop(READ, [])
    if not rates:
        run.recorder.add(area, name, params, mine, "tokens/s")
    for peer_name, peer in rates.items():
        run.recorder.add(area, name, params, mine, "tokens/s", (peer_name, peer))
    if not run.prefill and point == 1:
        run.reads += reads
        record_weight_bandwidth(run, model, params, mine, reads)


def isa_params(device: torch.device) -> dict[str, str]:
    """On a CPU, the native kernels' ISA variant inference runs ("avx512", "avx2", "neon", "portable"), or
    "pytorch" where it runs on the PyTorch layouts; nothing on other devices, where neither runs."""
    return {"isa": active_isa()} if device.type == "cpu" else {}


def record_weight_bandwidth(
    run: DecodeRun, model: GPT, params: dict[str, Any], rates: list[float], reads: list[float]
) -> None:
    """At batch 1 a token is a step: the weight bytes a step reads x steps/s, each repetition; the ratio is the
    fraction of the read bandwidth the read passes of the same rounds reached."""
    step_bytes = decode_step_bytes(model)
    values = [step_bytes * rate / GB for rate in rates]
    limit = (READ, reads) if reads else None
    params = params | {"step_mb": round(step_bytes / 1e6, 1)}
    run.recorder.add("decode", "weight GB/s", params, values, "GB/s", limit)


def peer_functions(
    engines: dict[str, dict[str, Any]],
    precision: str,
    prompt: torch.Tensor,
    grid: DecodeGrid,
    prefill: bool,
    reference: GPT,
) -> dict[str, Callable[[], float]]:
    """The peers' measurement of this grid point, by peer name (only peers with an engine at this precision)."""
    functions: dict[str, Callable[[], float]] = {}
    B, T = prompt.shape
    if (theirs := engines.get("transformers", {}).get(precision)) is not None:
        name = f"transformers {precision}"
        if prefill:
            functions[name] = lambda: transformers_prefill(theirs, prompt)
        else:
            functions[name] = lambda: transformers_decode(theirs, prompt, grid.new_tokens)
    if (session := engines.get("onnxruntime", {}).get(precision)) is not None and not prefill:
        functions[f"onnxruntime {ONNX_FILES[precision]}"] = lambda: onnx_decode(session, reference, prompt.cpu(),
                                                                               grid.new_tokens)  # fmt: skip
    if (gguf := engines.get("llama.cpp", {}).get(precision)) is not None and B == 1:
        assert grid.llama_bench is not None
        binary, threads = Path(grid.llama_bench), torch.get_num_threads()
        name = f"llama.cpp {GGUF_TYPES[precision]}"
        if prefill:
            functions[name] = lambda: llama_bench(binary, gguf, prompt=T, generate=0, threads=threads)
        else:
            functions[name] = lambda: llama_bench(binary, gguf, prompt=0, generate=grid.new_tokens, threads=threads)
    return functions


def parse_ints(values: Sequence[str] | str) -> tuple[int, ...]:
    """'1,8,64' (or a list of such) -> (1, 8, 64)."""
    items = values.split(",") if isinstance(values, str) else [v for value in values for v in value.split(",")]
    try:
        return tuple(int(item) for item in items if item)
    except ValueError as err:
        raise ValueError(f"expected whole numbers separated by commas, got {values!r}") from err
