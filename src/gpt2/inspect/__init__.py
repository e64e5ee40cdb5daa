"""Look inside a model: named activations and hooks, the logit lens, logit attribution, attention pictures.

Nothing here changes the model or its forward: `run_with_cache` and `run_with_hooks` run their own forward
through the model's submodules (see gpt2.inspect.hooks), so the normal forward stays on its fused path and
pays nothing. Modules: hooks (names, cache, hooks), lens (logit lens, direct logit attribution), plots (PNG),
attention_html (interactive page), pictures (model + prompt -> file, what `gpt2 inspect` calls).
"""

from gpt2.inspect.hooks import ActivationCache, hook_names, run_with_cache, run_with_hooks
from gpt2.inspect.lens import LogitAttribution, LogitLens, direct_logit_attribution, logit_lens
from gpt2.inspect.pictures import attention_picture, logit_lens_picture

__all__ = [
    "ActivationCache",
    "LogitAttribution",
    "LogitLens",
    "attention_picture",
    "direct_logit_attribution",
    "hook_names",
    "logit_lens",
    "logit_lens_picture",
    "run_with_cache",
    "run_with_hooks",
]
