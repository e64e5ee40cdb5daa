"""Native CPU kernels for decoding (csrc/), and the bfloat16 / int8 / int4 layers that use them.

Decoding reads every weight once per step, so on a CPU it runs at the speed the weights stream from memory.
PyTorch's one-row products stream bf16, int8 and int4 weights well below that speed (its int8 and int4 kernels
are built for many rows), and a step of ~250 small framework ops costs 2-3 ms on top. The C++ file has products
that stream every format at close to memory speed, and a decoder that runs a whole one-token step in one call
(gpt2.cpu.decoder).

Each kernel is written once over a small vector layer (csrc/simd.h) with one implementation per instruction set:
AVX-512, AVX2 (+ FMA, F16C), ARM NEON, and plain C++ (the portable reference). The file is compiled on first use
by torch's extension builder for one of them (about 20 s, once per machine and instruction set: the build is cached
under torch's extensions folder, keyed by the sources, the torch version, the instruction set and, for builds
tuned to this CPU, its features) and loaded as `torch.ops.gpt2_<isa>`. `GPT2_CPU_ISA=avx512|avx2|neon|portable`
picks the build; by default it is the best one this CPU runs, so an AVX-512 machine can measure and test the AVX2
path exactly as an AVX2-only CPU runs it. A CPU with none of the vector sets (or no C++ compiler, not Linux,
`GPT2_NATIVE_KERNELS=0`) uses the PyTorch layouts of gpt2.cpu.layouts, which compute the same thing more slowly;
`GPT2_NATIVE_KERNELS=1` asks for the portable loops there.

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

SOURCES = Path(__file__).resolve().parent / "csrc"
SOURCE = SOURCES / "cpu_decode.cpp"  # the one compiled file; it includes simd.h and one simd_<isa>.h
SWITCH_VARIABLE = "GPT2_NATIVE_KERNELS"  # 0: the PyTorch layouts only; 1: the portable loops where no vector set is
ISA_VARIABLE = "GPT2_CPU_ISA"  # which build of the kernels runs (default: the best this CPU has)
CFLAGS_VARIABLE = "GPT2_KERNEL_CFLAGS"  # more compiler flags (e.g. -DGPT2_PREFETCH_BYTES=N when tuning a constant)
ISAS = ("avx512", "avx2", "neon", "portable")  # best first
# What each vector build needs of the CPU (as /proc/cpuinfo names the flags) and how it is compiled. The AVX-512
# build is tuned to the CPU it runs on (VNNI and BF16 instructions where present); the AVX2 one uses exactly what
# AVX2-only CPUs (AMD Zen 1-3, Intel client CPUs) have, so it runs here as it runs there.
ISA_MACHINES = {"avx512": "x86_64", "avx2": "x86_64", "neon": "aarch64"}
ISA_FLAGS = {
    "avx512": ("avx512f", "avx512bw", "avx512vl", "fma", "f16c"),
    "avx2": ("avx2", "fma", "f16c"),
    "neon": ("asimd",),
}
ISA_CFLAGS = {
    "avx512": ["-march=native", "-DGPT2_ISA_AVX512"],
    "avx2": ["-mavx2", "-mfma", "-mf16c", "-DGPT2_ISA_AVX2"],
    "neon": ["-mcpu=native", "-DGPT2_ISA_NEON"],
    "portable": [],
}
NO_KERNELS = "pytorch"  # what active_isa() says when the PyTorch layouts run instead
BUILD_LOCK = "gpt2-build.flock"  # in the build folder: held (fcntl) by the one process building or loading
TILE = 16  # output rows per tile of the packed formats
BLOCK = 32  # inputs per activation-quantization block and per int4 group
# Rows from which NativeLinear multiplies by the dequantized weight, per precision (measured crossovers, 124M on
# the 2-core Zen 5 VM, a prefill of P tokens: int8 24-32 (P = 63: 68 ms native, 38 dequantized), int4 the same,
# bfloat16 64; benchmarks/inference/prefill_crossover.py). The native product reads the weights once every 4 rows.
MANY_ROWS = {"bfloat16": 64, "int8": 32, "int4": 32}
# Where int16 pair products are one instruction (AVX512-VNNI's `vpdpwssd`: 32 multiply-adds, twice a float32 FMA's),
# int8 and int4 products of any number of rows stay native: a whole tile against 12 rows at a time runs ~1.3x
# oneDNN's float32 product over the dequantized weight (`gpt2 bench prefill --precisions float32,int8,int4`).
NATIVE_PROMPT_FLAGS = {"avx512": "avx512_vnni"}
INT8_MAX = 127
INT4_LEVELS = 15
KIND = {"float32": 0, "bfloat16": 1, "int8": 2, "int4": 3}  # the C++ file's `Kind`

log = logging.getLogger(__name__)


def library_name(isa: str) -> str:
    """The namespace an ISA's build registers its ops under: `torch.ops.<name>`, `torch.classes.<name>`."""
    return f"gpt2_{isa}"


