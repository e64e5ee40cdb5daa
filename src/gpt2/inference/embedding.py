"""Text embeddings from a GPT-2: the final LayerNorm's output at each text's last token, L2-normalized.

Last-token pooling, as llama-server's `--pooling last`: in a causal model only the last position has read the
whole text (a mean would weigh the first tokens, which saw almost nothing, as much as the last). The vector has the
model's width (n_embd: 768 for GPT-2 small) and unit length, so a dot product is the cosine similarity, as with
OpenAI's embeddings. GPT-2 was not trained for embeddings: these serve clients that need the endpoint, and
similarity search at the quality a language model's states give.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gpt2.model import GPT


def embed(model: GPT, texts: Sequence[Sequence[int]]) -> torch.Tensor:
    """(N, C) float32 unit vectors, one per token-id sequence (each run alone, so padding never enters).

    >>> from gpt2 import GPT, GPTConfig
    >>> embed(GPT(GPTConfig.from_name("gpt2-tiny", vocab_size=50257)), [[464, 3797], [50256]]).shape[0]
    2
    """
    if not texts or any(len(ids) == 0 for ids in texts):
        raise ValueError("every input must hold at least one token")
    device = next(model.parameters()).device
    pooled = []
    with torch.inference_mode():
        for ids in texts:
            idx = torch.tensor([list(ids)], dtype=torch.long, device=device)  # (1, T)
            hidden = model.hidden_states(idx)  # (1, T, C)
            pooled.append(hidden[0, -1].float())
    return F.normalize(torch.stack(pooled), dim=-1).cpu()  # (N, C)
