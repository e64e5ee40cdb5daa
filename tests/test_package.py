"""The package as a user gets it: `python -m build` makes an sdist and a wheel (from the sdist, as build does), and
the wheel installed into a fresh virtual environment gives a working `gpt2` command.

No network: the build runs without isolation on this environment's setuptools, and the fresh venv sees this
environment's packages (torch, numpy, ...) through a .pth file, so pip installs only the wheel and resolves its
dependencies against what is already there (`--no-index`: a dependency the metadata names and nothing provides
fails the install). The project is copied out first: building never writes into the working tree.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.slow  # a build, a venv and a 5-step training run (~1 minute)

DISTRIBUTION = "gpt2-faithful"
KERNEL_SOURCE = "gpt2/cpu/csrc/cpu_decode.cpp"


def run(command: list[str], **options: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL, **options)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("build")
    project = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, project / name)
    shutil.copytree(REPO_ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = project / "dist"
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(project)])
    return out


def only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def test_build_makes_an_sdist_and_a_wheel_named_for_the_distribution(dist: Path) -> None:
    wheel, sdist = only(dist, "*.whl"), only(dist, "*.tar.gz")
    assert wheel.name.startswith("gpt2_faithful-0.1.0-py3-none-any")
    assert sdist.name == "gpt2_faithful-0.1.0.tar.gz"
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
    assert f"gpt2_faithful-0.1.0/src/{KERNEL_SOURCE}" in names and "gpt2_faithful-0.1.0/LICENSE" in names


def test_the_wheel_holds_the_kernel_source_the_license_and_the_metadata(dist: Path) -> None:
    with zipfile.ZipFile(only(dist, "*.whl")) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read("gpt2_faithful-0.1.0.dist-info/METADATA").decode()
        entry_points = wheel.read("gpt2_faithful-0.1.0.dist-info/entry_points.txt").decode()
    assert {KERNEL_SOURCE, "gpt2/py.typed", "gpt2/model.py", "gpt2_faithful-0.1.0.dist-info/licenses/LICENSE"} <= names
    assert not [name for name in names if name.startswith(("tests/", "benchmarks/"))]
    assert f"Name: {DISTRIBUTION}" in metadata and "License-Expression: MIT" in metadata
    assert "Classifier: Programming Language :: Python :: 3" in metadata
    assert "Provides-Extra: onnx" in metadata
    assert "gpt2 = gpt2.cli:main" in entry_points


def test_the_wheel_in_a_fresh_venv_runs_gpt2_help_and_a_5_step_training(dist: Path, tmp_path: Path) -> None:
    environment = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(environment)
    python = environment / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    # this environment's packages (torch and the other dependencies) below the venv's own; ensurepip's old
    # setuptools would hide the newer one torch requires
    Path(site, "outer-environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(python), "-m", "pip", "uninstall", "--yes", "setuptools"])
    run([str(python), "-m", "pip", "install", "--no-index", "--no-cache-dir", str(only(dist, "*.whl"))])

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # the wheel, not the checkout
    command = environment / "bin" / "gpt2"
    located = run([str(python), "-c", "import gpt2; print(gpt2.__file__)"], env=env, cwd=tmp_path).stdout
    assert located.startswith(site), located
    assert "usage: gpt2" in run([str(command), "--help"], env=env, cwd=tmp_path).stdout
    source = "from gpt2.cpu.kernels import SOURCE; print(SOURCE.is_file(), SOURCE)"  # compiled on first use
    assert run([str(python), "-c", source], env=env, cwd=tmp_path).stdout.startswith(f"True {site}")

    out = tmp_path / "run"
    settings = {
        "data.max_corpus_bytes": 60000, "data.vocab_size": 300, "data.batch_size": 4, "schedule.max_steps": 5,
        "model.n_layer": 1, "model.n_embd": 32, "model.block_size": 32, "evaluation.eval_interval": 5,
        "evaluation.eval_batches": 1, "evaluation.sample_tokens": 8, "runtime.device": "cpu",
    }  # fmt: skip
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    trained = run([str(command), "train", "stdlib", "--no-progress", "--out", str(out), *overrides], env=env)
    assert "val loss" in trained.stdout
    assert (out / "model.safetensors").is_file() and (out / "metrics.jsonl").is_file()
