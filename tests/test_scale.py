"""Specification of corpora larger than memory: `TokenView` (a split read through its memory-mapped shards),
batches and training over it, `prepare` resumed after a crash, the Hugging Face streaming path on a local
dataset, and a CPU dry run of the GPT-2 124M recipe (docs/reproduce-gpt2-124m.md) with 2 gloo processes."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt2.cli import main
from gpt2.data import MANIFEST_NAME, BatchLoader, PrepareOptions, TokenView, load_split, prepare, save_token_shards
from gpt2.data.prepare import STAGING_DIR
from gpt2.data.progress import PROGRESS_NAME
from gpt2.tokenizer import ByteTokenizer
from gpt2.train import train
from gpt2.train.config import TrainConfig

SHARD_LENGTHS = [7, 1, 30, 12, 5, 45]  # uneven on purpose: windows of 16 cross one or several boundaries


def make_shards(tmp_path: Path, lengths: list[int] = SHARD_LENGTHS) -> tuple[Path, np.ndarray]:
    """A folder whose train split is `lengths` shards of one random stream of byte ids; returns it and the stream."""
    stream = np.random.default_rng(0).integers(0, 257, size=sum(lengths)).astype(np.uint16)
    cuts = np.cumsum(lengths)[:-1]
    save_token_shards(tmp_path / "shards", {"train": np.split(stream, cuts), "val": [stream[:20]]}, ByteTokenizer())
    return tmp_path / "shards", stream


def words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    vocab = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "naïve", "42", "!!", "\n"]
    return " ".join(rng.choice(vocab) for _ in range(count))


def write_corpus(folder: Path) -> Path:
    """Text files, a JSONL file, an empty file and invalid UTF-8: every kind of unit and every count the
    manifest keeps."""
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(4):
        (folder / f"doc{index}.txt").write_text(words(600, seed=index), encoding="utf-8")
    (folder / "empty.txt").write_text("")
    (folder / "latin1.txt").write_bytes(b"caf\xe9 na\xefve " * 40)
    records = [{"text": words(random.Random(i).randint(0, 40), seed=100 + i)} for i in range(60)]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return folder


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


SMALL = PrepareOptions(shard_tokens=500, chunk_chars=64)  # many stream files, many batches


# ----------------------------------------------------------------------------------------------- TokenView


def test_a_view_over_many_shards_equals_their_concatenation(tmp_path):
    folder, stream = make_shards(tmp_path)
    view = load_split(folder, "train")
    assert len(view) == len(stream) and view.shape == stream.shape and view.dtype == stream.dtype
    assert np.array_equal(np.asarray(view), stream) and view.tolist() == stream.tolist()
    rng = np.random.default_rng(1)
    for _ in range(300):
        start, stop = sorted(rng.integers(-len(stream) - 5, len(stream) + 5, size=2).tolist())
        step = int(rng.choice([1, 1, 1, 2, 3, -1, -4]))
        key = slice(start, stop, step) if step > 0 else slice(stop, start, step)
        assert np.array_equal(view[key], stream[key]), key
    for index in [0, 6, 7, 8, len(stream) - 1, -1, -len(stream)]:
        assert view[index] == stream[index]
    positions = rng.integers(0, len(stream), size=50)
    assert np.array_equal(view.take(positions), stream[positions])


def test_load_split_maps_every_shard_and_reads_nothing_up_front(tmp_path):
    folder, _ = make_shards(tmp_path)
    view = load_split(folder, "train")
    assert len(view.shards) == len(SHARD_LENGTHS)
    assert all(isinstance(shard, np.memmap) and not shard.flags.writeable for shard in view.shards)


def test_a_slice_inside_one_shard_is_a_view_and_one_across_shards_a_copy(tmp_path):
    folder, _ = make_shards(tmp_path)
    view = load_split(folder, "train")
    inside = view[8:30]  # shard 2 holds positions 8 ... 37
    assert np.shares_memory(inside, view.shards[2])
    across = view[30:45]
    assert not any(np.shares_memory(across, shard) for shard in view.shards)


def test_windows_cross_shard_boundaries_and_read_both_shards(tmp_path):
    folder, stream = make_shards(tmp_path)
    view = load_split(folder, "train")
    boundaries = np.cumsum(SHARD_LENGTHS)[:-1]
    starts = np.array([b - k for b in boundaries for k in (1, 4, 7)])  # windows of 16 over each boundary
    rows = view.rows(starts, 16)
    assert rows.shape == (len(starts), 16) and rows.dtype == np.int64
    assert np.array_equal(rows, np.stack([stream[s : s + 16] for s in starts]))
    assert np.array_equal(view.rows([6], 3)[0], stream[6:9])  # shards of 7, 1 and 30: one window, three shards


def mapped_kilobytes(path: Path) -> int:
    """Resident kB of this process's mappings of `path` (Linux /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ", 1)[0] and len(line.split()) >= 5:  # a mapping's header line
            inside = line.split()[-1] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads Linux /proc/self/smaps")
