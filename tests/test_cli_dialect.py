"""One command-line dialect: every command and subcommand describes itself in --help, the top-level help names
every view of `inspect`, a flag means the same in every command that takes it (--adapter [NAME=]DIR, --dtype in
one set of spellings), renamed flags keep their old spelling with one line saying so, and the README's commands
run as printed.

The README's fenced `gpt2` commands are all parsed; those that run offline in seconds are run as printed, in a
temporary folder holding what they read: `out/stdlib` (a tiny model with GPT-2's tokenizer, standing in for what
`gpt2 train stdlib` leaves there) and `corpus.txt`. `gpt2 train stdlib` itself is parsed only: it takes minutes
(tests/test_package.py trains the stdlib preset, shortened)."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import torch

from gpt2.cli import build_parser, main
from gpt2.config import GPTConfig
from gpt2.cpu.layouts import PRECISIONS
from gpt2.export import export_dtype
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import save_pretrained
from test_cli_docs import subcommand_parsers

README = Path(__file__).resolve().parents[1] / "README.md"
# Commands that take minutes: parsed, not run here (see the module docstring).
PARSED_ONLY = {"train"}


def every_parser() -> dict[str, argparse.ArgumentParser]:
    """Every command and subcommand parser by its command line ('eval', 'eval perplexity', ...)."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        if prefix:
            found[prefix] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


@pytest.mark.parametrize("command", sorted(every_parser()))
def test_every_command_describes_itself_in_its_help(command: str) -> None:
    parser = every_parser()[command]
    assert parser.description and parser.description.strip(), command
    assert f"usage: gpt2 {command}" in parser.format_help()


def test_the_top_level_help_names_every_view_of_inspect(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help of a command over lines
    entry = text.split(" inspect ", 1)[1].split(" export ", 1)[0]
    views = next(a for a in every_parser()["inspect"]._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(views) == {"attention", "logit-lens", "patch", "sae"}
    assert all(view in entry for view in views), entry


@pytest.mark.parametrize("command", ["sample", "chat", "export"])
@pytest.mark.parametrize(
    ("given", "expected"),
    [("out/poems", ("poems", "out/poems")), ("out/poems/", ("poems", "out/poems/")),
     ("verse=out/poems", ("verse", "out/poems"))],
)  # fmt: skip
def test_adapter_is_one_adapter_as_name_equals_folder_or_a_folder_everywhere(command, given, expected) -> None:
    extra = ["--format", "gguf-lora", "--out", "x.gguf"] if command == "export" else []
    assert parse([command, "--model", "m", "--adapter", given, *extra]).adapter == expected
    assert every_parser()[command]._option_string_actions["--adapter"].metavar == "[NAME=]DIR"


@pytest.mark.parametrize("command", ["sample", "chat", "serve", "eval perplexity"])
@pytest.mark.parametrize(
    ("spelling", "precision"),
    [("f16", "float16"), ("fp16", "float16"), ("half", "float16"), ("bf16", "bfloat16"), ("F32", "float32"),
     ("float32", "float32"), ("int8", "int8")],
)  # fmt: skip
def test_dtype_takes_the_spellings_export_takes(command, spelling, precision) -> None:
    extra = ["--data", "x.txt"] if command.startswith("eval") else []
    assert parse([*command.split(), "--model", "m", "--dtype", spelling, *extra]).dtype == precision


def test_export_takes_the_spellings_sample_takes() -> None:
    for precision in ("float32", "float16", "bfloat16"):
        assert parse(["sample", "--model", "m", "--dtype", precision]).dtype == precision
    assert [export_dtype("gguf", name) for name in ("float32", "float16", "bfloat16")] == ["f32", "f16", "bf16"]
    assert set(every_parser()["sample"]._option_string_actions["--dtype"].choices) == set(PRECISIONS)


def test_an_unknown_dtype_is_refused_naming_the_choices(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["sample", "--model", "m", "--dtype", "f8"])
    assert exited.value.code == 2 and "--dtype: invalid choice: 'f8'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "dest", "new"),
    [(["train", "--out-dir", "a", "--out-dir", "b"], "out", "--out"),
     (["eval", "perplexity", "--model", "m", "--data", "x", "--max-tokens", "7", "--max-tokens", "9"],
      "max_eval_tokens", "--max-eval-tokens"),
     (["finetune", "--model", "m", "--data", "d", "--out", "o", "--lora", "--lora"], "method", "--method lora")],
)  # fmt: skip
def test_an_old_spelling_works_and_says_so_once(argv, dest, new, capsys) -> None:
    args = parse(argv)
    assert getattr(args, dest) in ("b", 9, "lora")  # the last one given, as for the new spelling
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"is the old spelling of {new}; use {new}" in error, error


def test_the_new_spellings_say_nothing(capsys) -> None:
    assert parse(["train", "--out", "a"]).out == "a"
    assert parse(["eval", "perplexity", "--model", "m", "--data", "x", "--max-eval-tokens", "7"]).max_eval_tokens == 7
    finetune = ["finetune", "--model", "m", "--data", "d", "--out", "o"]
    assert parse(finetune).method == "full" and parse([*finetune, "--method", "lora"]).method == "lora"
    assert capsys.readouterr().err == ""


def test_eval_max_tokens_is_not_sample_max_tokens() -> None:
    sample = every_parser()["sample"]._option_string_actions["--max-tokens"]
    evaluation = every_parser()["eval perplexity"]._option_string_actions["--max-eval-tokens"]
    assert sample.dest == "max_tokens" and evaluation.dest == "max_eval_tokens"
    assert "--max-eval-tokens" not in subcommand_parsers()["sample"]._option_string_actions


# ------------------------------------------------------------------------------------------ the README
def readme_commands() -> list[str]:
    """Every `gpt2 ...` line of the README's fenced bash blocks, as printed (after an `&&`, what follows it)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), re.S):
        for line in block.splitlines():
            match = re.search(r"(?:^|&& )(gpt2 .*)$", line.split("  #")[0].strip())
            if match:
                commands.append(match[1])
    return commands


def test_the_readme_shows_commands() -> None:
    assert len(readme_commands()) >= 8


@pytest.mark.parametrize("command", readme_commands())
def test_every_readme_command_parses(command: str) -> None:
    args = parse(shlex.split(command)[1:])  # argparse exits on anything it does not accept
    assert args.func is not None


@pytest.fixture
def readme_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpt2_bpe_dir: Path) -> Path:
    """The working folder of the README's commands: out/stdlib (a tiny model with a byte-level BPE, as `gpt2 train
    stdlib` makes, here GPT-2's) and corpus.txt."""
    tokenizer = load_tokenizer(gpt2_bpe_dir)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=len(tokenizer), block_size=64))
    save_pretrained(model, tmp_path / "out" / "stdlib")
    tokenizer.save(tmp_path / "out" / "stdlib")
    (tmp_path / "corpus.txt").write_text("import os\n\ndef f(x):\n    return x + 1\n" * 20, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPT2_NATIVE_KERNELS", "0")  # the commands' behaviour, not the kernels, is checked here
    return tmp_path


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in readme_commands() if shlex.split(c)[1] not in PARSED_ONLY])
def test_every_offline_readme_command_runs_as_printed(command: str, readme_folder: Path, capsys) -> None:
    status = main(shlex.split(command)[1:])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert "Traceback" not in captured.err + captured.out
    if "--out" in command:
        assert (readme_folder / shlex.split(command)[shlex.split(command).index("--out") + 1]).exists()
