"""The command line says what it does: every flag a command shows works (or is refused before anything runs),
messages name flags rather than Python keywords, and `--help` / `--version` answer."""

from __future__ import annotations

import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from gpt2.cli import build_parser, main
from gpt2.cli.serve import choose_model, server_config
from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer
from gpt2.weights import save_pretrained


@pytest.fixture
def byte_model(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    directory = tmp_path / "tiny"
    save_pretrained(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=257, block_size=32)), directory)
    ByteTokenizer().save(directory)
    return directory


def test_version_names_the_package(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and re.fullmatch(r"gpt2 \S+.*\n", capsys.readouterr().out)


@pytest.mark.parametrize("command", [["chat"], ["tokenize"], ["tokenizer"], ["tokenizer", "train"]])
def test_help_describes_the_command(command, capsys):
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    usage, _, rest = capsys.readouterr().out.partition("\n\n")
    assert rest.split("\n")[0] and not rest.startswith(("positional arguments", "options")), rest[:200]


@pytest.mark.parametrize("flag", [["-n", "2"], ["--num-beams", "2"], ["--length-penalty", "2"]])
def test_chat_refuses_multi_sample_and_beam_flags_before_anything_runs(flag, byte_model, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["chat", "--model", str(byte_model), *flag])
    assert exited.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def chat(model: Path, monkeypatch, capsys, *extra: str) -> str:
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n"))
    args = ["chat", "--model", str(model), "--max-new-tokens", "4", "--temperature", "0", "--device", "cpu", *extra]
    assert main(args) == 0
    return capsys.readouterr().out


def test_chat_takes_a_dtype(byte_model, monkeypatch, capsys):
    assert chat(byte_model, monkeypatch, capsys, "--dtype", "bfloat16", "--threads", "1").count("assistant> ") == 1


@pytest.fixture
def lora_output(tmp_path: Path, gpt2_bpe_dir: Path) -> tuple[Path, Path]:
    """(base model, a `gpt2 finetune --method lora`-shaped output: the merged model with adapter/ beside it)."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from gpt2.finetune.lora import apply_adapter
    from gpt2.weights import load_model

    torch.manual_seed(0)
    base = tmp_path / "base"
    config = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    transformers.GPT2LMHeadModel(config).save_pretrained(base)
    out = tmp_path / "out"
    lora = peft.LoraConfig(r=2, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False)
    peft.get_peft_model(transformers.GPT2LMHeadModel.from_pretrained(base), lora).save_pretrained(out / "adapter")
    save_pretrained(apply_adapter(load_model(base), out / "adapter"), out)
    for folder in (base, out):
        for name in ("encoder.json", "vocab.bpe"):
            shutil.copy(gpt2_bpe_dir / name, folder / name)
    return base, out


@pytest.mark.slow
def test_chat_adapter_finds_the_adapter_in_a_finetune_output(lora_output, monkeypatch, capsys):
    base, out = lora_output
    assert chat(base, monkeypatch, capsys, "--adapter", str(out)) == chat(out, monkeypatch, capsys)


@pytest.mark.parametrize("adapter", ["out", "out/adapter"])
def test_chat_refuses_an_adapter_over_the_model_it_is_merged_into(adapter, lora_output, capsys):
    _, out = lora_output
    code = main(["chat", "--model", str(out), "--adapter", str(out.parent / adapter), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "already has the adapter" in err and "drop --adapter" in err


def test_sample_refuses_a_too_long_prompt_before_echoing_it(byte_model, capsys):
    prompt = "x" * 40  # the model's context is 32
    assert main(["sample", "--model", str(byte_model), "--prompt", prompt, "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--truncate left" in captured.err and captured.err.count("\n") == 1


def test_beam_search_without_greedy_names_the_flag(byte_model, capsys):
    args = ["sample", "--model", str(byte_model), "--prompt", "hi", "--num-beams", "2", "--device", "cpu"]
    assert main(args) == 2
    assert "--temperature 0" in capsys.readouterr().err


def test_serve_takes_the_model_as_its_argument_or_as_model():
    parser = build_parser()
    positional = parser.parse_args(["serve", "out/run1"])
    choose_model(positional)
    assert positional.model == "out/run1" and server_config(positional).model_name == "out/run1"
    flag = parser.parse_args(["serve", "--model", "out/run1"])
    choose_model(flag)
    assert flag.model == "out/run1"
    with pytest.raises(ValueError, match="no model given"):
        choose_model(parser.parse_args(["serve"]))
    with pytest.raises(ValueError, match="two models given"):
        choose_model(parser.parse_args(["serve", "a", "--model", "b"]))


def test_threads_flag_sets_torchs_threads(byte_model, capsys):
    before = torch.get_num_threads()
    try:
        assert main(["sample", "--model", str(byte_model), "--prompt", "hi", "--max-new-tokens", "2",
                     "--device", "cpu", "--threads", "2"]) == 0  # fmt: skip
        assert torch.get_num_threads() == 2
        assert main(["sample", "--model", str(byte_model), "--prompt", "hi", "--threads", "0"]) == 2
        assert "--threads must be at least 1" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)
    for command in (["serve", "m"], ["eval", "perplexity", "--model", "m", "--data", "d"]):
        assert build_parser().parse_args([*command, "--threads", "3"]).threads == 3


def test_serve_help_curl_example_works_as_printed(byte_model, capsys):
    """The help's first `gpt2 serve` line and its curl line, run as printed (the model swapped for a tiny one)."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from gpt2.api import LLM
    from gpt2.serve.app import create_app

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = capsys.readouterr().out.replace("\\\n", " ")
    serve_line = next(line for line in help_text.splitlines() if line.strip().startswith("gpt2 serve "))
    curl_line = next(line for line in help_text.splitlines() if line.strip().startswith("curl "))
    serve_args = build_parser().parse_args(shlex.split(serve_line.split("#")[0].strip())[1:])
    choose_model(serve_args)
    curl = shlex.split(curl_line.strip())
    url, body = curl[1], json.loads(curl[curl.index("-d") + 1])
    path = "/" + url.split("/", 1)[1]
    with TestClient(create_app(LLM.load(byte_model), server_config(serve_args))) as client:
        answer = client.post(path, json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"]
        health = client.get("/health").json()
    assert str(byte_model) not in json.dumps(health) and serve_args.model not in json.dumps(health)


def test_finetune_on_non_utf8_text_names_the_file_and_line(byte_model, tmp_path, capsys):
    data = tmp_path / "notes.txt"
    data.write_bytes(b"first line\nsecond line\ncaf\xe9 au lait\n")
    args = ["finetune", "--model", str(byte_model), "--data", str(data), "--out", str(tmp_path / "out"),
            "--no-progress", "--set", "device=cpu"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{data}:3" in err and "UTF-8" in err