def test_rows_give_the_pages_they_mapped_back_to_the_page_cache(tmp_path):
    stream = (np.arange(1 << 20) % 257).astype(np.uint16)  # 2 MB in one shard
    save_token_shards(tmp_path / "big", {"train": [stream]}, ByteTokenizer())
    view = load_split(tmp_path / "big", "train")
    shard = (tmp_path / "big" / "train_000000.bin").resolve()
    inside = view[1000:1010]  # a slice is a zero-copy view: its pages stay mapped while it is used
    assert inside.tolist() == stream[1000:1010].tolist() and mapped_kilobytes(shard) > 0
    starts = np.arange(0, len(stream) - 64, 4096)  # a window on every 8 KB of the file
    rows = view.rows(starts, 64)
    assert mapped_kilobytes(shard) == 0
    assert np.array_equal(rows[:, 0], stream[starts]) and inside[3] == stream[1003]  # the slice is still valid


def test_a_view_refuses_indexes_outside_it_and_mixed_shards():
    view = TokenView([np.arange(3, dtype=np.uint16), np.arange(2, dtype=np.uint16)])
    with pytest.raises(IndexError, match="index 5 is out of range for a view of 5 tokens"):
        view[5]
    with pytest.raises(IndexError):
        view.rows([3], 3)
    with pytest.raises(ValueError, match="share one dtype"):
        TokenView([np.arange(3, dtype=np.uint16), np.arange(2, dtype=np.uint32)])
    assert len(TokenView([], dtype=np.uint16)) == 0


def test_save_token_shards_refuses_ids_outside_the_vocabulary(tmp_path):
    with pytest.raises(ValueError, match=r"ids in \[0, 257\)"):
        save_token_shards(tmp_path / "out", {"train": [np.array([1, 300])]}, ByteTokenizer())
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


# ------------------------------------------------------------------------------------ batches over a view


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_over_a_view_are_those_of_the_concatenated_array(tmp_path, shuffle):
    folder, stream = make_shards(tmp_path)
    view = load_split(folder, "train")
    ours = BatchLoader(view, batch_size=3, block_size=16, seed=4, shuffle=shuffle)
    reference = BatchLoader(stream, batch_size=3, block_size=16, seed=4, shuffle=shuffle)
    for _ in range(12):
        (x, y), (x_ref, y_ref) = ours.next_batch(), reference.next_batch()
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert ours.state_dict() == reference.state_dict()  # a checkpoint made with either resumes with the other


