"""Specification of gpt2.data: `prepare` (text -> token shards + manifest), `load_split`, `BatchLoader`, and the
`gpt2 prepare` command."""

from __future__ import annotations

import hashlib
import json
import random
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_file
from gpt2.cli import main
from gpt2.data import (
    MANIFEST_NAME,
    BatchLoader,
    PrepareOptions,
    TokenView,
    load_split,
    prepare,
    token_dtype,
)
from gpt2.data.sources import Report, _pieces
from gpt2.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

EOT_BYTES = ByteTokenizer.eot_token  # 256


@pytest.fixture(scope="module")
def gpt2_tokenizer() -> Tokenizer:
    shared_file("gpt2-bpe/encoder.json")
    return load_tokenizer(shared_file("gpt2-bpe/vocab.bpe").parent)


class WideTokenizer:
    """A stand-in with more than 65536 ids (one id per character, all of them above 60000)."""

    vocab_size = 70_000
    eot_token = 69_999
    identity = "test-wide:1"

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[60_000 + ord(c) % 9_000 for c in text] for text in texts]


def stream(tokenizer, documents: list[str]) -> list[int]:
    """The token stream `prepare` must produce: EOT before every document."""
    ids: list[int] = []
    for text in documents:
        ids.append(tokenizer.eot_token)
        ids.extend(tokenizer.encode(text))
    return ids


def all_tokens(data_dir: Path) -> np.ndarray:
    return np.concatenate([load_split(data_dir, "train"), load_split(data_dir, "val")])


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode("utf-8")
    path.write_bytes(content)
    return path


def random_words(count: int, seed: int) -> str:
    rng = random.Random(seed)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "café", "naïve", "42", "1999", "!!", "--"]
    return " ".join(rng.choice(words) for _ in range(count))


# ------------------------------------------------------------------------------------------------ prepare


MIXED_DOCUMENTS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "  leading spaces,\ttabs,\r\nCRLF lines,   runs   of  spaces \n\n\n and trailing   \n",
    "Unicode: naïve café — 東京 🙂 don't won't it's <|endoftext|> stays text\n" * 5,
]


def test_stream_is_eot_then_document_for_each_document_with_exact_gpt2_ids(tmp_path, gpt2_tokenizer):
    files = [write(tmp_path / "in" / f"{i}.txt", text) for i, text in enumerate(MIXED_DOCUMENTS)]
    # a tiny chunk size forces many cuts inside every document; the ids must not notice
    manifest = prepare(
        files, tmp_path / "out", gpt2_tokenizer, PrepareOptions(val_fraction=0.0, chunk_chars=16), progress=False
    )
    expected = stream(gpt2_tokenizer, MIXED_DOCUMENTS)
    assert load_split(tmp_path / "out", "train").tolist() == expected
    assert manifest["splits"] == {"train": len(expected), "val": 0}
    assert manifest["documents"] == 3
    assert manifest["forced_splits"] == 0
    assert manifest["document_separator"] == "eot_before_each_document"


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(
        st.sampled_from(
            list("ab Z9'.,!\n\t\r\x0b\x0c\x1c\x85\u00a0\u2028\u3000é東🙂\u0301") + ["  ", "\n\n", "'s", "ll"]
        ),
        max_size=80,
    ).map("".join),
    chunk_chars=st.integers(min_value=1, max_value=40),
)
def test_cutting_text_into_pieces_never_changes_gpt2_ids_unless_a_cut_is_forced(text, chunk_chars, gpt2_tokenizer):
    report = Report()
    pieces = list(_pieces([text], chunk_chars, report))
    assert "".join(pieces) == text
    assert all(0 < len(piece) <= chunk_chars for piece in pieces)
    if report.forced_splits == 0:
        ids = [i for piece_ids in gpt2_tokenizer.encode_batch(pieces) for i in piece_ids]
        assert ids == gpt2_tokenizer.encode(text)


def test_prepare_is_deterministic_byte_for_byte(tmp_path, gpt2_tokenizer):
    write(tmp_path / "in" / "a.txt", random_words(3000, seed=1))
    write(tmp_path / "in" / "sub" / "b.md", random_words(2000, seed=2))
    for out in ("out1", "out2"):
        prepare(
            [tmp_path / "in"],
            tmp_path / out,
            gpt2_tokenizer,
            PrepareOptions(shard_tokens=1000, chunk_chars=100),
            progress=False,
        )
    names = sorted(p.name for p in (tmp_path / "out1").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "out2").iterdir())
    assert MANIFEST_NAME in names and len(names) > 3
    for name in names:
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes(), name


