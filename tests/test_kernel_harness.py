"""Each vector build of the native kernels (csrc/kernels.h on simd_neon.h, simd_avx2.h, simd_avx512.h) computes what
the portable reference computes.

tests/native/kernel_harness.cpp runs the kernels of kernels.h, and the contract functions cpu_decode.cpp calls
outside them, on fixed seeded inputs and prints the results; kernels.h needs no torch (c10::Half comes from
tests/native/stub), so the harness builds with any C++ compiler. It is built for the portable reference and for each
vector ISA, and every build's output must agree with the portable one line by line (the harness's top comment
describes the lines). No AArch64 machine runs the tests, so NEON is cross-compiled and run under qemu-user, which
needs Debian's g++-aarch64-linux-gnu and qemu-user: without them the NEON tests skip, saying so, and under CI
(CI=true) they fail. AVX2 and AVX-512 build and run natively, and skip on a CPU without them.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpt2.cpu.kernels import ISA_CFLAGS, ISA_FLAGS, SOURCES, runnable_isas

NATIVE = Path(__file__).resolve().parent / "native"
HARNESS = NATIVE / "kernel_harness.cpp"
STUB = NATIVE / "stub"  # c10/util/Half.h, standing in for torch's
CROSS_COMPILER = "aarch64-linux-gnu-g++"
EMULATORS = ("qemu-aarch64", "qemu-aarch64-static")  # Debian's qemu-user, or qemu-user-static
SYSROOT = Path("/usr/aarch64-linux-gnu")  # AArch64 libraries of the cross toolchain, for qemu's loader
INSTALL = "apt-get install g++-aarch64-linux-gnu qemu-user"
# -ffp-contract=off: no multiply and add fused by the compiler, so lanewise results are exact on every ISA
CXXFLAGS = ["-std=c++17", "-O2", "-ffp-contract=off", "-Wall", "-Wextra", f"-I{SOURCES}", f"-I{STUB}"]
SUM_TOLERANCE = 1e-5  # relative: float sums of positive terms added in an order that depends on the lanes
COMMAND_TIMEOUT = 300  # seconds, for a compile on a busy machine
VECTOR_ISAS = ["neon", "avx2", "avx512"]
LANES = {"neon": "4", "avx2": "8", "avx512": "16"}
TILE_CHECKS = [
    f"tile_{kind}.{check}"
    for kind in ("int8", "int4")
    for check in ("decode_equals_scalar", "sums_equal_scalar", "streamed_sums_equal_scalar")
]


@dataclass(frozen=True)
class Line:
    kind: str  # info, exact, close or check
    values: list[str]


@dataclass(frozen=True)
class Build:
    isa: str
    lines: dict[str, Line]


def missing_tools(message: str) -> None:
    """Skip, saying what is missing; under CI, which installs the tools (.ci/run), fail."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


def host_compiler() -> str:
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        missing_tools("the kernel harness needs a C++ compiler (c++)")
    assert compiler
    return compiler


def toolchain(isa: str) -> tuple[str, list[str], list[str]]:
    """The compiler, its flags and what runs the binary here (nothing, or qemu for NEON off AArch64)."""
    if isa == "neon" and platform.machine() != "aarch64":
        cross_compiler = shutil.which(CROSS_COMPILER)
        emulator = next((found for name in EMULATORS if (found := shutil.which(name))), None)
        missing = [
            name
            for name, present in [
                (CROSS_COMPILER, cross_compiler),
                (" or ".join(EMULATORS), emulator),
                (str(SYSROOT), SYSROOT.is_dir()),
            ]
            if not present
        ]
        if missing:
            missing_tools(f"the NEON kernel test needs {', '.join(missing)} (Debian: {INSTALL})")
        assert cross_compiler and emulator
        return cross_compiler, ["-DGPT2_ISA_NEON"], [emulator, "-L", str(SYSROOT)]
    if isa not in runnable_isas():
        pytest.skip(f"this CPU ({platform.machine()}) cannot run the {isa} build: it needs {', '.join(ISA_FLAGS[isa])}")
    return host_compiler(), ISA_CFLAGS[isa], []


