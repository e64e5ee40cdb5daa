"""Sparse autoencoders in SAELens' saved format: load, encode, splice into the forward, measure, train, save.

A folder holds `cfg.json` and `sae_weights.safetensors` (what SAELens' `SAE.save_model` writes and
`SAE.load_from_disk` reads; its Hub releases are such folders). The weights: W_enc (d_in, d_sae), b_enc
(d_sae), W_dec (d_sae, d_in), b_dec (d_in), and for JumpReLU a threshold (d_sae). Architectures, as SAELens'
classes of the same name compute them (`encode`, `decode`):

    standard   acts = relu(x' @ W_enc + b_enc)
    topk       pre = x' @ W_enc + b_enc (times |W_dec rows| if rescale_acts_by_decoder_norm); the k largest
               of pre, relu'd, the rest 0
    jumprelu   pre = x' @ W_enc + b_enc; acts = relu(pre) where pre > threshold, else 0
    decode     x_hat = acts @ W_dec + b_dec (topk with rescale_acts_by_decoder_norm: acts / |W_dec rows| first)

x' is the activation after the input normalisation (`normalize_activations`: "none"; "layer_norm": x minus
its mean over its C entries, over its unbiased std + 1e-5, undone on the reconstruction; "constant_norm_rescale":
x * sqrt(d_in) / |x|, undone likewise; "expected_average_only_in": nothing at run time, as SAELens'
`load_from_disk`, which leaves that scale to the caller) minus b_dec when `apply_b_dec_to_input`. An SAE on
`hook_z` reads the heads side by side, (..., nh, hs) -> (..., nh * hs).

The hook is the config's `metadata.hook_name` (SAELens 6) or `hook_name` / `hook_point` (earlier files), a
TransformerLens name as gpt2.inspect.hooks uses. `train_sae` fits a standard (L1) or top-k SAE on a model's
activations over a prepared corpus and saves it in the same format, so SAELens loads it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gpt2.config import GPTConfig, is_integer, shown
from gpt2.data.shards import load_split
from gpt2.inspect.hooks import hook_names, run_with_cache, run_with_hooks
from gpt2.model import GPT

CONFIG_NAME = "cfg.json"
WEIGHTS_NAME = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "topk", "jumprelu")
NORMALIZATIONS = ("none", "expected_average_only_in", "constant_norm_rescale", "layer_norm")
FORMAT_VERSION = "6.0.0"
"""The SAELens config layout the saved cfg.json follows (from 6.0: SAE settings at the top level, the model's
hook and name under "metadata"); SAELens reads older layouts by version, so the file names the one it is in."""
LAYER_NORM_EPS = 1e-5  # SAELens' run-time layer_norm


@dataclass(frozen=True)
class SAEConfig:
    """What cfg.json says about an SAE. Unknown keys are kept in `extra` and written back unchanged."""

    architecture: str
    d_in: int
    d_sae: int
    hook_name: str
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    k: int | None = None
    """topk: how many features are active per token."""
    rescale_acts_by_decoder_norm: bool = False
    model_name: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # each field's type is checked, not assumed: cfg.json is untrusted (a JSON 1e999 arrives as inf, "false"
        # is a true string, and Python's True is an int)
        if not isinstance(self.architecture, str) or self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {shown(self.architecture)} is not supported; one of {ARCHITECTURES}")
        if not isinstance(self.normalize_activations, str) or self.normalize_activations not in NORMALIZATIONS:
            raise ValueError(
                f"normalize_activations {shown(self.normalize_activations)} is not one of {NORMALIZATIONS}"
            )
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {shown(value)}")
        if not isinstance(self.hook_name, str):
            raise ValueError(f"the hook must be a name such as 'blocks.8.hook_resid_pre', got {shown(self.hook_name)}")
        for name in ("apply_b_dec_to_input", "rescale_acts_by_decoder_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {shown(getattr(self, name))}")
        if self.model_name is not None and not isinstance(self.model_name, str):
            raise ValueError(f"model_name must be a string, got {shown(self.model_name)}")
        if self.architecture == "topk" and not (is_integer(self.k) and 0 < self.k <= self.d_sae):
            raise ValueError(f"a topk SAE needs k in [1, d_sae={self.d_sae}], got {shown(self.k)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SAEConfig:
        """Read a SAELens cfg.json dict (6.x layout, or the earlier one with hook_point / activation_fn). A
        ValueError names the field that is missing or of the wrong type or range."""
        if not isinstance(values, dict):
            raise ValueError(f"the config must be a JSON object, not a {type(values).__name__}")
        metadata = values.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise ValueError(f"metadata must be an object, got {shown(metadata)}")
        hook = metadata.get("hook_name") or values.get("hook_name") or values.get("hook_point")
        if not isinstance(hook, str):
            raise ValueError("the SAE config names no hook (metadata.hook_name); it cannot be placed in the model")
        missing = [name for name in ("d_in", "d_sae") if name not in values]
        if missing:
            raise ValueError(f"the field {missing[0]} is missing; an SAE config gives d_in and d_sae")
        architecture = values.get("architecture", "standard")
        k = values.get("k")
        if values.get("activation_fn") == "topk" or values.get("activation_fn_str") == "topk":
            options = values.get("activation_fn_kwargs") or {}
            if not isinstance(options, dict):
                raise ValueError(f"activation_fn_kwargs must be an object, got {shown(options)}")
            architecture, k = "topk", options.get("k", k)
        normalize = values.get("normalize_activations", "none")
        if isinstance(normalize, bool) or normalize is None:  # earlier files: a flag for the April 2024 scheme
            normalize = "expected_average_only_in" if normalize else "none"
        known = {"architecture", "d_in", "d_sae", "apply_b_dec_to_input", "normalize_activations", "k"}
        known |= {"rescale_acts_by_decoder_norm", "hook_name", "hook_point", "dtype", "device", "reshape_activations"}
        return cls(
            architecture=architecture,
            d_in=values["d_in"],
            d_sae=values["d_sae"],
            hook_name=hook,
            apply_b_dec_to_input=values.get("apply_b_dec_to_input", True),
            normalize_activations=normalize,
            k=k,
            rescale_acts_by_decoder_norm=values.get("rescale_acts_by_decoder_norm", False),
            model_name=metadata.get("model_name") or values.get("model_name"),
            extra={key: value for key, value in values.items() if key not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """cfg.json in SAELens' 6.x layout."""
        metadata = {**self.extra.get("metadata", {}), "hook_name": self.hook_name, "model_name": self.model_name}
        metadata.setdefault("sae_lens_version", FORMAT_VERSION)
        values: dict[str, Any] = {
            **{key: value for key, value in self.extra.items() if key not in ("activation_fn", "activation_fn_str")},
            "d_in": self.d_in,
            "d_sae": self.d_sae,
            "dtype": "float32",
            "device": "cpu",
            "apply_b_dec_to_input": self.apply_b_dec_to_input,
            "normalize_activations": self.normalize_activations,
            "reshape_activations": "hook_z" if self.hook_name.endswith("hook_z") else "none",
            "architecture": self.architecture,
            "metadata": {
                "hook_name": self.hook_name,
                "model_name": self.model_name,
                "sae_lens_version": FORMAT_VERSION,
            },
        }
        if self.architecture == "topk":
            values |= {"k": self.k, "rescale_acts_by_decoder_norm": self.rescale_acts_by_decoder_norm}
        return values