def test_val_split_is_the_tail_of_the_stream_for_a_single_file(tmp_path, gpt2_tokenizer):
    text = random_words(5000, seed=3)
    write(tmp_path / "input.txt", text)
    manifest = prepare(
        [tmp_path / "input.txt"], tmp_path / "out", gpt2_tokenizer, PrepareOptions(val_fraction=0.1), progress=False
    )
    expected = stream(gpt2_tokenizer, [text])
    n_train = int(len(expected) * 0.9)  # nanoGPT's split
    assert manifest["splits"] == {"train": n_train, "val": len(expected) - n_train}
    assert load_split(tmp_path / "out", "train").tolist() == expected[:n_train]
    assert load_split(tmp_path / "out", "val").tolist() == expected[n_train:]


def test_shards_hold_at_most_shard_tokens_and_the_boundary_shard_is_split(tmp_path):
    write(tmp_path / "a.txt", "x" * 2499)  # 2500 tokens with the EOT
    manifest = prepare(
        [tmp_path / "a.txt"],
        tmp_path / "out",
        ByteTokenizer(),
        PrepareOptions(shard_tokens=1000, val_fraction=0.3),
        progress=False,
    )
    layout = [(s["file"], s["split"], s["tokens"]) for s in manifest["shards"]]
    assert layout == [
        ("train_000000.bin", "train", 1000),
        ("train_000001.bin", "train", 750),
        ("val_000000.bin", "val", 250),
        ("val_000001.bin", "val", 500),
    ]
    for shard in manifest["shards"]:
        data = (tmp_path / "out" / shard["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == shard["sha256"]
        assert len(data) == 2 * shard["tokens"]
    assert all_tokens(tmp_path / "out").tolist() == [EOT_BYTES] + [ord("x")] * 2499


def test_uint16_while_the_vocabulary_fits_else_uint32(tmp_path):
    assert token_dtype(257) == np.dtype("<u2")
    assert token_dtype(50257) == np.dtype("<u2")
    assert token_dtype(65536) == np.dtype("<u2")
    assert token_dtype(65537) == np.dtype("<u4")
    write(tmp_path / "a.txt", "hello")
    small = prepare(
        [tmp_path / "a.txt"], tmp_path / "bytes", ByteTokenizer(), PrepareOptions(val_fraction=0.0), progress=False
    )
    wide = prepare(
        [tmp_path / "a.txt"], tmp_path / "wide", WideTokenizer(), PrepareOptions(val_fraction=0.0), progress=False
    )
    assert (small["dtype"], wide["dtype"]) == ("uint16", "uint32")
    assert (tmp_path / "wide" / "train_000000.bin").stat().st_size == 4 * 6
    tokens = load_split(tmp_path / "wide", "train")
    assert tokens.dtype == np.dtype("<u4")
    assert tokens.tolist() == [69_999] + [60_000 + ord(c) % 9_000 for c in "hello"]


def test_manifest_records_tokenizer_and_sources(tmp_path):
    write(tmp_path / "a.txt", "hello")
    manifest = prepare([tmp_path / "a.txt"], tmp_path / "out", ByteTokenizer(), progress=False)
    assert manifest == json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["format"] == "gpt2-token-shards" and manifest["version"] == 1
    assert manifest["tokenizer"] == {"identity": ByteTokenizer().identity, "vocab_size": 257, "eot_token": 256}
    assert manifest["byteorder"] == "little"
    assert manifest["sources"] == [
        {"source": str(tmp_path / "a.txt"), "kind": "file", "files": 1, "documents": 1, "tokens": 6}
    ]


def test_directories_are_read_recursively_in_sorted_order_skipping_hidden_and_other_files(tmp_path):
    for name, text in [
        ("b.txt", "B"),
        ("a/z.md", "Z"),
        ("a/c.txt", "C"),
        (".hidden/h.txt", "H"),
        ("image.png", "P"),
        (".dot.txt", "D"),
    ]:
        write(tmp_path / "in" / name, text)
    manifest = prepare(
        [tmp_path / "in"], tmp_path / "out", ByteTokenizer(), PrepareOptions(val_fraction=0.0), progress=False
    )
    assert load_split(tmp_path / "out", "train").tolist() == [256, ord("C"), 256, ord("Z"), 256, ord("B")]
    assert manifest["sources"][0]["kind"] == "directory"
    assert manifest["sources"][0]["files"] == 3


def test_a_glob_chooses_files_in_sorted_order(tmp_path):
    for name in ("2.html", "1.html", "3.txt"):
        write(tmp_path / "in" / name, name[0])
    manifest = prepare(
        [str(tmp_path / "in" / "*.html")],
        tmp_path / "out",
        ByteTokenizer(),
        PrepareOptions(val_fraction=0.0),
        progress=False,
    )
    assert load_split(tmp_path / "out", "train").tolist() == [256, ord("1"), 256, ord("2")]
    assert manifest["sources"][0]["kind"] == "glob"


@pytest.mark.parametrize(
    "source, message",
    [
        ("missing.txt", "missing.txt' does not exist"),
        ("nothing/*.txt", "matches no files"),
        ("emptydir", "has no text files"),
    ],
)
def test_a_source_that_matches_nothing_is_a_file_not_found_error_naming_it(tmp_path, source, message):
    (tmp_path / "emptydir").mkdir()
    write(tmp_path / "emptydir" / "x.png", "x")
    with pytest.raises(FileNotFoundError, match=message):
        prepare([str(tmp_path / source)], tmp_path / "out", ByteTokenizer(), progress=False)
    assert not (tmp_path / "out").exists()


def test_invalid_utf8_is_replaced_counted_and_warned_about(tmp_path, capsys):
    write(tmp_path / "bad.txt", b"caf\xe9 and \xff\xfe done")
    write(tmp_path / "genuine.txt", "a real \ufffd is not an error")
    manifest = prepare(
        [tmp_path / "bad.txt", tmp_path / "genuine.txt"],
        tmp_path / "out",
        ByteTokenizer(),
        PrepareOptions(val_fraction=0.0),
        progress=False,
    )
    notice = capsys.readouterr().err
    assert notice.startswith("gpt2: note: 1 file(s) had bytes that are not valid UTF-8") and notice.count("\n") == 1
    assert manifest["invalid_utf8"] == {
        "files": 1,
        "replacements": 3,
        "examples": [{"file": str(tmp_path / "bad.txt"), "replacements": 3}],
    }
    expected = stream(ByteTokenizer(), ["caf\ufffd and \ufffd\ufffd done", "a real \ufffd is not an error"])
    assert load_split(tmp_path / "out", "train").tolist() == expected


def test_invalid_utf8_split_across_reads_is_counted_once(tmp_path):
    # a 2-byte character cut by the read boundary is valid; a lone continuation byte is not
    write(tmp_path / "a.txt", b"ab\xc3\xa9cd\x80ef")
    manifest = prepare(
        [tmp_path / "a.txt"],
        tmp_path / "out",
        ByteTokenizer(),
        PrepareOptions(val_fraction=0.0, chunk_chars=3),
        progress=False,
    )
    assert manifest["invalid_utf8"]["replacements"] == 1
    assert ByteTokenizer().decode(load_split(tmp_path / "out", "train")[1:].tolist()) == "abécd\ufffdef"


def test_empty_files_are_skipped_and_recorded(tmp_path):
    write(tmp_path / "in" / "a.txt", "A")
    write(tmp_path / "in" / "b.txt", "")
    manifest = prepare(
        [tmp_path / "in"], tmp_path / "out", ByteTokenizer(), PrepareOptions(val_fraction=0.0), progress=False
    )
    assert load_split(tmp_path / "out", "train").tolist() == [256, ord("A")]
    assert manifest["empty_files"] == {"count": 1, "files": [str(tmp_path / "in" / "b.txt")]}
    assert manifest["documents"] == 1


def test_sources_with_no_text_at_all_are_a_value_error(tmp_path):
    write(tmp_path / "empty.txt", "")
    with pytest.raises(ValueError, match="no text"):
        prepare([tmp_path / "empty.txt"], tmp_path / "out", ByteTokenizer(), progress=False)


def test_a_word_longer_than_a_chunk_is_cut_losslessly_and_counted(tmp_path, gpt2_tokenizer):
    text = "abcdefghij" * 1000  # 10,000 characters, no whitespace
    write(tmp_path / "a.txt", text)
    manifest = prepare(
        [tmp_path / "a.txt"],
        tmp_path / "out",
        gpt2_tokenizer,
        PrepareOptions(val_fraction=0.0, chunk_chars=1024),
        progress=False,
    )
    assert manifest["forced_splits"] == 9
    tokens = load_split(tmp_path / "out", "train").tolist()
    assert tokens[0] == gpt2_tokenizer.eot_token
    assert gpt2_tokenizer.decode(tokens[1:]) == text


# ------------------------------------------------------------------------------------------------ JSONL


def test_jsonl_records_are_documents_read_from_the_named_field(tmp_path, gpt2_tokenizer):
    records = [{"id": 1, "body": "First record.\n"}, {"id": 2, "body": ""}, {"id": 3, "body": "Third, with 東京."}]
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    write(tmp_path / "c.jsonl", "\n".join(lines[:2]) + "\n\n" + lines[2] + "\n")
    manifest = prepare(
        [tmp_path / "c.jsonl"],
        tmp_path / "out",
        gpt2_tokenizer,
        PrepareOptions(jsonl_field="body", val_fraction=0.0),
        progress=False,
    )
    expected = stream(gpt2_tokenizer, ["First record.\n", "Third, with 東京."])
    assert load_split(tmp_path / "out", "train").tolist() == expected
    assert (manifest["documents"], manifest["empty_records"]) == (2, 1)


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "ok"}\n{"body": "no text field"}\n', r"c\.jsonl:2: the record has no field 'text' \(fields: body\)"),
        ('{"text": "ok"}\n\n{"text": "unterminated\n', r"c\.jsonl:3: not valid JSON"),
        ('["a list"]\n', r"c\.jsonl:1: expected a JSON object"),
        ('{"text": 5}\n', r"c\.jsonl:1: field 'text' holds int"),
    ],
)
def test_a_bad_jsonl_line_is_a_value_error_naming_file_and_line(tmp_path, content, message):
    write(tmp_path / "c.jsonl", content)
    with pytest.raises(ValueError, match=message):
        prepare([tmp_path / "c.jsonl"], tmp_path / "out", ByteTokenizer(), progress=False)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


