"""Fine-tuning a pretrained model (gpt2.finetune): data formats and their loss masks, the run on a
transformers-made model, its output, resume, bad input, the chat template and `gpt2 chat`."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from random import Random

import pytest
import torch
from safetensors.torch import load_file

import gpt2
from gpt2.api import LLM
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.finetune import FinetuneConfig, finetune, load_examples, make_rows
from gpt2.finetune.classify import (
    ClassificationBatches,
    GPTForSequenceClassification,
    classification_loss,
    classify_texts,
    load_classifier,
    pad_batch,
)
from gpt2.finetune.config import parse_bytes
from gpt2.finetune.data import Example, RowBatches, Rows
from gpt2.finetune.memory import estimate_memory
from gpt2.model import IGNORE_INDEX
from gpt2.tokenizer import ByteTokenizer
from gpt2.tokenizer.chat import CHAT_TEMPLATE, CHAT_TEMPLATE_FILE, encode_chat, header, render_chat
from gpt2.train.checkpoint import latest_checkpoint
from gpt2.train.config import TrainConfig
from gpt2.train.optimizer import configure_optimizer
from gpt2.train.trainer import Trainer, TrainingData

transformers = pytest.importorskip("transformers")

TEXT = "<|endoftext|>".join(f"the cat sat on the mat number {i % 5}. the dog ran.\n" for i in range(60))


@pytest.fixture
def pretrained(tmp_path: Path, gpt2_bpe_dir: Path) -> Path:
    """A tiny random GPT-2 made and saved by transformers, with the GPT-2 tokenizer files beside it."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=2)
    directory = tmp_path / "pretrained"
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)
    for name in ("encoder.json", "vocab.bpe"):
        shutil.copy(gpt2_bpe_dir / name, directory / name)
    return directory


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def small_run(model: Path, data: Path, out: Path, **changes) -> FinetuneConfig:
    values = dict(model=str(model), data=str(data), out_dir=str(out), block_size=32, batch_size=4, max_steps=12,
                  learning_rate=3e-3, warmup_steps=2, eval_interval=4, checkpoint_interval=4, sample_tokens=4,
                  device="cpu", dtype="float32", seed=0)  # fmt: skip
    return FinetuneConfig.from_overrides(**{**values, **changes})


# ----------------------------------------------------------------------------------------- loss masks
def test_prompt_completion_trains_on_the_completion_only(tmp_path: Path) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "ab", "completion": "c"}) + "\n", encoding="utf-8")
    rows = make_rows(load_examples(path, ByteTokenizer()), block_size=5, pad_id=256)
    # ids a b c <eot> + padding; targets: the next token where it is completion (c, <eot>), else ignored
    assert rows.x.tolist() == [[97, 98, 99, 256, 256]]
    assert rows.y.tolist() == [[IGNORE_INDEX, 99, 256, IGNORE_INDEX, IGNORE_INDEX]]


def test_chat_trains_on_assistant_turns_only(tmp_path: Path) -> None:
    tokenizer = ByteTokenizer()
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": messages}) + "\n", encoding="utf-8")
    user, assistant = list(header("user").encode()), list(header("assistant").encode())
    ids = user + [97, 256] + assistant + [98, 256]
    rows = make_rows(load_examples(path, tokenizer), block_size=len(ids) - 1, pad_id=256)
    expected_y = [IGNORE_INDEX] * (len(ids) - 3) + [98, 256]  # only "b" and its closing end-of-text
    assert rows.x.tolist() == [ids[:-1]]
    assert rows.y.tolist() == [expected_y]


def test_chat_text_matches_the_jinja_template_rendering() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]
    assert render_chat(messages, add_generation_prompt=True) == (
        "<|system|>\nS<|endoftext|><|user|>\nHi<|endoftext|><|assistant|>\n"
    )
    jinja2 = pytest.importorskip("jinja2")

    rendered = jinja2.Template(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=True)
    assert rendered == render_chat(messages, add_generation_prompt=True)


