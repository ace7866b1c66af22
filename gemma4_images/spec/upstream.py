"""Where upstream files are kept on this machine, and how they are hashed; no network (fetching
them from the package index is build/pypi.py's).

The recipe's `--chat-template examples/tool_chat_template_gemma4.jinja` is a file of vLLM's
repository that its wheels do not ship: the build host takes it from the source archive on the
package index (sha256-pinned in targets.yaml) and stages it under STAGE, so the image holds exactly
the pinned version's file and this repository holds none of vLLM's code.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from gemma4_images.spec.matrix import ROOT

STAGE = ROOT / ".build" / "upstream"


class UpstreamError(Exception):
    pass


def cache_dir() -> Path:
    """Machine-wide cache that survives fresh clones (CI runs in a new clone every time)."""
    configured = os.environ.get("GEMMA4_CACHE")
    if configured:
        path = Path(configured)
    elif os.access("/var/cache", os.W_OK):
        path = Path("/var/cache/gemma4-images")
    else:
        path = Path.home() / ".cache" / "gemma4-images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return stream_sha256(f)


def stream_sha256(f) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()
