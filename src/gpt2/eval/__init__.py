"""Evaluation as a Python API: perplexity / bits per byte of a text or prepared split, HellaSwag and LAMBADA.

One idea throughout: run the model over token rows and add up the cross-entropy of the positions that count.
Every evaluation switches the model to eval mode under `torch.no_grad()` and restores its previous mode, so
the training loop can call them on a model in train mode.

- `perplexity`: sliding windows over a token stream; `perplexity_of_text`, `perplexity_of_split` and
  `evaluate_perplexity` (a text file or a prepared folder) on top, with bits per byte.
- `scoring`: continuation log-likelihoods, texts encoded as lm-evaluation-harness does (`encode_pair`).
- `hellaswag`, `lambada`: the two tasks; `choice`: a multiple-choice JSONL file of your own.
- `fewshot`: k solved examples in front of each question, drawn and joined as lm-evaluation-harness does.
- `files`: the public evaluation files (fetched once into a cache folder, sha256-checked) and JSONL reading.
- `common`: eval mode, device, progress bar.
"""

from gpt2.eval.choice import evaluate_choice, read_choice_records
from gpt2.eval.common import DEFAULT_BATCH_SIZE, evaluation_mode
from gpt2.eval.fewshot import FEWSHOT_SEED, FewShot, FewShotSampler, fewshot_contexts
from gpt2.eval.files import CACHE_ENV, DATASETS, RemoteFile, default_cache_dir, fetch_dataset
from gpt2.eval.hellaswag import (
    HELLASWAG_NUM_ENDINGS,
    HELLASWAG_STYLES,
    HellaSwagStyle,
    MultipleChoiceExample,
    evaluate_hellaswag,
    parse_hellaswag_record,
    read_hellaswag,
)
from gpt2.eval.lambada import evaluate_lambada, parse_lambada_record, read_lambada
from gpt2.eval.perplexity import (
    PerplexityResult,
    Window,
    count_bytes,
    evaluate_perplexity,
    perplexity,
    perplexity_of_split,
    perplexity_of_text,
    sliding_windows,
    token_byte_lengths,
)
from gpt2.eval.scoring import ContinuationScore, encode_pair, score_continuations, score_texts

__all__ = [
    "CACHE_ENV",
    "DATASETS",
    "DEFAULT_BATCH_SIZE",
    "FEWSHOT_SEED",
    "HELLASWAG_NUM_ENDINGS",
    "HELLASWAG_STYLES",
    "ContinuationScore",
    "FewShot",
    "FewShotSampler",
    "HellaSwagStyle",
    "MultipleChoiceExample",
    "PerplexityResult",
    "RemoteFile",
    "Window",
    "count_bytes",
    "default_cache_dir",
    "encode_pair",
    "evaluate_choice",
    "evaluate_hellaswag",
    "evaluate_lambada",
    "evaluate_perplexity",
    "evaluation_mode",
    "fetch_dataset",
    "fewshot_contexts",
    "parse_hellaswag_record",
    "parse_lambada_record",
    "perplexity",
    "perplexity_of_split",
    "perplexity_of_text",
    "read_choice_records",
    "read_hellaswag",
    "read_lambada",
    "score_continuations",
    "score_texts",
    "sliding_windows",
    "token_byte_lengths",
]
