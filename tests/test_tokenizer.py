"""Specification of gpt2.tokenizer: GPT-2's exact ids, the file formats, special tokens, streaming, training, CLI.

The references are independent implementations of the same vocabulary: transformers' GPT2TokenizerFast (Rust
`tokenizers`), tiktoken built by its own loader from the same files, and gpt2.tokenizer.reference (plain Python).
"""

from __future__ import annotations

import inspect
import io
import json
import random
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import shared_file
from gpt2 import ByteTokenizer, Tokenizer, train_tokenizer
from gpt2.cli import main as cli_main
from gpt2.tokenizer import TIKTOKEN_SPLIT_PATTERN, load_tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.tokenizer.reference import GPT2_SPLIT_PATTERN, ReferenceBPE, split_pieces

EDGE_CASES = Path(__file__).parent / "data" / "tokenizer_edge_cases.txt"
EOT = "<|endoftext|>"


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def bpe_dir() -> Path:
    """OpenAI's encoder.json + vocab.bpe (module-scoped twin of conftest's gpt2_bpe_dir: loaded once)."""
    shared_file("gpt2-bpe/encoder.json")
    return shared_file("gpt2-bpe/vocab.bpe").parent


@pytest.fixture(scope="module")
def gpt2_tok(bpe_dir: Path) -> Tokenizer:
    return load_tokenizer(bpe_dir)


@pytest.fixture(scope="module")
def reference(gpt2_tok: Tokenizer) -> ReferenceBPE:
    return ReferenceBPE(gpt2_tok.vocab, gpt2_tok.merges, gpt2_tok.special_tokens)