# ------------------------------------------------------------------------------------------------ datasets


def test_a_dataset_name_without_the_datasets_library_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as if not installed
    with pytest.raises(ValueError, match=r"needs the `datasets` library.*pip install"):
        prepare([], tmp_path / "out", ByteTokenizer(), PrepareOptions(dataset="someone/corpus"), progress=False)


def test_dataset_records_are_documents_after_the_files(tmp_path, monkeypatch):
    calls = []

    def load_dataset(name, config, *, split, streaming):
        calls.append((name, config, split, streaming))
        return iter([{"text": "hi"}, {"text": ""}, {"text": "yo"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    write(tmp_path / "a.txt", "A")
    manifest = prepare(
        [tmp_path / "a.txt"],
        tmp_path / "out",
        ByteTokenizer(),
        PrepareOptions(dataset="someone/corpus", dataset_config="small", val_fraction=0.0),
        progress=False,
    )
    assert calls == [("someone/corpus", "small", "train", True)]
    assert load_split(tmp_path / "out", "train").tolist() == stream(ByteTokenizer(), ["A", "hi", "yo"])
    assert manifest["sources"][1]["kind"] == "dataset" and manifest["sources"][1]["documents"] == 2


# ------------------------------------------------------------------------------------------------ output dir


def test_existing_output_is_kept_unless_overwrite_and_then_stale_shards_go(tmp_path):
    write(tmp_path / "big.txt", "x" * 2999)
    write(tmp_path / "small.txt", "y")
    prepare(
        [tmp_path / "big.txt"], tmp_path / "out", ByteTokenizer(), PrepareOptions(shard_tokens=1000), progress=False
    )
    with pytest.raises(FileExistsError, match="overwrite"):
        prepare([tmp_path / "small.txt"], tmp_path / "out", ByteTokenizer(), progress=False)
    prepare(
        [tmp_path / "small.txt"],
        tmp_path / "out",
        ByteTokenizer(),
        PrepareOptions(val_fraction=0.0),
        overwrite=True,
        progress=False,
    )
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MANIFEST_NAME, "train_000000.bin"]
    assert load_split(tmp_path / "out", "train").tolist() == [256, ord("y")]


# ------------------------------------------------------------------------------------------------ load_split


@pytest.fixture
def prepared(tmp_path) -> Path:
    write(tmp_path / "a.txt", "hello world, " * 10)
    prepare([tmp_path / "a.txt"], tmp_path / "out", ByteTokenizer(), progress=False)
    return tmp_path / "out"


def test_load_split_memory_maps_a_single_shard(prepared):
    tokens = load_split(prepared, "train")
    assert isinstance(tokens, TokenView) and len(tokens.shards) == 1
    shard = tokens.shards[0]
    assert isinstance(shard, np.memmap) and not shard.flags.writeable
    assert tokens.ndim == 1 and len(tokens) == int(131 * 0.9)


def test_load_split_of_a_missing_directory_or_manifest_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist.*gpt2 prepare"):
        load_split(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="manifest.json' is missing.*gpt2 prepare"):
        load_split(tmp_path, "train")


def test_load_split_of_an_unknown_split_names_the_splits_there(prepared):
    with pytest.raises(ValueError, match="no split 'test'; it has: train, val"):
        load_split(prepared, "test")


def test_load_split_refuses_a_shard_whose_size_disagrees_with_the_manifest(prepared):
    shard = prepared / "val_000000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    # "hello world, " * 10 + EOT = 131 tokens: train int(131 * 0.9) = 117, val 14 = 28 bytes
    with pytest.raises(ValueError, match="val_000000.bin' has 26 bytes but the manifest says 14 uint16 tokens"):
        load_split(prepared, "val")


def test_load_split_verify_checks_sha256(prepared):
    shard = prepared / "train_000000.bin"
    shard.write_bytes(bytes(shard.stat().st_size))  # same size, other content
    load_split(prepared, "train")  # sizes alone cannot tell
    with pytest.raises(ValueError, match="does not match its sha256"):
        load_split(prepared, "train", verify=True)


# ------------------------------------------------------------------------------------------------ CLI


@pytest.mark.slow
def test_cli_prepare_handles_invalid_bytes_empty_files_and_a_5mb_line(tmp_path, gpt2_tokenizer, gpt2_bpe_dir, capsys):
    huge = random_words(1_200_000, seed=4)[:5_000_000]  # one 5 MB line, no newline
    write(tmp_path / "corpus" / "a.txt", "A short document.\n")
    write(tmp_path / "corpus" / "b.txt", b"Latin-1 caf\xe9 here.\n")
    write(tmp_path / "corpus" / "c.txt", "")
    write(tmp_path / "corpus" / "d.txt", huge)
    status = main(
        [
            "prepare",
            str(tmp_path / "corpus"),
            "--out",
            str(tmp_path / "out"),
            "--tokenizer",
            str(gpt2_bpe_dir),
            "--chunk-chars",
            "65536",
            "--quiet",
        ]
    )
    assert status == 0
    printed = capsys.readouterr()
    assert "not valid UTF-8" in printed.err
    printed = printed.out
    assert "prepared 3 document(s)" in printed
    assert "1 empty file(s) skipped" in printed and "1 file(s) with invalid UTF-8 repaired" in printed

    documents = ["A short document.\n", "Latin-1 caf\ufffd here.\n", huge]
    expected = stream(gpt2_tokenizer, documents)
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert manifest["splits"]["train"] + manifest["splits"]["val"] == len(expected)
    assert manifest["forced_splits"] == 0
    assert all_tokens(tmp_path / "out").tolist() == expected


def test_cli_prepare_with_the_byte_tokenizer(tmp_path, capsys):
    write(tmp_path / "a.txt", "hello")
    assert (
        main(
            [
                "prepare",
                str(tmp_path / "a.txt"),
                "--out",
                str(tmp_path / "out"),
                "--tokenizer",
                "bytes",
                "--val-fraction",
                "0",
                "--quiet",
            ]
        )
        == 0
    )
    assert load_split(tmp_path / "out", "train").tolist() == [256, *b"hello"]


def test_cli_prepare_reports_a_missing_source_as_one_line(tmp_path, capsys):
    status = main(["prepare", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "out"), "--tokenizer", "bytes"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2 prepare: error: source") and "missing.txt" in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------ BatchLoader

TOKENS = np.arange(1000, dtype=np.uint16)


def batches(loader: BatchLoader, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [loader.next_batch() for _ in range(steps)]


@pytest.mark.parametrize("shuffle", [True, False])
def test_batches_are_int64_rows_of_the_stream_with_y_shifted_by_one(shuffle):
    x, y = BatchLoader(TOKENS, batch_size=4, block_size=8, shuffle=shuffle).next_batch()
    assert x.shape == y.shape == (4, 8) and x.dtype == y.dtype == torch.int64
    for row_x, row_y in zip(x, y, strict=True):
        start = int(row_x[0])  # TOKENS[i] == i, so a row's first value is its offset
        assert row_x.tolist() == list(range(start, start + 8))
        assert row_y.tolist() == list(range(start + 1, start + 9))


def test_shuffled_batches_depend_only_on_the_seed():
    first = batches(BatchLoader(TOKENS, 4, 8, seed=7), 3)
    again = batches(BatchLoader(TOKENS, 4, 8, seed=7), 3)
    other = batches(BatchLoader(TOKENS, 4, 8, seed=8), 3)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, other, strict=True))
    assert not torch.equal(first[0][0], first[1][0])  # steps differ from each other


def test_shuffled_offsets_reach_the_last_window_and_never_past_it():
    tokens = np.arange(12, dtype=np.uint16)
    x, y = BatchLoader(tokens, batch_size=2000, block_size=10).next_batch()
    assert set(x[:, 0].tolist()) == {0, 1}
    assert int(y.max()) == 11


def test_sequential_batches_walk_the_stream_and_wrap_around():
    loader = BatchLoader(np.arange(35, dtype=np.uint16), batch_size=2, block_size=10, shuffle=False)
    starts = [loader.next_batch()[0][:, 0].tolist() for _ in range(3)]
    # windows [0,10], [10,20], [20,30] fit (each needs one target token more); then back to the start
    assert starts == [[0, 10], [20, 0], [10, 20]]


@pytest.mark.parametrize("shuffle", [True, False])
def test_resuming_from_a_state_dict_continues_exactly(shuffle):
    original = BatchLoader(TOKENS, 4, 8, seed=3, shuffle=shuffle)
    batches(original, 5)
    state = json.loads(json.dumps(original.state_dict()))  # survives a JSON checkpoint
    expected = batches(original, 4)
    resumed = BatchLoader(TOKENS, 4, 8, seed=3, shuffle=shuffle)
    resumed.load_state_dict(state)
    assert all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(expected, batches(resumed, 4), strict=True)
    )


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_union_over_ranks_equals_one_process_with_the_global_batch(shuffle, world_size):
    single = BatchLoader(TOKENS, 2 * world_size, 8, seed=5, shuffle=shuffle)
    ranks = [
        BatchLoader(TOKENS, 2, 8, rank=r, world_size=world_size, seed=5, shuffle=shuffle) for r in range(world_size)
    ]
    for _ in range(4):
        x, y = single.next_batch()
        per_rank = [loader.next_batch() for loader in ranks]
        assert torch.equal(torch.cat([b[0] for b in per_rank]), x)
        assert torch.equal(torch.cat([b[1] for b in per_rank]), y)


def test_a_state_dict_resumes_under_another_world_size_with_the_same_global_batch():
    single = BatchLoader(TOKENS, 4, 8, seed=1)
    batches(single, 3)
    rank1 = BatchLoader(TOKENS, 2, 8, rank=1, world_size=2, seed=1)
    rank1.load_state_dict(single.state_dict())
    assert torch.equal(rank1.next_batch()[0], single.next_batch()[0][2:])


def test_a_state_dict_from_another_configuration_is_refused():
    state = BatchLoader(TOKENS, 4, 8, seed=1).state_dict()
    with pytest.raises(ValueError, match="saved state has seed=1 but this loader has seed=2"):
        BatchLoader(TOKENS, 4, 8, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match="global_batch_size=4 but this loader has global_batch_size=8"):
        BatchLoader(TOKENS, 8, 8, seed=1).load_state_dict(state)


def test_data_shorter_than_block_size_plus_one_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"^the split has 8 tokens; need at least block_size\+1 = 9; "
        "use a smaller block size or more data$",
    ):
        BatchLoader(np.arange(8, dtype=np.uint16), batch_size=1, block_size=8)
    BatchLoader(np.arange(9, dtype=np.uint16), batch_size=1, block_size=8).next_batch()  # exactly enough


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
        ({"block_size": -1}, "block_size must be a positive integer"),
        ({"rank": 2, "world_size": 2}, r"rank must be in \[0, world_size=2\), got 2"),
    ],
)
def test_bad_loader_arguments_are_value_errors(kwargs, message):
    arguments = {"batch_size": 2, "block_size": 8, **kwargs}
    batch_size, block_size = arguments.pop("batch_size"), arguments.pop("block_size")
    with pytest.raises(ValueError, match=message):
        BatchLoader(TOKENS, batch_size, block_size, **arguments)


