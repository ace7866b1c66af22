"""E2B's configuration, read from e2b.json (each part cites its sources there), as transformers takes it."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

FACTS = Path(__file__).resolve().parent / "e2b.json"


@cache
def facts() -> dict:
    return json.loads(FACTS.read_text(encoding="utf-8"))


def values(part: str) -> dict:
    return dict(facts()[part]["values"])


def text_config() -> dict:
    text = values("text_config")
    pattern = text.pop("layer_types_pattern")
    layers = text["num_hidden_layers"]
    if layers % len(pattern):
        raise ValueError(f"{layers} layers are not a whole number of {len(pattern)}-layer patterns")
    # global_head_dim stays an argument: transformers 5.17 and 5.24 turn it into per-layer head_dim.
    return text | {"layer_types": pattern * (layers // len(pattern))}


def model_config():
    """Gemma4Config with E2B's text, vision and audio configuration (transformers is imported here)."""
    from transformers import Gemma4Config

    return Gemma4Config(
        text_config=text_config(),
        vision_config=values("vision_config"),
        audio_config=values("audio_config"),
        **values("model"),
    )


def control_ids() -> dict[str, int]:
    return values("tokens")


def vocab_size() -> int:
    return facts()["tokens"]["vocab_size"]
