"""Atomic writers: a write killed before its rename leaves only a temporary of our own naming, which the next
write to that path removes once its writer is gone; a live writer's temporary is never touched. The same holds
for the native kernels' build folder, so a builder killed mid-build never blocks a later build."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpt2.runtime.files import atomic_directory, atomic_write_bytes, remove_stale_temporaries, temporary_path

REPO_SRC = Path(__file__).resolve().parents[1] / "src"


def run_python(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO_SRC), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                          timeout=300, env=environment)  # fmt: skip


def leftovers(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


@pytest.mark.slow
def test_a_killed_write_leaves_one_temporary_that_the_next_write_removes(tmp_path):
    target = tmp_path / "model.gguf"
    done = run_python(f"""
        import os, signal
        from gpt2.runtime.files import atomic_output
        with atomic_output({str(target)!r}) as temporary:
            temporary.write_bytes(b"half a file")
            os.kill(os.getpid(), signal.SIGKILL)  # as kill -9 during an export
    """)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not target.exists() and len(leftovers(target)) == 1  # never a half-written output
    atomic_write_bytes(target, b"a whole file")
    assert target.read_bytes() == b"a whole file" and leftovers(target) == []


@pytest.mark.slow
def test_a_killed_directory_write_is_removed_by_the_next_one(tmp_path):
    target = tmp_path / "export"
    done = run_python(f"""
        import os, signal
        from gpt2.runtime.files import atomic_directory
        with atomic_directory({str(target)!r}) as staging:
            (staging / "model.onnx").write_bytes(b"half")
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert done.returncode == -signal.SIGKILL and len(leftovers(target)) == 1
    with atomic_directory(target) as staging:
        (staging / "model.onnx").write_bytes(b"whole")
    assert (target / "model.onnx").read_bytes() == b"whole" and leftovers(target) == []


def test_a_live_writers_temporary_and_other_files_are_left_alone(tmp_path):
    target = tmp_path / "out.bin"
    live = temporary_path(target)  # this process's: alive
    live.write_bytes(b"being written")
    other_host = tmp_path / f".{target.name}.elsewhere-1.abcd1234.tmp"  # another machine's, on a shared disk
    other_host.write_bytes(b"?")
    unrelated = tmp_path / ".out.bin.notes.tmp"
    unrelated.write_bytes(b"not ours")
    assert remove_stale_temporaries(target) == []
    assert live.exists() and other_host.exists() and unrelated.exists()


def test_temporaries_are_named_for_the_path_and_the_writer(tmp_path):
    name = temporary_path(tmp_path / "x.safetensors").name
    assert name.startswith(".x.safetensors.") and name.endswith(".tmp") and f"-{os.getpid()}." in name


@pytest.mark.slow
def test_a_native_kernel_build_killed_mid_build_does_not_block_the_next(tmp_path):
    # torch's builder waits forever while its `lock` file exists; a builder killed mid-build leaves one.
    from gpt2.cpu import kernels

    if not kernels.kernels_available():
        pytest.skip("the native kernels do not build here")
    built = kernels.build_folder(kernels.active_isa())
    copy = tmp_path / "extensions" / built.name
    shutil.copytree(built, copy, ignore=shutil.ignore_patterns("lock", kernels.BUILD_LOCK))
    (copy / "lock").write_text("")  # what a killed builder leaves
    done = run_python(
        "from gpt2.cpu.kernels import kernels_available; assert kernels_available(); print('loaded')",
        TORCH_EXTENSIONS_DIR=str(tmp_path / "extensions"),
    )
    assert done.returncode == 0 and "loaded" in done.stdout, done.stderr[-2000:]