@pytest.mark.slow
def test_encode_chat_equals_encoding_the_rendered_text(gpt2_bpe_dir: Path) -> None:
    from gpt2.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(gpt2_bpe_dir)
    messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "General Kenobi"}]
    ids, _ = encode_chat(messages, tokenizer)
    assert ids == tokenizer.encode(render_chat(messages), allowed_special="all")


def test_text_documents_are_packed_and_every_token_is_a_target(tmp_path: Path) -> None:
    examples = [Example([1, 2, 3], [True] * 3), Example([4, 5, 6], [True] * 3)]
    rows = make_rows(examples, block_size=3, pad_id=0)
    assert rows.x.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert rows.y.tolist() == [[2, 3, 4], [5, 6, IGNORE_INDEX]]


def test_pairs_longer_than_the_block_are_cut_and_counted() -> None:
    examples = [Example([1, 2, 3, 4, 5, 6], [False, False, True, True, True, True], packed=False),
                Example([1, 2, 3, 4, 5, 6], [False] * 5 + [True], packed=False)]  # fmt: skip
    rows = make_rows(examples, block_size=3, pad_id=0)
    assert len(rows) == 1
    assert (rows.truncated, rows.dropped) == (2, 1)
    assert "2 examples" in rows.notes[0] and "1 examples were dropped" in rows.notes[1]


def test_row_batches_have_batch_size_rows_and_visit_every_row_once_per_epoch() -> None:
    rows = Rows(torch.arange(5).unsqueeze(1), torch.arange(5).unsqueeze(1))  # row i holds the id i
    batches = RowBatches(rows, batch_size=2, seed=0)
    drawn = [batches.next_batch()[0] for _ in range(5)]  # 10 rows: exactly two epochs
    assert all(x.shape == (2, 1) for x in drawn)
    ids = torch.cat(drawn).flatten().tolist()
    assert sorted(ids[:5]) == sorted(ids[5:]) == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------------------- bad input