def test_loader_reads_a_prepared_split(prepared):
    tokens = load_split(prepared, "train")
    x, y = BatchLoader(tokens, batch_size=2, block_size=16, seed=0).next_batch()
    assert x.shape == (2, 16)
    text = bytes(x[0].tolist()).decode("utf-8", errors="replace")
    assert text in ("hello world, " * 10) * 2


# ------------------------------------------------------------------------------------------ stdlib corpus


@pytest.mark.slow
def test_stdlib_corpus_is_library_code_in_a_fixed_order():
    from gpt2.data.corpus import EXCLUDED_DIRS, stdlib_files, stdlib_root

    files = stdlib_files()
    root = stdlib_root()
    assert files == stdlib_files() and len(files) > 100
    assert all(f.suffix == ".py" and not set(f.relative_to(root).parts[:-1]) & EXCLUDED_DIRS for f in files)
    subset = stdlib_files(max_bytes=50_000)
    assert subset == files[: len(subset)]
    assert sum(f.stat().st_size for f in subset) <= 50_000 or len(subset) == 1


def fake_stdlib(root: Path, sizes: list[int]) -> list[Path]:
    """A stdlib folder whose modules, in stdlib_files' shuffled order, have `sizes` bytes; returns that order."""
    from gpt2.data.corpus import stdlib_files

    for index in range(len(sizes)):
        write(root / f"module_{index:02d}.py", "")
    write(root / "test" / "test_module.py", "x" * 5)  # excluded folders never count
    order = stdlib_files(root=root)
    for path, size in zip(order, sizes, strict=True):
        write(path, "#" * size)
    return order


