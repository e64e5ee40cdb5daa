"""OpenAI's TensorFlow release of GPT-2 (`models/124M/`: hparams.json + model.ckpt.*), read without TensorFlow."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from gpt2.config import GPTConfig
from gpt2.model import GPT
from gpt2.weights.empty import empty_model
from gpt2.weights.hf import load_hf_state_dict

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
            raise ValueError(f"variable {key.decode()} has unsupported TF dtype {values.get(1)!r}")
        shape_proto = values.get(2, b"")
        assert isinstance(shape_proto, bytes), "TensorShapeProto is a length-delimited field"
        dims = [dim for number, dim in _proto_fields(shape_proto) if number == 2 and isinstance(dim, bytes)]
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
            vocab_size=hparams["n_vocab"],
            block_size=hparams["n_ctx"],
            n_layer=hparams["n_layer"],
            n_head=hparams["n_head"],
            n_embd=hparams["n_embd"],
            **config_overrides,
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
    model = empty_model(config)
    load_hf_state_dict(model, tensors)
    return model.eval()
