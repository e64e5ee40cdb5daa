"""The files a Hugging Face runtime reads beside a model: config.json, generation_config.json, tokenizer.json and
tokenizer_config.json, the layout transformers.js (`AutoTokenizer`, `AutoModelForCausalLM`) and Optimum expect in a
model folder. tokenizer.json is built with the `tokenizers` library itself (GPT-2's byte-level BPE: no prefix
space, byte-level decoder, special tokens as added tokens), so it is that library's own file, not a copy of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpt2.config import GPTConfig
from gpt2.runtime.files import atomic_write_text
from gpt2.tokenizer import Tokenizer
from gpt2.tokenizer.protocol import TextTokenizer
from gpt2.weights import config_to_hf


def write_hf_runtime_files(directory: Path, config: GPTConfig, tokenizer: TextTokenizer) -> list[Path]:
    """Write the tokenizer's own files (`tokenizer.save`) and, for byte-level BPE, tokenizer.json +
    tokenizer_config.json; then config.json and generation_config.json. Returns the paths written besides
    the tokenizer's own files. A byte tokenizer has no tokenizer.json form: its byte_tokenizer.json is written."""
    tokenizer.save(directory)
    written: list[Path] = []
    eot_text = tokenizer.decode([tokenizer.eot_token])
    if isinstance(tokenizer, Tokenizer):
        written.append(_write_json(directory / "tokenizer.json", tokenizer_json(tokenizer)))
        tokenizer_config = {
            "tokenizer_class": "GPT2Tokenizer",
            "model_max_length": config.block_size,
            "add_prefix_space": False,
            "bos_token": eot_text,
            "eos_token": eot_text,
            "unk_token": eot_text,
        }
        written.append(_write_json(directory / "tokenizer_config.json", tokenizer_config))
    hf_config = config_to_hf(config) | {"bos_token_id": tokenizer.eot_token, "eos_token_id": tokenizer.eot_token}
    written.append(_write_json(directory / "config.json", hf_config))
    generation = {"bos_token_id": tokenizer.eot_token, "eos_token_id": tokenizer.eot_token}
    written.append(_write_json(directory / "generation_config.json", generation))
    return written


def tokenizer_json(tokenizer: Tokenizer) -> dict[str, Any]:
    """tokenizer.json for `tokenizer`, as the `tokenizers` library serializes GPT-2's byte-level BPE."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    hf = HFTokenizer(models.BPE(vocab=tokenizer.vocab, merges=tokenizer.merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.post_processor = processors.ByteLevel(trim_offsets=False)
    hf.add_special_tokens([AddedToken(text, special=True) for text in sorted(tokenizer.special_tokens)])
    data: dict[str, Any] = json.loads(hf.to_str())
    return data


def _write_json(path: Path, data: dict[str, Any]) -> Path:
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    return path
