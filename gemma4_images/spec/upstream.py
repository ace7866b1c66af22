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
import urllib.error
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


# How long to wait for each answer of the package index: pip's own default socket timeout (15 s,
# pip/_internal/cli/cmdoptions.py `--timeout`), so an index that never answers fails in seconds.
INDEX_TIMEOUT_ENV = "GEMMA4_INDEX_TIMEOUT"
INDEX_TIMEOUT_S = 15.0


def index_timeout() -> float:
    value = os.environ.get(INDEX_TIMEOUT_ENV) or str(INDEX_TIMEOUT_S)
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise UpstreamError(f"{INDEX_TIMEOUT_ENV}={value!r}: give the seconds to wait for the package index (e.g. 15)")
    return seconds


def index_page(project: str) -> tuple[str, dict]:
    """(the URL, the JSON) of project's page on the package index, in the JSON form of the simple
    API; an index that cannot be read in time, or answers anything else, is one line saying so."""
    page = f"{_index_url()}/{project}/"
    req = urllib.request.Request(page, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    timeout = index_timeout()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body, kind = r.read(), r.headers.get_content_type()
    except (OSError, ValueError) as e:
        reason = e if isinstance(e, urllib.error.HTTPError) else getattr(e, "reason", e)  # URLError wraps it
        waited = (
            f" in {timeout:g} s ({INDEX_TIMEOUT_ENV} sets how long to wait)" if isinstance(reason, TimeoutError) else ""
        )
        raise UpstreamError(
            f"cannot read {page}: {reason}{waited}; it is the index pip is configured with (PIP_INDEX_URL, or "
            "`pip config set global.index-url URL`)"
        ) from None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    problem = _not_simple_json(data, kind)
    if problem:
        raise UpstreamError(
            f"{page} is not the JSON simple API (PEP 691): {problem}; set PIP_INDEX_URL to an index that "
            "serves it, as PyPI does"
        )
    return page, data


def _not_simple_json(data, kind: str) -> str | None:
    """What the answer lacks of what is read from it: PEP 691's files, each with a filename, url and
    hashes object (and an upload-time string, PEP 700), and PEP 700's versions; None when nothing."""
    if not isinstance(data, dict):
        return f"it answered {kind}, not a JSON object"
    if not isinstance(data.get("files"), list):
        return "it has no `files` list"
    wanted = {"filename": str, "url": str, "hashes": dict}
    for f in data["files"]:
        if not isinstance(f, dict):
            return f"a file is {f!r}, not an object"
        for key, kind_of in wanted.items():
            if not isinstance(f.get(key), kind_of):
                return f"file {f.get('filename')!r} has no `{key}` {kind_of.__name__}"
        if not isinstance(f.get("upload-time") or "", str):
            return f"file {f['filename']!r} has an `upload-time` that is not a string"
    versions = data.get("versions", [])
    if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
        return "its `versions` is not a list of strings"
    return None


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
    try:
        page, data = index_page(filename.rsplit("-", 1)[0])
    except UpstreamError as e:
        raise UpstreamError(f"{e}. Offline? Put {filename} in {path.parent} and run again.") from None
    url = next((f["url"] for f in data["files"] if f["filename"] == filename), None)
    if url is None:
        raise UpstreamError(f"{filename} is not listed at {page}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    try:
        with urllib.request.urlopen(url, timeout=index_timeout()) as r, open(tmp, "wb") as out:
            shutil.copyfileobj(r, out)
    except (OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        raise UpstreamError(
            f"cannot download {filename} from {url}: {e}. Offline? Put the file in {path.parent} and run again."
        ) from None
    if file_sha256(tmp) != sha256:
        tmp.unlink()
        raise UpstreamError(f"{filename}: sha256 does not match the pin in targets.yaml ({sha256})")
    tmp.rename(path)
    return path


def sdist_member(sdist: str, sha256: str, member: str) -> bytes | None:
    """The file member of the source archive (fetched and verified by fetch_sdist); None when the
    archive holds no such file."""
    with tarfile.open(fetch_sdist(sdist, sha256)) as tar:
        try:
            f = tar.extractfile(member)
        except KeyError:  # tarfile's answer for a name the archive lacks
            return None
        return None if f is None else f.read()  # None: a folder, not a file


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
            data = sdist_member(src.sdist, src.sdist_sha256, src.member)
            if data is None:
                raise UpstreamError(
                    f"{src.sdist} holds no file {src.member} (upstream file {rel}): correct its member in "
                    "targets.yaml upstream_files, or in the release file's for another vLLM release"
                )
            dest.parent.mkdir(parents=True, exist_ok=True)
            # whole or not at all: a file that exists is never half-written
            partial = dest.with_name(f".{dest.name}.partial")
            partial.write_bytes(data)
            partial.replace(dest)
            sources[rel] = source
            record.write_text(json.dumps(sources, indent=2) + "\n")
        staged.append(dest)
    return staged
