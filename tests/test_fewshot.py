"""Few-shot evaluation: the prompts and scores lm-evaluation-harness gets on the same model.

The harness itself runs here: its `hf` model (transformers) on our HF export of a tiny random model, with local
copies of its tasks (a multiple-choice JSONL with a train split and with none, its own HellaSwag and lambada_openai
definitions over local files) and num_fewshot=2. Per request, the context text it built must be ours and the
log-likelihood it computed ours within 1e-4.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import shared_file
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.eval import FewShot, FewShotSampler, evaluate_choice, fewshot_contexts, score_texts
from gpt2.eval.choice import choice_requests, read_choice_records
from gpt2.eval.hellaswag import hellaswag_fewshot_contexts, read_hellaswag
from gpt2.eval.lambada import read_lambada
from gpt2.export import export_hf
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer

NUM_FEWSHOT = 2
TOLERANCE = 1e-4

CHOICE_TRAIN = [
    {"query": "Water freezes at", "choices": ["zero degrees", "ninety degrees"], "label": 0},
    {"query": "The sun rises in the", "choices": ["west", "east", "north"], "label": 1},
    {"query": "Cats like to chase", "choices": ["mice", "clouds"], "label": 0},
    {"query": "Two plus two is", "choices": ["five", "four"], "label": 1},
    {"query": "Bees make", "choices": ["honey", "steel", "glass"], "label": 0},
]
CHOICE_TEST = [
    {"query": "The capital of France is", "choices": ["Paris", "Rome", "Berlin"], "label": 0},
    {"query": "Fish live in", "choices": ["trees", "water"], "label": 1},
    {"query": "Snow is", "choices": ["white", "green"], "label": 0},
    {"query": "A week has", "choices": ["five days", "seven days", "ten days"], "label": 1},
    {"query": "Ice is made of", "choices": ["water", "sand"], "label": 0},
]
HELLASWAG = [  # the official format; bracketed WikiHow tags exercise the harness's clean-up
    {
        "ind": i,
        "activity_label": activity,
        "ctx_a": a,
        "ctx_b": b,
        "ctx": f"{a} {b}",
        "endings": endings,
        "label": label,
    }
    for i, (activity, a, b, endings, label) in enumerate(
        [
            ("Baking", "A man mixes flour.", "he", ["adds eggs.", "sings.", "[title] Sleeps.", "runs away."], "0"),
            ("Surfing", "A girl rides a wave.", "she", ["falls in.", "flies.", "reads.", "cooks."], "0"),
            ("Home", "[header] How to clean a rug", "first", ["vacuum it.", "burn it.", "eat it.", "sell it."], "0"),
            ("Running", "People run a race.", "they", ["finish.", "swim.", "sleep.", "paint."], "0"),
            ("Cooking", "A cook chops onions.", "then", ["fries them.", "flies.", "sings.", "drives."], "0"),
            ("Music", "A boy plays guitar.", "he", ["strums.", "digs.", "bakes.", "dives."], "0"),
        ]
    )
]
LAMBADA = [
    {"text": "She opened the door and saw her old friend standing there, smiling at her"},
    {"text": "He put the key in the lock and turned it slowly until the door"},
    {"text": "After a long day of work, all she wanted was to sleep in her own bed"},
    {"text": "The dog barked at the mailman every morning without fail, scaring the"},
    {"text": "They walked along the beach collecting shells until the sun went down"},
]

TASKS = """\
task: gpt2_choice_train_split
dataset_path: json
dataset_kwargs:
  data_files:
    train: {choice_train}
    test: {choice_test}
training_split: train
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
---
task: gpt2_choice_same_split
dataset_path: json
dataset_kwargs:
  data_files:
    test: {choice_test}
test_split: test
fewshot_split: test
output_type: multiple_choice
doc_to_text: "{{{{query}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
---
task: gpt2_hellaswag_local
dataset_path: json
dataset_kwargs:
  data_files:
    train: {hellaswag_train}
    validation: {hellaswag_val}
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: null
process_docs: !function hellaswag_utils.process_docs
doc_to_text: "{{{{query}}}}"
doc_to_target: "{{{{label}}}}"
doc_to_choice: "choices"
metric_list:
  - metric: acc
  - metric: acc_norm