def test_stdlib_corpus_cut_stops_at_the_first_file_that_does_not_fit(tmp_path):
    from gpt2.data.corpus import stdlib_files

    order = fake_stdlib(tmp_path, [100, 1000, 10, 10, 10, 10, 10, 10])
    # the second file does not fit in 150 bytes: the cut ends there, later small files are not picked instead
    assert stdlib_files(max_bytes=150, root=tmp_path) == order[:1]
    assert stdlib_files(max_bytes=1100, root=tmp_path) == order[:2]
    assert stdlib_files(max_bytes=1119, root=tmp_path) == order[:3]


def test_stdlib_corpus_cut_is_the_longest_prefix_within_max_bytes_for_every_budget(tmp_path):
    from gpt2.data.corpus import stdlib_files

    sizes = [30, 500, 7, 120, 64, 1, 300, 45, 90, 12]
    order = fake_stdlib(tmp_path, sizes)
    prefix_sums = [sum(sizes[: count + 1]) for count in range(len(sizes))]
    budgets = sorted({1} | {total + delta for total in prefix_sums for delta in (-1, 0, 1)})  # every boundary
    for budget in budgets:
        kept = stdlib_files(max_bytes=budget, root=tmp_path)
        assert kept == order[: len(kept)], budget
        assert sum(sizes[: len(kept)]) <= budget or len(kept) == 1, budget
        assert len(kept) == len(order) or sum(sizes[: len(kept) + 1]) > budget, budget  # the next one won't fit


def test_stdlib_corpus_cut_keeps_the_first_file_even_when_it_alone_is_larger(tmp_path):
    from gpt2.data.corpus import stdlib_files

    order = fake_stdlib(tmp_path, [400, 10, 10])
    assert stdlib_files(max_bytes=100, root=tmp_path) == order[:1]
    with pytest.raises(ValueError, match="max_bytes must be positive or None, got 0"):
        stdlib_files(max_bytes=0, root=tmp_path)


@pytest.mark.slow
def test_cli_prepare_tells_of_invalid_utf8_in_one_clean_line(tmp_path):
    # as a user sees it: no Python warning format (no source path, no echoed line of our code)
    write(tmp_path / "bad.txt", b"caf\xe9 and \xff\xfe done\n" * 50)
    done = subprocess.run(
        [sys.executable, "-m", "gpt2.cli", "prepare", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "out"),
         "--tokenizer", "bytes", "--quiet"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "UTF-8" in line]
    assert len(lines) == 1 and lines[0].startswith("gpt2: note: 1 file(s) had bytes that are not valid UTF-8")
    assert "Warning" not in done.stderr and ".py:" not in done.stderr and "manifest = prepare(" not in done.stderr
