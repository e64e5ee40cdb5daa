"""Fine-tuning a pretrained GPT-2: data formats with loss masks, chat sessions in the chat template
(`gpt2.tokenizer.chat`), LoRA adapters (PEFT's format), and the run that ties them to the Trainer."""

from gpt2.finetune.chat import ChatSession
from gpt2.finetune.config import FinetuneConfig
from gpt2.finetune.data import Example, RowBatches, Rows, load_examples, make_rows, split_rows
from gpt2.finetune.lora import (
    LoRAConfig,
    LoRALinear,
    add_lora,
    apply_adapter,
    load_adapter,
    lora_state_dict,
    merge_lora,
    save_adapter,
)
from gpt2.finetune.run import FinetuneResult, finetune
from gpt2.weights.adapters import read_adapter_config

__all__ = [
    "ChatSession", "Example", "FinetuneConfig", "FinetuneResult", "LoRAConfig", "LoRALinear", "RowBatches", "Rows",
    "add_lora", "apply_adapter", "finetune", "load_adapter", "load_examples", "lora_state_dict", "make_rows",
    "merge_lora", "read_adapter_config", "save_adapter", "split_rows",
]  # fmt: skip
