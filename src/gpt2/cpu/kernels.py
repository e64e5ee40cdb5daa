"""Native CPU kernels for decoding (csrc/cpu_decode.cpp), and the bfloat16 / int8 / int4 layers that use them.

Decoding reads every weight once per step, so on a CPU it runs at the speed the weights stream from memory.
PyTorch's one-row products stream bf16, int8 and int4 weights well below that speed (its int8 and int4 kernels
are built for many rows), and a step of ~250 small framework ops costs 2-3 ms on top. The C++ file has products
that stream every format at close to memory speed, and a decoder that runs a whole one-token step in one call
(gpt2.cpu.decoder).

The file is compiled on first use by torch's extension builder (`-O3 -march=native`, about 20 s, once per
machine: the build is cached under torch's extensions folder, keyed by the source, the torch version and the
CPU's features). Where that cannot happen (no C++ compiler, not x86/ARM Linux, `GPT2_NATIVE_KERNELS=0`), every
caller falls back to the PyTorch layouts of gpt2.cpu.layouts, which compute the same thing more slowly.

Inference uses them by default only where they are faster (`use_native_kernels`): on x86 CPUs with AVX-512
(F/BW/VL), for which the file has hand-vectorized paths. Elsewhere only the portable C++ loops run, and on an
AVX2-only CPU they measured 2.2x (fp32) to 5.6x (int8) slower per decoded token than the PyTorch layouts
(docs/performance.md; `gpt2 bench decode`); `GPT2_NATIVE_KERNELS=1` uses them anyway (as the kernel tests do).

Formats (what `NativeLinear` holds; the C++ file's header has the byte layout): bfloat16 as it is, and
- int8: tiles of 16 output rows, one scale per row (symmetric, absmax / 127), as `Int8Linear`'s values;
- int4: tiles of 16 output rows and groups of 32 inputs, codes 0..15 with a float16 scale and minimum per row and
  group (asymmetric), as `Int4Linear`'s groups.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import platform
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt2.runtime.device import cpu_prefers_bf16

SOURCE = Path(__file__).resolve().parent / "csrc" / "cpu_decode.cpp"
SWITCH_VARIABLE = "GPT2_NATIVE_KERNELS"  # 0: the PyTorch layouts only; 1: the kernels on any CPU
BUILD_LOCK = "gpt2-build.flock"  # in the build folder: held (fcntl) by the one process building or loading
TILE = 16  # output rows per tile of the packed formats
BLOCK = 32  # inputs per activation-quantization block and per int4 group
VECTOR_FLAGS = ("avx512f", "avx512bw", "avx512vl")  # the CPU flags the file's vector paths need (GPT2_AVX512)
# Rows from which NativeLinear multiplies by the dequantized weight, per precision (measured crossovers, 124M on
# the 2-core Zen 5 VM, a prefill of P tokens: int8 24-32 (P = 63: 68 ms native, 38 dequantized), int4 the same,
# bfloat16 64; benchmarks/inference/prefill_crossover.py). The native product reads the weights once every 4 rows.
MANY_ROWS = {"bfloat16": 64, "int8": 32, "int4": 32}
INT8_MAX = 127
INT4_LEVELS = 15
KIND = {"float32": 0, "bfloat16": 1, "int8": 2, "int4": 3}  # the C++ file's `Kind`

log = logging.getLogger(__name__)


@functools.cache
def kernels_available() -> bool:
    """Build (once per machine) and load the native kernels; False, with one logged line saying why, where that
    is not possible. Cached for the process: the ops are registered process-wide by torch (`torch.ops.gpt2`)."""
    if os.environ.get(SWITCH_VARIABLE) == "0":
        return False
    if platform.system() != "Linux":
        log.warning("gpt2: native CPU kernels are built on Linux only; decoding uses PyTorch's kernels")
        return False
    try:
        from torch.utils.cpp_extension import load

        name = f"gpt2_cpu_decode_{_build_key()}"
        build_directory = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
        build_directory = build_directory / name
        if not (build_directory / f"{name}.so").exists():
            log.warning("gpt2: compiling the native CPU kernels (once per machine, about 20 s)")
        build_directory.mkdir(parents=True, exist_ok=True)
        # torch's builder marks a build in progress with a `lock` file and waits, forever, while one exists, so
        # a builder killed mid-build (Ctrl-C, kill -9) blocked every later one. Our own lock is an OS file lock,
        # released when its holder dies: whoever holds it knows no builder is running, and removes the leftover.
        with open(build_directory / BUILD_LOCK, "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            (build_directory / "lock").unlink(missing_ok=True)
            load(
                name=name,
                sources=[str(SOURCE)],
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                build_directory=str(build_directory),
                is_python_module=False,
                verbose=False,
            )
    except Exception as error:  # a missing compiler, headers or ninja: the PyTorch layouts still work
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.warning("gpt2: native CPU kernels unavailable (%s); decoding uses PyTorch's kernels", first_line)
        return False
    return True


def _build_key() -> str:
    """What the compiled file depends on: the source, torch, and the CPU features -march=native sees."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(platform.machine().encode())
    digest.update(" ".join(sorted(cpu_flags())).encode())
    return digest.hexdigest()[:16]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (x86 `flags`, ARM `Features`); empty elsewhere."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def use_native_kernels() -> bool:
    """Whether inference should run on the native kernels: they are available and, unless GPT2_NATIVE_KERNELS=1
    asks for them anyway, this CPU has the AVX-512 paths that make them faster than the PyTorch layouts (module
    docstring). Read at each call, so that a test or a caller can switch it with the variable."""
    switch = os.environ.get(SWITCH_VARIABLE)
    if switch == "0" or (switch != "1" and not cpu_flags().issuperset(VECTOR_FLAGS)):
        return False
    return kernels_available()


