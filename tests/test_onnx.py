"""ONNX export: ONNX Runtime, running the exported decoder in Optimum's / transformers.js's GPT-2 layout, computes
what our model computes: the same logits with and without past key values, and the same cached greedy text.

The model is the shared `gguf-tiny` fixture (random weights, GPT-2's real 50257-token vocabulary), exported once
through the CLI with --dtype int8, which writes both graphs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import shared_file
from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.export import export_onnx, onnx_input_names, onnx_output_names
from gpt2.export import onnx as onnx_export
from gpt2.inference.generation import generate
from gpt2.model import GPT
from gpt2.tokenizer import ByteTokenizer, load_tokenizer
from gpt2.weights import load_model

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

pytestmark = pytest.mark.slow  # one export traces the model (~20 s)

FP32_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return shared_file("fixtures/gguf-tiny/hf/model.safetensors").parent


@pytest.fixture(scope="module")
def model(model_dir: Path) -> GPT:
    return load_model(model_dir).eval()


@pytest.fixture(scope="module")
def exported(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("onnx") / "tiny-onnx"
    tokenizer = shared_file("gpt2-bpe/encoder.json").parent
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            ["export", "--model", str(model_dir), "--tokenizer", str(tokenizer), "--format", "onnx"]
            + ["--dtype", "int8", "--out", str(out)]
        )
    assert code == 0
    lines = printed.getvalue().splitlines()  # one line per graph, each with the dtype it holds
    assert [line.split(" MB")[0].rsplit(",", 1)[0] for line in lines] == [
        f"wrote {out / 'onnx' / 'model.onnx'} (onnx, f32",
        f"wrote {out / 'onnx' / 'model_quantized.onnx'} (onnx, int8",
    ]
    return out


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def empty_past(model: GPT, batch: int) -> dict[str, np.ndarray]:
    config = model.config
    shape = (batch, config.n_head, 0, config.head_dim)
    return {name: np.zeros(shape, np.float32) for name in onnx_input_names(config.n_layer)[3:]}


def run(
    graph: ort.InferenceSession, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: dict[str, np.ndarray]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One call: logits (B, T, V) and the next call's past, read from the present outputs."""
    outputs = graph.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past})
    present = dict(zip(graph.get_outputs()[1:], outputs[1:], strict=True))
    next_past = {meta.name.replace("present.", "past_key_values."): value for meta, value in present.items()}
    return outputs[0], next_past


def test_the_graph_has_optimums_gpt2_inputs_and_outputs(exported: Path, model: GPT) -> None:
    graph = session(exported / "onnx" / "model.onnx")
    n_layer, n_head, head_dim = model.config.n_layer, model.config.n_head, model.config.head_dim
    assert [meta.name for meta in graph.get_inputs()] == onnx_input_names(n_layer)
    assert [meta.name for meta in graph.get_outputs()] == onnx_output_names(n_layer)
    assert onnx_input_names(n_layer)[3:5] == ["past_key_values.0.key", "past_key_values.0.value"]
    assert onnx_output_names(n_layer)[1:3] == ["present.0.key", "present.0.value"]
    past = graph.get_inputs()[3]
    assert past.type == "tensor(float)" and past.shape[1:] == [n_head, "past_sequence_length", head_dim]
    assert graph.get_inputs()[0].type == "tensor(int64)"


def test_each_layers_cache_write_stays_in_its_own_tensor(exported: Path) -> None:
    """A write into a view of one stacked cache exports as a ScatterElements over every layer's cache, per layer:
    that made ONNX Runtime's decode several times slower. Each layer's write is one ScatterND of its T positions."""
    import onnx

    graph = onnx.load(str(exported / "onnx" / "model.onnx"), load_external_data=False).graph
    op_types = [node.op_type for node in graph.node]
    assert "ScatterElements" not in op_types
    assert op_types.count("ScatterND") <= 2 * 2 + 1  # keys and values of 2 layers (+ the mask's diagonal)


