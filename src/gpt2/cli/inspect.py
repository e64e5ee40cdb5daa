"""`gpt2 inspect attention | logit-lens | patch | sae`: what a model does with a prompt (gpt2.inspect).

    gpt2 inspect attention --model out/run1 --prompt "The cat sat on the mat" --layer 3 --out att.png
    gpt2 inspect attention --model gpt2 --prompt "When Mary and John went to the store" --out att.html
    gpt2 inspect logit-lens --model gpt2 --prompt "The Eiffel Tower is in the city of" --out lens.png
    gpt2 inspect patch --model gpt2 --clean "When John and Mary went to the shops, John gave the bag to" \
        --corrupt "When John and Mary went to the shops, Mary gave the bag to" --answer " Mary" --wrong " John" \
        --out patch.png
    gpt2 inspect sae --model gpt2 --sae saes/blocks.8.hook_resid_pre --prompt "The cat sat" --out features.html

attention: a heatmap per head (queries down, keys across) with the tokens as labels; every layer and head
unless --layer / --head pick one. `.png` is a static figure; `.html` one self-contained interactive page (no
network needed to open it). logit-lens: the top next token at every layer and position, as a `.png` table.
patch: activation patching (gpt2.inspect.patching): the answer's logit minus the wrong one's in the corrupted
run with one activation (--site: resid_pre, attn_out or mlp_out at one layer and position, or one head's output
at every position) taken from the clean run; `.json`, `.png` or `.html`. sae: a sparse autoencoder in SAELens'
format (a folder, or a Hub folder owner/repo/path) at its hook: the top features per token, the reconstruction
MSE and the loss with the SAE spliced in; `.json` (NaN or infinity written as null) or `.html`. An SAE is checked
to fit the model (its hook exists, its width is the model's there) before anything runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from gpt2.cli.common import add_model_arguments


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="a model's internals: attention, logit-lens, patch (activation patching), sae",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    views = parser.add_subparsers(dest="view", metavar="VIEW", required=True)

    common = argparse.ArgumentParser(add_help=False)
    add_model_arguments(common)
    common.add_argument("--prompt", required=True, help="the text to look at")
    common.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda', ...")

    attention = views.add_parser(
        "attention",
        parents=[common],
        help="attention heatmaps per head, as .png or interactive .html",
        description="A heatmap per head of --prompt's attention (queries down, keys across, the tokens as labels), "
        "every layer and head unless --layer / --head pick one: a static .png or one self-contained interactive "
        ".html page.",
    )
    attention.add_argument("--layer", type=int, help="only this layer (default: all)")
    attention.add_argument("--head", type=int, help="only this head (default: all)")
    attention.add_argument("--out", required=True, help="FILE.png or FILE.html")
    attention.set_defaults(func=run_attention)

    lens = views.add_parser(
        "logit-lens",
        parents=[common],
        help="top next token per layer and position, as .png",
        description="The logit lens of --prompt: the residual stream after the embeddings and after each block, "
        "read through the final LayerNorm and the unembedding; a .png table of the top next token per layer and "
        "position.",
    )
    lens.add_argument("--out", required=True, help="FILE.png")
    lens.set_defaults(func=run_logit_lens)

    patch = views.add_parser(
        "patch",
        help="activation patching: which activations carry a prompt's answer",
        description="Activation patching: the logit of --answer minus that of --wrong in the run of --corrupt, with "
        "one activation at a time (--site at one layer and position, or one head) taken from the run of --clean. "
        "The two prompts have the same number of tokens; --answer and --wrong are one token each and differ.",
    )
    add_model_arguments(patch)
    patch.add_argument("--device", default="auto", help="'auto' (cuda when available), 'cpu', 'cuda', ...")
    patch.add_argument("--clean", required=True, help="the prompt that gives the answer")
    patch.add_argument("--corrupt", required=True, help="a prompt of the same token count that does not")
    patch.add_argument("--answer", required=True, help="the clean prompt's next token (one token, e.g. ' Mary')")
    patch.add_argument("--wrong", required=True, help="the corrupted prompt's next token (one token)")
    patch.add_argument("--site", default="resid_pre", choices=("resid_pre", "attn_out", "mlp_out", "head"))
    patch.add_argument("--out", required=True, help="FILE.json, FILE.png or FILE.html")
    patch.set_defaults(func=run_patch)

    sae = views.add_parser(
        "sae",
        parents=[common],
        help="a sparse autoencoder's top features per token",
        description="A sparse autoencoder (SAELens' format: a folder, or owner/repo/path on the Hub) at its hook: the "
        "top features per token of --prompt, the reconstruction MSE and the loss with the SAE spliced in. .json "
        "(a value that is NaN or infinite, as from an SAE whose activations overflow, is written as null) or .html.",
    )
    sae.add_argument(
        "--sae", required=True, help="SAELens folder (cfg.json, sae_weights.safetensors) or owner/repo/path"
    )
    sae.add_argument("--out", required=True, help="FILE.json or FILE.html")
    sae.set_defaults(func=run_sae)


def run_attention(args: argparse.Namespace) -> int:
    from gpt2.inspect.pictures import attention_picture

    llm = _load(args)
    path = attention_picture(llm.model, llm.tokenizer, args.prompt, args.out, layer=args.layer, head=args.head)
    print(f"wrote {path}")
    return 0


def run_logit_lens(args: argparse.Namespace) -> int:
    from gpt2.inspect.pictures import logit_lens_picture

    llm = _load(args)
    path = logit_lens_picture(llm.model, llm.tokenizer, args.prompt, args.out)
    print(f"wrote {path}")
    return 0


def run_patch(args: argparse.Namespace) -> int:
    from gpt2.inspect.pictures import patching_picture

    llm = _load(args)
    prompts, answers = (args.clean, args.corrupt), (args.answer, args.wrong)
    path = patching_picture(llm.model, llm.tokenizer, prompts, answers, args.out, site=args.site)
    print(f"wrote {path}")
    return 0


def run_sae(args: argparse.Namespace) -> int:
    from gpt2.inspect.pictures import sae_features_file
    from gpt2.inspect.sae import load_sae

    llm = _load(args)
    sae = load_sae(args.sae, llm.model.config).to(llm.device)
    path = sae_features_file(llm.model, llm.tokenizer, sae, args.prompt, args.out)
    print(f"wrote {path}")
    return 0


def _load(args: argparse.Namespace) -> Any:
    from gpt2.api import LLM

    return LLM.load(args.model, tokenizer=args.tokenizer, device=args.device)
