"""SAEs checked at the door (gpt2.inspect.sae.load_sae): one reader refuses a malformed cfg.json (a field missing,
of the wrong type or range), an SAE for another model (another width, a hook past the last block), NaN weights and
a corrupt safetensors file with one line naming the file and the problem, for the Python API, `gpt2 sample
--steer --sae`, `gpt2 inspect sae` and `gpt2 serve --sae` (refused at start, not per request)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt2.api import LLM
from gpt2.cli import main
from gpt2.inference.sampling import SamplingParams
from gpt2.inspect.sae import SAEConfig, SparseAutoencoder, load_sae, save_sae
from gpt2.tokenizer import ByteTokenizer
from test_serve import save_model, tiny_gpt
from test_serve_adapter_checks import assert_one_line_naming
from test_serve_adapter_checks import gpt2_command as run_gpt2

WIDTH = 32  # tiny_gpt's n_embd
HOOK = "blocks.1.hook_resid_pre"  # tiny_gpt has blocks 0 and 1
CONFIG = "cfg.json"
WEIGHTS = "sae_weights.safetensors"


def raw(config: dict[str, Any], field: str, text: str) -> str:
    """The config as JSON text with `field`'s value written as `text` exactly (1e999 stays 1e999)."""
    return json.dumps({**config, field: "<value>"}).replace('"<value>"', text)


# What each malformed cfg.json is: (what the error says, the config's text from the good config)
BAD_CONFIGS: dict[str, tuple[str, Any]] = {
    "not JSON": ("is not valid JSON", lambda config: "{"),
    "a list": ("must be a JSON object, not a list", lambda config: "[]"),
    "no d_in": (
        "the field d_in is missing",
        lambda config: json.dumps({k: v for k, v in config.items() if k != "d_in"}),
    ),
    "d_in 1e999": ("d_in must be a positive integer, got inf", lambda config: raw(config, "d_in", "1e999")),
    "d_in 400 digits": ("d_in must be a positive integer", lambda config: raw(config, "d_in", "-" + "9" * 400)),
    "d_in '32'": ("d_in must be a positive integer, got '32'", lambda config: raw(config, "d_in", '"32"')),
    "d_sae true": ("d_sae must be a positive integer, got True", lambda config: raw(config, "d_sae", "true")),
    "architecture 5": ("architecture 5 is not supported", lambda config: raw(config, "architecture", "5")),
    "apply_b_dec 'false'": (
        "apply_b_dec_to_input must be true or false",
        lambda config: raw(config, "apply_b_dec_to_input", '"false"'),
    ),
    "metadata a list": ("metadata must be an object", lambda config: raw(config, "metadata", "[1]")),
}
# An SAE for another model, with files consistent in themselves: (what the error says, the SAE)
MISFITS: dict[str, tuple[str, SAEConfig]] = {
    "another width": (
        f"reads 16 values at '{HOOK}'; this model has {WIDTH} there",
        SAEConfig(architecture="standard", d_in=16, d_sae=8, hook_name=HOOK),
    ),
    "a hook past the last block": (
        "'blocks.2.hook_resid_pre', which this model (2 blocks, numbered 0 to 1) has not",
        SAEConfig(architecture="standard", d_in=WIDTH, d_sae=8, hook_name="blocks.2.hook_resid_pre"),
    ),
}


def random_sae(config: SAEConfig) -> SparseAutoencoder:
    torch.manual_seed(1)
    sae = SparseAutoencoder(config)
    with torch.no_grad():
        for parameter in sae.parameters():
            parameter.copy_(0.3 * torch.randn_like(parameter))
    return sae


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_model(tmp_path_factory.mktemp("tiny"), tiny_gpt(), ByteTokenizer())


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = SAEConfig(architecture="standard", d_in=WIDTH, d_sae=16, hook_name=HOOK)
    return save_sae(random_sae(config), tmp_path_factory.mktemp("good") / "sae")