@pytest.fixture(scope="module")
def hf_dir(bpe_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same vocabulary under Hugging Face's file names."""
    directory = tmp_path_factory.mktemp("hf-gpt2")
    shutil.copyfile(bpe_dir / "encoder.json", directory / "vocab.json")
    shutil.copyfile(bpe_dir / "vocab.bpe", directory / "merges.txt")
    return directory


@pytest.fixture(scope="module")
def hf_reference(hf_dir: Path):
    """transformers' fast GPT-2 tokenizer, with <|endoftext|> in the text kept as text (as our default)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2TokenizerFast(
        vocab=str(hf_dir / "vocab.json"), merges=str(hf_dir / "merges.txt"), split_special_tokens=True
    )
    # transformers 5.x builds an empty tokenizer from vocab_file=/merges_file=; never trust a reference unchecked
    assert hf.encode("Hello world") == [15496, 995]
    return hf


@pytest.fixture(scope="module")
def tiktoken_reference(bpe_dir: Path):
    """tiktoken's own GPT-2 loader on the same files (it checks encoder.json against vocab.bpe itself)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_CACHE_DIR", "")  # "" = read the files directly, cache nothing
        ranks = data_gym_to_mergeable_bpe_ranks(str(bpe_dir / "vocab.bpe"), str(bpe_dir / "encoder.json"))
    encoding = tiktoken.Encoding(
        name="gpt2-reference",
        pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
        mergeable_ranks=ranks,
        special_tokens={EOT: 50256},
    )
    assert encoding.encode_ordinary("Hello world") == [15496, 995]
    return encoding


@pytest.fixture(scope="module")
def shakespeare_text() -> str:
    return shared_file("corpora/tinyshakespeare.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def trained(shakespeare_text: str) -> Tokenizer:
    return train_tokenizer([shakespeare_text], vocab_size=1024)


def edge_case_texts() -> list[str]:
    text = EDGE_CASES.read_text(encoding="utf-8")
    return [text, *text.split("\n"), ""]


# ------------------------------------------------------------------------------------------ known GPT-2 ids


def test_hello_world_has_gpt2s_ids(gpt2_tok: Tokenizer) -> None:
    assert gpt2_tok.encode("Hello world") == [15496, 995]
    assert gpt2_tok.encode(" Hello world") == [18435, 995]


def test_gpt2_vocabulary_sizes(gpt2_tok: Tokenizer) -> None:
    assert gpt2_tok.eot_token == 50256
    assert gpt2_tok.vocab_size == len(gpt2_tok) == 50257


def test_empty_string_encodes_to_nothing(gpt2_tok: Tokenizer) -> None:
    assert gpt2_tok.encode("") == []
    assert gpt2_tok.decode([]) == ""


# ---------------------------------------------------------------------------------- exact ids vs references


@pytest.mark.slow
def test_same_ids_as_transformers_on_tinyshakespeare(gpt2_tok, hf_reference, shakespeare_text) -> None:
    assert gpt2_tok.encode(shakespeare_text) == hf_reference.encode(shakespeare_text)


def test_same_ids_as_tiktoken_on_tinyshakespeare(gpt2_tok, tiktoken_reference, shakespeare_text) -> None:
    assert gpt2_tok.encode(shakespeare_text) == tiktoken_reference.encode_ordinary(shakespeare_text)


@pytest.mark.parametrize("text", edge_case_texts(), ids=lambda text: repr(text[:24]))
def test_same_ids_as_all_references_on_edge_cases(gpt2_tok, hf_reference, tiktoken_reference, reference, text):
    ids = gpt2_tok.encode(text)
    assert ids == hf_reference.encode(text)
    assert ids == tiktoken_reference.encode_ordinary(text)
    assert ids == reference.encode(text)
    assert gpt2_tok.decode(ids) == text


@pytest.mark.slow
def test_reference_agrees_on_tinyshakespeare(gpt2_tok, reference, shakespeare_text) -> None:
    assert reference.encode(shakespeare_text) == gpt2_tok.encode(shakespeare_text)


MULTILINGUAL = (
    "Ünïcödé façade — naïve café. Привет, как дела? Это тест 123. 你好，世界！这是一个测试。 こんにちは世界。"
    " مرحبا بالعالم 42. Γειά σου κόσμε! हिन्दी पाठ।  \t\n  x's we'll THEY'RE 3.14e10 \u00a0nbsp  \r\n\n  "
)
SPLIT_ALPHABET = st.sampled_from(list("aZé你1٣ '\"sdmtlvre.,!-_\t\n\r\u00a0\u3000\u2028") + ["'s", "'ll", "  "])


def fast_pieces(text: str) -> list[str]:
    import regex

    return regex.findall(TIKTOKEN_SPLIT_PATTERN, text)


@pytest.mark.parametrize("corpus", ["code", "prose", "multilingual"])
def test_the_fast_split_pattern_splits_as_gpt2s(corpus, shakespeare_text) -> None:
    text = {
        "code": inspect.getsource(inspect) + inspect.getsource(json),
        "prose": shakespeare_text[:300_000],
        "multilingual": MULTILINGUAL * 20,
    }[corpus]
    assert fast_pieces(text) == split_pieces(text)


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(st.lists(SPLIT_ALPHABET).map("".join) | st.text())
def test_the_fast_split_pattern_splits_any_text_as_gpt2s(text: str) -> None:
    assert fast_pieces(text) == split_pieces(text)


def test_split_pattern_keeps_contractions_lower_case_only() -> None:
    assert split_pieces("it's IT'S") == ["it", "'s", " IT", "'", "S"]
    assert "'ll" in GPT2_SPLIT_PATTERN


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_decode_inverts_encode_and_reference_agrees(gpt2_tok, reference, text: str) -> None:
    ids = gpt2_tok.encode(text)
    assert gpt2_tok.decode(ids) == text
    assert reference.encode(text) == ids


# --------------------------------------------------------------------------------------------- special tokens


def test_endoftext_text_is_ordinary_by_default(gpt2_tok: Tokenizer) -> None:
    ids = gpt2_tok.encode(f"a{EOT}b")
    assert 50256 not in ids
    assert gpt2_tok.decode(ids) == f"a{EOT}b"


def test_endoftext_becomes_its_id_only_when_allowed(gpt2_tok: Tokenizer) -> None:
    assert gpt2_tok.encode(f"a{EOT}b", allowed_special={EOT}) == [64, 50256, 65]
    assert gpt2_tok.encode(f"a{EOT}b", allowed_special="all") == [64, 50256, 65]
    assert gpt2_tok.decode([64, 50256, 65]) == f"a{EOT}b"


def test_unknown_allowed_special_is_refused(gpt2_tok: Tokenizer) -> None:
    with pytest.raises(ValueError, match="<|startoftext|>"):
        gpt2_tok.encode("x", allowed_special={"<|startoftext|>"})


# ----------------------------------------------------------------------------------------------- decoding


def test_decode_replaces_invalid_utf8(gpt2_tok: Tokenizer) -> None:
    first_byte_of_emoji = gpt2_tok.encode("🤗")[0]  # 🤗 takes several tokens; the first is not valid UTF-8 alone
    assert gpt2_tok.decode([first_byte_of_emoji]) == "\ufffd"


@pytest.mark.parametrize("bad_id", [50257, -1, 10**9])
def test_decode_rejects_ids_outside_the_vocabulary(gpt2_tok: Tokenizer, bad_id: int) -> None:
    with pytest.raises(ValueError, match=rf"token id {bad_id} is outside the vocabulary \(valid ids are 0..50256\)"):
        gpt2_tok.decode([15496, bad_id])


def test_stream_decoder_holds_back_a_split_character(gpt2_tok: Tokenizer) -> None:
    ids = gpt2_tok.encode("🤗")
    assert len(ids) > 1
    decoder = gpt2_tok.stream_decoder()
    pieces = [decoder.push(token_id) for token_id in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1)
    assert pieces[-1] == "🤗"
    assert decoder.flush() == ""


def test_stream_decoder_pieces_concatenate_to_decode(gpt2_tok: Tokenizer) -> None:
    ids = gpt2_tok.encode(EDGE_CASES.read_text(encoding="utf-8"))
    decoder = gpt2_tok.stream_decoder()
    streamed = "".join(decoder.push(token_id) for token_id in ids) + decoder.flush()
    assert streamed == gpt2_tok.decode(ids)


def test_stream_decoder_flush_replaces_an_unfinished_character(gpt2_tok: Tokenizer) -> None:
    first = gpt2_tok.encode("🤗")[0]
    decoder = gpt2_tok.stream_decoder()
    assert decoder.push(first) == ""
    assert decoder.flush() == "\ufffd"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=50256), max_size=40))
