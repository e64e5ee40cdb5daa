"""Model weight formats: reading and writing GPT-2 checkpoints as the rest of the world stores them.

HuggingFace layout (what `transformers` and the Hub use): a directory with `config.json` and the weights in
`model.safetensors`, sharded `model-0000N-of-0000M.safetensors` + `model.safetensors.index.json`, or a legacy
`pytorch_model.bin` (read with `torch.load(weights_only=True)`, which cannot run code). Keys are ours
(`transformer.h.0.attn.c_attn.weight`, ...) with or without the `transformer.` prefix. The linear layers are
stored as OpenAI's "Conv1D": weight [in, out], the transpose of `nn.Linear`'s [out, in]. `to_hf_tensor` /
`from_hf_tensor` are the one place that transposes.

llm.c layout (`model_fp32.bin` / `model_bf16.bin`): read by `load_llmc`. OpenAI's TensorFlow release
(hparams.json + model.ckpt.*): read by `load_openai_tf`, without TensorFlow. `load_any` picks the right one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.runtime.files import atomic_write_bytes
from gpt2.weights.hub import resolve_pretrained

# Weights of these modules are Conv1D ([in, out]) in HF/OpenAI files and nn.Linear ([out, in]) here.
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Non-parameter buffers older transformers versions saved (the causal mask); they carry no information.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
# GELU variants in HF configs that are the tanh form GPT-2 uses.
TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
HF_FILES = ("config.json", "*.safetensors", "model.safetensors.index.json")


def _is_conv1d(name: str) -> bool:
    return name.endswith(CONV1D_SUFFIXES)


def from_hf_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """A tensor from a HF/OpenAI file as our parameter `name` holds it (Conv1D [in, out] -> Linear [out, in])."""
    return tensor.t() if _is_conv1d(name) else tensor


def to_hf_tensor(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Our parameter as a HF file stores it (Linear [out, in] -> Conv1D [in, out])."""
    return tensor.t() if _is_conv1d(name) else tensor


# --------------------------------------------------------------------------------------- config
def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> GPTConfig:
    """GPTConfig from a HF GPT-2 config.json; refuses variants this model does not compute."""
    model_type = hf.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ValueError(f"config.json has model_type {model_type!r}; only 'gpt2' checkpoints can be loaded")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in TANH_GELU_NAMES:
        raise ValueError(f"config.json activation_function {activation!r} is not GPT-2's tanh GELU {TANH_GELU_NAMES}")
    unsupported = {
        "scale_attn_weights": (True, hf.get("scale_attn_weights", True)),
        "scale_attn_by_inverse_layer_idx": (False, hf.get("scale_attn_by_inverse_layer_idx", False)),
        "reorder_and_upcast_attn": (False, hf.get("reorder_and_upcast_attn", False)),
        "tie_word_embeddings": (True, hf.get("tie_word_embeddings", True)),
    }
    for key, (expected, value) in unsupported.items():
        if value != expected:
            raise ValueError(f"config.json sets {key}={value!r}; this GPT-2 implementation supports only {expected!r}")
    try:
        values: dict[str, Any] = dict(
            vocab_size=hf["vocab_size"],
            block_size=hf.get("n_positions", hf.get("n_ctx")),
            n_layer=hf["n_layer"],
            n_head=hf["n_head"],
            n_embd=hf["n_embd"],
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            bias=True,
        )
    except KeyError as err:
        raise ValueError(f"config.json lacks the GPT-2 field {err.args[0]!r}") from err
    values.update(overrides)
    return GPTConfig(**values)


def config_to_hf(config: GPTConfig) -> dict[str, Any]:
    """A config.json that `transformers.GPT2LMHeadModel` reads as the same model."""
    eos = 50256 if config.vocab_size > 50256 else config.vocab_size - 1
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": True,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "use_cache": True,
        "torch_dtype": "float32",
    }


