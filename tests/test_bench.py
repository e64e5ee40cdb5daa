"""`gpt2 bench`: the command surface, the record schema (JSON lines and the markdown table), and the GPU profile's
steps run dry on a tiny CPU model. No figure is asserted: speed is measured by the tool, never in tests."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from gpt2.bench.bandwidth import decode_step_bytes
from gpt2.bench.record import Environment, Recorder, markdown_table, ratio_of
from gpt2.bench.timing import interleaved
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.cpu.kernels import onednn_available
from gpt2.cpu.layouts import OneDNNLinear, pack_weights
from gpt2.model import GPT

SCHEMA = {"area", "name", "params", "value", "values", "unit", "peer", "peer_value", "peer_values", "ratio",
          "machine", "torch", "commit", "date", "command"}  # fmt: skip
TINY = ["--preset", "gpt2-tiny", "--tokenizer", "bytes", "--repetitions", "2", "--warmup", "0"]


@pytest.fixture(autouse=True)
def pytorch_layouts(monkeypatch):
    """The records' schema does not depend on the decode path: the PyTorch layouts spare each test the native
    kernels' first build (tests/test_kernels.py covers the kernels)."""
    monkeypatch.setenv("GPT2_NATIVE_KERNELS", "0")


def records(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_help_lists_every_area(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    for area in ("decode", "prefill", "serve", "train", "tokenizer", "eval", "finetune", "gpu-profile"):
        assert f"    {area}" in out


@pytest.mark.slow
def test_decode_prints_one_json_record_per_measurement(capsys):
    argv = ["bench", "decode", *TINY, "--precisions", "float32,int8", "--batch-sizes", "1,2", "--new-tokens", "4"]
    assert main(argv) == 0
    found = records(capsys.readouterr().out)
    assert all(set(record) == SCHEMA and record["area"] == "decode" for record in found)
    rates = [record for record in found if record["name"] == "decode tokens/s"]
    assert [(r["params"]["precision"], r["params"]["batch"]) for r in rates] == [
        ("float32", 1), ("float32", 2), ("int8", 1), ("int8", 2),
    ]  # fmt: skip
    for record in rates:
        assert record["unit"] == "tokens/s" and record["value"] > 0
        assert len(record["values"]) == 2 and record["peer"] is None
        assert record["params"]["isa"] == "pytorch"  # GPT2_NATIVE_KERNELS=0
        assert record["command"] == (
            "gpt2 bench decode --preset gpt2-tiny --tokenizer bytes --repetitions 2 --warmup 0 --precisions "
            "float32,int8 --batch-sizes 1,2 --new-tokens 4"
        )


@pytest.mark.slow
def test_decode_at_batch_1_gives_weight_bandwidth_as_a_fraction_of_the_read_bandwidth(capsys):
    argv = ["bench", "decode", *TINY, "--precisions", "float32,int8", "--batch-sizes", "1,2", "--new-tokens", "4"]
    assert main(argv) == 0
    found = records(capsys.readouterr().out)
    (read,) = [record for record in found if record["name"] == "read bandwidth GB/s"]
    assert read["unit"] == "GB/s" and read["value"] > 0 and read["params"]["buffer_mib"] == 512
    assert len(read["values"]) == 4  # a pass in each of the 2 rounds of each batch-1 decode
    weights = [record for record in found if record["name"] == "weight GB/s"]
    assert [(r["params"]["precision"], r["params"]["batch"]) for r in weights] == [("float32", 1), ("int8", 1)]
    for record, passes in zip(weights, (read["values"][:2], read["values"][2:]), strict=True):
        assert record["unit"] == "GB/s" and len(record["values"]) == 2 and record["params"]["step_mb"] > 0
        # against the passes of its own rounds
        assert record["peer"] == "read bandwidth" and record["peer_value"] == pytest.approx(
            statistics.median(passes), abs=1e-3
        )
        assert record["ratio"] == pytest.approx(record["value"] / record["peer_value"], abs=1e-3)


def test_interleaved_alternates_the_engines_and_keeps_no_warmup():
    calls: list[str] = []

    def engine(name: str):
        def run() -> str:
            calls.append(name)
            return f"{name} {sum(call == name for call in calls)}"

        return run

    results = interleaved({"ours": engine("ours"), "peer": engine("peer")}, warmup=2, repetitions=3)
    assert calls == ["ours", "peer"] * 2 + ["ours", "peer", "peer", "ours", "ours", "peer"]
    assert results == {"ours": ["ours 3", "ours 4", "ours 5"], "peer": ["peer 3", "peer 4", "peer 5"]}


def test_interleaved_without_repetitions_only_warms_up():
    calls: list[str] = []
    assert interleaved({"ours": lambda: calls.append("ours")}, warmup=1, repetitions=0) == {"ours": []}
    assert calls == ["ours"]


def tiny_model() -> GPT:
    """2 blocks of width 32 (in_features a multiple of the kernels' blocks of 32), a vocabulary of 100 (not a
    multiple of the packed formats' tiles of 16 rows)."""
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, vocab_size=100, block_size=16)).eval()


@pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN")
def test_decode_step_bytes_counts_float32_weights_not_onednns_packed_copy():
    model = tiny_model()
    layers = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, linear in layers:  # as prepare_for_inference lays float32 out where the native kernels run
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, OneDNNLinear.from_linear(linear))  # packs its copy now
    # weights (out x in) and biases of c_attn 96x32, attn.c_proj 32x32, c_fc 128x32, mlp.c_proj 32x128
    linears = 96 * 32 + 96 + 32 * 32 + 32 + 128 * 32 + 128 + 32 * 128 + 32
    norms = 2 * (32 + 32)  # ln_1, ln_2: weight and bias
    head = 100 * 32 + 2 * 32  # the tied LM head (V, C), and ln_f
    assert decode_step_bytes(model) == 4 * (2 * (linears + norms) + head)


def test_decode_step_bytes_counts_int8_tiles_with_their_padding_and_scales():
    model = pack_weights(tiny_model(), "int8")
    # a NativeLinear: int8 codes and float32 scales of the rows padded to 16, float32 bias; LayerNorms in bfloat16
    linears = (96 * 32 + 4 * 96 + 4 * 96) + (32 * 32 + 4 * 32 + 4 * 32) + (128 * 32 + 4 * 128 + 4 * 128)
    linears += 32 * 128 + 4 * 32 + 4 * 32
    norms = 2 * 2 * (32 + 32)
    head = 112 * 32 + 4 * 112 + 2 * 2 * 32  # 100 rows padded to 112, no bias; ln_f
    assert decode_step_bytes(model) == 2 * (linears + norms) + head