def run(command: list[str]) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}"
    return result.stdout


def harness_output(compiler: str, flags: list[str], runner: list[str], binary: Path) -> dict[str, Line]:
    """The harness built with `flags` and run, its lines by name."""
    run([compiler, *CXXFLAGS, *flags, f"-DGPT2_OPS=gpt2_{binary.name}", str(HARNESS), "-o", str(binary)])
    lines: dict[str, Line] = {}
    for text in run([*runner, str(binary)]).splitlines():
        kind, name, *values = text.split()
        assert name not in lines, f"the harness printed {name} twice"
        lines[name] = Line(kind, values)
    return lines


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kernel_harness")


@pytest.fixture(scope="module")
def portable(folder: Path) -> dict[str, Line]:
    return harness_output(host_compiler(), [], [], folder / "portable")


@pytest.fixture(scope="module", params=VECTOR_ISAS)
def vector(request: pytest.FixtureRequest, folder: Path) -> Build:
    isa = request.param
    compiler, flags, runner = toolchain(isa)
    return Build(isa, harness_output(compiler, flags, runner, folder / isa))


def first_difference(ours: list[str], reference: list[str]) -> str:
    if len(ours) != len(reference):
        return f"{len(ours)} values, the reference {len(reference)}"
    index = next(i for i, (a, b) in enumerate(zip(ours, reference, strict=True)) if a != b)
    return f"value {index}: {ours[index]}, the reference {reference[index]}"


@pytest.mark.slow
def test_each_build_runs_its_own_header(vector: Build, portable: dict[str, Line]) -> None:
    assert (vector.lines["NAME"].values, vector.lines["W"].values) == ([vector.isa], [LANES[vector.isa]])
    assert (portable["NAME"].values, portable["W"].values) == (["portable"], ["1"])


def test_both_builds_print_the_same_lines(vector: Build, portable: dict[str, Line]) -> None:
    def kinds(lines: dict[str, Line]) -> dict[str, str]:
        return {name: line.kind for name, line in lines.items() if line.kind != "info"}

    assert kinds(vector.lines) == kinds(portable)


def test_lanewise_results_equal_the_portable_reference_exactly(vector: Build, portable: dict[str, Line]) -> None:
    """Rounding, conversions, bfloat16 / float16 widening and narrowing, exp, the activations' quantization, the int8
    and int4 tile products, GELU and the attention's weighted sums: the same bits."""
    mismatches = [
        f"{name}: {first_difference(line.values, portable[name].values)}"
        for name, line in vector.lines.items()
        if line.kind == "exact" and line.values != portable[name].values
    ]
    assert mismatches == []


def test_sums_equal_the_portable_reference_to_rounding(vector: Build, portable: dict[str, Line]) -> None:
    """The row-major products, LayerNorm and the attention's dot products add in an order that depends on the lanes."""
    mismatches = []
    for name, line in vector.lines.items():
        if line.kind != "close":
            continue
        ours, theirs = [float.fromhex(v) for v in line.values], [float.fromhex(v) for v in portable[name].values]
        if len(ours) != len(theirs) or not all(
            math.isclose(a, b, rel_tol=SUM_TOLERANCE) for a, b in zip(ours, theirs, strict=True)
        ):
            mismatches.append(f"{name}: {ours} != {theirs}")
    assert mismatches == []


def test_tile_products_equal_scalar_sums_of_the_same_bytes(vector: Build) -> None:
    """The int8 and int4 tiles decoded as cpu_decode.cpp dequantizes them, and multiplied as its products do, give
    what plain scalar code reading the same bytes gives, to the bit."""
    checks = {name: line.values for name, line in vector.lines.items() if line.kind == "check"}
    assert checks == {name: ["ok"] for name in TILE_CHECKS}


def test_the_portable_tile_products_equal_scalar_sums_of_the_same_bytes(portable: dict[str, Line]) -> None:
    checks = {name: line.values for name, line in portable.items() if line.kind == "check"}
    assert checks == {name: ["ok"] for name in TILE_CHECKS}