# ------------------------------------------------------------------------------------- reading
def read_hf_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a HF-format directory as stored (names and layout untouched)."""
    from safetensors.torch import load_file

    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    legacy = directory / "pytorch_model.bin"
    if single.is_file():
        return load_file(single)
    if index.is_file():
        try:
            weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise ValueError(f"{index} is not a safetensors index (needs a 'weight_map'): {err}") from err
        tensors: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            if not (directory / shard).is_file():
                raise FileNotFoundError(f"{index} names shard {shard!r}, which is missing from {directory}")
            tensors.update(load_file(directory / shard))
        return tensors
    if legacy.is_file():
        # weights_only=True: a pickle that tries to build anything but tensors is refused, never executed.
        try:
            return torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"{legacy} could not be read as plain tensors (refused: {err})") from err
    raise FileNotFoundError(
        f"no weights in {directory}: expected model.safetensors, model.safetensors.index.json + shards, "
        "or pytorch_model.bin"
    )


def load_hf_state_dict(model: GPT, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy HF-layout tensors into `model`, transposing Conv1D weights; every mismatch is a named error."""
    ours = {name: p for name, p in model.state_dict().items() if name != "lm_head.weight"}  # tied to wte
    found: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for key, tensor in tensors.items():
        if key.endswith(IGNORED_SUFFIXES) or key == "lm_head.weight":
            continue  # causal-mask buffers; the head is tied to wte (checked below when present)
        name = key if key.startswith("transformer.") else f"transformer.{key}"
        if name not in ours:
            unexpected.append(key)
            continue
        found[name] = from_hf_tensor(name, tensor)
    missing = sorted(set(ours) - set(found))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing tensors: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
        if unexpected:
            parts.append(f"unexpected tensors: {sorted(unexpected)[:8]}{' ...' if len(unexpected) > 8 else ''}")
        raise ValueError("checkpoint does not match the GPT-2 config: " + "; ".join(parts))
    for name, tensor in found.items():
        if tensor.shape != ours[name].shape:
            stored = tuple(to_hf_tensor(name, tensor).shape)
            raise ValueError(
                f"tensor {name} has shape {stored} in the checkpoint but the config needs "
                f"{tuple(to_hf_tensor(name, ours[name]).shape)}"
            )
    head = tensors.get("lm_head.weight")
    if head is not None and not torch.equal(head, found["transformer.wte.weight"]):
        raise ValueError("lm_head.weight differs from wte.weight; GPT-2 ties them and untied heads are unsupported")
    with torch.no_grad():
        for name, tensor in found.items():
            ours[name].copy_(tensor)


def load_pretrained(name_or_path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """A GPT from a HF-format directory or Hub name. See the module docstring for the accepted layouts."""
    directory = resolve_pretrained(name_or_path, allow_patterns=HF_FILES)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} is missing: a HF-format GPT-2 directory needs config.json")
    try:
        hf_config = json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_path} is not valid JSON: {err}") from err
    config = config_from_hf(hf_config, **config_overrides)
    tensors = read_hf_state_dict(directory)
    with torch.device("meta"):
        model = GPT(config)  # no allocation, no init: every tensor is about to be overwritten
    model.to_empty(device="cpu")
    model.lm_head.weight = model.transformer.wte.weight  # to_empty breaks the tie; restore it
    load_hf_state_dict(model, tensors)
    return model.eval()


# ------------------------------------------------------------------------------------- writing
def hf_state_dict(model: GPT) -> dict[str, torch.Tensor]:
    """Our weights under HF names and layout (no lm_head: transformers ties it to wte on load). A model built
    with bias=False gets zero biases, which computes the same function in GPT-2's biased layout."""
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        tensors[name] = to_hf_tensor(name, tensor.detach()).contiguous().cpu()
    if not model.config.bias:
        for name, module in model.named_modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and name != "lm_head":
                tensors[f"{name}.bias"] = torch.zeros(module.weight.shape[0], dtype=module.weight.dtype)
    return tensors


def save_pretrained(model: GPT, directory: str | os.PathLike[str]) -> None:
    """config.json + model.safetensors in the HF GPT-2 layout; each file written atomically."""
    from safetensors.torch import save

    model = getattr(model, "_orig_mod", model)  # a torch.compile wrapper saves its module's names
    model = getattr(model, "module", model)  # likewise DDP
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(directory / "model.safetensors", save(hf_state_dict(model), metadata={"format": "pt"}))
    atomic_write_bytes(directory / "config.json", (json.dumps(config_to_hf(model.config), indent=2) + "\n").encode())


# --------------------------------------------------------------------------------------- llm.c
LLMC_MAGIC = 20240326
LLMC_DTYPES = {3: torch.float32, 5: torch.bfloat16}  # header version -> stored dtype


