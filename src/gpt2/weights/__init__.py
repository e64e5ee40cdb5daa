"""Checkpoint formats (HF, llm.c, OpenAI TF) read and written; the Hub is the only network access (hub.py)."""

from gpt2.weights.core import *  # noqa: F403