class Normalized(NamedTuple):
    """An SAE's input after its normalisation, and what undoes it on the reconstruction."""

    x: torch.Tensor  # (..., d_in)
    shift: torch.Tensor | None  # (..., 1) added back after the scale (layer_norm's mean)
    scale: torch.Tensor | None  # (..., 1) the reconstruction is multiplied by


class SparseAutoencoder(nn.Module):
    """An SAE as SAELens computes it (see the module docstring). Parameters keep SAELens' names."""

    def __init__(self, config: SAEConfig) -> None:
        super().__init__()
        self.config = config
        d_in, d_sae = config.d_in, config.d_sae
        self.W_enc = nn.Parameter(torch.zeros(d_in, d_sae))
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.W_dec = nn.Parameter(torch.zeros(d_sae, d_in))
        self.b_dec = nn.Parameter(torch.zeros(d_in))
        if config.architecture == "jumprelu":
            self.threshold = nn.Parameter(torch.zeros(d_sae))

    @property
    def hook_name(self) -> str:
        return self.config.hook_name

    @property
    def d_in(self) -> int:
        return self.config.d_in

    @property
    def d_sae(self) -> int:
        return self.config.d_sae

    def normalize(self, x: torch.Tensor) -> Normalized:
        """x (..., d_in) or, at hook_z, (..., nh, hs) -> the normalised input (..., d_in)."""
        if self.hook_name.endswith("hook_z"):
            x = x.flatten(-2)
        x = x.to(self.W_enc.dtype)
        mode = self.config.normalize_activations
        if mode == "layer_norm":
            mean = x.mean(dim=-1, keepdim=True)
            std = (x - mean).std(dim=-1, keepdim=True)
            return Normalized((x - mean) / (std + LAYER_NORM_EPS), mean, std)
        if mode == "constant_norm_rescale":
            coefficient = math.sqrt(self.config.d_in) / x.norm(dim=-1, keepdim=True)
            return Normalized(x * coefficient, None, 1.0 / coefficient)
        return Normalized(x, None, None)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations (..., d_sae) of activations x (..., d_in) read at the SAE's hook."""
        return self.encode_normalized(self.normalize(x).x)

    def encode_normalized(self, x: torch.Tensor) -> torch.Tensor:
        if self.config.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc  # (..., d_sae)
        architecture = self.config.architecture
        if architecture == "jumprelu":
            return F.relu(pre) * (pre > self.threshold).to(pre.dtype)
        if architecture == "topk":
            if self.config.rescale_acts_by_decoder_norm:
                pre = pre * self.W_dec.norm(dim=-1)
            assert self.config.k is not None  # checked by SAEConfig
            top = pre.topk(self.config.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        return F.relu(pre)

    def decode(self, acts: torch.Tensor, normalized: Normalized | None = None) -> torch.Tensor:
        """The reconstruction (..., d_in) of feature activations (..., d_sae); `normalized` (what `normalize`
        gave for the input) undoes a run-time normalisation, which SAELens also applies per input."""
        if self.config.architecture == "topk" and self.config.rescale_acts_by_decoder_norm:
            acts = acts / self.W_dec.norm(dim=-1)
        x_hat = acts @ self.W_dec + self.b_dec
        if normalized is not None and normalized.scale is not None:
            x_hat = x_hat * normalized.scale
        if normalized is not None and normalized.shift is not None:
            x_hat = x_hat + normalized.shift
        return x_hat

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction of x in x's own shape (hook_z: (..., nh, hs))."""
        normalized = self.normalize(x)
        x_hat = self.decode(self.encode_normalized(normalized.x), normalized)
        return x_hat.view(x.shape).to(x.dtype)

    def clamped(self, x: torch.Tensor, feature: int, value: float) -> torch.Tensor:
        """x (..., d_in) with `feature` set to `value` and everything the SAE does not reconstruct kept:
        x + decode(acts with acts[feature] = value) - decode(acts) (steering, gpt2.inference.steering)."""
        normalized = self.normalize(x)
        acts = self.encode_normalized(normalized.x)  # (..., d_sae)
        changed = acts.clone()
        changed[..., feature] = value
        delta = self.decode(changed, normalized) - self.decode(acts, normalized)
        return x + delta.view(x.shape).to(x.dtype)


# ------------------------------------------------------------------------------------------ files
def load_sae(source: str | os.PathLike[str], model_config: GPTConfig | None = None) -> SparseAutoencoder:
    """An SAE from a folder holding SAELens' cfg.json and sae_weights.safetensors, or from the Hub
    ("owner/repo/folder/in/repo", fetched by gpt2.weights.hub); with `model_config`, checked to fit that model
    (its hook exists there, its width is the activation's). The one reader of SAEs from disk (the CLI, the
    server at start, the Python API).

    Errors (ValueError, FileNotFoundError) are one line naming the file and the first problem: a config that is
    not JSON, a field missing or of the wrong type or range (`"d_in": 1e999`), an SAE for another model, a
    weights file that is not safetensors (corrupt, truncated), tensors of the wrong shape, NaN or infinite
    weights.

    >>> load_sae("saes/blocks.8.hook_resid_pre", GPTConfig.from_name("gpt2"))  # doctest: +SKIP
    """
    path = Path(source).expanduser()
    if not path.is_dir():
        from gpt2.weights.hub import resolve_subfolder

        path = resolve_subfolder(str(source), (CONFIG_NAME, WEIGHTS_NAME))
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path / name} is missing; an SAE folder holds {CONFIG_NAME} and {WEIGHTS_NAME}")
    config = read_sae_config(path / CONFIG_NAME)
    if model_config is not None:
        try:
            check_sae_config_fits(model_config, config)
        except ValueError as err:
            raise ValueError(f"{path / CONFIG_NAME}: {err}") from err
    weights = path / WEIGHTS_NAME
    try:
        tensors = load_file(weights)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise ValueError(f"{weights} is not a readable safetensors file ({err}); save the SAE again") from err
    scaling = tensors.pop("scaling_factor", None)
    if scaling is not None and not (scaling.is_floating_point() and torch.allclose(scaling, torch.ones_like(scaling))):
        raise ValueError(f"{weights} has a finetuning scaling_factor, which is not supported")
    expected = parameter_shapes(config)
    got = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if got != expected:
        raise ValueError(f"{weights} holds {got}; this {config.architecture} SAE's config needs {expected}")
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            raise ValueError(f"{weights}: {name} holds {tensor.dtype}, not floats; save the SAE again")
        # one NaN or infinity makes every activation the SAE touches NaN, and every logit after it
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{weights}: {name} holds NaN or infinite values; save the SAE again")
    sae = SparseAutoencoder(config)
    sae.load_state_dict({name: tensor.float() for name, tensor in tensors.items()})
    return sae.eval()