def test_stream_decoder_equals_decode_for_any_ids(gpt2_tok: Tokenizer, ids: list[int]) -> None:
    decoder = gpt2_tok.stream_decoder()
    assert "".join(decoder.push(token_id) for token_id in ids) + decoder.flush() == gpt2_tok.decode(ids)


# ---------------------------------------------------------------------------------------------- batching


def test_encode_batch_equals_encode_on_each_text(gpt2_tok: Tokenizer, shakespeare_text: str) -> None:
    texts = shakespeare_text[:200_000].split("\n\n") + ["", EOT]
    expected = [gpt2_tok.encode(text) for text in texts]
    assert gpt2_tok.encode_batch(texts, num_threads=2) == expected
    assert gpt2_tok.encode_batch(texts, num_threads=1) == expected


def test_encode_batch_keeps_literal_special_text_as_text(gpt2_tok: Tokenizer) -> None:
    texts = ["a", f"b{EOT}c", "d"] * 5
    assert gpt2_tok.encode_batch(texts, num_threads=2) == [gpt2_tok.encode(text) for text in texts]


def test_encode_batch_without_special_tokens(trained: Tokenizer) -> None:
    vocab = trained.vocab
    del vocab[EOT]
    tok = Tokenizer(vocab, trained.merges)
    texts = ["to be", "", " or not"] * 3
    assert tok.encode_batch(texts) == [tok.encode(text) for text in texts]


def test_encode_batch_passes_allowed_special_on(gpt2_tok: Tokenizer) -> None:
    assert gpt2_tok.encode_batch([f"a{EOT}", "b"], allowed_special="all") == [[64, 50256], [65]]