---
task: gpt2_lambada_local
dataset_path: json
dataset_kwargs:
  data_files:
    test: {lambada}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{text.split(' ')[:-1]|join(' ')}}}}"
doc_to_target: "{{{{' '+text.split(' ')[-1]}}}}"
metric_list:
  - metric: perplexity
    aggregation: perplexity
  - metric: acc
"""


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(record) + "\n" for record in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("fewshot-data")
    return {
        "choice_train": write_jsonl(folder / "choice_train.jsonl", CHOICE_TRAIN),
        "choice_test": write_jsonl(folder / "choice_test.jsonl", CHOICE_TEST),
        "hellaswag_train": write_jsonl(folder / "hellaswag_train.jsonl", HELLASWAG[:4]),
        "hellaswag_val": write_jsonl(folder / "hellaswag_val.jsonl", HELLASWAG[3:]),
        "lambada": write_jsonl(folder / "lambada.jsonl", LAMBADA),
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model with GPT-2's tokenizer, exported in HF format (what the harness's `hf` model loads)."""
    tokenizer = load_tokenizer(shared_file("gpt2-bpe/encoder.json").parent)
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=len(tokenizer), block_size=256))
    return export_hf(model, tokenizer, tmp_path_factory.mktemp("fewshot-model") / "hf")


@pytest.fixture(scope="module")
def harness(
    model_dir: Path, files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[dict[str, Any]]]:
    """lm-eval's samples per task (doc order), from one simple_evaluate run with num_fewshot=2."""
    lm_eval = pytest.importorskip("lm_eval")
    from lm_eval.tasks import TaskManager

    tasks = tmp_path_factory.mktemp("fewshot-tasks")
    (tasks / "hellaswag_utils.py").write_text("from lm_eval.tasks.hellaswag.utils import process_docs  # noqa\n")
    for number, task in enumerate(TASKS.format(**files).split("---\n")):
        (tasks / f"task{number}.yaml").write_text(task, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_HUB_OFFLINE", "1")
        results = lm_eval.simple_evaluate(
            model="hf",
            model_args={"pretrained": str(model_dir), "dtype": "float32", "device": "cpu"},
            tasks=["gpt2_choice_train_split", "gpt2_choice_same_split", "gpt2_hellaswag_local", "gpt2_lambada_local"],
            num_fewshot=NUM_FEWSHOT,
            task_manager=TaskManager(include_path=str(tasks)),
            batch_size=4,
            log_samples=True,
        )
    assert results is not None
    samples = {name: sorted(found, key=lambda sample: sample["doc_id"]) for name, found in results["samples"].items()}
    return {**samples, "results": [results["results"]]}


@pytest.fixture(scope="module")
def ours(model_dir: Path) -> tuple[GPT, Any]:
    from gpt2.weights import load_model

    return load_model(model_dir).eval(), load_tokenizer(model_dir)


def assert_same_requests(
    samples: list[dict[str, Any]], requests: list[tuple[str, str]], ours: tuple[GPT, Any], per_doc: Callable[[int], int]
) -> None:
    """Every request of the harness is (context, continuation) of ours, and its log-likelihood ours within 1e-4."""
    model, tokenizer = ours
    scores = score_texts(model, tokenizer, requests)
    first = 0
    for number, sample in enumerate(samples):
        count = per_doc(number)
        theirs = [tuple(argument) for argument in sample["arguments"]]
        assert [(context, continuation) for context, continuation in theirs] == requests[first : first + count]
        loglikelihoods = [response[0][0] for response in sample["resps"]]
        expected = [-score.loss_sum for score in scores[first : first + count]]
        assert loglikelihoods == pytest.approx(expected, abs=TOLERANCE)
        first += count
    assert first == len(requests)


# ------------------------------------------------------------------------------------ the sampler
def test_the_sampler_draws_what_lm_evals_default_sampler_draws() -> None:
    pytest.importorskip("lm_eval")
    from lm_eval.api.samplers import ContextSampler

    pool = [{"id": i} for i in range(9)]
    theirs, ours = ContextSampler(pool, rnd=1234), FewShotSampler(pool, seed=1234)
    for step in range(12):
        k, doc = step % 4 + 1, pool[step % len(pool)]
        assert ours.sample(k) == theirs.sample(k)
        assert ours.sample(k, exclude=doc) == theirs.sample(k, eval_doc=doc)


def test_shots_are_query_delimiter_answer_and_blank_lines_before_the_query() -> None:
    docs = [("Q3", "A3")]
    pool = [("Q1", "A1"), ("Q2", "A2")]
    (context,) = fewshot_contexts(docs, lambda doc: doc, pool, FewShot(k=2))
    shots = context.removesuffix("Q3").split("\n\n")[:-1]
    assert sorted(shots) == ["Q1 A1", "Q2 A2"] and context.endswith("\n\nQ3")


def test_zero_shot_is_the_query_alone() -> None:
    assert fewshot_contexts([("Q", "A")], lambda doc: doc, [("P", "B")], FewShot(k=0)) == ["Q"]


def test_more_shots_than_the_pool_holds_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"--num-fewshot 2 needs more examples than the few-shot pool holds \(1\)"):
        fewshot_contexts([("Q", "A")], lambda doc: doc, [("P", "B")], FewShot(k=2))
    pool = [("Q", "A"), ("P", "B")]  # 1 + 1 drawn from 2: fine; 2 + 1: the harness fails likewise
    assert fewshot_contexts(pool[:1], lambda doc: doc, pool, FewShot(k=1), exclude_self=True) == ["P B\n\nQ"]
    with pytest.raises(ValueError, match=r"--num-fewshot 2 \(drawn as 2 \+ 1, .*\) needs more examples"):
        fewshot_contexts(pool[:1], lambda doc: doc, pool, FewShot(k=2), exclude_self=True)


