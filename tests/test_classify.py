"""Sequence classification: transformers' GPT2ForSequenceClassification layout both ways, the data files, training
with the Trainer, and `gpt2 classify`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.finetune.classify import (
    ClassificationBatches,
    GPTForSequenceClassification,
    LabelSet,
    accuracy,
    accuracy_evaluation,
    classification_loss,
    encode_texts,
    load_classifier,
    pad_batch,
    read_examples,
    save_classifier,
    split_examples,
)
from gpt2.tokenizer import ByteTokenizer
from gpt2.train.config import TrainConfig
from gpt2.train.optimizer import configure_optimizer
from gpt2.train.trainer import Trainer, TrainingData

transformers = pytest.importorskip("transformers")

PAD = 256  # the byte tokenizer's <|endoftext|>, used as padding
ROWS = [[72, 101, 108, 108, 111], [33, 63], [1, 2, 3, 4], [200]]  # different lengths: padding on every side


def tiny_classifier(num_labels: int = 3, seed: int = 0) -> GPTForSequenceClassification:
    torch.manual_seed(seed)
    config = GPTConfig.from_name("gpt2-tiny", vocab_size=257)
    return GPTForSequenceClassification(config, num_labels, pad_token_id=PAD).eval()


def hf_logits(hf_model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # transformers numbers positions 0..T-1 whatever the mask; a left-padded row needs its real positions given
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return hf_model(ids, attention_mask=mask, position_ids=positions).logits


# ------------------------------------------------------------------------------------- the HF layout
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_transformers_reads_our_classifier_and_computes_the_same_logits(tmp_path, padding_side):
    model = tiny_classifier()
    save_classifier(model, tmp_path, LabelSet(("neg", "neutral", "pos")))
    hf_model = transformers.GPT2ForSequenceClassification.from_pretrained(tmp_path).eval()
    assert hf_model.config.id2label == {0: "neg", 1: "neutral", 2: "pos"}
    assert hf_model.config.pad_token_id == PAD
    ids, mask = pad_batch(ROWS, PAD, padding_side=padding_side)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(ours, hf_logits(hf_model, ids, mask), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_we_read_a_classifier_transformers_saved_and_compute_the_same_logits(tmp_path, padding_side):
    torch.manual_seed(1)
    hf_config = transformers.GPT2Config(
        vocab_size=257, n_positions=64, n_embd=32, n_layer=2, n_head=4, num_labels=2, pad_token_id=PAD,
        id2label={0: "ham", 1: "spam"}, label2id={"ham": 0, "spam": 1},
    )  # fmt: skip
    hf_model = transformers.GPT2ForSequenceClassification(hf_config).eval()
    hf_model.save_pretrained(tmp_path)
    model, labels = load_classifier(tmp_path)
    assert labels.names == ("ham", "spam")
    ids, mask = pad_batch(ROWS, PAD, padding_side=padding_side)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(ours, hf_logits(hf_model, ids, mask), atol=1e-5, rtol=1e-5)


def test_without_a_mask_the_last_token_is_the_rightmost_non_padding_token_as_in_transformers():
    model = tiny_classifier()
    ids, mask = pad_batch(ROWS, PAD, padding_side="left")
    assert model.last_token_index(ids).tolist() == [ids.size(1) - 1] * len(ROWS)
    ids, mask = pad_batch(ROWS, PAD, padding_side="right")
    assert model.last_token_index(ids).tolist() == [4, 1, 3, 0]
    assert model.last_token_index(ids, mask).tolist() == [4, 1, 3, 0]


def test_a_padded_row_scores_like_the_same_row_alone():
    model = tiny_classifier()
    ids, mask = pad_batch(ROWS, PAD, padding_side="left")
    with torch.no_grad():
        batched = model(ids, attention_mask=mask).logits
        alone = torch.cat([model(torch.tensor([row])).logits for row in ROWS])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_our_saved_classifier_loads_back_identically(tmp_path):
    model = tiny_classifier()
    save_classifier(model, tmp_path, LabelSet(("a", "b", "c")))
    loaded, labels = load_classifier(tmp_path)
    assert labels.names == ("a", "b", "c")
    assert loaded.pad_token_id == PAD and loaded.num_labels == 3
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_a_language_model_directory_is_not_a_classifier(tmp_path):
    from gpt2.model import GPT
    from gpt2.weights.hf import save_pretrained

    save_pretrained(GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257)), tmp_path)
    with pytest.raises(ValueError, match="no score.weight"):
        load_classifier(tmp_path)


# ------------------------------------------------------------------------------------------ data
def test_jsonl_with_string_labels_maps_them_in_sorted_order(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "good", "label": "pos"}\n\n{"text": "bad", "label": "neg"}\n')
    examples = read_examples(path)
    assert [(e.text, e.label) for e in examples] == [("good", "pos"), ("bad", "neg")]
    labels = LabelSet.from_values([e.label for e in examples])
    assert labels.names == ("neg", "pos")
    assert labels.to_hf() == {"id2label": {"0": "neg", "1": "pos"}, "label2id": {"neg": 0, "pos": 1}}


def test_csv_with_integer_labels_reads_them_as_class_ids(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('sentence,label\n"hello, world",1\nbye,0\n')
    examples = read_examples(path, text_field="sentence")
    assert [(e.text, e.label) for e in examples] == [("hello, world", 1), ("bye", 0)]
    assert LabelSet.from_values([e.label for e in examples]).names == ("0", "1")


def test_a_missing_label_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 0}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:2: the label field 'label' is missing"):
        read_examples(path)


def test_labels_of_mixed_kinds_are_an_error_naming_both_lines(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "a", "label": 0}\n{"text": "b", "label": "pos"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:2: label 'pos' is a str but .*d\.jsonl:1 has 0"):
        read_examples(path)


def test_a_csv_without_the_label_column_is_an_error_naming_the_header(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,category\nhello,1\n")
    with pytest.raises(ValueError, match=r"d\.csv:1: the header has no column 'label'"):
        read_examples(path)


def test_the_batch_source_resumes_exactly_where_it_stopped():
    rows, labels = [[i] for i in range(7)], [i % 2 for i in range(7)]
    straight = ClassificationBatches(rows, labels, batch_size=3, pad_token_id=PAD, seed=5)
    expected = [straight.next_batch() for _ in range(5)]
    first = ClassificationBatches(rows, labels, batch_size=3, pad_token_id=PAD, seed=5)
    got = [first.next_batch() for _ in range(2)]
    second = ClassificationBatches(rows, labels, batch_size=3, pad_token_id=PAD, seed=0)
    second.load_state_dict(first.state_dict())
    got += [second.next_batch() for _ in range(3)]
    for a, b in zip(expected, got, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_split_examples_holds_out_a_seeded_fraction(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": str(i), "label": i % 2}) + "\n" for i in range(10)))
    examples = read_examples(path)
    train, val = split_examples(examples, 0.2, seed=3)
    assert (len(train), len(val)) == (8, 2)
    assert sorted(e.text for e in train + val) == sorted(e.text for e in examples)
    assert split_examples(examples, 0.2, seed=3) == (train, val)


# -------------------------------------------------------------------------------------- training
def toy_task(count: int, seed: int) -> tuple[list[str], list[str]]:
    """Separable: 'vowel' texts use only a/e/i/o/u, 'consonant' texts only b/c/d/f/g."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(count):
        label = rng.choice(["vowel", "consonant"])
        letters = "aeiou" if label == "vowel" else "bcdfg"
        texts.append("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))))
        labels.append(label)
    return texts, labels


def train_toy_classifier(out_dir: Path) -> tuple[GPTForSequenceClassification, LabelSet, float]:
    tokenizer = ByteTokenizer()
    train_texts, train_labels = toy_task(256, seed=0)
    val_texts, val_labels = toy_task(64, seed=1)
    labels = LabelSet.from_values(train_labels)
    model = tiny_classifier(num_labels=len(labels)).train()
    config = TrainConfig.from_dict(dict(
        model="gpt2-tiny", max_steps=40, learning_rate=3e-3, warmup_steps=4, eval_interval=0, checkpoint_interval=0,
        sample_tokens=0, device="cpu", dtype="float32", out_dir=str(out_dir / "run"), batch_size=16,
    ))  # fmt: skip
    block = model.config.block_size
    batches = ClassificationBatches(
        encode_texts(tokenizer, train_texts, block), [labels.id_of(x) for x in train_labels], 16, PAD, seed=0
    )
    trainer = Trainer(
        model,
        configure_optimizer(model, config.optimizer, torch.device("cpu")),
        config,
        TrainingData(batches, loss_fn=classification_loss),
    )
    for _ in range(config.schedule.max_steps):
        trainer.train_step()
    val_ids, val_label_ids = encode_texts(tokenizer, val_texts, block), [labels.id_of(x) for x in val_labels]
    val_accuracy = accuracy(model, val_ids, val_label_ids)
    assert accuracy_evaluation(val_ids, val_label_ids)(model, trainer.step) == {"val_accuracy": val_accuracy}
    return model, labels, val_accuracy


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("toy")
    model, labels, val_accuracy = train_toy_classifier(out_dir)
    save_classifier(model, out_dir / "classifier", labels)
    ByteTokenizer().save(out_dir / "classifier")
    return out_dir / "classifier", val_accuracy


def test_a_tiny_classifier_learns_a_separable_task_with_the_trainer(trained):
    _, val_accuracy = trained
    assert val_accuracy >= 0.95


def test_the_cli_prints_label_and_probability_per_text(trained, capsys):
    directory, _ = trained
    assert main(["classify", "--model", str(directory), "aeiou", "bcdfg"]) == 0
    lines = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(label, text) for label, _, text in lines] == [("vowel", "aeiou"), ("consonant", "bcdfg")]
    assert all(0.5 < float(probability) <= 1.0 for _, probability, _ in lines)


def test_the_cli_reports_a_missing_model_in_one_line(tmp_path, capsys):
    assert main(["classify", "--model", str(tmp_path / "nope"), "text"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt2 classify: error:") and len(err.strip().splitlines()) == 1


def test_saved_labels_travel_in_config_json(trained):
    directory, _ = trained
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["GPT2ForSequenceClassification"]
    assert config["id2label"] == {"0": "consonant", "1": "vowel"}
    assert config["label2id"] == {"consonant": 0, "vowel": 1}
    assert config["num_labels"] == 2