def test_the_folder_is_what_transformers_js_reads(exported: Path, model: GPT) -> None:
    names = {path.relative_to(exported).as_posix() for path in exported.rglob("*") if path.is_file()}
    expected = {"onnx/model.onnx", "onnx/model_quantized.onnx", "config.json", "generation_config.json"}
    assert expected | {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"} <= names
    config = json.loads((exported / "config.json").read_text())
    assert (config["model_type"], config["n_layer"], config["n_head"]) == ("gpt2", 2, 4)
    assert not [name for name in exported.parent.iterdir() if name.name.endswith(".tmp")]


def test_tokenizer_json_encodes_like_ours(exported: Path) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    theirs = HFTokenizer.from_file(str(exported / "tokenizer.json"))
    ours = load_tokenizer(exported)
    for text in ["Hello world", " leading space, café ☕ and 12345", "a<|endoftext|>b", "\n\n  tabs\tend"]:
        assert theirs.encode(text).ids == ours.encode(text, allowed_special="all"), text
        assert theirs.decode(theirs.encode(text).ids, skip_special_tokens=False) == text


def test_logits_without_past_equal_ours(exported: Path, model: GPT) -> None:
    graph = session(exported / "onnx" / "model.onnx")
    ids = torch.tensor([[464, 2068, 7586, 21831, 18045, 625], [15496, 995, 11, 314, 716, 257]])
    logits, _ = run(graph, ids.numpy(), np.ones_like(ids.numpy()), np.tile(np.arange(6), (2, 1)), empty_past(model, 2))
    with torch.no_grad():
        expected = model(ids).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=FP32_TOLERANCE, rtol=0)


def test_logits_with_past_equal_ours_for_a_left_padded_batch(exported: Path, model: GPT) -> None:
    graph = session(exported / "onnx" / "model.onnx")
    # Row 0 has two padding positions on the left; positions count real tokens only, as transformers.js does.
    ids = torch.tensor([[50256, 50256, 464, 2068], [15496, 995, 11, 314]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    _, past = run(graph, ids.numpy(), mask.numpy(), positions.numpy(), empty_past(model, 2))
    step = torch.tensor([[7586], [716]])
    step_mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
    step_positions = positions[:, -1:] + 1
    logits, past = run(graph, step.numpy(), step_mask.numpy(), step_positions.numpy(), past)

    with torch.no_grad():
        full = model(torch.cat([ids, step], dim=1), attention_mask=step_mask).logits[:, -1:]
    np.testing.assert_allclose(logits, full.numpy(), atol=FP32_TOLERANCE, rtol=0)
    assert past["past_key_values.0.key"].shape == (2, model.config.n_head, 5, model.config.head_dim)


def test_greedy_continuation_with_the_cache_is_ours(exported: Path, model: GPT) -> None:
    graph = session(exported / "onnx" / "model.onnx")
    prompt = [464, 2068, 7586, 21831]
    steps = 24
    expected = generate(model, torch.tensor([prompt]), steps, temperature=0, native=False)[0, len(prompt) :].tolist()

    ids, tokens = np.array([prompt]), []
    past, mask = empty_past(model, 1), np.ones((1, 0), np.int64)
    position = 0
    for _ in range(len(expected)):
        mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
        positions = np.arange(position, position + ids.shape[1])[None]
        logits, past = run(graph, ids, mask, positions, past)
        position += ids.shape[1]
        ids = logits[:, -1].argmax(-1, keepdims=True)
        tokens.append(int(ids[0, 0]))
    assert tokens == expected


TRANSFORMERS_JS_ENV = "GPT2_TRANSFORMERS_JS"
TRANSFORMERS_JS_SCRIPT = """
import {{ env, AutoTokenizer, AutoModelForCausalLM }} from "@huggingface/transformers";
env.allowRemoteModels = false;
env.localModelPath = {models};
const tokenizer = await AutoTokenizer.from_pretrained({name});
const model = await AutoModelForCausalLM.from_pretrained({name}, {{ dtype: "fp32" }});
const inputs = tokenizer({prompt});
const out = await model.generate({{ ...inputs, max_new_tokens: {steps}, do_sample: false }});
console.log(JSON.stringify(out.tolist()[0].map(Number)));
"""


def test_transformers_js_generates_our_greedy_text(exported: Path, model: GPT, tmp_path: Path) -> None:
    """Needs Node.js and the npm package: GPT2_TRANSFORMERS_JS names a folder where
    `npm install --ignore-scripts @huggingface/transformers` was run (.ci/run makes one; under CI a missing one
    fails the test)."""
    folder = os.environ.get(TRANSFORMERS_JS_ENV)
    if not folder or not (Path(folder) / "node_modules" / "@huggingface" / "transformers").is_dir():
        message = f"set {TRANSFORMERS_JS_ENV} to a folder with @huggingface/transformers installed (npm)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    prompt, steps = "The quick brown fox", 12
    script = Path(folder) / f"gpt2-test-{os.getpid()}.mjs"  # node resolves the package from the script's folder
    script.write_text(
        TRANSFORMERS_JS_SCRIPT.format(
            models=json.dumps(str(exported.parent) + "/"), name=json.dumps(exported.name), prompt=json.dumps(prompt),
            steps=steps,
        )
    )  # fmt: skip
    try:
        done = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=300, check=False)
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr
    ids = load_tokenizer(exported).encode(prompt)
    expected = generate(model, torch.tensor([ids]), steps, temperature=0, native=False)[0].tolist()
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected


def test_int8_graph_runs_and_stays_close_to_fp32(exported: Path, model: GPT) -> None:
    fp32, int8 = session(exported / "onnx" / "model.onnx"), session(exported / "onnx" / "model_quantized.onnx")
    sizes = [(exported / "onnx" / name).stat().st_size for name in ("model_quantized.onnx", "model.onnx")]
    assert sizes[0] < sizes[1] / 2
    ids = np.array([[464, 2068, 7586, 21831, 18045, 625, 262, 16931]])
    feed = (ids, np.ones_like(ids), np.arange(8)[None], empty_past(model, 1))
    reference, _ = run(fp32, *feed)
    quantized, _ = run(int8, *feed)
    assert quantized.shape == reference.shape and np.isfinite(quantized).all()
    # int8 weights move the logits by a small fraction of their spread; a wrong graph moves them by the spread
    assert np.abs(quantized - reference).mean() < 0.05 * reference.std()
    assert np.corrcoef(quantized.ravel(), reference.ravel())[0, 1] > 0.99


@pytest.fixture(scope="module")
def byte_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, vocab_size=ByteTokenizer.vocab_size, block_size=16)).eval()


