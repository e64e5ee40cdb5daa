"""Generation speed at the GPT-2 124M shape on CPU: ours vs `transformers`, and the memory-bandwidth limit.

Random weights (no network), prompt of 32 tokens, 128 new tokens, greedy. For each batch size, each variant
runs once per repeat, interleaved (ours fp32 in the split layout of gpt2.inference.optimize_for_inference,
ours fp32 with plain nn.Linear, transformers fp32, ours bf16, ours int8), so the load other
processes put on the machine falls on all of them alike; the tables report each run and the ratios.

Limit: decoding one step reads every weight once (plus the KV cache), so tokens/s <= B * read bandwidth /
bytes read per step. Read bandwidth is measured here by timing the sum of a 512 MiB tensor (best of 5).
Times include the prefill of the prompt, as transformers' generate does.

Precision: the same random weights in bf16 and int8 (weight-only, bf16 activations) against fp32, on
tinyshakespeare tokens (GPT-2 BPE) when the shared data is there, else random tokens: mean and max |delta
log p(next token)| teacher-forced, top-1 agreement, and how many of 256 greedy tokens agree.

    python benchmarks/bench_generate.py --threads 1 --repeats 2
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
from gpt2.inference import optimize_for_inference, quantize_int8
from gpt2.inference.generation import generate
from gpt2.model import GPT
from gpt2.tokenizer import load_tokenizer
from gpt2.weights import load_model, save_pretrained

SEED = 0
BANDWIDTH_BYTES = 512 * 2**20  # far beyond any cache, so the sum streams from DRAM
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def read_bandwidth() -> float:
    """Bytes per second a sum over a large fp32 tensor reads (median of 7: on this VM single readings range
    from ~38 to ~78 GB/s, so the median is the honest figure and the spread is reported beside it)."""
    big = torch.ones(BANDWIDTH_BYTES // 4)
    big.sum()
    times = sorted(timed(lambda: big.sum()) for _ in range(7))
    return BANDWIDTH_BYTES / times[len(times) // 2]


@torch.no_grad()
def decode_step_seconds(model: GPT, batch_size: int, context: int, steps: int = 20) -> float:
    """Seconds of one cached decode step at `context` positions (no prefill, no sampling): the part of
    generation that reads every weight once per token."""
    cache = model.new_kv_cache(batch_size, max_len=context + steps + 4)
    prompt = torch.randint(
        0, model.config.vocab_size, (batch_size, context), generator=torch.Generator().manual_seed(SEED)
    )
    model(prompt, kv_cache=cache, validate=False)
    token = prompt[:, -1:]
    for _ in range(3):
        model(token, kv_cache=cache, validate=False)
    start = time.perf_counter()
    for _ in range(steps):
        model(token, kv_cache=cache, validate=False)
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
        ours_bf16 = load_model(directory).to(torch.bfloat16).eval()
        ours_int8 = quantize_int8(load_model(directory)).eval()
        ours_split = optimize_for_inference(load_model(directory))

    n_new, n_prompt = args.new_tokens, args.prompt_tokens
    context = n_prompt + n_new // 2
    results: dict = {"threads": args.threads, "bandwidth GB/s": [], "runs": {}}
    print(f"threads={args.threads} prompt={n_prompt} new={n_new}")
    for batch_size in args.batch_sizes:
        idx = torch.randint(
            0, ours.config.vocab_size, (batch_size, n_prompt), generator=torch.Generator().manual_seed(SEED)
        )
        outputs: dict[str, torch.Tensor] = {}
        variants: dict[str, Callable[[], torch.Tensor]] = {
            "ours fp32": lambda idx=idx: generate(ours_split, idx, n_new, temperature=0),
            "ours fp32 (plain nn.Linear)": lambda idx=idx: generate(ours, idx, n_new, temperature=0),
            "transformers fp32": lambda idx=idx: theirs.generate(
                idx,
                attention_mask=torch.ones_like(idx),
                do_sample=False,
                max_new_tokens=n_new,
                min_new_tokens=n_new,
                pad_token_id=50256,
            ),
            "ours bf16": lambda idx=idx: generate(ours_bf16, idx, n_new, temperature=0),
            "ours int8 (bf16 act.)": lambda idx=idx: generate(ours_int8, idx, n_new, temperature=0),
        }
        for name, fn in variants.items():  # warm-up (allocator, oneDNN kernels) and the outputs to compare
            outputs[name] = fn()
        runs = results["runs"].setdefault(f"B={batch_size}", {name: [] for name in variants})
        for repeat in range(args.repeats):
            results["bandwidth GB/s"].append(read_bandwidth() / 1e9)
            for name, fn in variants.items():
                tokens_per_s = batch_size * n_new / timed(fn)
                runs[name].append(tokens_per_s)
                print(f"B={batch_size} repeat {repeat}: {name:24s} {tokens_per_s:8.1f} tokens/s", flush=True)
        results.setdefault("greedy identical to transformers", {})[f"B={batch_size}"] = bool(
            torch.equal(outputs["ours fp32"], outputs["transformers fp32"])
        )

    bandwidth = sorted(results["bandwidth GB/s"])[len(results["bandwidth GB/s"]) // 2] * 1e9
    models = {"ours fp32": ours_split, "ours bf16": ours_bf16, "ours int8 (bf16 act.)": ours_int8}
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
            model = models.get(name, ours)
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
        for name, model in {"ours fp32": ours_split, "ours fp32 (plain nn.Linear)": ours, **models}.items():
            seconds = decode_step_seconds(model, batch_size, context)
            achieved = bytes_per_step(model, batch_size, context) / seconds
            results.setdefault("decode step ms", {})[f"B={batch_size} {name}"] = seconds * 1e3
            print(
                f"| {batch_size} | {name} | {seconds * 1e3:.1f} | {batch_size / seconds:.1f} | "
                f"{achieved / 1e9:.1f} | {achieved / bandwidth:.0%} |"
            )

    if not args.skip_precision:
        tokens, source = evaluation_tokens(args.eval_tokens, ours.config.vocab_size)
        report = precision_report(ours, {"bf16": ours_bf16, "int8": ours_int8}, tokens, args.greedy_tokens)
        results["precision"] = {"tokens": source, "count": tokens.size(1), **report}
        print(f"\nprecision vs fp32 on {tokens.size(1)} {source} tokens (random weights):")
        print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