def kernels_available(isa: str | None = None) -> bool:
    """Build (once per machine) and load the native kernels for `isa` (default: the one `selected_isa` picks now);
    False, with one logged line saying why, where that is not possible."""
    if os.environ.get(SWITCH_VARIABLE) == "0":
        return False
    isa = isa or selected_isa()
    return isa is not None and _built(isa)


@functools.cache
def _built(isa: str) -> bool:
    """kernels_available for one build, cached for the process: the ops are registered process-wide by torch
    (`torch.ops.gpt2_<isa>`)."""
    if platform.system() != "Linux":
        log.warning("gpt2: native CPU kernels are built on Linux only; decoding uses PyTorch's kernels")
        return False
    if isa not in runnable_isas():
        raise ValueError(f"this CPU cannot run the {isa} kernels; it runs {', '.join(runnable_isas())}")
    try:
        from torch.utils.cpp_extension import load

        build_directory = build_folder(isa)
        name = build_directory.name
        if not (build_directory / f"{name}.so").exists():
            log.warning("gpt2: compiling the native CPU kernels for %s (once per machine, about 20 s)", isa)
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
                extra_cflags=["-O3", "-fopenmp", f"-DGPT2_OPS={library_name(isa)}", *compiler_flags(isa)],
                extra_include_paths=[str(SOURCES)],
                build_directory=str(build_directory),
                is_python_module=False,
                verbose=False,
            )
    except Exception as error:  # a missing compiler, headers or ninja: the PyTorch layouts still work
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        log.warning("gpt2: native CPU kernels unavailable (%s); decoding uses PyTorch's kernels", first_line)
        return False
    return True


def build_folder(isa: str) -> Path:
    """Where `isa`'s build lives (torch's extensions folder, TORCH_EXTENSIONS_DIR where set), named for what it was
    built from."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    return root / f"{library_name(isa)}_{_build_key(isa)}"


def _build_key(isa: str) -> str:
    """What the compiled file depends on: the sources, torch, the ISA and, for -march/-mcpu=native builds, the CPU
    features the compiler sees."""
    digest = hashlib.sha256()
    for source in sorted(SOURCES.iterdir()):
        if source.suffix in (".cpp", ".h"):
            digest.update(source.name.encode() + source.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(platform.machine().encode())
    digest.update(" ".join(compiler_flags(isa)).encode())
    if any("native" in flag for flag in ISA_CFLAGS[isa]):
        digest.update(" ".join(sorted(cpu_flags())).encode())
    return digest.hexdigest()[:16]


def compiler_flags(isa: str) -> list[str]:
    """The flags `isa`'s build is compiled with: its instruction set's, then GPT2_KERNEL_CFLAGS's."""
    return [*ISA_CFLAGS[isa], *os.environ.get(CFLAGS_VARIABLE, "").split()]


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as /proc/cpuinfo lists them (x86 `flags`, ARM `Features`); empty elsewhere."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((line for line in cpuinfo.splitlines() if line.startswith(("flags", "Features"))), "")
    return frozenset(line.partition(":")[2].split())


def runnable_isas() -> tuple[str, ...]:
    """The kernel builds this CPU executes, best first; `portable` always last."""
    machine = platform.machine().lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
    vector = [isa for isa in ISA_FLAGS if ISA_MACHINES[isa] == machine and cpu_flags().issuperset(ISA_FLAGS[isa])]
    return (*vector, "portable")


def selected_isa() -> str | None:
    """The build inference should use: GPT2_CPU_ISA where set (a ValueError names the choices when it is not one
    this CPU runs), else the best vector build this CPU has, else None (the PyTorch layouts are faster than the
    portable loops), unless GPT2_NATIVE_KERNELS=1 asks for those."""
    asked = os.environ.get(ISA_VARIABLE, "").strip().lower()
    if asked:
        if asked not in runnable_isas():
            raise ValueError(
                f"{ISA_VARIABLE}={asked!r} is not a kernel build this CPU runs; choose one of "
                f"{', '.join(runnable_isas())} (or unset it for the best)"
            )
        return asked
    best = runnable_isas()[0]
    if best != "portable" or os.environ.get(SWITCH_VARIABLE) == "1":
        return best
    return None


