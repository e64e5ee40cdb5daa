"""A whole activation-patching sweep: gpt2.inspect.patching against TransformerLens' own function, one run.

Both sweep the residual stream before every block at every position (`resid_pre`, n_layer x T cells) of one
prompt pair with the logit-difference metric, on the same random weights: ours on the GPT module, TransformerLens'
`transformer_lens.patching.get_act_patch_resid_pre` on its TransformerBridge over transformers' GPT2LMHeadModel
(eager attention) loaded from the same saved weights. The two tables are checked equal (1e-4) before any time
is reported. Figures: the median of --repeats sweeps of each, interleaved (TransformerLens' progress bar
goes to stderr).

    flock /tmp/bench.lock python benchmarks/inspect/patching.py                 # 124M shape, T=16
    flock /tmp/bench.lock python benchmarks/inspect/patching.py --site head --repeats 3 2>/dev/null
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from gpt2.config import GPTConfig
from gpt2.inspect.patching import activation_patching, logit_diff
from gpt2.model import GPT
from gpt2.weights import save_pretrained

THEIRS = {
    "resid_pre": "get_act_patch_resid_pre",
    "attn_out": "get_act_patch_attn_out",
    "mlp_out": "get_act_patch_mlp_out",
    "head": "get_act_patch_attn_head_out_all_pos",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="gpt2", help="model shape (default gpt2: 124M)")
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--site", default="resid_pre", choices=sorted(THEIRS))
    parser.add_argument("--repeats", type=int, default=1, help="timed sweeps of each (median reported)")
    args = parser.parse_args()

    import transformers
    from transformer_lens import patching
    from transformer_lens.model_bridge import TransformerBridge

    torch.manual_seed(0)
    config = GPTConfig.from_name(args.preset)
    model = GPT(config).eval()
    clean = torch.randint(0, config.vocab_size, (1, args.seq_len))
    corrupted = clean.clone()
    corrupted[0, args.seq_len // 2] = (clean[0, args.seq_len // 2] + 1) % config.vocab_size
    answer, wrong = 11, 22
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, Path(folder))
        hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        bridge = TransformerBridge.boot_transformers(folder, device="cpu", hf_model=hf)

    tables: dict[str, torch.Tensor] = {}

    def ours() -> torch.Tensor:
        return activation_patching(model, clean, corrupted, logit_diff(answer, wrong), args.site).values

    def theirs() -> torch.Tensor:
        with torch.no_grad():
            _, clean_cache = bridge.run_with_cache(clean)
            return getattr(patching, THEIRS[args.site])(
                bridge, corrupted, clean_cache, lambda logits: logits[0, -1, answer] - logits[0, -1, wrong]
            )

    ours()  # warm-up (allocator, first-call setup); TransformerLens' sweep is long enough to need none
    times: dict[str, list[float]] = {"ours": [], "transformer_lens": []}
    for _ in range(args.repeats):
        for name, fn in (("ours", ours), ("transformer_lens", theirs)):
            start = time.perf_counter()
            values = fn()
            times[name].append(time.perf_counter() - start)
            tables[name] = values
        torch.testing.assert_close(tables["ours"], tables["transformer_lens"].float(), atol=1e-4, rtol=0)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(
        f"# {args.preset}: {model.num_parameters() / 1e6:.0f}M parameters, T={args.seq_len}, site {args.site}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, {platform.processor() or platform.machine()}"
    )
    print(
        f"ours {median['ours']:.3f} s, TransformerLens {median['transformer_lens']:.3f} s, "
        f"ratio {median['ours'] / median['transformer_lens']:.3f}"
    )
    row = {"preset": args.preset, "seq_len": args.seq_len, "site": args.site, "threads": torch.get_num_threads()}
    print(json.dumps({**row, **{f"{name}_s": round(value, 3) for name, value in median.items()}}))


if __name__ == "__main__":
    main()
