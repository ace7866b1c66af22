"""Files that serve flags name, taken from vLLM's own source release of the pinned version.

The recipe's `--chat-template examples/tool_chat_template_gemma4.jinja` is a file of vLLM's
repository that its wheels do not ship. The build host takes it from the source archive on the
package index (sha256-pinned in targets.yaml), so the image holds exactly the pinned version's file
and this repository holds none of vLLM's code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

from gemma4_images.spec.matrix import ROOT, Matrix

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


def _index_url() -> str:
    """The index pip is configured with, so mirrors and proxies users already set up apply."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
        )
        url = out.stdout.strip() if out.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/")


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return stream_sha256(f)


def stream_sha256(f) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def fetch_sdist(filename: str, sha256: str) -> Path:
    """The named source archive, from the cache or the index, verified against its pinned hash."""
    path = cache_dir() / "sdists" / filename
    if path.exists() and file_sha256(path) == sha256:
        return path
    project = filename.rsplit("-", 1)[0]
    page = f"{_index_url()}/{project}/"
    try:
        req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            files = json.load(r)["files"]
        url = next(f["url"] for f in files if f["filename"] == filename)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        with urllib.request.urlopen(url, timeout=600) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out)
    except StopIteration:
        raise UpstreamError(f"{filename} is not listed at {page}") from None
    except (OSError, ValueError) as e:
        raise UpstreamError(
            f"cannot download {filename} from {page}: {e}. Offline? Put the file in {path.parent} and run again."
        ) from None
    if file_sha256(tmp) != sha256:
        tmp.unlink()
        raise UpstreamError(f"{filename}: sha256 does not match the pin in targets.yaml ({sha256})")
    tmp.rename(path)
    return path


def stage(matrix: Matrix, stage_dir: Path = STAGE) -> list[Path]:
    """Put every upstream file targets.yaml names (at matrix's vLLM release) under .build/upstream/,
    ready for COPY. A staged file is fetched again only when its source differs: each one's source
    is kept in stage_dir/sources.json, outside what the Dockerfiles COPY, so builds of two releases
    in turn each COPY their own."""
    staged = []
    record = stage_dir / "sources.json"
    sources = json.loads(record.read_text()) if record.exists() else {}
    for rel, src in matrix.upstream_files.items():
        dest = stage_dir / rel
        source = f"{src.sdist} sha256:{src.sdist_sha256} {src.member}"
        if not dest.exists() or sources.get(rel) != source:
            archive = fetch_sdist(src.sdist, src.sdist_sha256)
            with tarfile.open(archive) as tar:
                member = tar.extractfile(src.member)
                if member is None:
                    raise UpstreamError(f"{src.member} is not in {src.sdist}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                # whole or not at all: a file that exists is never half-written
                partial = dest.with_name(f".{dest.name}.partial")
                partial.write_bytes(member.read())
                partial.replace(dest)
            sources[rel] = source
            record.write_text(json.dumps(sources, indent=2) + "\n")
        staged.append(dest)
    return staged
