"""Shared test fixtures: where the read-only shared data lives, and small seeded helpers."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("GPT2_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


def shared_file(relative: str) -> Path:
    """Path to a file under the shared data folder; skip outside CI when missing, fail under CI."""
    path = SHARED_DATA / relative
    if not path.exists():
        message = f"shared data file {path} is missing (set GPT2_SHARED_DATA to the shared/data folder)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def gpt2_bpe_dir() -> Path:
    """Folder with OpenAI's encoder.json and vocab.bpe."""
    shared_file("gpt2-bpe/encoder.json")
    return shared_file("gpt2-bpe/vocab.bpe").parent


@pytest.fixture
def tinyshakespeare() -> Path:
    return shared_file("corpora/tinyshakespeare.txt")


@pytest.fixture
def fixtures_dir() -> Path:
    return shared_file("fixtures/expected.json").parent


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Every test runs torch on one thread: the models are tiny (a second thread only waits on the other, often
    busy, core) and float reductions then run in one fixed order. Restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def perturbed_tiny_gpt():
    """gpt2-tiny over the byte tokenizer's 257 ids, every parameter perturbed (biases and LayerNorm gains are not
    the trivial 0 and 1), in eval mode, seeded: the model the patching, SAE and steering tests look into."""
    from gpt2.config import GPTConfig
    from gpt2.model import GPT

    torch.manual_seed(0)
    model = GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=257))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


@contextmanager
def headless_chromium(width: int = 1100, height: int = 900) -> Iterator[Any]:
    """A real browser for the playground's tests: Debian's chromium through selenium (skipped, saying how to install
    it, where chromedriver is missing)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    driver_path = shutil.which("chromedriver")
    if driver_path is None:
        pytest.skip("chromedriver is not installed (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()