def native_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    kind: int,
    out_features: int,
) -> torch.Tensor:
    """y = x W^T + b by the native product for the format `kind`; x (..., in) -> (..., out) float32."""
    return native_ops().linear(x, weight, scale, bias, kind, out_features)


def native_ops() -> torch._ops._OpNamespace:
    """`torch.ops.gpt2`, the kernels loaded (built on first use); a clear error where they cannot be."""
    if not kernels_available():
        raise RuntimeError(
            "the native CPU kernels are not available on this machine (the log line above says why); "
            "use the PyTorch layouts: gpt2.cpu.prepare_for_inference falls back to them"
        )
    return torch.ops.gpt2


# ------------------------------------------------------------------------------------------ packing
def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, K) float weight -> (codes (O, K) int8, scale (O,) float32): W ~= codes * scale, one symmetric scale per
    output row (absmax / 127). The int8 quantization of both int8 layouts (this file's tiles, `Int8Linear`)."""
    weight = weight.detach().float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / INT8_MAX  # (O,)
    codes = torch.round(weight / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scale


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, K) float weight -> (tiles (O/16, K/2, 16, 2) int8, scale (O padded,) float32): W ~= q * scale per row,
    with the rows padded with zeros to a multiple of 16."""
    out_features, in_features = weight.shape
    codes, scale = quantize_int8_rows(weight)
    padding = -out_features % TILE
    codes, scale = F.pad(codes, (0, 0, 0, padding)), F.pad(scale, (0, padding))
    tiles = codes.view(-1, TILE, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()  # (O/16, K/2, 16, 2)
    return tiles, scale.contiguous()


def unpack_int8(tiles: torch.Tensor, scale: torch.Tensor, out_features: int) -> torch.Tensor:
    """The (O, K) float32 weight that `pack_int8`'s output stands for."""
    codes = tiles.permute(0, 2, 1, 3).reshape(-1, tiles.shape[1] * 2)  # (O padded, K)
    return (codes.float() * scale[:, None])[:out_features]


def pack_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(O, K) float weight -> (codes (O/16, K/32, 8, 16, 2) uint8, params (O/16, K/32, 2, 16) float16): per row
    and group of 32 inputs W ~= code * scale + minimum, code in 0..15, scale and minimum rounded to float16
    before the codes are chosen (so the codes fit the parameters the kernel reads)."""
    weight = weight.detach().float()
    out_features, in_features = weight.shape
    weight = F.pad(weight, (0, 0, 0, -out_features % TILE))
    tiles, groups = weight.shape[0] // TILE, in_features // BLOCK
    grouped = weight.view(tiles, TILE, groups, BLOCK)  # (tile, row, group, input)
    minimum = grouped.amin(dim=-1).half().float()  # (tile, row, group)
    scale = ((grouped.amax(dim=-1) - minimum) / INT4_LEVELS).clamp(min=2**-24).half().float()
    codes = torch.round((grouped - minimum[..., None]) / scale[..., None]).clamp(0, INT4_LEVELS).to(torch.uint8)
    # chunk c of a group: inputs 4c..4c+3; byte j of a row's pair = code(4c + j) | code(4c + 2 + j) << 4
    chunks = codes.view(tiles, TILE, groups, BLOCK // 4, 4)
    packed = chunks[..., :2] | (chunks[..., 2:] << 4)  # (tile, row, group, chunk, 2)
    packed = packed.permute(0, 2, 3, 1, 4).contiguous()  # (tile, group, chunk, row, 2)
    params = torch.stack([scale, minimum], dim=2).permute(0, 3, 2, 1).contiguous().half()  # (tile, group, 2, row)
    return packed, params


def unpack_int4(packed: torch.Tensor, params: torch.Tensor, out_features: int) -> torch.Tensor:
    """The (O, K) float32 weight that `pack_int4`'s output stands for."""
    tiles, groups = packed.shape[0], packed.shape[1]
    pairs = packed.permute(0, 3, 1, 2, 4)  # (tile, row, group, chunk, 2)
    codes = torch.cat([pairs & 0x0F, pairs >> 4], dim=-1).float()  # (tile, row, group, chunk, 4)
    codes = codes.view(tiles, TILE, groups, BLOCK)
    scale, minimum = params.float().permute(0, 3, 1, 2).unbind(dim=-1)  # (tile, row, group) each
    weight = codes * scale[..., None] + minimum[..., None]
    return weight.reshape(tiles * TILE, groups * BLOCK)[:out_features]


class NativeLinear(nn.Module):
    """y = x W^T + b with W in bfloat16 or a packed int8 / int4 format, on the native kernels. Activations and
    output keep the input's dtype. For inference only.

    A few rows (decode steps, small batches) stream the weight through the native product; from
    MANY_ROWS[precision] rows on (prefills, evaluation) one matrix product over the weight dequantized on the fly
    is faster, in the dtype this CPU multiplies fastest (`many_rows_dtype`)."""

    weight_packed: torch.Tensor
    scale: torch.Tensor | None

    def __init__(
        self,
        precision: str,
        weight: torch.Tensor,
        scale: torch.Tensor | None,
        bias: torch.Tensor | None,
        in_features: int,
        out_features: int,
    ) -> None:
        super().__init__()
        if precision not in ("bfloat16", "int8", "int4"):
            raise ValueError(f"NativeLinear holds bfloat16, int8 or int4 weights, not {precision!r}")
        self.precision = precision
        self.kind = KIND[precision]
        self.register_buffer("weight_packed", weight)  # bfloat16 (O, K), or the packed tiles
        self.register_buffer("scale", scale)  # int8: per row (O padded,); int4: the groups' scale and minimum
        self.bias = None if bias is None else nn.Parameter(bias.detach().float(), requires_grad=False)
        self.in_features = in_features
        self.out_features = out_features  # the packed rows are padded to a multiple of 16

    @classmethod
    def from_linear(cls, linear: nn.Linear, precision: str) -> NativeLinear:
        if linear.in_features % BLOCK:
            raise ValueError(f"native layers need in_features divisible by {BLOCK}, got {linear.in_features}")
        scale: torch.Tensor | None = None
        if precision == "bfloat16":
            weight = linear.weight.detach().to(torch.bfloat16).contiguous()  # shared when already bfloat16
        else:
            weight, scale = (pack_int8 if precision == "int8" else pack_int4)(linear.weight)
        return cls(precision, weight, scale, linear.bias, linear.in_features, linear.out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // x.shape[-1] >= MANY_ROWS[self.precision]:
            dtype = many_rows_dtype()
            bias = None if self.bias is None else self.bias.to(dtype)
            return F.linear(x.to(dtype), self.dequantized_weight(dtype), bias).to(x.dtype)
        y = native_linear(x, self.weight_packed, self.scale, self.bias, self.kind, self.out_features)
        return y.to(x.dtype)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (out, in) weight the stored values stand for, in `dtype` (for int8 / int4 a transposed view of a
        contiguous (in, out) matrix, which matrix products read as it is)."""
        kind, size = self.kind, (self.in_features, self.out_features)
        weight = native_ops().dequantize(self.weight_packed, self.scale, kind, *size, dtype)
        return weight if self.precision == "bfloat16" else weight.t()

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The plain path in float32: dequantize, then an ordinary linear layer."""
        return F.linear(x.float(), self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.precision} (native)"


def many_rows_dtype() -> torch.dtype:
    """The dtype of prefill matrix products over dequantized weights: bfloat16 where the CPU multiplies it fast
    (AMX tiles, or AMD's AVX512-BF16: about 3x float32's prompt tokens/s there, `gpt2 bench prefill --precisions
    float32,bfloat16`), else float32 (elsewhere bfloat16 products are emulated or slow)."""
    return torch.bfloat16 if cpu_prefers_bf16() else torch.float32
