"""The facade (gpt2.api.LLM) and the one sampling-parameters dataclass (gpt2.inference.SamplingParams)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from gpt2.api import LLM
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.inference import SamplingParams, stream_text
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer
from gpt2.weights import save_pretrained


def tiny_gpt(vocab_size: int = ByteTokenizer.vocab_size) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=vocab_size, block_size=64))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)  # peaked distributions: greedy text is not a run of ties
        if vocab_size > ByteTokenizer.eot_token:
            # end-of-text's logit is then 0 while the best of 256 random logits is far above: greedy text runs on
            model.transformer.wte.weight[ByteTokenizer.eot_token].zero_()
    return model.eval()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """What `gpt2 train` leaves: a HF-format model with its tokenizer beside it."""
    directory = tmp_path / "run"
    save_pretrained(tiny_gpt(), directory)
    ByteTokenizer().save(directory)
    return directory


# ------------------------------------------------------------------------------- SamplingParams
def test_sampling_params_use_openai_names_and_defaults() -> None:
    params = SamplingParams()
    assert (params.max_tokens, params.temperature, params.top_p, params.n, params.stop) == (16, 1.0, 1.0, 1, ())


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(max_tokens=-3), "max_tokens must be an integer >= 0, got -3"),
        (dict(temperature=-1.0), "temperature must be a number >= 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_k=0), "top_k must be an integer >= 1"),
        (dict(stop=[""]), "stop must be a non-empty string"),
        (dict(stop_token_ids=[-1]), "stop_token_ids must be token ids"),
        (dict(seed="1"), "seed must be an integer"),
        (dict(n=0), "n must be an integer >= 1"),
        (dict(temperature=True), "temperature must be a number"),
    ],
)
def test_sampling_params_refuse_bad_values_at_construction(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**changes)


def test_a_single_stop_string_becomes_a_tuple_and_replace_validates_again() -> None:
    params = SamplingParams(stop="\n")
    assert params.stop == ("\n",)
    with pytest.raises(ValueError, match="max_tokens"):
        params.replace(max_tokens=-1)


@pytest.mark.parametrize("speculation", [{}, {"prompt_lookup": 4}], ids=["plain", "speculative"])
def test_a_stop_id_outside_the_vocabulary_is_refused_on_every_text_path(speculation: dict) -> None:
    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"), **speculation)
    outside = ByteTokenizer.vocab_size
    params = SamplingParams(max_tokens=3, temperature=0, stop_token_ids=[outside])
    paths = {
        "stream": lambda: list(llm.stream("ab", params)),
        "generate": lambda: llm.generate("ab", params),
        "batch": lambda: llm.generate(["ab", "c"], params),
        "beams": lambda: llm.generate("ab", params.replace(num_beams=2)),
    }
    for name, call in paths.items():
        with pytest.raises(ValueError, match=rf"stop_token_ids holds {outside}, which is not a token id in") as caught:
            call()
        assert "\n" not in str(caught.value), name


def test_the_samples_of_n_get_consecutive_seeds() -> None:
    params = SamplingParams(seed=7, n=3)
    assert [params.for_sample(i).seed for i in range(3)] == [7, 8, 9]
    assert SamplingParams(n=3).for_sample(2).seed is None


# ------------------------------------------------------------------------------- stop texts
def test_a_stop_text_ends_the_continuation_and_is_not_returned(run_dir: Path) -> None:
    llm = LLM.load(run_dir, device="cpu")
    full = "".join(llm.stream("ab", SamplingParams(max_tokens=40, temperature=0)))
    assert len(full) >= 6, "the fixture model must produce a continuation to cut"
    stop = full[3:5]
    cut = "".join(llm.stream("ab", SamplingParams(max_tokens=40, temperature=0, stop=[stop])))
    assert cut == full[: full.index(stop)]


def test_the_earliest_of_several_stop_texts_wins(run_dir: Path) -> None:
    llm = LLM.load(run_dir, device="cpu")
    full = "".join(llm.stream("ab", SamplingParams(max_tokens=40, temperature=0)))
    late, early = full[5:7], full[2:3]
    cut = "".join(llm.stream("ab", SamplingParams(max_tokens=40, temperature=0, stop=[late, early])))
    assert cut == full[: min(full.index(late), full.index(early))]


def test_a_stop_text_that_never_appears_changes_nothing(run_dir: Path) -> None:
    llm = LLM.load(run_dir, device="cpu")
    params = SamplingParams(max_tokens=30, temperature=0)
    assert llm.generate("ab", params.replace(stop=["\x00never\x00"])) == llm.generate("ab", params)


# ------------------------------------------------------------------------------- the facade
def test_llm_load_reads_model_and_tokenizer_from_one_directory(run_dir: Path) -> None:
    llm = LLM.load(run_dir, device="cpu")
    assert isinstance(llm.tokenizer, ByteTokenizer) and llm.device == torch.device("cpu")
    params = SamplingParams(max_tokens=12, temperature=0)
    assert llm.generate("Hi", params) == ["".join(stream_text(llm.model, llm.tokenizer, "Hi", params))]


def test_llm_generate_returns_n_reproducible_samples(run_dir: Path) -> None:
    llm = LLM.load(run_dir, device="cpu")
    params = SamplingParams(max_tokens=10, seed=3, n=2, temperature=1.5)
    first, second = llm.generate("Hi", params), llm.generate("Hi", params)
    assert first == second and len(first) == 2 and first[0] != first[1]


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "int8", "int4"])
def test_every_inference_precision_loads_and_generates(run_dir: Path, precision: str) -> None:
    llm = LLM.load(run_dir, device="cpu", precision=precision)
    assert len(llm.generate("Hi", SamplingParams(max_tokens=5, temperature=0))[0]) > 0


def test_an_llmc_file_finds_the_tokenizer_in_its_folder(fixtures_dir: Path, tmp_path: Path) -> None:
    shutil.copy(fixtures_dir / "llmc-tiny" / "model_fp32.bin", tmp_path / "model.bin")
    ByteTokenizer().save(tmp_path)
    llm = LLM.load(tmp_path / "model.bin", device="cpu")
    assert isinstance(llm.tokenizer, ByteTokenizer)


def test_a_tokenizer_larger_than_the_model_vocabulary_is_refused(tmp_path: Path) -> None:
    save_pretrained(tiny_gpt(vocab_size=100), tmp_path)
    ByteTokenizer().save(tmp_path)
    with pytest.raises(ValueError, match="the tokenizer has 257 tokens but the model only 100"):
        LLM.load(tmp_path, device="cpu")


def test_save_writes_what_load_reads(run_dir: Path, tmp_path: Path) -> None:
    llm = LLM.load(run_dir, device="cpu")
    llm.save(tmp_path / "copy")
    again = LLM.load(tmp_path / "copy", device="cpu")
    params = SamplingParams(max_tokens=8, temperature=0)
    assert again.generate("x", params) == llm.generate("x", params)


# ------------------------------------------------------------------------------- gpt2 sample
def test_sample_refuses_a_bad_option_before_printing_anything(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    code = main(["sample", "--model", str(run_dir), "--prompt", "Hi", "--max-new-tokens", "-3"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == "gpt2 sample: error: max_tokens must be an integer >= 0, got -3"


def test_sample_stops_at_a_stop_text(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    llm = LLM.load(run_dir, device="cpu")
    full = llm.generate("ab", SamplingParams(max_tokens=20, temperature=0))[0]
    stop = full[4:6]
    assert (
        main(
            [
                "sample",
                "--model",
                str(run_dir),
                "--prompt",
                "ab",
                "--temperature",
                "0",
                "--max-new-tokens",
                "20",
                "--stop",
                stop,
                "--no-echo",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == full[: full.index(stop)] + "\n"


# ------------------------------------------------------------------------------- many prompts, beams, rules
PROMPTS = ["Hi", "Once upon a time", "ab", "The quick brown fox jumps"]


def test_many_prompts_decoded_together_give_each_prompts_greedy_text_in_order(run_dir: Path) -> None:
    llm = LLM.load(run_dir)
    params = SamplingParams(max_tokens=20, temperature=0)
    assert llm.generate(PROMPTS, params) == [llm.generate(prompt, params) for prompt in PROMPTS]


def test_many_prompts_with_a_seed_give_each_prompts_seeded_samples(run_dir: Path) -> None:
    llm = LLM.load(run_dir)
    params = SamplingParams(max_tokens=12, seed=7, n=2, top_k=20)
    assert llm.generate(PROMPTS, params) == [llm.generate(prompt, params) for prompt in PROMPTS]


def test_many_prompts_with_stop_texts_and_rules_match_one_at_a_time(run_dir: Path) -> None:
    llm = LLM.load(run_dir)
    full = llm.generate("ab", SamplingParams(max_tokens=30, temperature=0))[0]
    params = SamplingParams(max_tokens=30, temperature=0, stop=[full[10:12]], repetition_penalty=1.3, min_tokens=5)
    assert llm.generate(["ab", "Hi"], params) == [llm.generate("ab", params), llm.generate("Hi", params)]


def test_generate_with_beams_returns_n_beams_per_prompt(run_dir: Path) -> None:
    llm = LLM.load(run_dir)
    params = SamplingParams(max_tokens=10, temperature=0, num_beams=3, n=2)
    single = llm.generate("Hi", params)
    assert len(single) == 2 and single[0] != single[1]
    assert llm.generate(["Hi", "ab"], params) == [single, llm.generate("ab", params)]


def test_bad_words_as_text_are_never_produced(run_dir: Path) -> None:
    llm = LLM.load(run_dir)
    text = llm.generate("ab", SamplingParams(max_tokens=30, temperature=0))[0]
    banned = text[3]
    again = llm.generate("ab", SamplingParams(max_tokens=30, temperature=0, bad_words=[banned]))[0]
    assert banned not in again and again != text


def test_sample_with_generation_controls_prints_what_the_library_generates(
    run_dir: Path, capsys: pytest.CaptureFixture
) -> None:
    llm = LLM.load(run_dir, device="cpu")
    params = SamplingParams(
        max_tokens=24, temperature=0, repetition_penalty=1.5, no_repeat_ngram_size=2, min_tokens=3,
        bad_words=("e",), logit_bias={ord("a"): -5.0}, presence_penalty=0.5, frequency_penalty=0.25,
    )  # fmt: skip
    expected = llm.generate("ab", params)[0]
    flags = ["--repetition-penalty", "1.5", "--no-repeat-ngram-size", "2", "--min-tokens", "3", "--bad-words", "e"]
    flags += ["--logit-bias", f"{ord('a')}=-5", "--presence-penalty", "0.5", "--frequency-penalty", "0.25"]
    command = ["sample", "--model", str(run_dir), "--prompt", "ab", "--temperature", "0", "--max-new-tokens", "24"]
    assert main([*command, "--no-echo", *flags]) == 0
    assert capsys.readouterr().out == expected + "\n"


def test_sample_with_beams_prints_the_n_best_beams(run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    from gpt2.cli.sample import SAMPLE_SEPARATOR

    llm = LLM.load(run_dir, device="cpu")
    beams = llm.generate("ab", SamplingParams(max_tokens=12, temperature=0, num_beams=4, n=2, length_penalty=0.5))
    command = ["sample", "--model", str(run_dir), "--prompt", "ab", "--temperature", "0", "--max-new-tokens", "12"]
    assert main([*command, "--num-beams", "4", "-n", "2", "--length-penalty", "0.5"]) == 0
    assert capsys.readouterr().out == SAMPLE_SEPARATOR.join("ab" + beam for beam in beams) + "\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--logit-bias", "x=1"], "--logit-bias takes TOKEN_ID=BIAS (e.g. 50256=-100), got 'x=1'"),
        (
            ["--num-beams", "4"],
            "num_beams=4 is beam search, which is deterministic: pass temperature=0 (--temperature 0; got 1.0)",
        ),
        (["--repetition-penalty", "-1"], "repetition_penalty must be a number > 0 (1.0: off), got -1.0"),
    ],
)
def test_sample_refuses_bad_generation_controls_in_one_line(
    run_dir: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str
) -> None:
    code = main(["sample", "--model", str(run_dir), "--prompt", "Hi", *flags])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.strip() == f"gpt2 sample: error: {message}"