# ------------------------------------------------------------------------------------ against the harness
@pytest.mark.slow
def test_a_choice_file_with_a_train_split_matches_the_harness(
    harness: dict[str, list[dict[str, Any]]], files: dict[str, Path], ours: tuple[GPT, Any]
) -> None:
    records, pool = read_choice_records(files["choice_test"]), read_choice_records(files["choice_train"])
    requests = choice_requests(records, FewShot(k=NUM_FEWSHOT), pool, exclude_self=False)
    samples = harness["gpt2_choice_train_split"]
    assert_same_requests(samples, requests, ours, lambda number: len(records[number]["choices"]))
    model, tokenizer = ours
    results = evaluate_choice(
        model, tokenizer, files["choice_test"], fewshot=FewShot(k=NUM_FEWSHOT), fewshot_source=files["choice_train"]
    )
    theirs = harness["results"][0]["gpt2_choice_train_split"]
    assert (results["acc"], results["acc_norm"]) == pytest.approx((theirs["acc,none"], theirs["acc_norm,none"]))


@pytest.mark.slow
def test_a_choice_file_as_its_own_fewshot_pool_matches_the_harness(
    harness: dict[str, list[dict[str, Any]]], files: dict[str, Path], ours: tuple[GPT, Any]
) -> None:
    records = read_choice_records(files["choice_test"])
    requests = choice_requests(records, FewShot(k=NUM_FEWSHOT), records, exclude_self=True)
    for (context, _), record in zip(requests[::2], records, strict=False):
        assert record["query"] + " " + record["choices"][record["label"]] not in context  # never its own shot
    samples = harness["gpt2_choice_same_split"]
    assert_same_requests(samples, requests, ours, lambda number: len(records[number]["choices"]))


@pytest.mark.slow
def test_hellaswag_fewshot_matches_the_harness(
    harness: dict[str, list[dict[str, Any]]], files: dict[str, Path], ours: tuple[GPT, Any]
) -> None:
    examples = read_hellaswag(files["hellaswag_val"], style="lm-eval")
    contexts = hellaswag_fewshot_contexts(
        files["hellaswag_val"], files["hellaswag_train"], FewShot(k=NUM_FEWSHOT), style="lm-eval"
    )
    requests = [(context, ending) for context, ex in zip(contexts, examples, strict=True) for ending in ex.endings]
    assert_same_requests(harness["gpt2_hellaswag_local"], requests, ours, lambda number: 4)


