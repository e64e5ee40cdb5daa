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
  * the logits at every position agree: the largest |difference| is printed. Even the f32 file differs by ~1e-3
    (with the KV cache in f32): llama.cpp's CPU GELU rounds its input to f16 and looks the result up in an f16
    table (ggml-cpu/vec.h, GGML_GELU_FP16). The half and 8-bit formats add their own rounding.

Measured on the 2-core dev VM (llama-cpp-python 0.3.36, built in 322 s): all four dtypes give the prompt ids and
the 12 greedy tokens ours give (= the text recorded above); max |logit difference| f32 7.4e-4, f16 2.5e-3,
bf16 1.4e-2, q8_0 5.9e-2.

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
GGML_TYPE_F32 = 0  # for the KV cache (llama.cpp's default is f16, which alone moves the logits by ~1e-3)
# Greedy tokens may part ways where two logits are closer than a format's rounding; f32 must match exactly.
EXACT_DTYPES = ("f32",)


def install() -> float:
    """pip install llama-cpp-python (a source build); returns the seconds it took."""
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    env.setdefault("CMAKE_ARGS", "-DLLAVA_BUILD=OFF")  # the multimodal library: not needed here, long to build
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "pip", "install", "llama-cpp-python"], env=env, check=True)
    return time.perf_counter() - started


def without_weight_repacking(llama_cpp) -> None:
    """Make `llama_cpp.Llama` load weights with use_extra_bufts=False (llama.cpp's --no-repack). On a CPU with AMX
    (this machine's Xeon) llama.cpp 0.3.36's repacked q8_0 path segfaults in decode on this tiny model, for
    llama.cpp's own converter output as for ours; the plain CPU kernels run both."""
    low_level = llama_cpp.llama_cpp
    default_params = low_level.llama_model_default_params

    def params_without_extra_buffers():
        params = default_params()
        params.use_extra_bufts = False
        return params

    low_level.llama_model_default_params = params_without_extra_buffers


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
    parser.add_argument(
        "--extra-buffers", action="store_true",
        help="let llama.cpp repack weights into its CPU 'extra' buffers (AMX/repack; segfaults on q8_0 here)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.install:
        print(f"built and installed llama-cpp-python in {install():.0f} s")
    try:
        import llama_cpp
    except ModuleNotFoundError:
        print("llama_cpp is not installed; see this script's docstring (or pass --install)", file=sys.stderr)
        return 2

    if not args.extra_buffers:
        without_weight_repacking(llama_cpp)
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
                model_path=str(path), n_ctx=64, n_batch=64, n_threads=args.threads, logits_all=True, verbose=False,
                type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32,
            )  # fmt: skip
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