def test_ranks_read_disjoint_windows_in_order_until_the_stream_wraps(tmp_path):
    folder, _ = make_shards(tmp_path)
    view = load_split(folder, "train")  # 100 tokens: (100 - 1) // 8 = 12 windows of 8, 4 per global batch
    ranks = [BatchLoader(view, 2, 8, rank=rank, world_size=2, shuffle=False) for rank in range(2)]
    starts: list[list[int]] = [[], []]
    for _ in range(3):  # one pass over the stream
        for rank, loader in enumerate(ranks):
            starts[rank] += loader.next_batch()[0][:, 0].tolist()
    offsets = [[int(o) for step in range(3) for o in loader._offsets(step)] for loader in ranks]
    assert set(offsets[0]).isdisjoint(offsets[1])
    assert sorted(offsets[0] + offsets[1]) == list(range(0, 96, 8))  # every window once
    assert offsets[0][:2] == [0, 8] and offsets[1][:2] == [16, 24]  # rank r keeps rows 2r, 2r + 1
    assert starts == [[int(view[o]) for o in offsets[rank]] for rank in range(2)]


def test_shuffled_ranks_keep_their_own_rows_of_one_global_draw(tmp_path):
    folder, stream = make_shards(tmp_path)
    view = load_split(folder, "train")
    single = BatchLoader(view, 4, 16, seed=9)
    ranks = [BatchLoader(view, 2, 16, rank=r, world_size=2, seed=9) for r in range(2)]
    for step in range(5):
        global_offsets = single._offsets(step)
        assert np.array_equal(ranks[0]._offsets(step), global_offsets[:2])
        assert np.array_equal(ranks[1]._offsets(step), global_offsets[2:])


# -------------------------------------------------------------------------------------- training over a view