def test_a_byte_level_model_exports_with_its_own_tokenizer_file(byte_model: GPT, tmp_path: Path) -> None:
    (path,) = export_onnx(byte_model, ByteTokenizer(), tmp_path / "bytes")
    assert path == tmp_path / "bytes" / "onnx" / "model.onnx"
    assert (tmp_path / "bytes" / "byte_tokenizer.json").is_file() and (tmp_path / "bytes" / "config.json").is_file()
    assert not (tmp_path / "bytes" / "tokenizer.json").exists()  # tokenizer.json describes BPE only
    ids = np.array([list(b"hello")])
    logits, _ = run(session(path), ids, np.ones_like(ids), np.arange(5)[None], empty_past(byte_model, 1))
    with torch.no_grad():
        expected = byte_model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(logits, expected, atol=FP32_TOLERANCE, rtol=0)


def test_a_failed_export_leaves_nothing_behind(
    byte_model: GPT, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(model: GPT, path: Path) -> None:
        path.write_bytes(b"half a graph")
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(onnx_export, "write_onnx_graph", broken)
    with pytest.raises(RuntimeError, match="the exporter failed"):
        export_onnx(byte_model, ByteTokenizer(), tmp_path / "out", dtype="int8")
    assert list(tmp_path.iterdir()) == []  # no folder, no half-written model.onnx, no staging folder


def test_a_missing_onnx_extra_is_one_line_naming_it(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(onnx_export, "_importable", lambda name: name != "onnxscript")
    code = main(["export", "--model", str(model_dir), "--format", "onnx", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "onnxscript" in err and "gpt2-faithful[onnx]" in err
    assert not (tmp_path / "out").exists()


def test_a_dtype_onnx_cannot_store_is_refused(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["export", "--model", str(model_dir), "--format", "onnx", "--dtype", "q8_0", "--out", str(tmp_path)])
    assert code == 2
    assert "choose one of f32, int8" in capsys.readouterr().err
