"""gpt2.inspect.patching: every sweep equals TransformerLens' own patching function on the same weights, the
batched sweep equals patching one cell at a time with hooks, and attribution patching is the first-order term.

TransformerLens runs through its TransformerBridge over transformers' GPT2LMHeadModel (eager attention) loaded
from our saved weights, as in tests/test_inspect.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpt2.cli import main
from gpt2.config import GPTConfig
from gpt2.inspect import run_with_cache, run_with_hooks
from gpt2.inspect.patching import activation_patching, attribution_patching, logit_diff
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import save_pretrained

VOCAB = 257
ATOL = 1e-4
ANSWER, WRONG = 17, 42


@pytest.fixture
def model(perturbed_tiny_gpt: GPT) -> GPT:
    return perturbed_tiny_gpt


@pytest.fixture
def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    corrupted = clean.clone()
    corrupted[0, [2, 5]] = torch.tensor([100, 200])  # two tokens differ
    return clean, corrupted


@pytest.fixture
def bridge(model: GPT, tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    bridge_module = pytest.importorskip("transformer_lens.model_bridge")
    save_pretrained(model, tmp_path / "tiny")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "tiny", attn_implementation="eager").eval()
    return bridge_module.TransformerBridge.boot_transformers(str(tmp_path / "tiny"), device="cpu", hf_model=hf)


@pytest.mark.parametrize(
    ("site", "theirs"),
    [
        ("resid_pre", "get_act_patch_resid_pre"),
        ("attn_out", "get_act_patch_attn_out"),
        ("mlp_out", "get_act_patch_mlp_out"),
        ("head", "get_act_patch_attn_head_out_all_pos"),
    ],
)
def test_a_sweep_equals_transformer_lens_patching(model: GPT, prompts, bridge, site: str, theirs: str) -> None:
    patching = pytest.importorskip("transformer_lens.patching")
    clean, corrupted = prompts
    with torch.no_grad():
        _, clean_cache = bridge.run_with_cache(clean)
        expected = getattr(patching, theirs)(
            bridge, corrupted, clean_cache, lambda logits: logits[0, -1, ANSWER] - logits[0, -1, WRONG]
        )
    ours = activation_patching(model, clean, corrupted, logit_diff(ANSWER, WRONG), site)
    assert ours.values.shape == expected.shape
    torch.testing.assert_close(ours.values, expected.float().cpu(), atol=ATOL, rtol=0)
    assert ours.values.std() > 1e-3  # the patches changed something


def test_a_batch_of_patched_copies_equals_one_hooked_run_per_cell(model: GPT, prompts) -> None:
    clean, corrupted = prompts
    metric = logit_diff(ANSWER, WRONG)
    result = activation_patching(model, clean, corrupted, metric, "head", rows_per_forward=3)
    with torch.no_grad():
        _, cache = run_with_cache(model, clean, "blocks.1.attn.hook_z")

        def patch_head_2(z: torch.Tensor, name: str) -> torch.Tensor:  # z: (B, T, nh, hs)
            z = z.clone()
            z[:, :, 2] = cache[name][:, :, 2]
            return z

        logits = run_with_hooks(model, corrupted, [("blocks.1.attn.hook_z", patch_head_2)])
    torch.testing.assert_close(result.values[1, 2], metric(logits[:, -1])[0], atol=1e-5, rtol=0)


def test_positions_before_the_first_difference_change_nothing(model: GPT, prompts) -> None:
    clean, corrupted = prompts  # they differ first at position 2
    result = activation_patching(model, clean, corrupted, logit_diff(ANSWER, WRONG))
    torch.testing.assert_close(result.values[:, :2], torch.full_like(result.values[:, :2], result.corrupted))
    assert not torch.allclose(result.values[:, 2:], torch.full_like(result.values[:, 2:], result.corrupted))


@pytest.mark.parametrize(
    ("site", "name", "cell"),
    [("resid_pre", "blocks.1.hook_resid_pre", (1, 5)), ("head", "blocks.1.attn.hook_z", (1, 3))],
)
def test_attribution_is_the_first_order_term_of_patching(
    model: GPT, prompts, site: str, name: str, cell: tuple[int, int]
) -> None:
    model = model.double()
    clean, corrupted = prompts
    metric = logit_diff(ANSWER, WRONG)
    attribution = attribution_patching(model, clean, corrupted, metric, site)
    with torch.no_grad():
        _, clean_cache = run_with_cache(model, clean, name)
        base, corrupted_cache = run_with_cache(model, corrupted, name)
    difference = clean_cache[name] - corrupted_cache[name]
    t = 1e-6  # a small step toward the clean activation at one cell moves the metric by t * attribution

    def step(x: torch.Tensor, hook_name: str) -> torch.Tensor:
        x = x.clone()
        if site == "resid_pre":
            x[:, cell[1]] += t * difference[:, cell[1]]
        else:
            x[:, :, cell[1]] += t * difference[:, :, cell[1]]
        return x

    with torch.no_grad():
        moved = run_with_hooks(model, corrupted, [(name, step)])
    finite_difference = float((metric(moved[:, -1]) - metric(base[:, -1]))[0]) / t
    assert float(attribution.values[cell]) == pytest.approx(finite_difference, rel=1e-4, abs=1e-6)
    assert attribution.corrupted == pytest.approx(float(metric(base[:, -1])[0]))
    assert all(p.grad is None for p in model.parameters())


def test_bad_patching_input_is_refused(model: GPT, prompts) -> None:
    clean, corrupted = prompts
    with pytest.raises(ValueError, match="same length"):
        activation_patching(model, clean, corrupted[:, :-1], logit_diff(1, 2))
    with pytest.raises(ValueError, match="unknown patching site 'resid_post'"):
        activation_patching(model, clean, corrupted, logit_diff(1, 2), "resid_post")
    with pytest.raises(ValueError, match="dropout off"):
        dropout = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=VOCAB, dropout=0.1)).train()
        activation_patching(dropout, clean, corrupted, logit_diff(1, 2))


@pytest.fixture
def model_dir(model: GPT, tmp_path: Path) -> Path:
    save_pretrained(model, tmp_path / "model")
    load_tokenizer("bytes").save(tmp_path / "model")
    return tmp_path / "model"


def test_cli_writes_the_patching_json_png_and_html(model: GPT, model_dir: Path, tmp_path: Path, capsys) -> None:
    common = [
        "inspect",
        "patch",
        "--model",
        str(model_dir),
        "--device",
        "cpu",
        "--clean",
        "Mary had a lamb",
        "--corrupt",
        "John had a lamb",
        "--answer",
        "M",
        "--wrong",
        "J",
    ]
    assert main([*common, "--out", str(tmp_path / "p.json")]) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["site"] == "resid_pre" and data["tokens"][:4] == ["J", "o", "h", "n"]
    tokenizer = load_tokenizer("bytes")
    clean, corrupted = (torch.tensor([tokenizer.encode(text)]) for text in ("Mary had a lamb", "John had a lamb"))
    expected = activation_patching(model, clean, corrupted, logit_diff(ord("M"), ord("J")))
    torch.testing.assert_close(torch.tensor(data["logit_diff"]), expected.values, atol=1e-5, rtol=0)
    assert main([*common, "--site", "head", "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes().startswith(b"\x89PNG")
    assert main([*common, "--site", "mlp_out", "--out", str(tmp_path / "p.html")]) == 0
    assert "<table>" in (tmp_path / "p.html").read_text() and "layer 1" in (tmp_path / "p.html").read_text()
    assert f"wrote {tmp_path / 'p.html'}" in capsys.readouterr().out


def test_cli_refuses_prompts_of_different_lengths_in_one_line(model_dir: Path, tmp_path: Path, capsys) -> None:
    common = ["inspect", "patch", "--model", str(model_dir), "--device", "cpu", "--answer", "M", "--wrong", "J"]
    assert main([*common, "--clean", "Mary", "--corrupt", "Jo", "--out", str(tmp_path / "p.json")]) == 2
    assert "patching needs prompts of the same number of tokens" in capsys.readouterr().err
    assert main([*common, "--clean", "Ma", "--corrupt", "Jo", "--answer", "MM", "--out", str(tmp_path / "p.json")]) == 2
    assert "--answer 'MM' is 2 tokens" in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--clean", "", "--corrupt", "John"], "the clean prompt is empty; pass --clean TEXT"),
        (["--clean", "Mary", "--corrupt", ""], "the corrupted prompt is empty; pass --corrupt TEXT"),
        (["--clean", "Mary", "--corrupt", "John", "--wrong", "M"], "--answer and --wrong are the same token ('M'"),
    ],
    ids=["empty clean", "empty corrupt", "answer equals wrong"],
)
def test_cli_names_an_empty_prompt_or_one_token_twice_in_one_line(
    model_dir: Path, tmp_path: Path, capsys, flags: list[str], message: str
) -> None:
    common = ["inspect", "patch", "--model", str(model_dir), "--device", "cpu", "--answer", "M", "--wrong", "J"]
    assert main([*common, *flags, "--out", str(tmp_path / "p.json")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and message in error and "--prompt" not in error, error
    assert not (tmp_path / "p.json").exists()