def tiny(tmp_path: Path, data: Path, **overrides) -> TrainConfig:
    values = dict(
        data=str(data), tokenizer="bytes", model="gpt2-tiny", n_layer=2, n_head=2, n_embd=32, block_size=16,
        dropout=0.0, batch_size=4, max_steps=4, learning_rate=1e-2, warmup_steps=1, eval_interval=2,
        eval_batches=2, checkpoint_interval=0, sample_tokens=0, device="cpu", dtype="float32",
        out_dir=str(tmp_path / "out"),
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig.from_dict(values)


@pytest.mark.slow
def test_training_on_many_shards_matches_training_on_one(tmp_path):
    stream = np.frombuffer(words(3000, seed=5).encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    cuts = list(range(997, len(stream), 997))
    save_token_shards(tmp_path / "many", {"train": np.split(stream, cuts), "val": [stream[:500]]}, ByteTokenizer())
    save_token_shards(tmp_path / "one", {"train": [stream], "val": [stream[:500]]}, ByteTokenizer())
    many = train(tiny(tmp_path / "a", tmp_path / "many"))
    one = train(tiny(tmp_path / "b", tmp_path / "one"))
    assert many.losses == one.losses and many.val_losses == one.val_losses


@pytest.mark.slow
def test_activation_checkpointing_option_trains_to_the_same_losses(tmp_path):
    folder = tmp_path / "data"
    stream = np.frombuffer(words(2000, seed=6).encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    save_token_shards(folder, {"train": [stream[:8000], stream[8000:]], "val": [stream[:400]]}, ByteTokenizer())
    plain = train(tiny(tmp_path / "a", folder))
    checkpointed = train(tiny(tmp_path / "b", folder, activation_checkpointing=True))
    assert checkpointed.losses == pytest.approx(plain.losses, abs=1e-6, rel=0)


# ---------------------------------------------------------------------------------------- prepare, resumed


class Interrupted(Exception):
    """Stands for a crash: raised from inside the tokenizer."""


class FailingTokenizer:
    """ByteTokenizer that raises on its `fail_at`-th encode_batch call and counts the characters it encoded."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.inner = ByteTokenizer()
        self.fail_at = fail_at
        self.calls = 0
        self.characters = 0
        self.vocab_size, self.eot_token, self.identity = (
            self.inner.vocab_size,
            self.inner.eot_token,
            self.inner.identity,
        )

    def encode_batch(self, texts: list[str], **options) -> list[list[int]]:
        self.calls += 1
        if self.calls == self.fail_at:
            raise Interrupted(f"interrupted at batch {self.calls}")
        self.characters += sum(map(len, texts))
        return self.inner.encode_batch(texts, **options)


@pytest.fixture
def reference(tmp_path) -> tuple[Path, Path, int]:
    """The corpus, its uninterrupted preparation, and how many encode_batch calls that took (batches are sized
    by the number of cores, so points of failure are chosen as fractions of it)."""
    corpus = write_corpus(tmp_path / "corpus")
    counter = FailingTokenizer()
    prepare([corpus], tmp_path / "reference", counter, SMALL, progress=False)
    assert counter.calls >= 8, "the corpus must take several batches"
    return corpus, tmp_path / "reference", counter.calls


@pytest.mark.parametrize("fraction", [0.1, 0.35, 0.6, 0.9])
def test_prepare_interrupted_by_an_error_resumes_to_the_same_bytes(tmp_path, reference, fraction):
    corpus, expected, calls = reference
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        prepare([corpus], out, FailingTokenizer(max(3, round(calls * fraction))), SMALL, progress=False)
    assert (out / STAGING_DIR / PROGRESS_NAME).is_file() and not (out / MANIFEST_NAME).exists()
    messages: list[str] = []
    resumed = FailingTokenizer()
    prepare([corpus], out, resumed, SMALL, log=messages.append, progress=False)
    assert folder_bytes(out) == folder_bytes(expected)  # shards and manifest, byte for byte; staging gone
    assert len(messages) == 1 and messages[0].startswith("resuming: ")
    full = FailingTokenizer()
    prepare([corpus], tmp_path / "again", full, SMALL, progress=False)
    assert resumed.characters < full.characters  # the finished stream files were not tokenized again


def test_prepare_interrupted_twice_resumes_from_the_later_point(tmp_path, reference):
    corpus, expected, calls = reference
    out = tmp_path / "out"
    for _ in range(2):  # the second run resumes, then fails as many batches further on
        with pytest.raises(Interrupted):
            prepare([corpus], out, FailingTokenizer(calls // 3), SMALL, progress=False)
    prepare([corpus], out, ByteTokenizer(), SMALL, progress=False)
    assert folder_bytes(out) == folder_bytes(expected)


@pytest.mark.slow
def test_prepare_killed_after_the_first_shard_resumes_to_the_same_bytes(tmp_path, reference):
    corpus, expected, _ = reference
    out = tmp_path / "out"
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from gpt2.data import PrepareOptions, prepare
        from gpt2.tokenizer import ByteTokenizer

        progress = Path({str(out / STAGING_DIR / PROGRESS_NAME)!r})

        class KilledAfterFirstShard(ByteTokenizer):
            def encode_batch(self, texts, **options):
                if progress.exists():  # a stream file is finished: die as a crash would, no cleanup
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().encode_batch(texts, **options)

        small = PrepareOptions(shard_tokens={SMALL.shard_tokens}, chunk_chars={SMALL.chunk_chars})
        prepare([{str(corpus)!r}], {str(out)!r}, KilledAfterFirstShard(), small, progress=False)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    staged = sorted(p.name for p in (out / STAGING_DIR).iterdir())
    assert PROGRESS_NAME in staged and len(staged) >= 3  # progress, a finished file, the one being written
    prepare([corpus], out, ByteTokenizer(), SMALL, progress=False)
    assert folder_bytes(out) == folder_bytes(expected)


def test_a_changed_input_starts_over(tmp_path, reference):
    corpus, _, calls = reference
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        prepare([corpus], out, FailingTokenizer(calls // 2), SMALL, progress=False)
    (corpus / "doc3.txt").write_text(words(700, seed=99), encoding="utf-8")
    messages: list[str] = []
    prepare([corpus], out, ByteTokenizer(), SMALL, log=messages.append, progress=False)
    prepare([corpus], tmp_path / "fresh", ByteTokenizer(), SMALL, progress=False)
    assert messages == [
        f"starting over in {out / STAGING_DIR}: the earlier run had other sources, settings or tokenizer"
    ]
    assert folder_bytes(out) == folder_bytes(tmp_path / "fresh")


def test_a_damaged_finished_file_starts_over(tmp_path, reference):
    corpus, expected, calls = reference
    out = tmp_path / "out"
    with pytest.raises(Interrupted):
        prepare([corpus], out, FailingTokenizer(calls // 2), SMALL, progress=False)
    first = out / STAGING_DIR / "stream_000000.bin"
    first.write_bytes(bytes(first.stat().st_size))  # same size, other content
    messages: list[str] = []
    prepare([corpus], out, ByteTokenizer(), SMALL, log=messages.append, progress=False)
    assert messages == [
        f"starting over in {out / STAGING_DIR}: finished stream file stream_000000.bin does not match its sha256"
    ]
    assert folder_bytes(out) == folder_bytes(expected)


def test_a_failure_before_any_finished_file_leaves_nothing_to_resume(tmp_path, reference):
    corpus, _, _ = reference
    with pytest.raises(Interrupted):
        prepare([corpus], tmp_path / "out", FailingTokenizer(1), SMALL, progress=False)
    assert not (tmp_path / "out" / STAGING_DIR).exists()


def test_prepare_shows_tokens_per_second_and_the_time_left(tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus")
    prepare([corpus], tmp_path / "out", ByteTokenizer(), SMALL, progress=True)
    bar = capsys.readouterr().err
    assert "tok/s" in bar and "tokenizing" in bar
    assert re.search(r"<\d\d:\d\d", bar)  # elapsed<remaining: the time left, estimated from the bytes read


# -------------------------------------------------------------------------------- Hugging Face, streamed


def fineweb_lookalike(folder: Path, documents: list[str]) -> Path:
    """A local dataset laid out like HuggingFaceFW/fineweb: parquet files under sample/10BT, and a README whose
    YAML declares the config 'sample-10BT', which `datasets` reads as it does on the Hub."""
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet as parquet

    (folder / "sample" / "10BT").mkdir(parents=True)
    half = len(documents) // 2
    for index, part in enumerate([documents[:half], documents[half:]]):
        table = pyarrow.table({"text": part, "id": [f"doc{index}-{i}" for i in range(len(part))]})
        parquet.write_table(table, folder / "sample" / "10BT" / f"{index:03d}_00000.parquet")
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n  - split: train\n    path: sample/10BT/*\n---\n"
    )
    return folder


def test_a_local_dataset_with_a_named_config_streams_like_the_hub(tmp_path):
    pytest.importorskip("datasets")
    documents = [words(random.Random(i).randint(1, 60), seed=200 + i) for i in range(40)]
    dataset = fineweb_lookalike(tmp_path / "fineweb", documents)
    status = main([
        "prepare", "--dataset", str(dataset), "--dataset-config", "sample-10BT", "--out", str(tmp_path / "out"),
        "--tokenizer", "bytes", "--val-fraction", "0.1", "--shard-tokens", "300", "--quiet",
    ])  # fmt: skip
    assert status == 0
    stream = [t for text in documents for t in [256, *text.encode("utf-8")]]
    tokens = np.concatenate([load_split(tmp_path / "out", "train"), load_split(tmp_path / "out", "val")])
    assert tokens.tolist() == stream
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["sources"] == [
        {"source": f"{dataset} (config sample-10BT, split train)", "kind": "dataset", "files": 0,
         "documents": 40, "tokens": len(stream)},
    ]  # fmt: skip


def test_a_dataset_run_resumes_after_an_error(tmp_path):
    pytest.importorskip("datasets")
    documents = [words(random.Random(i).randint(1, 60), seed=300 + i) for i in range(60)]
    dataset = str(fineweb_lookalike(tmp_path / "fineweb", documents))
    options = dataclasses.replace(SMALL, dataset=dataset, dataset_config="sample-10BT")
    counter = FailingTokenizer()
    prepare([], tmp_path / "reference", counter, options, progress=False)
    with pytest.raises(Interrupted):
        prepare([], tmp_path / "out", FailingTokenizer(max(3, counter.calls // 2)), options, progress=False)
    resumed = FailingTokenizer()
    prepare([], tmp_path / "out", resumed, options, progress=False)
    assert folder_bytes(tmp_path / "out") == folder_bytes(tmp_path / "reference")
    assert resumed.characters < sum(map(len, documents))


# ----------------------------------------------------------------------------- the 124M recipe, dry run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_hellaswag(path: Path) -> Path:
    records = [
        {"ctx": "the quick brown", "endings": ["fox", "dog", "café", "42"], "label": 0},
        {"ctx": "over the", "endings": ["lazy dog", "!!", "naïve", "quick"], "label": 0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.mark.parametrize(("parallel", "activation_checkpointing"), [("ddp", "false"), ("fsdp", "true")])
@pytest.mark.slow
def test_the_gpt2_124m_recipe_runs_end_to_end_on_cpu_with_two_processes(
    tmp_path, gpt2_bpe_dir, parallel, activation_checkpointing
):
    """docs/reproduce-gpt2-124m.md at toy size: `gpt2 prepare --dataset ... --dataset-config sample-10BT` into
    many shards, then `torchrun --nproc_per_node 2 -m gpt2.cli train gpt2-124m` with HellaSwag in the loop,
    shrunk by --set overrides (the recipe's own keys otherwise). About 10 s: not marked slow."""
    pytest.importorskip("datasets")
    documents = [words(random.Random(i).randint(20, 200), seed=400 + i) for i in range(150)]
    dataset = fineweb_lookalike(tmp_path / "fineweb", documents)
    data = tmp_path / "fineweb10B"
    assert main([
        "prepare", "--dataset", str(dataset), "--dataset-config", "sample-10BT", "--out", str(data),
        "--tokenizer", str(gpt2_bpe_dir), "--val-fraction", "0.1", "--shard-tokens", "2000", "--quiet",
    ]) == 0  # fmt: skip
    manifest = json.loads((data / MANIFEST_NAME).read_text())
    assert sum(s["split"] == "train" for s in manifest["shards"]) >= 4

    overrides = {
        "data.source": str(data), "data.tokenizer": str(gpt2_bpe_dir), "data.batch_size": 2,
        "data.total_batch_tokens": 256, "output.out_dir": str(tmp_path / "run"), "output.checkpoint_interval": 2,
        "model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
        "schedule.max_steps": 4, "schedule.warmup_steps": 1, "evaluation.eval_interval": 2,
        "evaluation.eval_batches": 2, "evaluation.hellaswag_file": str(write_hellaswag(tmp_path / "hellaswag.jsonl")),
        "evaluation.hellaswag_limit": 2, "evaluation.sample_tokens": 0, "runtime.compile": "false",
        "runtime.device": "cpu", "runtime.dtype": "float32", "runtime.parallel": parallel,
        "runtime.activation_checkpointing": activation_checkpointing,  # FSDP as gpt2-xl runs it
    }  # fmt: skip
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
        "--master_port", str(free_port()), "-m", "gpt2.cli", "train", "gpt2-124m", "--no-progress",
        *[part for key, value in overrides.items() for part in ("--set", f"{key}={value}")],
    ]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 4 and all(np.isfinite(losses))
    assert any("val_loss" in r for r in records)
    assert any("hellaswag_acc_norm" in r for r in records)
    assert "accum 2 x 2)" in done.stderr  # 256 tokens per step = batch 2 x 32 positions x accum 2 x 2 ranks
    assert (tmp_path / "run" / "model.safetensors").is_file()