def read_sae_config(path: Path) -> SAEConfig:
    """The SAEConfig in a cfg.json, every field checked: a ValueError names the file and the field."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); save the SAE again") from err
    except OSError as err:
        raise ValueError(f"{path} cannot be read ({err.strerror}); check its permissions") from err
    try:
        return SAEConfig.from_dict(values)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def parameter_shapes(config: SAEConfig) -> dict[str, tuple[int, ...]]:
    """The shape of each of an SAE's parameters, by SAELens' name, from its config alone (nothing allocated)."""
    shapes = {
        "W_enc": (config.d_in, config.d_sae),
        "b_enc": (config.d_sae,),
        "W_dec": (config.d_sae, config.d_in),
        "b_dec": (config.d_in,),
    }
    return shapes | ({"threshold": (config.d_sae,)} if config.architecture == "jumprelu" else {})


def save_sae(sae: SparseAutoencoder, directory: str | os.PathLike[str]) -> Path:
    """Write `sae` as SAELens does (cfg.json, sae_weights.safetensors in float32); returns the folder."""
    from gpt2.runtime.files import atomic_write_text

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: parameter.detach().float().contiguous().cpu() for name, parameter in sae.named_parameters()}
    staging = directory / (WEIGHTS_NAME + ".partial")
    save_file(tensors, staging)
    staging.replace(directory / WEIGHTS_NAME)
    atomic_write_text(directory / CONFIG_NAME, json.dumps(sae.config.to_dict(), indent=1) + "\n")
    return directory


def check_sae_fits(model: GPT, sae: SparseAutoencoder) -> None:
    """Refuse an SAE whose hook the model does not have or whose width does not match it there."""
    check_sae_config_fits(model.config, sae.config)


def check_sae_config_fits(model_config: GPTConfig, config: SAEConfig) -> None:
    """A ValueError when a model of `model_config` has no `config.hook_name` or another width there than d_in."""
    n_layer = model_config.n_layer
    if config.hook_name not in hook_names(n_layer):
        raise ValueError(
            f"the SAE reads {config.hook_name!r}, which this model ({n_layer} blocks, numbered 0 to {n_layer - 1}) "
            "has not; use an SAE made for this model"
        )
    width = 4 * model_config.n_embd if ".mlp.hook_" in config.hook_name else model_config.n_embd
    if config.d_in != width:
        raise ValueError(
            f"the SAE reads {config.d_in} values at {config.hook_name!r}; this model has {width} there; use an SAE "
            "made for this model"
        )


# ------------------------------------------------------------------------------------------ in the forward
class SAELosses(NamedTuple):
    mse: float
    """Mean squared error of the reconstruction, over tokens and the d_in entries."""
    loss: float
    """The model's next-token cross-entropy (mean over predicted positions)."""
    spliced_loss: float
    """The same with the SAE's reconstruction in place of the activation at its hook."""


