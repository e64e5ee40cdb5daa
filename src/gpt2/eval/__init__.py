"""Evaluation: perplexity, HellaSwag, LAMBADA."""

from gpt2.eval.core import *  # noqa: F403
