"""Fine-tuning a pretrained GPT-2: supervised data formats, LoRA, chat, sequence classification, memory planning."""
