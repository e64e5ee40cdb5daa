"""A disk that says no (full, read-only, not ours) gives every writing command one line naming the path, the cause
and the fix, exit status 1, the earlier output intact and no temporary left behind. The disks are real: a tmpfs
mounted small and filled, and one remounted read-only (root only; skipped with the reason elsewhere).
`gpt2 export` also refuses to replace an existing output without --overwrite."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import shared_file
from gpt2.cli import main
from gpt2.runtime.files import atomic_write_bytes, describe_write_error

FORMATS = {"gguf": "out.gguf", "llmc": "out.bin", "hf": "out-hf", "onnx": "out-onnx"}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of its own, unmounted after the test."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; these tests run where the test user may mount")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"mount is not permitted here: {done.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(disk: Path) -> None:
    """Write a filler file until the disk refuses even a page."""
    with open(disk / "filler", "wb", buffering=0) as filler:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            try:
                while True:
                    filler.write(b"\0" * chunk)
            except OSError as err:
                assert err.errno == errno.ENOSPC, err


def read_only(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)


def hidden_leftovers(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.rglob(".*"))


@pytest.fixture(scope="module")
def model() -> Path:
    return shared_file("fixtures/gguf-tiny/model-f32.gguf").parent / "hf"


def one_line_error(capsys: pytest.CaptureFixture[str], command: str, *words: str) -> str:
    """The error: the last line on stderr (after any progress lines), no traceback."""
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert last.startswith(f"gpt2 {command}: error: cannot write ") and "Traceback" not in err, err
    assert all(word in last for word in words), err
    return last


def test_a_disk_refusal_is_described_by_path_cause_and_fix():
    full = OSError(errno.ENOSPC, "No space left on device", "/data/out.gguf")
    assert describe_write_error(full) == (
        "cannot write /data/out.gguf: no space left on the device; free some space there or write to another disk"
    )
    assert "permission denied" in str(describe_write_error(PermissionError(errno.EACCES, "denied", "/x")))
    assert describe_write_error(FileNotFoundError(errno.ENOENT, "missing", "/x")) is None


def test_a_write_that_loses_its_errno_on_a_full_disk_is_no_space(disk: Path):
    fill(disk)
    target = disk / "tensors.bin"
    with pytest.raises(OSError) as raised:
        atomic_write_bytes(target, b"\1" * (1 << 20))
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(target)
    assert sorted(path.name for path in disk.iterdir()) == ["filler"]


@pytest.mark.slow
@pytest.mark.parametrize("format", ["gguf", "llmc", "hf", "onnx"])
def test_export_on_a_full_disk_keeps_the_earlier_output(format, disk, model, capsys):
    if format == "onnx":
        pytest.importorskip("onnx")
    if format == "gguf":
        pytest.importorskip("gguf")
    out = disk / FORMATS[format]
    assert main(["export", "--model", str(model), "--format", format, "--out", str(out)]) == 0
    before = {path: path.read_bytes() for path in disk.rglob("*") if path.is_file()}
    fill(disk)
    code = main(["export", "--model", str(model), "--format", format, "--dtype", "f32", "--out", str(out),
                 "--overwrite"])  # fmt: skip
    assert code == 1
    one_line_error(capsys, "export", str(out), "no space left on the device")
    after = {path: path.read_bytes() for path in disk.rglob("*") if path.is_file() and path.name != "filler"}
    assert after == before and hidden_leftovers(disk) == []


@pytest.mark.parametrize("format", ["gguf", "llmc", "hf"])
def test_export_to_a_read_only_disk_is_one_line(format, disk, model, capsys):
    pytest.importorskip("gguf")
    read_only(disk)
    out = disk / "sub" / FORMATS[format]
    assert main(["export", "--model", str(model), "--format", format, "--out", str(out)]) == 1
    one_line_error(capsys, "export", str(disk / "sub"), "the filesystem is read-only")


@pytest.mark.parametrize("format", ["gguf", "llmc", "hf", "onnx"])
def test_export_refuses_an_existing_output_without_overwrite(format, tmp_path, model, capsys):
    out = tmp_path / FORMATS[format]
    if format in ("hf", "onnx"):
        out.mkdir()
        (out / "notes.txt").write_text("precious")
    else:
        out.write_text("precious")
    code = main(["export", "--model", str(model), "--format", format, "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{out} already exists" in err and "--overwrite" in err
    assert (out / "notes.txt" if out.is_dir() else out).read_text() == "precious"


def test_export_llmc_refuses_to_replace_the_tokenizer_file_beside_it(tmp_path, model, capsys):
    (tmp_path / "gpt2_tokenizer.bin").write_text("precious")
    assert main(["export", "--model", str(model), "--format", "llmc", "--out", str(tmp_path / "m.bin")]) == 2
    assert "gpt2_tokenizer.bin already exists" in capsys.readouterr().err
    assert not (tmp_path / "m.bin").exists()


@pytest.mark.slow
def test_export_into_an_empty_folder_needs_no_overwrite(tmp_path, model):
    (tmp_path / "hf").mkdir()
    assert main(["export", "--model", str(model), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def tiny_training(tmp_path: Path, out: Path, steps: int) -> list[str]:
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("the cat sat on the mat and the dog ate the bone. " * 200)
    settings = {"data.source": corpus, "data.tokenizer": "bytes", "data.batch_size": 2, "model.name": "gpt2-tiny",
                "model.n_layer": 1, "model.n_head": 2, "model.n_embd": 16, "model.block_size": 16,
                "schedule.max_steps": steps, "schedule.warmup_steps": 1, "evaluation.eval_interval": 2,
                "evaluation.eval_batches": 1, "evaluation.sample_tokens": 0, "output.checkpoint_interval": 2,
                "runtime.device": "cpu", "runtime.dtype": "float32"}  # fmt: skip
    sets = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    return ["train", "shakespeare-char", "--no-progress", "--out", str(out), *sets]


def test_train_on_a_full_disk_keeps_the_last_checkpoint(disk, tmp_path, capsys):
    out = disk / "run"
    assert main(tiny_training(tmp_path, out, steps=2)) == 0
    checkpoints = sorted((out / "checkpoints").iterdir())
    saved = {path: path.read_bytes() for path in checkpoints[-1].iterdir()}
    fill(disk)
    assert main([*tiny_training(tmp_path, out, steps=4), "--resume"]) == 1
    one_line_error(capsys, "train", str(out), "no space left on the device")
    assert sorted((out / "checkpoints").iterdir()) == checkpoints
    assert {path: path.read_bytes() for path in checkpoints[-1].iterdir()} == saved
    assert hidden_leftovers(out) == []


def test_train_into_a_read_only_disk_is_one_line(disk, tmp_path, capsys):
    read_only(disk)
    assert main(tiny_training(tmp_path, disk / "run", steps=2)) == 1
    one_line_error(capsys, "train", "the filesystem is read-only")


def test_prepare_on_a_full_disk_is_one_line(disk, tmp_path, capsys):
    text = tmp_path / "input.txt"
    text.write_text("To be, or not to be: that is the question.\n" * 2000)
    fill(disk)
    code = main(["prepare", str(text), "--out", str(disk / "data"), "--tokenizer", "bytes", "--quiet"])
    assert code == 1
    one_line_error(capsys, "prepare", str(disk / "data"), "no space left on the device")


@pytest.mark.slow
def test_finetune_into_a_read_only_disk_is_one_line(disk, tmp_path, model, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat. " * 200)
    read_only(disk)
    out = disk / "tuned"
    code = main(["finetune", "--model", str(model), "--data", str(text), "--out", str(out), "--no-progress",
                 "--set", "block_size=16", "--set", "max_steps=1", "--set", "device=cpu"])  # fmt: skip
    assert code == 1
    one_line_error(capsys, "finetune", str(out), "the filesystem is read-only")


@pytest.mark.slow
def test_inspect_and_eval_out_on_a_read_only_disk_are_one_line(disk, tmp_path, model, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 20)
    read_only(disk)
    lens = ["inspect", "logit-lens", "--model", str(model), "--prompt", "the cat", "--device", "cpu"]
    assert main([*lens, "--out", str(disk / "lens.png")]) == 1
    one_line_error(capsys, "inspect", str(disk / "lens.png"), "the filesystem is read-only")
    perplexity = ["eval", "perplexity", "--model", str(model), "--data", str(text), "--device", "cpu"]
    assert main([*perplexity, "--out", str(disk / "ppl.json")]) == 1
    one_line_error(capsys, "eval", str(disk), "the filesystem is read-only")


def test_permission_denied_is_one_line(tmp_path, model, capsys):
    if os.geteuid() == 0:
        pytest.skip("root writes through a folder's permissions; the read-only mount tests cover the refusal")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["export", "--model", str(model), "--format", "llmc", "--out", str(locked / "m.bin")]) == 1
    one_line_error(capsys, "export", str(locked), "permission denied")