# ------------------------------------------------------------------------------------ files and identities


@pytest.mark.slow
def test_loads_the_same_vocabulary_from_every_layout(gpt2_tok, bpe_dir, hf_dir, tmp_path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    hf = HFTokenizer(models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([EOT])
    (tmp_path / "json").mkdir()
    hf.save(str(tmp_path / "json" / "tokenizer.json"))

    loaded = [
        load_tokenizer(hf_dir),
        load_tokenizer(tmp_path / "json"),
        Tokenizer.from_files(bpe_dir / "encoder.json", bpe_dir / "vocab.bpe"),
    ]
    for tok in loaded:
        assert tok.identity == gpt2_tok.identity
        assert tok.encode(" Hello world") == [18435, 995]
        assert tok.eot_token == 50256


def test_identity_names_the_kind_and_a_sha256(gpt2_tok: Tokenizer, trained: Tokenizer) -> None:
    assert gpt2_tok.identity.startswith("byte-level-bpe:sha256:") and len(gpt2_tok.identity.split(":")[-1]) == 64
    assert trained.identity != gpt2_tok.identity
    assert ByteTokenizer().identity.startswith("bytes:sha256:")


def test_save_writes_both_layouts_and_reloads_identically(gpt2_tok, bpe_dir, tmp_path) -> None:
    gpt2_tok.save(tmp_path)
    assert (tmp_path / "encoder.json").read_text() == (tmp_path / "vocab.json").read_text()
    assert (tmp_path / "vocab.bpe").read_text() == (tmp_path / "merges.txt").read_text()
    assert json.loads((tmp_path / "encoder.json").read_text()) == json.loads((bpe_dir / "encoder.json").read_text())
    assert load_tokenizer(tmp_path).identity == gpt2_tok.identity


def test_hub_name_that_cannot_be_fetched_is_a_clear_error(monkeypatch, tmp_path) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")

    def offline(**kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)  # the test never touches the network
    monkeypatch.chdir(tmp_path)  # so the name cannot be mistaken for a local directory
    with pytest.raises(FileNotFoundError, match="'no-such-user/no-such-tokenizer'"):
        load_tokenizer("no-such-user/no-such-tokenizer")


def test_directory_without_vocabulary_names_the_files_it_wants(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="encoder.json \\+ vocab.bpe, vocab.json \\+ merges.txt"):
        load_tokenizer(tmp_path)


def test_missing_merges_file_is_named(bpe_dir, tmp_path) -> None:
    shutil.copyfile(bpe_dir / "encoder.json", tmp_path / "encoder.json")
    with pytest.raises(FileNotFoundError, match="vocab.bpe"):
        load_tokenizer(tmp_path)


def test_corrupt_vocabulary_json_names_file_and_position(bpe_dir, tmp_path) -> None:
    (tmp_path / "encoder.json").write_bytes((bpe_dir / "encoder.json").read_bytes()[:5000])
    shutil.copyfile(bpe_dir / "vocab.bpe", tmp_path / "vocab.bpe")
    with pytest.raises(ValueError, match=r"encoder.json: not valid JSON \(.* line 1 column"):
        load_tokenizer(tmp_path)


def test_malformed_merge_line_is_named(trained: Tokenizer, tmp_path) -> None:
    trained.save(tmp_path)
    lines = (tmp_path / "vocab.bpe").read_text().split("\n")
    lines[3] = "abc"
    (tmp_path / "vocab.bpe").write_text("\n".join(lines))
    with pytest.raises(ValueError, match=r"vocab.bpe line 4: expected two symbols .* got 'abc'"):
        load_tokenizer(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": {"type": "WordPiece"}}, r"tokenizer.json: model type is 'WordPiece'; only byte-level BPE"),
        ({"pre_tokenizer": {"type": "Whitespace"}}, r"tokenizer.json: the pre-tokenizer is 'Whitespace', not Byte"),
        (
            {"pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": True}},
            r"tokenizer.json: ByteLevel add_prefix_space=true is not GPT-2's behaviour; set it to false",
        ),
    ],
)
def test_a_tokenizer_json_that_is_not_gpt2_style_bpe_is_one_line_naming_the_file(tmp_path, change, message) -> None:
    document = {"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}
    (tmp_path / "tokenizer.json").write_text(json.dumps({**document, **change}))
    with pytest.raises(ValueError, match=message) as caught:
        load_tokenizer(tmp_path)
    assert "\n" not in str(caught.value)


def test_merge_whose_result_is_not_in_the_vocabulary_is_refused(trained: Tokenizer) -> None:
    vocab = trained.vocab
    merges = trained.merges
    left, right = merges[10]
    del vocab[left + right]
    vocab = {symbol: index for index, symbol in enumerate(sorted(vocab, key=vocab.__getitem__))}
    with pytest.raises(ValueError, match=rf"merge 11 .* makes '{left + right}', which is not in the vocabulary"):
        Tokenizer(vocab, merges)


def test_truncated_merges_are_a_size_disagreement(trained: Tokenizer) -> None:
    with pytest.raises(ValueError, match=r"1024 entries but 256 bytes \+ 667 merge results \+ 1 special"):
        Tokenizer(trained.vocab, trained.merges[:667])


def test_duplicate_ids_are_refused(trained: Tokenizer) -> None:
    vocab = trained.vocab
    vocab["e"] = vocab["a"]
    with pytest.raises(ValueError, match=r"id \d+ is given to both"):
        Tokenizer(vocab, trained.merges)


def test_vocabulary_without_a_byte_is_refused(trained: Tokenizer) -> None:
    vocab = trained.vocab
    del vocab["Ġ"]
    with pytest.raises(ValueError, match="lacks the symbol 'Ġ' for byte 32"):
        Tokenizer(vocab, [])


def test_ids_not_in_merge_order_are_renumbered_for_the_engine(trained, shakespeare_text) -> None:
    # shuffle the ids of all non-byte tokens: tiktoken's rank == id shortcut would now merge in the wrong order
    vocab = trained.vocab
    movable = sorted(vocab, key=vocab.__getitem__)[256:]
    new_ids = list(range(256, len(vocab)))
    random.Random(0).shuffle(new_ids)
    shuffled = {**vocab, **dict(zip(movable, new_ids, strict=True))}
    tok = Tokenizer(shuffled, trained.merges)
    old_to_new = {vocab[symbol]: shuffled[symbol] for symbol in vocab}
    text = shakespeare_text[:50_000] + EOT
    assert tok.encode(text) == [old_to_new[token_id] for token_id in trained.encode(text)]
    assert tok.encode(EOT, allowed_special="all") == [shuffled[EOT]]
    assert tok.decode(tok.encode(text)) == text
    reference = ReferenceBPE(shuffled, trained.merges)
    assert reference.encode(text) == tok.encode(text)


# ----------------------------------------------------------------------------------------------- training


def test_trained_tokenizer_has_the_requested_size_and_eot_last(trained: Tokenizer) -> None:
    assert trained.vocab_size == 1024
    assert trained.eot_token == 1023


def test_trained_ids_follow_merge_order(trained: Tokenizer) -> None:
    vocab = trained.vocab
    first_ids = [vocab[left + right] for left, right in dict.fromkeys(trained.merges)]
    assert sorted(set(first_ids)) == list(range(256, 1023))


def test_trained_tokenizer_round_trips_and_reloads_to_the_same_ids(trained, shakespeare_text, tmp_path) -> None:
    ids = trained.encode(shakespeare_text)
    assert trained.decode(ids) == shakespeare_text
    assert len(ids) < len(shakespeare_text.encode()) / 2  # it learned something
    trained.save(tmp_path)
    reloaded = load_tokenizer(tmp_path)
    assert reloaded.encode(shakespeare_text) == ids
    assert reloaded.identity == trained.identity


@pytest.mark.slow
def test_trained_tokenizer_matches_hf_bpe_and_reference(trained, shakespeare_text, tmp_path) -> None:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers

    trained.save(tmp_path)
    hf = HFTokenizer(models.BPE.from_file(str(tmp_path / "vocab.json"), str(tmp_path / "merges.txt")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    reference = ReferenceBPE(trained.vocab, trained.merges)
    for text in [shakespeare_text, *edge_case_texts()[1:]]:
        ids = trained.encode(text)
        assert ids == hf.encode(text, add_special_tokens=False).ids
        assert ids == reference.encode(text)


def test_training_reads_files_and_directories(tmp_path, shakespeare_text) -> None:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(shakespeare_text[:300_000])
    (tmp_path / "corpus" / "b.md").write_text("ignored by the pattern")
    from_dir = train_tokenizer([tmp_path / "corpus"], vocab_size=300, file_pattern="*.txt")
    from_text = train_tokenizer([shakespeare_text[:300_000]], vocab_size=300)
    assert from_dir.identity == from_text.identity


def test_training_with_too_little_text_says_so() -> None:
    with pytest.raises(ValueError, match="supports only .* not vocab_size=5000"):
        train_tokenizer(["tiny text, tiny text"], vocab_size=5000)


def test_training_vocab_size_below_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_tokenizer(["text"], vocab_size=100)


# ----------------------------------------------------------------------------------------- ByteTokenizer


def test_byte_tokenizer_ids_are_utf8_bytes() -> None:
    tok = ByteTokenizer()
    assert tok.encode("hé") == [104, 195, 169]
    assert tok.vocab_size == len(tok) == 257 and tok.eot_token == 256
    assert tok.decode([104, 195, 169]) == "hé"


def test_byte_tokenizer_special_tokens_only_when_allowed() -> None:
    tok = ByteTokenizer()
    assert 256 not in tok.encode(f"a{EOT}b")
    assert tok.encode(f"a{EOT}b", allowed_special="all") == [97, 256, 98]
    assert tok.decode([97, 256, 98]) == f"a{EOT}b"
    assert tok.encode_batch(["a", f"{EOT}"], allowed_special={EOT}) == [[97], [256]]


def test_byte_tokenizer_decode_replaces_and_rejects() -> None:
    tok = ByteTokenizer()
    assert tok.decode([0xE2, 0x82]) == "\ufffd"
    with pytest.raises(ValueError, match="token id 257 is outside the vocabulary"):
        tok.decode([257])


def test_byte_tokenizer_streams_a_split_character() -> None:
    tok = ByteTokenizer()
    decoder = tok.stream_decoder()
    assert [decoder.push(token_id) for token_id in tok.encode("€")] == ["", "", "€"]


def test_byte_tokenizer_saves_and_is_recognised_by_load_tokenizer(tmp_path) -> None:
    ByteTokenizer().save(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, ByteTokenizer)
    assert loaded.identity == ByteTokenizer().identity


def test_a_byte_tokenizer_file_for_another_tokenizer_is_refused(tmp_path) -> None:
    ByteTokenizer().save(tmp_path)
    description = json.loads((tmp_path / "byte_tokenizer.json").read_text())
    (tmp_path / "byte_tokenizer.json").write_text(json.dumps({**description, "vocab_size": 300}))
    with pytest.raises(ValueError, match=r"byte_tokenizer.json: describes .* the file is corrupt or newer"):
        load_tokenizer(tmp_path)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips(text: str) -> None:
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


# ------------------------------------------------------------------------------------------ the interface


def protocol_methods() -> list[str]:
    return sorted(
        name for name, member in vars(TextTokenizer).items() if callable(member) and not name.startswith("_")
    ) + ["__len__"]


@pytest.mark.parametrize("tokenizer_class", [Tokenizer, ByteTokenizer])
def test_both_tokenizers_satisfy_the_text_tokenizer_protocol(gpt2_tok, tokenizer_class) -> None:
    tok = gpt2_tok if tokenizer_class is Tokenizer else ByteTokenizer()
    assert isinstance(tok, TextTokenizer)
    assert isinstance(tok.kind, str) and isinstance(tok.identity, str)
    assert isinstance(tok.eot_token, int) and isinstance(tok.vocab_size, int)
    for name in protocol_methods():
        wanted = inspect.signature(getattr(TextTokenizer, name)).parameters
        actual = inspect.signature(getattr(tokenizer_class, name)).parameters
        for parameter in wanted.values():  # every argument a caller of the Protocol may pass is accepted alike
            assert parameter.name in actual, (name, parameter.name)
            assert actual[parameter.name].kind == parameter.kind, (name, parameter.name)
            assert actual[parameter.name].default == parameter.default, (name, parameter.name)
        extra = [p for p in actual.values() if p.name not in wanted and p.default is inspect.Parameter.empty]
        assert extra == [], (name, extra)  # anything more must be optional


# ----------------------------------------------------------------------------------------------------- CLI


def run_cli(argv: list[str], stdin: str = "", monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    if monkeypatch is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with redirect_stdout(out), redirect_stderr(err):
        status = cli_main(argv)
    return status, out.getvalue(), err.getvalue()


def test_cli_tokenize_prints_ids_of_a_file(bpe_dir, tmp_path) -> None:
    (tmp_path / "in.txt").write_text("Hello world")
    status, out, _ = run_cli(["tokenize", str(tmp_path / "in.txt"), "--tokenizer", str(bpe_dir)])
    assert status == 0
    assert out == "15496 995\n"


def test_cli_tokenize_counts_stdin_with_the_env_tokenizer(bpe_dir, shakespeare_text, gpt2_tok, monkeypatch) -> None:
    monkeypatch.setenv("GPT2_TOKENIZER", str(bpe_dir))
    status, out, _ = run_cli(["tokenize", "--count"], stdin=shakespeare_text, monkeypatch=monkeypatch)
    assert status == 0
    assert int(out) == len(gpt2_tok.encode(shakespeare_text))


def test_cli_tokenize_allow_special(bpe_dir, monkeypatch) -> None:
    argv = ["tokenize", "-", "--tokenizer", str(bpe_dir), "--allow-special"]
    assert run_cli(argv, stdin=f"a{EOT}", monkeypatch=monkeypatch)[1] == "64 50256\n"


def test_cli_tokenize_without_a_tokenizer_says_what_to_pass(monkeypatch) -> None:
    monkeypatch.delenv("GPT2_TOKENIZER", raising=False)
    status, out, err = run_cli(["tokenize", "-"], stdin="x", monkeypatch=monkeypatch)
    assert status == 2 and out == ""
    assert "--tokenizer" in err and "GPT2_TOKENIZER" in err
    assert len(err.strip().splitlines()) == 1


def test_cli_tokenizer_train_writes_a_loadable_tokenizer(tinyshakespeare, tmp_path) -> None:
    out_dir = tmp_path / "tok"
    status, out, _ = run_cli(["tokenizer", "train", str(tinyshakespeare), "--vocab-size", "512", "--out", str(out_dir)])
    assert status == 0
    assert "vocab_size=512" in out
    assert sorted(path.name for path in out_dir.iterdir()) == ["encoder.json", "merges.txt", "vocab.bpe", "vocab.json"]
    tok = load_tokenizer(out_dir)
    assert tok.vocab_size == 512 and tok.eot_token == 511
    status, out, _ = run_cli(["tokenize", str(tinyshakespeare), "--tokenizer", str(out_dir), "--count"])
    assert int(out) == len(tok.encode(tinyshakespeare.read_text()))


def test_cli_tokenizer_train_missing_input_is_one_line(tmp_path) -> None:
    status, _, err = run_cli(
        ["tokenizer", "train", str(tmp_path / "nope"), "--vocab-size", "512", "--out", str(tmp_path)]
    )
    assert status == 2
    assert "nope" in err and "does not exist" in err
