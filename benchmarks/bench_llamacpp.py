"""llama.cpp runs our GGUF export as our own model runs: same prompt ids, same greedy tokens, near-equal logits.

Opt-in: needs llama.cpp's Python binding, built from source (a few tens of minutes on 2 cores):

    CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="-DLLAVA_BUILD=OFF" pip install llama-cpp-python
    flock /tmp/bench.lock python benchmarks/bench_llamacpp.py            # f32 f16 bf16 q8_0
    flock /tmp/bench.lock python benchmarks/bench_llamacpp.py --install  # runs (and times) the pip line first

On the gguf-tiny fixture (a 2-layer GPT-2 with the real 50257-token vocabulary; shared/data/fixtures/gguf-tiny):
export it with `gpt2.export.export_gguf` at each dtype, load it with `llama_cpp.Llama`, and check that

  * llama.cpp's tokenizer gives the prompt the ids ours gives;
  * greedy decoding (argmax, no sampler) gives the same NEW_TOKENS tokens as our model, and for f32 the text the
    fixture's README recorded from llama.cpp's own converter + `llama-completion`;
  * the logits at every position agree: the largest |difference| is printed (f32 should be ~1e-5; the half and
    8-bit formats show their rounding).

Exit status 1 when a check fails, 2 when llama_cpp is not installed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gpt2.export import export_gguf
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import load_model

SHARED_DATA = Path(os.environ.get("GPT2_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
FIXTURE = SHARED_DATA / "fixtures" / "gguf-tiny"
PROMPT = "The quick brown fox"
NEW_TOKENS = 12
# What llama.cpp printed for the converter's files (fixtures/gguf-tiny/README.md), prompt included.
RECORDED_TEXT = "The quick brown fox Asset Asset Frey-(isitionisitionisitionisitionisitionisitionisitionisition"
DTYPES = ("f32", "f16", "bf16", "q8_0")
# Greedy tokens may part ways where two logits are closer than a format's rounding; f32 must match exactly.
EXACT_DTYPES = ("f32",)


def install() -> float:
    """pip install llama-cpp-python (a source build); returns the seconds it took."""
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.setdefault("CMAKE_ARGS", "-DLLAVA_BUILD=OFF")  # the multimodal library: not needed here, long to build
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "llama-cpp-python"], env=env, check=True)
    return time.perf_counter() - started


@torch.no_grad()
def our_greedy(model: GPT, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """(new ids, logits (len(ids) + steps - 1, V)) of plain argmax decoding with the full forward each step."""
    tokens = list(ids)
    for _ in range(steps):
        logits = model(torch.tensor([tokens])).logits[0]  # (T, V)
        tokens.append(int(logits[-1].argmax()))
    return tokens[len(ids) :], logits.float().numpy()


def llamacpp_greedy(llama, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """The same with llama.cpp: evaluate the prompt, then one token at a time, taking the argmax."""
    llama.reset()
    llama.eval(ids)
    new: list[int] = []
    for _ in range(steps):
        new.append(int(np.argmax(llama.scores[llama.n_tokens - 1])))
        if len(new) < steps:
            llama.eval([new[-1]])
    return new, np.array(llama.scores[: llama.n_tokens])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--install", action="store_true", help="pip install llama-cpp-python first (slow)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.install:
        print(f"built and installed llama-cpp-python in {install():.0f} s")
    try:
        import llama_cpp
    except ModuleNotFoundError:
        print("llama_cpp is not installed; see this script's docstring (or pass --install)", file=sys.stderr)
        return 2

    torch.set_num_threads(args.threads)
    model = load_model(FIXTURE / "hf")
    tokenizer = load_tokenizer(FIXTURE / "hf")
    prompt_ids = tokenizer.encode(PROMPT)
    ours, our_logits = our_greedy(model, prompt_ids, NEW_TOKENS)
    text = PROMPT + tokenizer.decode(ours)
    print(f"llama_cpp {llama_cpp.__version__}; prompt {PROMPT!r} -> {prompt_ids}")
    print(f"ours: {ours}  {text!r}  (recorded llama.cpp text: {'same' if text == RECORDED_TEXT else 'DIFFERENT'})")
    failures = [] if text == RECORDED_TEXT else ["our greedy text differs from the recorded llama.cpp output"]
    with tempfile.TemporaryDirectory() as folder:
        for dtype in args.dtypes:
            path = export_gguf(model, tokenizer, Path(folder) / f"tiny-{dtype}.gguf", dtype=dtype)
            llama = llama_cpp.Llama(
                model_path=str(path), n_ctx=64, n_batch=64, n_threads=args.threads, logits_all=True, verbose=False
            )
            their_prompt = llama.tokenize(PROMPT.encode(), add_bos=False, special=False)
            theirs, their_logits = llamacpp_greedy(llama, their_prompt, NEW_TOKENS)
            worst = float(np.abs(their_logits - our_logits).max())
            same = theirs == ours
            print(
                f"{dtype:5s} prompt ids {'same' if their_prompt == prompt_ids else their_prompt}; greedy "
                f"{'same' if same else theirs}; max |logit difference| {worst:.2e}; {path.stat().st_size:,} bytes"
            )
            if their_prompt != prompt_ids:
                failures.append(f"{dtype}: llama.cpp tokenizes the prompt differently")
            if not same and dtype in EXACT_DTYPES:
                failures.append(f"{dtype}: greedy tokens differ")
            del llama  # frees the model before the next one loads
    for failure in failures:
        print("FAIL:", failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