def run_with_sae(model: GPT, idx: torch.Tensor, sae: SparseAutoencoder) -> torch.Tensor:
    """The logits (B, T, V) of `idx` with the activation at the SAE's hook replaced by its reconstruction."""
    check_sae_fits(model, sae)
    return run_with_hooks(model, idx, [(sae.hook_name, lambda x, name: sae(x))])


@torch.no_grad()
def sae_losses(model: GPT, idx: torch.Tensor, sae: SparseAutoencoder) -> SAELosses:
    """Reconstruction MSE at the SAE's hook and the model's loss on `idx` (B, T) without and with the SAE."""
    check_sae_fits(model, sae)
    logits, cache = run_with_cache(model, idx, sae.hook_name)
    activation = cache[sae.hook_name]
    mse = F.mse_loss(sae(activation), activation)
    spliced = run_with_sae(model, idx, sae)
    return SAELosses(float(mse), _next_token_loss(logits, idx), _next_token_loss(spliced, idx))


def _next_token_loss(logits: torch.Tensor, idx: torch.Tensor) -> float:
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), idx[:, 1:].flatten()))


@torch.no_grad()
def top_features(
    model: GPT, idx: torch.Tensor, sae: SparseAutoencoder, k: int = 5
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most active features at every position of `idx` (1, T): (values, ids), each (T, k)."""
    check_sae_fits(model, sae)
    _, cache = run_with_cache(model, idx, sae.hook_name)
    acts = sae.encode(cache[sae.hook_name])[0]  # (T, d_sae)
    top = acts.topk(min(k, sae.config.d_sae), dim=-1)
    return top.values, top.indices


# ------------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class SAETrainConfig:
    """How `train_sae` fits an SAE (SAELens' training SAEs compute the same losses)."""

    hook_name: str
    d_sae: int
    architecture: str = "standard"
    """standard: loss = MSE + l1_coefficient * sum(acts * |W_dec rows|); topk: loss = MSE."""
    k: int = 32
    l1_coefficient: float = 1e-3
    learning_rate: float = 1e-3
    steps: int = 200
    batch_tokens: int = 256
    """Activations (tokens) per step."""
    context: int = 64
    """Tokens per model forward (windows of the corpus)."""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.architecture not in ("standard", "topk"):
            raise ValueError(f"train_sae trains 'standard' or 'topk' SAEs, got {self.architecture!r}")
        for name in ("d_sae", "steps", "batch_tokens", "context"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def train_sae(model: GPT, data_dir: str | os.PathLike[str], config: SAETrainConfig) -> SparseAutoencoder:
    """Fit an SAE on `model`'s activations at config.hook_name over the train split of a corpus prepared by
    `gpt2 prepare` (gpt2.data.shards). Mean squared error (summed over d_in, averaged over tokens) plus, for a
    standard SAE, the L1 penalty weighted by the decoder rows' norms; Adam; SAELens' initialisation (W_enc the
    transpose of a Kaiming-uniform W_dec, b_dec the mean activation of the first batch)."""
    generator = torch.Generator().manual_seed(config.seed)
    sae_config = SAEConfig(
        architecture=config.architecture,
        d_in=model.config.n_embd if ".mlp.hook_" not in config.hook_name else 4 * model.config.n_embd,
        d_sae=config.d_sae,
        hook_name=config.hook_name,
        k=config.k if config.architecture == "topk" else None,
    )
    sae = SparseAutoencoder(sae_config)
    check_sae_fits(model, sae)
    with torch.no_grad():
        w_dec = torch.empty(config.d_sae, sae_config.d_in)
        bound = math.sqrt(6.0 / sae_config.d_in)  # kaiming_uniform_'s bound for fan_in = d_in
        w_dec.uniform_(-bound, bound, generator=generator)
        sae.W_dec.copy_(w_dec)
        sae.W_enc.copy_(w_dec.T)
    batches = _activation_batches(model, data_dir, config, generator)
    device = model.transformer.wte.weight.device
    sae.to(device)
    optimizer = torch.optim.Adam(sae.parameters(), lr=config.learning_rate)
    for step in range(config.steps):
        x = next(batches)  # (batch_tokens, d_in)
        if step == 0:
            with torch.no_grad():
                sae.b_dec.copy_(x.mean(dim=0))
        acts = sae.encode(x)
        loss = (sae.decode(acts) - x).pow(2).sum(-1).mean()
        if config.architecture == "standard":
            loss = loss + config.l1_coefficient * (acts * sae.W_dec.norm(dim=-1)).sum(-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return sae.eval()


def _activation_batches(
    model: GPT, data_dir: str | os.PathLike[str], config: SAETrainConfig, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    """Endless (batch_tokens, d_in) batches of activations at the hook from random windows of the corpus."""
    tokens = load_split(Path(data_dir), "train")
    context = min(config.context, model.config.block_size, len(tokens))
    if len(tokens) < 2:
        raise ValueError(f"{str(data_dir)!r} holds too few tokens to train an SAE on")
    windows = max(1, math.ceil(config.batch_tokens / context))
    device = model.transformer.wte.weight.device
    while True:
        starts = torch.randint(0, len(tokens) - context + 1, (windows,), generator=generator).tolist()
        idx = torch.from_numpy(np.stack([np.asarray(tokens[s : s + context], dtype=np.int64) for s in starts]))
        with torch.no_grad():
            _, cache = run_with_cache(model, idx.to(device), config.hook_name)
        flat = cache[config.hook_name].flatten(0, 1).flatten(1)  # (windows * context, d_in)
        yield flat[: config.batch_tokens]
