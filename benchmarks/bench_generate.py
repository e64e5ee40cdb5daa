"""Generation speed at the GPT-2 124M shape on CPU: ours vs `transformers`, and the memory-bandwidth limit.

Random weights (no network), prompt of 32 tokens, 128 new tokens, greedy. For each batch size, each variant
runs once per repeat, interleaved, so the load other processes put on the machine falls on all of them alike;
the tables report each run and the ratios. Variants: ours at each precision as `gpt2 sample --dtype X` runs it
(`prepare_for_inference`, native decode steps where the kernels build), ours fp32 on the PyTorch path (the split
layout, `native=False`: what runs without the kernels), and transformers fp32.

Limit: decoding one step reads every weight once (plus the KV cache), so tokens/s <= B * read bandwidth /
bytes read per step. Read bandwidth: the fastest streaming read measured here (`read_bandwidth`). Times include
the prefill of the prompt, as transformers' generate does.

Precision: the same random weights at bfloat16, int8 and int4 as shipped against fp32, on tinyshakespeare tokens
(GPT-2 BPE) when the shared data is there, else random tokens: mean and max |delta log p(next token)|
teacher-forced, top-1 agreement, and how many of 256 greedy tokens agree.

    python benchmarks/bench_generate.py --threads 2 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from gpt2.config import GPTConfig
from gpt2.cpu import optimize_for_inference, prepare_for_inference
from gpt2.cpu.decoder import native_decoder
from gpt2.cpu.kernels import KIND, kernels_available, native_linear
from gpt2.inference.generation import generate
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import load_model, save_pretrained

SEED = 0
BANDWIDTH_BYTES = 512 * 2**20  # far beyond any cache, so the sum streams from DRAM
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def read_bandwidth() -> float:
    """Bytes per second the fastest streaming read here reaches (median of 7 each): a sum over a large fp32
    tensor, and, where the native kernels build, their one-row product with a large fp32 matrix (which streams
    faster than torch's sum on some machines; a rate the memory reached is a floor of what it can do)."""
    big = torch.ones(BANDWIDTH_BYTES // 4)
    readers = [lambda: big.sum()]
    if kernels_available():
        matrix, row = big.view(-1, 1024), torch.ones(1, 1024)
        readers.append(lambda: native_linear(row, matrix, None, None, KIND["float32"], matrix.shape[0]))
    rates = []
    for read in readers:
        read()
        times = sorted(timed(read) for _ in range(7))
        rates.append(BANDWIDTH_BYTES / times[len(times) // 2])
    return max(rates)


@torch.no_grad()
def decode_step_seconds(model: GPT, batch_size: int, context: int, *, native: bool, steps: int = 20) -> float:
    """Seconds of one cached decode step at `context` positions (no prefill, no sampling): the part of
    generation that reads every weight once per token. native: through the native decoder, as generation runs
    it where it can; else the model's forward."""
    cache = model.new_kv_cache(batch_size, max_len=context + steps + 4)
    prompt = torch.randint(
        0, model.config.vocab_size, (batch_size, context), generator=torch.Generator().manual_seed(SEED)
    )
    model(prompt, kv_cache=cache, validate=False)
    decoder = native_decoder(model) if native else None
    token = prompt[:, -1:]

    def step() -> None:
        if decoder is not None:
            decoder.step(token[:, 0], cache)
        else:
            model(token, kv_cache=cache, validate=False)

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bytes_per_step(model: torch.nn.Module, batch_size: int, context: int) -> int:
    """Bytes one decode step reads: every parameter and buffer once, except the position table and the
    embedding rows (a lookup reads B rows, not the table; the tied LM head is counted through lm_head),
    plus the KV cache at the mean context length."""
    total = 0
    seen: set[int] = set()
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if id(tensor) in seen or name.startswith(("transformer.wpe", "transformer.wte")):
            continue
        seen.add(id(tensor))
        total += tensor.numel() * tensor.element_size()
    if isinstance(model.lm_head, torch.nn.Linear):  # tied: the head reads wte, skipped above
        total += model.transformer.wte.weight.numel() * model.transformer.wte.weight.element_size()
    config = model.config
    kv_dtype_size = model.transformer.wte.weight.element_size()
    total += 2 * config.n_layer * batch_size * context * config.n_embd * kv_dtype_size
    return total


def evaluation_tokens(count: int, vocab_size: int) -> tuple[torch.Tensor, str]:
    text_path, bpe_dir = SHARED_DATA / "corpora" / "tinyshakespeare.txt", SHARED_DATA / "gpt2-bpe"
    if text_path.is_file() and bpe_dir.is_dir():
        ids = load_tokenizer(bpe_dir).encode(text_path.read_text()[:20000])[:count]
        return torch.tensor([ids]), "tinyshakespeare (GPT-2 BPE)"
    return torch.randint(0, vocab_size, (1, count), generator=torch.Generator().manual_seed(SEED)), "random tokens"


@torch.no_grad()
def precision_report(reference: GPT, variants: dict[str, GPT], tokens: torch.Tensor, greedy_tokens: int) -> dict:
    logp_ref = F.log_softmax(reference(tokens).logits.float(), dim=-1)  # (1, T, V)
    targets = tokens[:, 1:]
    chosen_ref = logp_ref[:, :-1].gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    greedy_ref = generate(reference, tokens[:, :32], greedy_tokens, temperature=0)[0, 32:]
    report = {"fp32 perplexity": math.exp(-chosen_ref.mean().item())}
    for name, model in variants.items():
        logp = F.log_softmax(model(tokens).logits.float(), dim=-1)
        chosen = logp[:, :-1].gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        delta = (chosen - chosen_ref).abs()
        greedy = generate(model, tokens[:, :32], greedy_tokens, temperature=0)[0, 32:]
        same = (greedy == greedy_ref).tolist()
        report[name] = {
            "mean |dlogp|": delta.mean().item(),
            "max |dlogp|": delta.max().item(),
            "perplexity": math.exp(-chosen.mean().item()),
            "top-1 agreement": (logp.argmax(-1) == logp_ref.argmax(-1)).float().mean().item(),
            "greedy tokens equal": sum(same),
            "greedy first divergence": same.index(False) if False in same else len(same),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--eval-tokens", type=int, default=1024)
    parser.add_argument("--greedy-tokens", type=int, default=256)
    parser.add_argument("--skip-precision", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from transformers import GPT2LMHeadModel

    torch.manual_seed(SEED)
    ours = GPT(GPTConfig.from_name("gpt2")).eval()
    with tempfile.TemporaryDirectory() as directory:
        save_pretrained(ours, directory)
        theirs = GPT2LMHeadModel.from_pretrained(directory).eval()
        # ours as `gpt2 sample --dtype X` runs it; "PyTorch path": without the native kernels (split layout)
        shipped = {p: prepare_for_inference(load_model(directory), p) for p in ("float32", "bfloat16", "int8", "int4")}
        pytorch_path = optimize_for_inference(load_model(directory))
    models = {
        "ours fp32": shipped["float32"],
        "ours fp32, PyTorch path": pytorch_path,
        "ours bf16": shipped["bfloat16"],
        "ours int8": shipped["int8"],
        "ours int4": shipped["int4"],
    }

    n_new, n_prompt = args.new_tokens, args.prompt_tokens
    context = n_prompt + n_new // 2
    results: dict = {"threads": args.threads, "native kernels": kernels_available(), "bandwidth GB/s": [], "runs": {}}
    print(f"threads={args.threads} prompt={n_prompt} new={n_new} native kernels={kernels_available()}")
    for batch_size in args.batch_sizes:
        idx = torch.randint(
            0, ours.config.vocab_size, (batch_size, n_prompt), generator=torch.Generator().manual_seed(SEED)
        )
        outputs: dict[str, torch.Tensor] = {}

        def ours_generate(model: GPT, idx: torch.Tensor = idx) -> torch.Tensor:
            return generate(model, idx, n_new, temperature=0, native=None if model is not pytorch_path else False)

        variants: dict[str, Callable[[], torch.Tensor]] = {
            name: (lambda model=model: ours_generate(model)) for name, model in models.items()
        }
        variants["transformers fp32"] = lambda idx=idx: theirs.generate(
            idx,
            attention_mask=torch.ones_like(idx),
            do_sample=False,
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            pad_token_id=50256,
        )
        for name, fn in variants.items():  # warm-up (allocator, oneDNN kernels) and the outputs to compare
            outputs[name] = fn()
        runs = results["runs"].setdefault(f"B={batch_size}", {name: [] for name in variants})
        for repeat in range(args.repeats):
            results["bandwidth GB/s"].append(read_bandwidth() / 1e9)
            for name, fn in variants.items():
                tokens_per_s = batch_size * n_new / timed(fn)
                runs[name].append(tokens_per_s)
                print(f"B={batch_size} repeat {repeat}: {name:24s} {tokens_per_s:8.1f} tokens/s", flush=True)
        results.setdefault("greedy identical to transformers", {})[f"B={batch_size}"] = {
            name: bool(torch.equal(outputs[name], outputs["transformers fp32"]))
            for name in ("ours fp32", "ours fp32, PyTorch path")
        }

    bandwidth = sorted(results["bandwidth GB/s"])[len(results["bandwidth GB/s"]) // 2] * 1e9
    print(
        f"\nread bandwidth (median): {bandwidth / 1e9:.1f} GB/s; all: "
        f"{', '.join(f'{b:.1f}' for b in results['bandwidth GB/s'])}"
    )
    print(
        "\n| batch | variant | tokens/s (runs) | vs transformers fp32 (per repeat) | MB read/step | limit tokens/s "
        "| of limit |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch_key, runs in results["runs"].items():
        batch_size = int(batch_key[2:])
        for name, values in runs.items():
            ratios = [v / t for v, t in zip(values, runs["transformers fp32"], strict=False)]
            model = models.get(name, ours)  # transformers: the same bytes as ours in fp32
            step_bytes = bytes_per_step(model, batch_size, context)
            limit = batch_size * bandwidth / step_bytes
            print(
                f"| {batch_size} | {name} | {' / '.join(f'{v:.1f}' for v in values)} | "
                f"{' / '.join(f'{r:.2f}x' for r in ratios)} | {step_bytes / 1e6:.0f} | {limit:.1f} | "
                f"{max(values) / limit:.0%} |"
            )
    print(f"\ngreedy output identical to transformers: {results['greedy identical to transformers']}")

    print("\ndecode step alone (cached, no prefill or sampling), at the mean context length:")
    print("| batch | variant | ms/step | tokens/s | GB/s read | of bandwidth |")
    print("|---|---|---|---|---|---|")
    for batch_size in args.batch_sizes:
        for name, model in models.items():
            seconds = decode_step_seconds(model, batch_size, context, native=model is not pytorch_path)
            achieved = bytes_per_step(model, batch_size, context) / seconds
            results.setdefault("decode step ms", {})[f"B={batch_size} {name}"] = seconds * 1e3
            print(
                f"| {batch_size} | {name} | {seconds * 1e3:.1f} | {batch_size / seconds:.1f} | "
                f"{achieved / 1e9:.1f} | {achieved / bandwidth:.0%} |"
            )

    if not args.skip_precision:
        tokens, source = evaluation_tokens(args.eval_tokens, ours.config.vocab_size)
        variants_of_precision = {p: shipped[p] for p in ("bfloat16", "int8", "int4")}
        report = precision_report(ours, variants_of_precision, tokens, args.greedy_tokens)
        results["precision"] = {"tokens": source, "count": tokens.size(1), **report}
        print(f"\nprecision vs fp32 on {tokens.size(1)} {source} tokens (random weights):")
        print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