def broken(good: Path, folder: Path, case: str) -> Path:
    """An SAE folder broken as `case` says: a BAD_CONFIGS or MISFITS key, "nan" or "truncated"."""
    if case in MISFITS:
        return save_sae(random_sae(MISFITS[case][1]), folder)
    folder.mkdir(parents=True)
    config = json.loads((good / CONFIG).read_text())
    (folder / CONFIG).write_text(BAD_CONFIGS[case][1](config) if case in BAD_CONFIGS else json.dumps(config))
    tensors = load_file(str(good / WEIGHTS))
    if case == "nan":
        tensors["W_dec"][3, 5] = float("nan")
    save_file(tensors, str(folder / WEIGHTS))
    if case == "truncated":
        data = (folder / WEIGHTS).read_bytes()
        (folder / WEIGHTS).write_bytes(data[: len(data) // 2])
    return folder


def expected_error(case: str) -> tuple[str, str]:
    """(the file the error names, what it says is wrong) for a case of `broken`."""
    if case in BAD_CONFIGS:
        return CONFIG, BAD_CONFIGS[case][0]
    if case in MISFITS:
        return CONFIG, MISFITS[case][0]
    return WEIGHTS, {"nan": "W_dec holds NaN or infinite values", "truncated": "is not a readable safetensors file"}[
        case
    ]


CASES = [*BAD_CONFIGS, *MISFITS, "nan", "truncated"]


# ------------------------------------------------------------------------------------------ the Python API
@pytest.mark.parametrize("case", CASES)
def test_load_sae_names_the_file_and_the_problem_in_one_line(good: Path, tmp_path: Path, case: str) -> None:
    folder = broken(good, tmp_path / "broken", case)
    file, problem = expected_error(case)
    with pytest.raises(ValueError) as error:
        load_sae(folder, tiny_gpt().config)
    message = str(error.value)
    assert message.startswith(str(folder / file)) and problem in message and "\n" not in message, message
    assert len(message) < 400  # a 400-digit number is not echoed whole


def test_a_good_sae_loads_and_fits(good: Path) -> None:
    sae = load_sae(good, tiny_gpt().config)
    assert (sae.d_in, sae.d_sae, sae.hook_name) == (WIDTH, 16, HOOK)


def test_without_a_model_only_the_files_are_checked(good: Path, tmp_path: Path) -> None:
    folder = broken(good, tmp_path / "wide", "another width")
    assert load_sae(folder).d_in == 16  # fits some other model; the width is checked where a model is given


def test_generate_refuses_steering_with_an_sae_of_another_width(tmp_path: Path) -> None:
    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"))
    sae = random_sae(MISFITS["another width"][1])
    steering = [{"hook": HOOK, "sae": sae, "feature": 0, "value": 4.0}]
    with pytest.raises(ValueError, match=r"steering\[0\]\.sae reads 16 values .* the model has 32 there"):
        llm.generate("Hi", SamplingParams(max_tokens=2, temperature=0.0), steering=steering)


def test_the_server_refuses_a_misfitting_sae_at_start(good: Path, tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from gpt2.serve import ServerConfig
    from gpt2.serve.app import create_app

    llm = LLM(tiny_gpt(), ByteTokenizer(), torch.device("cpu"))
    wide = random_sae(MISFITS["another width"][1])
    with pytest.raises(ValueError, match="the SAE 'wide' reads 16 values"):
        create_app(llm, ServerConfig(model_name="tiny"), saes={"wide": wide, "good": load_sae(good)})


# ------------------------------------------------------------------------------------------ the command line
@pytest.mark.parametrize("case", CASES)
def test_inspect_sae_names_a_bad_sae_in_one_line(
    model_dir: Path, good: Path, tmp_path: Path, case: str, capsys
) -> None:
    folder = broken(good, tmp_path / "broken", case)
    out = tmp_path / "features.json"
    args = ["inspect", "sae", "--model", str(model_dir), "--sae", str(folder), "--prompt", "Hi", "--out", str(out)]
    assert main([*args, "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    file, problem = expected_error(case)
    error = captured.err.strip()
    assert len(error.splitlines()) == 1 and str(folder / file) in error and problem in error, error
    assert not out.exists() and not captured.out


def gpt2_command(*args: str) -> subprocess.CompletedProcess[str]:
    return run_gpt2(*args, native_kernels=False)


@pytest.mark.slow
def test_gpt2_sample_names_an_sae_of_another_width_in_one_line(model_dir: Path, good: Path, tmp_path: Path) -> None:
    folder = broken(good, tmp_path / "wide", "another width")
    steer = tmp_path / "steer.json"
    steer.write_text(json.dumps([{"hook": HOOK, "sae": "s", "feature": 0, "value": 4.0}]))
    result = gpt2_command("sample", "--model", str(model_dir), "--prompt", "Hi", "--max-new-tokens", "2",
                          "--steer", str(steer), "--sae", f"s={folder}")  # fmt: skip
    assert_one_line_naming(result, str(folder / CONFIG), MISFITS["another width"][0])
    assert not result.stdout  # nothing echoed before the refusal


@pytest.mark.slow
def test_gpt2_inspect_sae_names_a_truncated_weights_file_in_one_line(
    model_dir: Path, good: Path, tmp_path: Path
) -> None:
    folder = broken(good, tmp_path / "cut", "truncated")
    result = gpt2_command("inspect", "sae", "--model", str(model_dir), "--sae", str(folder), "--prompt", "Hi",
                          "--out", str(tmp_path / "f.json"))  # fmt: skip
    assert_one_line_naming(result, str(folder / WEIGHTS), "not a readable safetensors file")


@pytest.mark.slow
def test_gpt2_serve_refuses_an_sae_past_the_last_block_at_start(model_dir: Path, good: Path, tmp_path: Path) -> None:
    folder = broken(good, tmp_path / "deep", "a hook past the last block")
    result = gpt2_command("serve", str(model_dir), "--sae", f"deep={folder}", "--port", "0")
    assert_one_line_naming(result, f"--sae deep={folder}", MISFITS["a hook past the last block"][0])


@pytest.mark.slow
def test_gpt2_serve_names_a_config_of_1e999_in_one_line(model_dir: Path, good: Path, tmp_path: Path) -> None:
    folder = broken(good, tmp_path / "huge", "d_in 1e999")
    result = gpt2_command("serve", str(model_dir), "--sae", f"huge={folder}", "--port", "0")
    assert_one_line_naming(result, str(folder / CONFIG), "d_in must be a positive integer")


def test_inspect_sae_writes_null_where_a_value_is_not_finite(model_dir: Path, tmp_path: Path, capsys) -> None:
    # finite weights whose products overflow float32: activations and the reconstruction are infinite or NaN
    sae = random_sae(SAEConfig(architecture="standard", d_in=WIDTH, d_sae=16, hook_name=HOOK))
    with torch.no_grad():
        sae.W_enc.mul_(1e30)
        sae.W_dec.mul_(1e30)
    folder = save_sae(sae, tmp_path / "overflowing")
    out = tmp_path / "features.json"
    args = [
        "inspect",
        "sae",
        "--model",
        str(model_dir),
        "--sae",
        str(folder),
        "--prompt",
        "Hi there",
        "--out",
        str(out),
    ]
    assert main([*args, "--device", "cpu"]) == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} written into JSON")

    data = json.loads(out.read_text(), parse_constant=refuse)  # strict: NaN, Infinity and -Infinity are not JSON
    assert data["mse"] is None and data["spliced_loss"] is None
    assert data["loss"] > 0  # the model's own loss is finite and written as a number