def load_llmc(path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """A GPT from karpathy/llm.c's `model_fp32.bin` / `model_bf16.bin` (weights as nn.Linear [out, in];
    the vocabulary may be padded to Vp rows, which are dropped). Returned in float32."""
    import numpy as np

    path = Path(path)
    raw = path.read_bytes()
    if len(raw) < 1024:
        raise ValueError(f"{path} is too short ({len(raw)} bytes) to be an llm.c checkpoint (256-int header)")
    header = np.frombuffer(raw[:1024], dtype="<i4")
    magic, version, max_t, vocab, n_layer, n_head, width, padded_vocab = (int(v) for v in header[:8])
    if magic != LLMC_MAGIC or version not in LLMC_DTYPES:
        raise ValueError(f"{path} is not an llm.c GPT-2 checkpoint (magic {magic}, version {version})")
    config = GPTConfig(
        vocab_size=vocab, block_size=max_t, n_layer=n_layer, n_head=n_head, n_embd=width, **config_overrides
    )
    dtype = LLMC_DTYPES[version]
    item = 4 if dtype == torch.float32 else 2
    L, C = n_layer, width
    shapes = [
        ("wte", (padded_vocab, C)), ("wpe", (max_t, C)), ("ln_1.weight", (L, C)), ("ln_1.bias", (L, C)),
        ("attn.c_attn.weight", (L, 3 * C, C)), ("attn.c_attn.bias", (L, 3 * C)),
        ("attn.c_proj.weight", (L, C, C)), ("attn.c_proj.bias", (L, C)),
        ("ln_2.weight", (L, C)), ("ln_2.bias", (L, C)),
        ("mlp.c_fc.weight", (L, 4 * C, C)), ("mlp.c_fc.bias", (L, 4 * C)),
        ("mlp.c_proj.weight", (L, C, 4 * C)), ("mlp.c_proj.bias", (L, C)),
        ("ln_f.weight", (C,)), ("ln_f.bias", (C,)),
    ]  # fmt: skip
    expected = 1024 + item * sum(int(np.prod(shape)) for _, shape in shapes)
    if len(raw) != expected:
        raise ValueError(f"{path} has {len(raw)} bytes; its header describes a {expected}-byte checkpoint")
    payload = torch.frombuffer(bytearray(raw[1024:]), dtype=torch.int16 if item == 2 else torch.float32)
    if item == 2:
        payload = payload.view(torch.bfloat16)
    model = GPT(config)
    params = dict(model.named_parameters())
    offset = 0
    with torch.no_grad():
        for name, shape in shapes:
            n = int(np.prod(shape))
            tensor = payload[offset : offset + n].view(shape).float()
            offset += n
            if name in ("wte", "wpe"):
                params[f"transformer.{name}.weight"].copy_(tensor[: params[f"transformer.{name}.weight"].shape[0]])
            elif name.startswith("ln_f"):
                params[f"transformer.{name}"].copy_(tensor)
            else:
                for layer in range(L):
                    params[f"transformer.h.{layer}.{name}"].copy_(tensor[layer])
    return model.eval()


# --------------------------------------------------------------------------- OpenAI TensorFlow
# OpenAI's release (`models/124M/`): hparams.json + a TF "tensor bundle" checkpoint. The `.index` file is a
# LevelDB-format table mapping each variable name to a BundleEntryProto (dtype, shape, shard, offset, size);
# the bytes live raw, little-endian, in `.data-0000N-of-0000M`. Read here without TensorFlow: the table and the
# few protobuf fields needed are simple enough, and nothing in these files can run code.
TF_TABLE_MAGIC = 0xDB4775248B80FB57
TF_DTYPES = {1: torch.float32, 2: torch.float64, 3: torch.int32, 14: torch.bfloat16, 19: torch.float16}


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of a serialized protobuf message: varints as int, the rest as bytes."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            fields.append((number, value))
        elif wire == 2:
            length, pos = _varint(buf, pos)
            fields.append((number, buf[pos : pos + length]))
            pos += length
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            fields.append((number, buf[pos : pos + width]))
            pos += width
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return fields


def _table_block(data: bytes, handle: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) entries of one LevelDB table block, given its BlockHandle (offset, size varints)."""
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    if data[offset + size] != 0:
        raise ValueError("compressed TF checkpoint index blocks are not supported")
    block = data[offset : offset + size]
    num_restarts = int.from_bytes(block[-4:], "little")
    limit = size - 4 - 4 * num_restarts
    entries: list[tuple[bytes, bytes]] = []
    key = b""
    pos = 0
    while pos < limit:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        value_length, pos = _varint(block, pos)
        key = key[:shared] + block[pos : pos + unshared]  # keys are prefix-compressed against the previous one
        pos += unshared
        entries.append((key, block[pos : pos + value_length]))
        pos += value_length
    return entries


def read_tf_checkpoint(prefix: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Every variable of a TF V2 checkpoint (`prefix.index` + `prefix.data-*`) as a tensor, by TF name."""
    prefix = str(prefix)
    index_path = Path(prefix + ".index")
    if not index_path.is_file():
        raise FileNotFoundError(f"{index_path} is missing: expected a TensorFlow checkpoint with prefix {prefix}")
    index = index_path.read_bytes()
    if len(index) < 48 or int.from_bytes(index[-8:], "little") != TF_TABLE_MAGIC:
        raise ValueError(f"{index_path} is not a TensorFlow checkpoint index (bad table magic)")
    footer = index[-48:]
    _, pos = _varint(footer, 0)  # metaindex handle: offset, size (unused)
    _, pos = _varint(footer, pos)
    entries = [e for _, handle in _table_block(index, footer[pos:]) for e in _table_block(index, handle)]
    header = dict(_proto_fields(entries[0][1])) if entries and entries[0][0] == b"" else {}
    num_shards = int(header.get(1, 1))  # BundleHeaderProto.num_shards
    shards: dict[int, bytes] = {}
    tensors: dict[str, torch.Tensor] = {}
    for key, value in entries:
        if key == b"":
            continue
        fields = _proto_fields(value)  # BundleEntryProto: dtype=1, shape=2, shard_id=3, offset=4, size=5
        values = dict(fields)
        dtype = TF_DTYPES.get(int(values.get(1, 0)))
        if dtype is None:
            raise ValueError(f"variable {key.decode()} has unsupported TF dtype {values.get(1)}")
        dims = [dim for number, dim in _proto_fields(values.get(2, b"")) if number == 2]  # TensorShapeProto.dim
        shape = [int(dict(_proto_fields(dim)).get(1, 0)) for dim in dims]  # Dim.size
        shard = int(values.get(3, 0))
        if shard not in shards:
            shard_path = Path(f"{prefix}.data-{shard:05d}-of-{num_shards:05d}")
            if not shard_path.is_file():
                raise FileNotFoundError(f"{shard_path} is missing: the checkpoint index refers to it")
            shards[shard] = shard_path.read_bytes()
        start, size = int(values.get(4, 0)), int(values.get(5, 0))
        raw = bytearray(shards[shard][start : start + size])
        if len(raw) != size:
            raise ValueError(f"variable {key.decode()} lies past the end of its data file (truncated checkpoint?)")
        tensor = torch.frombuffer(raw, dtype=dtype).reshape(shape) if size else torch.empty(shape, dtype=dtype)
        tensors[key.decode()] = tensor
    return tensors


def tf_name_to_hf(name: str) -> str:
    """`model/h3/attn/c_attn/w` -> `transformer.h.3.attn.c_attn.weight` (g/w -> weight, b -> bias)."""
    parts = name.removeprefix("model/").split("/")
    if parts[0].startswith("h") and parts[0][1:].isdigit():
        parts = ["h", parts[0][1:], *parts[1:]]
    leaf = {"g": "weight", "w": "weight", "b": "bias"}.get(parts[-1])
    if parts[-1] in ("wte", "wpe"):
        leaf, parts = "weight", parts + ["weight"]
    if leaf is None:
        raise ValueError(f"unexpected variable {name!r} in a GPT-2 TensorFlow checkpoint")
    return "transformer." + ".".join(parts[:-1] + [leaf])


def load_openai_tf(directory: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """A GPT from OpenAI's released layout: hparams.json + checkpoint + model.ckpt.{index,data-*}."""
    directory = Path(directory)
    hparams_path = directory / "hparams.json"
    try:
        hparams = json.loads(hparams_path.read_text())
        config = GPTConfig(
            vocab_size=hparams["n_vocab"], block_size=hparams["n_ctx"], n_layer=hparams["n_layer"],
            n_head=hparams["n_head"], n_embd=hparams["n_embd"], **config_overrides,
        )
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{hparams_path} is missing: OpenAI's GPT-2 layout needs hparams.json") from err
    except (json.JSONDecodeError, KeyError) as err:
        raise ValueError(
            f"{hparams_path} is not a GPT-2 hparams file (needs n_vocab, n_ctx, n_layer, n_head, n_embd): {err}"
        ) from err
    prefix = directory / "model.ckpt"
    pointer = directory / "checkpoint"
    if pointer.is_file():  # `model_checkpoint_path: "model.ckpt"`, relative to the directory
        for line in pointer.read_text().splitlines():
            if line.startswith("model_checkpoint_path:"):
                prefix = directory / line.split(":", 1)[1].strip().strip('"')
    # Conv1D weights are [1, in, out] in TF: drop the leading 1 to get HF's [in, out].
    tensors = {tf_name_to_hf(k): (v.squeeze(0) if v.dim() == 3 else v) for k, v in read_tf_checkpoint(prefix).items()}
    model = GPT(config)
    load_hf_state_dict(model, tensors)
    return model.eval()


def load_any(path: str | os.PathLike[str], **config_overrides: Any) -> GPT:
    """Load whichever GPT-2 format `path` holds: a HF directory (or Hub name), OpenAI's TF release directory,
    or an llm.c `.bin` file."""
    local = Path(path).expanduser()
    if local.is_file():
        return load_llmc(local, **config_overrides)
    if local.is_dir() and not (local / "config.json").exists() and (local / "hparams.json").exists():
        return load_openai_tf(local, **config_overrides)
    return load_pretrained(path, **config_overrides)