@pytest.mark.slow
def test_gpt2_eval_hellaswag_fewshot_scores_as_the_harness(
    harness: dict[str, list[dict[str, Any]]], files: dict[str, Path], model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results.json"
    args = ["eval", "hellaswag", "--model", str(model_dir), "--data", str(files["hellaswag_val"]), "--style", "lm-eval"]
    args += ["--fewshot-data", str(files["hellaswag_train"]), "--num-fewshot", "2", "--no-progress", "--out", str(out)]
    assert main(args) == 0
    results, theirs = json.loads(out.read_text()), harness["results"][0]["gpt2_hellaswag_local"]
    assert results["num_fewshot"] == 2
    assert (results["acc"], results["acc_char_norm"]) == pytest.approx((theirs["acc,none"], theirs["acc_norm,none"]))


@pytest.mark.slow
def test_lambada_fewshot_matches_the_harness(
    harness: dict[str, list[dict[str, Any]]], files: dict[str, Path], ours: tuple[GPT, Any]
) -> None:
    pairs = read_lambada(files["lambada"])
    contexts = fewshot_contexts(pairs, lambda pair: pair, pairs, FewShot(k=NUM_FEWSHOT))
    requests = [(context, target) for context, (_, target) in zip(contexts, pairs, strict=True)]
    assert "  " in contexts[0]  # the harness's shot: context + " " + " word" (two spaces)
    assert_same_requests(harness["gpt2_lambada_local"], requests, ours, lambda number: 1)


@pytest.mark.slow
def test_gpt2_eval_lambada_fewshot_scores_as_the_harness(
    harness: dict[str, list[dict[str, Any]]], files: dict[str, Path], model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results.json"
    args = ["eval", "lambada", "--model", str(model_dir), "--data", str(files["lambada"]), "--num-fewshot", "2"]
    assert main([*args, "--no-progress", "--out", str(out)]) == 0
    results, theirs = json.loads(out.read_text()), harness["results"][0]["gpt2_lambada_local"]
    assert results["acc"] == pytest.approx(theirs["acc,none"])
    assert results["perplexity"] == pytest.approx(theirs["perplexity,none"], rel=1e-4)


# ------------------------------------------------------------------------------------ the command
@pytest.mark.slow
def test_gpt2_eval_choice_with_num_fewshot(
    model_dir: Path, files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.json"
    args = ["eval", "choice", "--model", str(model_dir), "--data", str(files["choice_test"]), "--no-progress"]
    code = main([*args, "--fewshot-data", str(files["choice_train"]), "--num-fewshot", "2", "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    assert (results["task"], results["num_examples"], results["num_fewshot"]) == ("choice", 5, 2)
    assert "acc_norm" in capsys.readouterr().out


def test_gpt2_eval_refuses_a_negative_num_fewshot(
    model_dir: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["eval", "lambada", "--model", str(model_dir), "--data", str(files["lambada"]), "--num-fewshot", "-1"])
    assert code == 2
    assert "--num-fewshot must be an integer >= 0" in capsys.readouterr().err


@pytest.mark.slow
def test_records_given_as_a_one_pass_iterator_are_read_for_questions_and_shots(ours: tuple[GPT, Any]) -> None:
    model, tokenizer = ours
    from_list = evaluate_choice(model, tokenizer, CHOICE_TEST, fewshot=FewShot(k=NUM_FEWSHOT))
    from_iterator = evaluate_choice(model, tokenizer, iter(CHOICE_TEST), fewshot=FewShot(k=NUM_FEWSHOT))
    assert from_iterator == from_list and from_list["num_examples"] == len(CHOICE_TEST)


def test_a_malformed_choice_line_names_the_file_and_line(files: dict[str, Path], tmp_path: Path) -> None:
    bad = write_jsonl(tmp_path / "bad.jsonl", [CHOICE_TEST[0], {"query": "x", "choices": ["a", "b"], "label": 2}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: 'label' 2 is not an index of the 2 choices"):
        read_choice_records(bad)