def active_isa() -> str:
    """The kernel build inference runs on ("avx512", "avx2", "neon", "portable"), or "pytorch" where it runs on
    the PyTorch layouts instead (module docstring). Read at each call, so that a test or a caller can switch it
    with the variables."""
    if os.environ.get(SWITCH_VARIABLE) == "0":
        return NO_KERNELS
    isa = selected_isa()
    return isa if isa is not None and kernels_available(isa) else NO_KERNELS


def use_native_kernels() -> bool:
    """Whether inference runs on the native kernels (`active_isa` is one of their builds)."""
    return active_isa() != NO_KERNELS


def native_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    bias: torch.Tensor | None,
    kind: int,
    out_features: int,
    *,
    isa: str | None = None,
) -> torch.Tensor:
    """y = x W^T + b by the native product for the format `kind` (in the build of `isa`, default the active one);
    x (..., in) -> (..., out) float32."""
    return native_ops(isa).linear(x, weight, scale, bias, kind, out_features)


def native_ops(isa: str | None = None) -> torch._ops._OpNamespace:
    """`torch.ops.gpt2_<isa>` (default: the active build), the kernels loaded (built on first use); a clear error
    where they cannot be."""
    isa = isa or active_isa()
    if isa == NO_KERNELS or not kernels_available(isa):
        raise RuntimeError(
            "the native CPU kernels are not available on this machine (the log line above says why); "
            "use the PyTorch layouts: gpt2.cpu.prepare_for_inference falls back to them"
        )
    return getattr(torch.ops, library_name(isa))


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
    is faster, in the dtype this CPU multiplies fastest (`many_rows_dtype`), unless the native int8 / int4 product
    of many rows is (`native_prompts`)."""

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
        if x.numel() // x.shape[-1] >= MANY_ROWS[self.precision] and not native_prompts(self.precision):
            dtype = many_rows_dtype()
            bias = None if self.bias is None else self.bias.to(dtype)
            weight = self.dequantized_weight(dtype)
            if dtype == torch.float32 and onednn_available():  # oneDNN's float32 product: faster than MKL's here
                return torch.ops.mkldnn._linear_pointwise(x.float(), weight, bias, "none", [], "").to(x.dtype)
            return F.linear(x.to(dtype), weight, bias).to(x.dtype)
        y = native_linear(x, self.weight_packed, self.scale, self.bias, self.kind, self.out_features)
        return y.to(x.dtype)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The (out, in) weight the stored values stand for, contiguous in `dtype`."""
        kind, size = self.kind, (self.in_features, self.out_features)
        return native_ops().dequantize(self.weight_packed, self.scale, kind, *size, dtype)

    def reference_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The plain path in float32: dequantize, then an ordinary linear layer."""
        return F.linear(x.float(), self.dequantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.precision} (native)"


def native_prompts(precision: str) -> bool:
    """Whether products of many rows at `precision` run on the native kernels rather than over the dequantized
    weight: int8 and int4 on a build whose CPU has one-instruction int16 pair products (NATIVE_PROMPT_FLAGS)."""
    if precision not in ("int8", "int4"):
        return False
    flag = NATIVE_PROMPT_FLAGS.get(active_isa())
    return flag is not None and flag in cpu_flags()


def onednn_available() -> bool:
    """PyTorch has its oneDNN backend and the ops the float32 products of many rows call (private ops Inductor
    uses): `OneDNNLinear`'s, and `NativeLinear`'s over a dequantized weight."""
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_linear_pointwise", "_reorder_linear_weight")
    )


def many_rows_dtype() -> torch.dtype:
    """The dtype of prefill matrix products over dequantized weights: bfloat16 where the CPU multiplies it fast
    (AMX tiles, or AMD's AVX512-BF16: about 3x float32's prompt tokens/s there, `gpt2 bench prefill --precisions
    float32,bfloat16`), else float32: elsewhere bfloat16 products are emulated or slow, and so they are for a build
    without AVX-512, which stands for a CPU without those instructions."""
    return torch.bfloat16 if cpu_prefers_bf16() and active_isa() == "avx512" else torch.float32
