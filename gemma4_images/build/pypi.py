"""What the package index says about a project: its releases, each file's hash and upload time
(the JSON form of the simple API, PEP 691/700), and what a wheel's METADATA requires. Asked of the
index pip is configured with, so the mirrors and proxies users already set up apply."""

from __future__ import annotations

import functools
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from gemma4_images.spec.upstream import UpstreamError, index_page


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