def test_csv_without_the_column_names_the_file_and_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "data.csv"
    path.write_text("title,body\nx,y\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"data\.csv:1: .*text_column.*\['title', 'body'\]"):
        load_examples(path, ByteTokenizer(), column="text")


def test_chat_record_without_roles_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    good = {"messages": [{"role": "user", "content": "a"}]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({"messages": [{"content": "a"}]}) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"chat\.jsonl:2: message 0 has role None"):
        load_examples(path, ByteTokenizer())


@pytest.mark.slow
def test_block_size_beyond_the_model_context_is_refused_and_nothing_is_written(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"block_size=128 is larger than the model's context of 64"):
        finetune(small_run(pretrained, text_file, out, block_size=128))
    assert not out.exists()


@pytest.mark.slow
def test_cli_turns_bad_data_into_one_line(pretrained: Path, tmp_path: Path, capsys) -> None:
    path = tmp_path / "data.csv"
    path.write_text("title\nx\n", encoding="utf-8")
    out = tmp_path / "out"
    status = main(["finetune", "--model", str(pretrained), "--data", str(path), "--out", str(out), "--no-progress"])
    assert status == 2
    assert "data.csv:1" in capsys.readouterr().err
    assert not out.exists()


# ----------------------------------------------------------------------------------------- the run
@pytest.mark.slow
def test_finetune_lowers_val_loss_and_transformers_loads_the_result(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = finetune(small_run(pretrained, text_file, out))
    assert result.best_val_loss < result.first_val_loss - 0.5
    for name in ("config.json", "model.safetensors", CHAT_TEMPLATE_FILE, "metrics.jsonl", "loss.png", "sample.txt"):
        assert (out / name).is_file(), name
    ours = LLM.load(out, device="cpu")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = torch.tensor([ours.tokenizer.encode("the cat sat on the mat")])
    with torch.no_grad():
        torch.testing.assert_close(ours.model.eval()(ids).logits, theirs(ids).logits, atol=1e-5, rtol=1e-5)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_loss" in r] == [0, 4, 8, 12]


@pytest.mark.slow
def test_gpt2_finetune_cli_then_gpt2_sample(pretrained: Path, text_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    args = ["finetune", "--model", str(pretrained), "--data", str(text_file), "--out", str(out), "--no-progress"]
    for item in ("max_steps=2", "eval_interval=1", "block_size=16", "device=cpu", "sample_tokens=0"):
        args += ["--set", item]
    assert main(args) == 0
    assert "best val loss" in capsys.readouterr().out
    assert (
        main(
            [
                "sample",
                "--model",
                str(out),
                "--prompt",
                "the",
                "--max-new-tokens",
                "3",
                "--device",
                "cpu",
                "--seed",
                "0",
            ]
        )
        == 0
    )


@pytest.mark.slow
def test_resume_of_a_finetune_is_exact(pretrained: Path, text_file: Path, tmp_path: Path) -> None:
    whole = finetune(small_run(pretrained, text_file, tmp_path / "whole", dropout=0.1))
    finetune(small_run(pretrained, text_file, tmp_path / "split", dropout=0.1), stop_at_step=6)
    split = finetune(small_run(pretrained, text_file, tmp_path / "split", dropout=0.1), resume=True)
    assert split.step == whole.step == 12
    assert split.best_val_loss == whole.best_val_loss
    a = load_file(str(latest_checkpoint(tmp_path / "whole") / "trainable.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "split") / "trainable.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)
    assert_same_weights(tmp_path / "whole", tmp_path / "split")


def assert_same_weights(a: Path, b: Path) -> None:
    first, second = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def finetune_command(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    args = [sys.executable, "-m", "gpt2.cli", "finetune", "--model", str(model), "--data", str(data), "--out",
            str(out), "--no-progress", *extra]  # fmt: skip
    for key, value in dict(block_size=32, batch_size=4, max_steps=12, learning_rate=3e-3, warmup_steps=2,
                           eval_interval=4, checkpoint_interval=2, sample_tokens=0, device="cpu", dtype="float32",
                           seed=0, dropout=0.1).items():  # fmt: skip
        args += ["--set", f"{key}={value}"]
    return args


def default_sigint() -> None:
    """A child's SIGINT as in a terminal: a suite launched in the background passes on an ignored SIGINT, which
    the trainer (rightly) keeps ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def child_env() -> dict[str, str]:
    """The environment of a `gpt2` child process: this checkout's package first."""
    source = str(Path(gpt2.__file__).parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}


def logged_steps(out: Path) -> list[int]:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line)["step"] for line in lines if line.endswith("}") and '"loss"' in line]


@pytest.mark.slow
def test_finetune_killed_at_random_moments_then_resumed_gives_the_uninterrupted_weights(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    whole = subprocess.run(finetune_command(pretrained, text_file, tmp_path / "whole"), env=child_env(),
                           capture_output=True, text=True)  # fmt: skip
    assert whole.returncode == 0, whole.stderr[-2000:]
    out = tmp_path / "killed"
    random = Random(0)
    for kill_after in sorted(random.sample(range(1, 12), 4)):  # a step, then a random moment after it
        resume = ["--resume"] if latest_checkpoint(out) is not None else []
        child = subprocess.Popen(finetune_command(pretrained, text_file, out, *resume), env=child_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        while child.poll() is None and max(logged_steps(out), default=0) < kill_after:
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.5))  # mid-step, mid-evaluation or mid-save
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL, "the run ended before it was killed"
    resume = ["--resume"] if latest_checkpoint(out) is not None else []
    done = subprocess.run(finetune_command(pretrained, text_file, out, *resume), env=child_env(),
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same_weights(tmp_path / "whole", out)


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_130_then_resume_finishes(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    child = subprocess.Popen(finetune_command(pretrained, text_file, out, "--set", "max_steps=100000"), env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=default_sigint)  # fmt: skip
    while child.poll() is None and not logged_steps(out):  # a step's line in metrics.jsonl: training has begun
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    printed, _ = child.communicate(timeout=120)
    assert child.returncode == 130, printed
    assert "interrupted at step" in printed and "--resume" in printed
    checkpoint = latest_checkpoint(out)
    assert checkpoint is not None and not (out / "model.safetensors").exists()  # no output model yet
    resumed = finetune(small_run(pretrained, text_file, out, dropout=0.1, checkpoint_interval=2,
                                 max_steps=int(checkpoint.name.removeprefix("step_")) + 2), resume=True)  # fmt: skip
    assert (out / "model.safetensors").is_file() and not resumed.interrupted


@pytest.mark.slow
def test_early_stopping_stops_after_patience_evaluations(pretrained: Path, text_file: Path, tmp_path: Path) -> None:
    # a learning rate of ~0 never improves the val loss, so the run stops after `patience` evaluations
    config = small_run(pretrained, text_file, tmp_path / "out", learning_rate=1e-12, eval_interval=1, patience=2)
    result = finetune(config)
    assert result.stopped_early and result.step == 2


@pytest.mark.slow
def test_an_earlier_run_is_refused_unless_resume_or_overwrite(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    finetune(small_run(pretrained, text_file, out, max_steps=2))
    with pytest.raises(FileExistsError, match="already holds a run .* --resume .* --overwrite"):
        finetune(small_run(pretrained, text_file, out, max_steps=2))
    again = finetune(small_run(pretrained, text_file, out, max_steps=2), overwrite=True)
    assert again.step == 2 and [p.name for p in out.joinpath("checkpoints").glob("step_*")] == ["step_00000002"]


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_restarts_in_place(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0, "val_loss": 9.9}\n')  # what a run killed early leaves
    with pytest.raises(FileNotFoundError, match="--resume: no checkpoint"):
        finetune(small_run(pretrained, text_file, out, max_steps=2), resume=True)
    assert finetune(small_run(pretrained, text_file, out, max_steps=2)).step == 2


@pytest.mark.slow
def test_finetune_settings_use_the_training_set_parser() -> None:
    config = FinetuneConfig.from_settings(["max_steps=5", "train.warmup_steps=1", "lora=yes", "lora_rank=4",
                                           "batch_size=auto", "log_to=tensorboard", "learning_rate=3e-4"])  # fmt: skip
    schedule = config.train.schedule
    assert (schedule.max_steps, schedule.warmup_steps, config.lora, config.lora_rank) == (5, 1, True, 4)
    assert (config.batch_size, config.train.output.log_to, config.learning_rate) == ("auto", ("tensorboard",), 3e-4)
    assert config.train.optimizer.weight_decay == 0.0  # fine-tuning's default, not pretraining's
    with pytest.raises(ValueError, match=r"^schedule.max_steps = 'many': must be an integer in \[1, 2\*\*63\)$"):
        FinetuneConfig.from_settings(["max_steps=many"])
    with pytest.raises(ValueError, match=r"^unknown fine-tuning key nope; a key is one of batch_size, data, "):
        FinetuneConfig.from_settings(["nope=1"])
    with pytest.raises(ValueError, match=r"^unknown fine-tuning key lora_rnk; did you mean lora_rank\?$"):
        FinetuneConfig.from_settings(["lora_rnk=1"])


def test_finetune_settings_report_every_problem_at_once_each_on_its_line() -> None:
    with pytest.raises(ValueError) as caught:
        FinetuneConfig.from_settings(["lora=maybe", "lora_rank=0", "batch_size=none", "memory_budget=lots",
                                      "schedule.max_steps=0", "runtime.seed=-1"])  # fmt: skip
    assert str(caught.value).splitlines() == [
        "lora = 'maybe': must be true or false",
        "lora_rank = 0: must be an integer in [1, 2**63)",
        "batch_size = 'none': must be an integer in [1, 2**63) or one of 'auto'",
        "memory_budget = 'lots': must be a size: write it like 16GiB, 512MiB or 8GB",
        "schedule.max_steps = 0: must be an integer in [1, 2**63)",
        "runtime.seed = -1: must be an integer in [0, 2**63)",
    ]


# ----------------------------------------------------------------------------------------- gpt2 chat
@pytest.mark.slow
def test_gpt2_chat_streams_a_reply_per_piped_line(pretrained: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\nHow are you?\n"))
    status = main(["chat", "--model", str(pretrained), "--max-new-tokens", "4", "--seed", "0", "--device", "cpu"])
    assert status == 0
    assert capsys.readouterr().out.count("assistant> ") == 2


# ------------------------------------------------------------------------------------ classification
@pytest.fixture
def labelled_file(tmp_path: Path) -> Path:
    """A separable toy task: the last word says the label (a fruit or an animal)."""
    generator = torch.Generator().manual_seed(0)
    fillers = ["the", "a", "one", "my", "your", "this", "that", "some"]
    lines = []
    for i in range(80):
        fruit = i % 2 == 0
        prefix = " ".join(fillers[int(j)] for j in torch.randint(len(fillers), (3,), generator=generator))
        text = f"{prefix} {'apple' if fruit else 'zebra'}"
        lines.append(json.dumps({"sentence": text, "kind": "fruit" if fruit else "animal"}))
    path = tmp_path / "labelled.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def classify_run(model: Path, data: Path, out: Path, **changes) -> FinetuneConfig:
    values = dict(
        task="classification",
        text_field="sentence",
        label_field="kind",
        batch_size=8,
        max_steps=16,
        eval_interval=8,
        checkpoint_interval=8,
        val_fraction=0.25,
        learning_rate=3e-3,
        dropout=0.1,
    )
    return small_run(model, data, out, **{**values, **changes})


@pytest.mark.slow
def test_classification_finetune_learns_the_task_and_transformers_loads_it(
    pretrained: Path, labelled_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    result = finetune(classify_run(pretrained, labelled_file, out))
    assert result.best_val_accuracy is not None and result.best_val_accuracy >= 0.9
    assert result.best_val_loss < result.first_val_loss
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "val_accuracy" in r] == [0, 8, 16]
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "animal", "1": "fruit"} and config["label2id"] == {"animal": 0, "fruit": 1}

    ours, labels = load_classifier(out)
    theirs = transformers.GPT2ForSequenceClassification.from_pretrained(out).eval()
    ids, mask = pad_batch([[1, 2, 3, 4], [5, 6]], pad_token_id=50256)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits, theirs(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
    assert [p.label for p in classify_texts(out, ["the my apple", "a one zebra"])] == ["fruit", "animal"]


@pytest.mark.slow
def test_gpt2_finetune_task_classification_then_gpt2_classify(
    pretrained: Path, labelled_file: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    args = ["finetune", "--task", "classification", "--model", str(pretrained), "--data", str(labelled_file),
            "--out", str(out), "--no-progress"]  # fmt: skip
    for key, value in [
        ("text_field", "sentence"),
        ("label_field", "kind"),
        ("max_steps", 12),
        ("batch_size", 8),
        ("learning_rate", 3e-3),
        ("eval_interval", 6),
        ("device", "cpu"),
        ("dtype", "float32"),
    ]:
        args += ["--set", f"{key}={value}"]  # fmt: skip
    assert main(args) == 0
    printed = capsys.readouterr()
    assert "val accuracy" in printed.out and "gpt2 classify" in printed.out
    assert "memory estimate:" in printed.err and "memory estimate with activation checkpointing:" in printed.err
    assert main(["classify", "--model", str(out), "a my apple"]) == 0
    assert "fruit" in capsys.readouterr().out


@pytest.mark.slow
def test_resume_of_a_classification_finetune_is_exact(pretrained: Path, labelled_file: Path, tmp_path: Path) -> None:
    whole = finetune(classify_run(pretrained, labelled_file, tmp_path / "whole"))
    finetune(classify_run(pretrained, labelled_file, tmp_path / "split"), stop_at_step=8)
    split = finetune(classify_run(pretrained, labelled_file, tmp_path / "split"), resume=True)
    assert split.step == whole.step == 16 and split.best_val_loss == whole.best_val_loss
    a = load_file(str(tmp_path / "whole" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model.safetensors"))
    assert a.keys() == b.keys() and "score.weight" in a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=0, rtol=0)


def test_trainer_save_and_resume_a_classifier_give_the_uninterrupted_weights(tmp_path: Path) -> None:
    def trainer(out: Path) -> Trainer:
        torch.manual_seed(0)
        model = GPTForSequenceClassification(GPTConfig.from_name("gpt2-tiny", vocab_size=64, block_size=16), 2)
        config = TrainConfig.from_dict(dict(data="-", tokenizer="bytes", block_size=16, batch_size=4, max_steps=6,
                                            warmup_steps=1, learning_rate=1e-2, out_dir=str(out), device="cpu",
                                            dtype="float32", seed=0))  # fmt: skip
        ids = [[(i * 7 + j) % 63 + 1 for j in range(3 + i % 5)] for i in range(20)]
        batches = ClassificationBatches(ids, [i % 2 for i in range(20)], 4, pad_token_id=0, seed=0)
        return Trainer(
            model,
            configure_optimizer(model, config.optimizer, torch.device("cpu")),
            config,
            TrainingData(batches, loss_fn=classification_loss),
        )

    whole = trainer(tmp_path / "whole")
    for _ in range(6):
        whole.train_step()
    first = trainer(tmp_path / "split")
    for _ in range(3):
        first.train_step()
    checkpoint = first.save()
    assert checkpoint is not None
    resumed = trainer(tmp_path / "split")
    resumed.resume(checkpoint)
    assert resumed.step == 3
    for _ in range(3):
        resumed.train_step()
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)


# ------------------------------------------------------------------------------------- memory planning
def test_a_run_beyond_the_memory_budget_is_refused_in_one_line_and_nothing_is_written(
    pretrained: Path, text_file: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "out"
    args = ["finetune", "--model", str(pretrained), "--data", str(text_file), "--out", str(out), "--no-progress",
            "--set", "memory_budget=1MiB", "--set", "block_size=32", "--set", "device=cpu"]  # fmt: skip
    assert main(args) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "memory budget is 0.00 GiB" in error and "activation_checkpointing=True" in error
    assert not out.exists()


@pytest.mark.slow
def test_batch_size_auto_keeps_the_global_batch_with_gradient_accumulation(
    pretrained: Path, text_file: Path, tmp_path: Path
) -> None:
    model_config = LLM.load(pretrained, device="cpu").model.config
    fits_two = estimate_memory(model_config, 2, 32).total  # a budget where 2 rows fit and 4 do not
    assert estimate_memory(model_config, 4, 32).total > fits_two
    run = small_run(pretrained, text_file, tmp_path / "out", batch_size="auto", global_batch_size=8,
                    memory_budget=str(fits_two), max_steps=2, eval_interval=0)  # fmt: skip
    result = finetune(run)
    assert (result.batch_size, result.grad_accum_steps) == (2, 4)
    assert result.batch_size * result.grad_accum_steps == 8


@pytest.mark.slow
def test_activation_checkpointing_setting_reaches_the_model(pretrained: Path, text_file: Path, tmp_path: Path) -> None:
    seen = []
    original = Trainer.train_step

    def spy(self: Trainer):  # noqa: ANN202
        seen.append(self.model.activation_checkpointing)
        return original(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Trainer, "train_step", spy)
        finetune(small_run(pretrained, text_file, tmp_path / "out", activation_checkpointing=True, max_steps=2))
    assert seen == [True, True]


def test_memory_budget_sizes_parse_and_bad_ones_name_the_format() -> None:
    assert parse_bytes("16GiB") == 16 * 2**30 and parse_bytes("512 MiB") == 512 * 2**20 and parse_bytes("1000") == 1000
    with pytest.raises(ValueError, match="write it like 16GiB"):
        FinetuneConfig.from_overrides(memory_budget="lots")