def test_decode_md_prints_a_table(capsys):
    assert main(["bench", "prefill", *TINY, "--precisions", "float32", "--prompt-tokens", "16", "-o", "md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| area | measurement |")
    assert "| prefill | prefill tokens/s | precision=float32, prompt_tokens=16" in out


@pytest.mark.slow
def test_transformers_peer_is_measured_in_the_same_run(capsys):
    argv = ["bench", "decode", *TINY, "--precisions", "float32", "--new-tokens", "4", "--peer", "transformers"]
    assert main(argv) == 0
    (record,) = [record for record in records(capsys.readouterr().out) if record["name"] == "decode tokens/s"]
    assert record["peer"] == "transformers float32"
    assert len(record["peer_values"]) == 2 and record["peer_value"] > 0
    assert record["ratio"] == pytest.approx(record["value"] / record["peer_value"], rel=1e-2)


def test_rl_rollouts_are_measured_against_trls_generate_in_the_same_run(capsys):
    pytest.importorskip("transformers")
    argv = ["bench", "rl", *TINY, "--prompts", "2", "--generations", "3", "--prompt-tokens", "4", "--max-tokens", "5",
            "--peer", "trl"]  # fmt: skip
    assert main(argv) == 0
    (record,) = records(capsys.readouterr().out)
    assert (record["area"], record["name"], record["unit"], record["peer"]) == ("rl", "rollout completions/s",
                                                                              "completions/s", "trl")  # fmt: skip
    assert record["value"] > 0 and record["peer_value"] > 0 and len(record["values"]) == 2
    assert record["params"]["generations"] == 3 and 1 <= record["params"]["tokens_per_completion"] <= 5


def test_save_appends_json_lines(tmp_path, capsys):
    save = tmp_path / "runs" / "bench.jsonl"
    argv = ["bench", "eval", *TINY, "--tokens", "200", "--stride", "64", "--batch-size", "2", "--save", str(save)]
    assert main(argv) == 0
    assert main(argv) == 0
    lines = [json.loads(line) for line in save.read_text().splitlines()]
    assert len(lines) == 2 and all(set(line) == SCHEMA and line["area"] == "eval" for line in lines)


def test_ratio_is_above_one_when_ours_is_better():
    assert ratio_of(200.0, 100.0, "tokens/s") == 2.0  # a rate: ours / theirs
    assert ratio_of(50.0, 100.0, "ms") == 2.0  # a time: theirs / ours
    assert ratio_of(50.0, None, "ms") is None


def test_markdown_table_gives_range_peer_and_ratio():
    environment = Environment("cpu", "2.13.0", "abc1234", "2026-11-26", "gpt2 bench decode")
    recorder = Recorder(environment, output="md")
    recorder.add("decode", "decode tokens/s", {"batch": 1}, [9.0, 11.0, 10.0], "tokens/s", ("peer x", [5.0, 5.0]))
    table = markdown_table(recorder.records)
    assert "| decode | decode tokens/s | batch=1 | 10 | peer x | 5 | 2.00x | 9-11 | tokens/s |" in table
    assert "abc1234" in table and "`gpt2 bench decode`" in table


@pytest.mark.parametrize(
    "argv, message",
    [
        (["decode", "--precisions", "float8"], "precision 'float8' is not one of"),
        (["decode", "--batch-sizes", "1,x"], "expected whole numbers"),
        (["train", "--nanogpt", "/nonexistent"], "no model.py in /nonexistent"),
        (["serve", "--llama-server", "/nonexistent"], "no llama-server binary at /nonexistent"),
        (["serve", "--adapters", "2", "--url", "http://127.0.0.1:1"], "leave out --url and --llama-server"),
        (["decode", "--repetitions", "0"], "repetitions must be at least 1"),
        (["decode", "--precisions", ""], "--precisions names no precision"),
        (["train", "--optimizers", ","], "--optimizers names no optimizer"),
        (["finetune", "--methods", ""], "--methods: full, lora, got none"),
        (["serve", "--max-tokens", "1"], "--max-tokens must be at least 2"),
        (["serve", "--dtype", "float64"], "--dtype 'float64' is not one of"),
        (["serve", "--url", "notaurl"], "--url 'notaurl' is not an http(s) URL"),
        (["serve", "--url", "http://127.0.0.1:9"], "no server answers /health there"),
        (["decode", "--save", "/proc/nope.jsonl"], "--save /proc/nope.jsonl: cannot write there"),
        (["eval", "--stride", "1000"], "--stride 1000 is longer than the model's context of 128 tokens"),
    ],
)
def test_bad_options_give_one_line_before_anything_is_measured(argv, message, capsys):
    assert main(["bench", argv[0], *TINY, *argv[1:]]) == 2  # the option under test given last
    out, err = capsys.readouterr()
    assert message in err and err.count("\n") == 1
    assert out == ""  # no record: nothing was measured


def test_gpu_profile_refuses_a_cpu_without_dry_run(capsys):
    assert main(["bench", "gpu-profile", *TINY]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


@pytest.mark.slow
def test_gpu_profile_dry_run_writes_every_step(tmp_path: Path, gpt2_bpe_dir: Path, capsys):
    """The profile's steps (train with AdamW and Muon, decode at two batch sizes, serve under clients) on a tiny
    model on the CPU, into a JSON-lines file with one schema."""
    save = tmp_path / "profile.jsonl"
    argv = ["bench", "gpu-profile", "--dry-run", "--preset", "gpt2-tiny", "--tokenizer", str(gpt2_bpe_dir), "--save",
            str(save)]  # fmt: skip
    assert main(argv) == 0
    lines = [json.loads(line) for line in save.read_text().splitlines()]
    assert all(set(line) == SCHEMA for line in lines)
    seen = {(line["area"], line["name"]) for line in lines}
    assert {("train", "tokens/s"), ("train", "MFU"), ("decode", "decode tokens/s"), ("serve", "ttft p50"),
            ("serve", "itl p99"), ("serve", "tokens/s")} <= seen  # fmt: skip
    optimizers = {line["params"]["optimizer"] for line in lines if line["area"] == "train"}
    assert optimizers == {"adamw", "muon"}
    assert {line["params"]["batch"] for line in lines if line["name"] == "decode tokens/s"} == {1, 4}
    mfu = next(line for line in lines if line["name"] == "MFU")
    assert mfu["params"]["peak_tflops"] == 989.0


@pytest.mark.slow
def test_serve_with_adapters_measures_them_against_the_base_alone_and_their_memory(gpt2_bpe_dir: Path, capsys):
    """One `gpt2 serve` (a real process): its clients spread over the adapters against the base model alone, in
    the same run, and the memory each adapter loaded at run time adds beside its weights' size."""
    argv = ["bench", "serve", "--preset", "gpt2-tiny", "--tokenizer", str(gpt2_bpe_dir), "--repetitions", "1",
            "--warmup", "0", "--adapters", "2", "--clients", "2", "--requests", "1", "--prompt-tokens", "8",
            "--max-tokens", "4"]  # fmt: skip
    assert main(argv) == 0
    found = {record["name"]: record for record in records(capsys.readouterr().out)}
    memory = found["added memory per adapter"]
    assert memory["unit"] == "MiB" and memory["peer"] == "its weights" and memory["peer_value"] > 0
    rate = found["tokens/s"]
    assert rate["peer"] == "base model alone" and rate["value"] > 0 and rate["peer_value"] > 0
    assert rate["params"]["adapters"] == 2 and rate["params"]["clients"] == 2
