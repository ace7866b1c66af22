"""Seeded bf16 values streamed straight into sharded safetensors files, one chunk in memory at a time.

A shard's header is written first (every tensor's shape and offsets are known from the meta model),
then each tensor's values chunk by chunk: no tensor, let alone the model, is ever whole in memory,
and nothing is ever float32."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

from .tensors import TensorSpec

BYTES_PER_VALUE = 2  # bfloat16, the published checkpoint's dtype and what the recipes serve
# 64M values (128 MiB) a chunk: large enough that 2 cores spend their time generating, not looping.
CHUNK_VALUES = 64 * 2**20
# Shards of at most 2 GiB, as save_pretrained cuts them; a larger tensor gets a shard of its own.
MAX_SHARD_BYTES = 2 * 2**30
INDEX = "model.safetensors.index.json"


def tensor_seed(seed: int, name: str) -> int:
    """Each tensor's own seed, from the model's and its name: its values do not depend on the order."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{name}".encode()).digest()[:8], "little") >> 1


def chunks(spec: TensorSpec, seed: int) -> Iterator:
    """spec's values, in row-major order, as bf16 tensors of at most CHUNK_VALUES values."""
    import torch

    shape = spec.shape or (1,)
    row = math.prod(shape[1:])
    rows = max(1, CHUNK_VALUES // max(row, 1))
    generator = torch.Generator().manual_seed(tensor_seed(seed, spec.name))
    for start in range(0, shape[0], rows):
        part = torch.empty((min(rows, shape[0] - start), *shape[1:]), dtype=torch.bfloat16)
        if spec.init.value is not None:
            part.fill_(spec.init.value)
            yield part
            continue
        part.normal_(0.0, spec.init.std, generator=generator)
        if spec.init.zero_row is not None and start <= spec.init.zero_row < start + len(part):
            part[spec.init.zero_row - start].zero_()
        yield part


def plan(specs: list[TensorSpec], max_bytes: int = MAX_SHARD_BYTES) -> list[list[TensorSpec]]:
    """Consecutive tensors packed into shards of at most max_bytes (one larger tensor alone)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec.numel * BYTES_PER_VALUE
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def header(specs: list[TensorSpec]) -> bytes:
    """The safetensors header: length, then JSON padded with spaces to 8 bytes, as the library writes it."""
    entries, offset = {"__metadata__": {"format": "pt"}}, 0
    for spec in specs:
        end = offset + spec.numel * BYTES_PER_VALUE
        entries[spec.name] = {"dtype": "BF16", "shape": list(spec.shape), "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def write_shard(path: Path, specs: list[TensorSpec], seed: int) -> int:
    """One shard file; returns the bytes of tensor data written."""
    import torch

    written = 0
    with path.open("wb") as f:
        f.write(header(specs))
        for spec in specs:
            for part in chunks(spec, seed):
                # int16 shares the bf16 bytes: numpy writes them without a copy.
                f.write(part.reshape(-1).view(torch.int16).numpy())
                written += part.numel() * BYTES_PER_VALUE
    return written


def write_checkpoint(out: Path, specs: list[TensorSpec], seed: int, max_bytes: int = MAX_SHARD_BYTES) -> dict:
    """The shards and model.safetensors.index.json in out; returns the index."""
    shards = plan(specs, max_bytes)
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, 1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        total += write_shard(out / name, shard, seed)
        weight_map.update({spec.name: name for spec in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return index
