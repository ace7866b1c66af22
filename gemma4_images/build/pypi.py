"""The package index, the package's one place that asks it (pip's own downloads aside): what it says
about a project (its releases, each file's hash and upload time: the JSON form of the simple API,
PEP 691/700), what a wheel's METADATA requires, and vLLM's source archives, fetched by their pinned
hash into the machine cache, whose files serve flags name are staged for the build. Asked of the
index pip is configured with, so the mirrors and proxies users already set up apply."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from gemma4_images.spec.matrix import Matrix
from gemma4_images.spec.upstream import STAGE, UpstreamError, cache_dir, file_sha256


class PyPIError(UpstreamError):
    """The index lacks what was asked for (index_page says when it cannot be read)."""


@dataclass(frozen=True)
class File:
    filename: str
    url: str
    sha256: str
    uploaded: str  # ISO 8601, as the index gives it


@dataclass(frozen=True)
class Project:
    name: str
    versions: list[str]  # oldest first, pre-releases and unparsable versions left out
    files: list[File]

    def files_of(self, version: str) -> list[File]:
        wheel = f"{self.name.replace('-', '_')}-{version}-"
        sdist = f"{self.name}-{version}.tar.gz"
        return [f for f in self.files if f.filename.startswith(wheel) or f.filename == sdist]

    def uploaded(self, version: str) -> str:
        """When the release's first file was uploaded: when the release was published."""
        return min(f.uploaded for f in self.files_of(version))

    def newest(self, spec: str = "", before: str | None = None) -> str | None:
        """The newest release matching spec (a PEP 440 specifier) published before the time given."""
        from packaging.specifiers import SpecifierSet

        ok = SpecifierSet(spec)
        found = [v for v in self.versions if v in ok and (before is None or self.uploaded(v) <= before)]
        return found[-1] if found else None


def _stable(version: str) -> Version | None:
    try:
        v = Version(version)
    except InvalidVersion:
        return None
    return None if v.is_prerelease or v.is_devrelease else v


@functools.lru_cache(maxsize=None)
def project(name: str) -> Project:
    page, data = index_page(name)
    files = [
        File(f["filename"], f["url"], f["hashes"].get("sha256", ""), f.get("upload-time") or "")
        for f in data.get("files", [])
        if not f.get("yanked")
    ]
    stable = {v: parsed for v in data.get("versions", []) if (parsed := _stable(v))}
    # A version whose files were all yanked is no release to take.
    listed = {v for v in stable if Project(name, [], files).files_of(v)}
    if not listed:
        raise PyPIError(f"{name} has no release on the package index ({page} lists no stable version with files)")
    return Project(name, sorted(listed, key=stable.get), files)


def metadata(wheel: Path) -> dict:
    """A wheel's METADATA as {"version", "requires": [Requirement], "extras": {name: [Requirement]}}."""
    with zipfile.ZipFile(wheel) as whl:
        name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        msg = Parser().parsestr(whl.read(name).decode())
    requires, extras = [], {}
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or "extra" not in str(req.marker):
            requires.append(req)
            continue
        for extra in msg.get_all("Provides-Extra") or []:
            if req.marker.evaluate({"extra": extra}):
                extras.setdefault(extra, []).append(req)
    return {"version": msg["Version"], "requires": requires, "extras": extras}


def requirement_of(meta: dict, name: str) -> Requirement | None:
    """The unconditional (or this host's) requirement on distribution name, if any."""
    wanted = name.lower().replace("_", "-")
    for req in meta["requires"]:
        if req.name.lower().replace("_", "-") == wanted and (req.marker is None or req.marker.evaluate()):
            return req
    return None


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
        raise UpstreamError(f"{filename}: sha256 does not match the pin in the release file ({sha256})")
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
                    "the release file's upstream_files (releases/vllm-<V>.yaml)"
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
