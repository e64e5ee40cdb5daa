"""Checkpoint formats: HF (read and written), llm.c and OpenAI's TensorFlow release (read); `load_model` picks
the right reader. hub.py is the only module of the package that reaches the network."""

from gpt2.weights.hf import (
    config_from_hf,
    config_to_hf,
    hf_state_dict,
    load_hf,
    load_hf_state_dict,
    read_hf_state_dict,
    save_pretrained,
)
from gpt2.weights.llmc import load_llmc
from gpt2.weights.load import load_model
from gpt2.weights.openai_tf import load_openai_tf, read_tf_checkpoint, tf_name_to_hf

__all__ = [
    "config_from_hf",
    "config_to_hf",
    "hf_state_dict",
    "load_hf",
    "load_hf_state_dict",
    "load_llmc",
    "load_model",
    "load_openai_tf",
    "read_hf_state_dict",
    "read_tf_checkpoint",
    "save_pretrained",
    "tf_name_to_hf",
]
