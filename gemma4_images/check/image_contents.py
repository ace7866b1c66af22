"""What a built image holds, read for its SBOM and provenance: files copied out of a container
that is created but never started, and the Python distributions listed by the image's own Python
in a container with no network. Nothing from the build host's checkout is trusted for these."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gemma4_images.build import probe
from gemma4_images.build.docker_build import local_image
from gemma4_images.check import cargo_auditable
from gemma4_images.spec.facts import RECORDS
from gemma4_images.spec.matrix import ROOT, Matrix, dockerfile_name

DPKG_STATUS = "/var/lib/dpkg/status"
# os-release(5): /etc/os-release, else /usr/lib/os-release (Debian's /etc one is a symlink to it,
# and an archive of a symlink holds the link, not the file).
OS_RELEASE = ("/etc/os-release", "/usr/lib/os-release")
# The pack as the template copies it into the image (COPY patches/ /opt/gemma4-e2b/patches/).
PACK = "/opt/gemma4-e2b/patches"
# The COPY lines of a rendered Dockerfile: `COPY [--flags] SRC... DEST`.
COPY_LINE = re.compile(r"^COPY\s+(?:--\S+\s+)*(.+)$", re.M)

# Run by the image's own python3 (the one first on its PATH, as the entrypoint's shebang finds it):
# every distribution on its sys.path, which import packages each one's files provide, the
# distributions vendored inside its files (metadata folders its RECORD lists besides its own, as
# setuptools/_vendor/*.dist-info), and every ELF file with cargo-auditable data (the whole file
# system but /proc, /sys and /dev; cargo_auditable's source, prepended, reads the section).
PROBE = r"""
import base64, hashlib, importlib.metadata as md, json, os, sys
from pathlib import Path


def vendored(d):
    own, found = Path(str(getattr(d, "_path", ""))).resolve(), {}
    for f in d.files or ():
        if f.name in ("METADATA", "PKG-INFO") and f.parent.name.endswith((".dist-info", ".egg-info", "EGG-INFO")):
            folder = Path(d.locate_file(f)).parent
            if folder.resolve() != own and folder.is_dir():
                m = md.PathDistribution(folder).metadata
                found[str(folder)] = {"name": m["Name"], "version": m["Version"], "path": str(folder)}
    return sorted(found.values(), key=lambda v: v["path"])


def audited(path):
    with open(path, "rb") as f:
        data = section(f)
        if data is None:
            return None
        f.seek(0)
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return {"path": path, "sha256": digest.hexdigest(), "dep_v0": base64.b64encode(data).decode()}


def auditable():
    out, folders = [], ["/"]
    while folders:
        with os.scandir(folders.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    if e.path not in ("/proc", "/sys", "/dev"):
                        folders.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    try:
                        found = audited(e.path)
                    except (OSError, ValueError):
                        continue  # unreadable, or an ELF file cut short: no section to read
                    if found:
                        out.append(found)
    return sorted(out, key=lambda b: b["path"])


owners = {}
for top, dists in md.packages_distributions().items():
    for dist in dists:
        owners.setdefault(dist, set()).add(top)
out = []
for d in md.distributions():
    m = d.metadata
    out.append({
        "name": m["Name"], "version": m["Version"], "summary": m.get("Summary") or "",
        "license": m.get("License-Expression") or m.get("License") or "",
        "classifiers": [c for c in (m.get_all("Classifier") or []) if c.startswith("License ::")],
        "packages": sorted(owners.get(m["Name"], ())),
        "vendored": vendored(d),
    })
print(json.dumps({"python": sys.executable, "version": sys.version.split()[0], "distributions": out,
                  "auditable": auditable()}))
"""


class ImageError(Exception):
    """The image cannot be described: missing, or lacking what every built image holds."""


@dataclass
class Contents:
    ref: str
    id: str  # the local image id: sha256 of the image config, which a push and a pull keep
    repo_digests: list[str]
    created: str
    docker_version: str
    labels: dict[str, str]
    files: dict[str, bytes]  # path in the image -> bytes, for everything read out of it
    copied: list[str]  # what the target's Dockerfile copies into the image: our own files
    python: dict
    fixes: list[dict] = field(default_factory=list)  # /etc/gemma4-e2b/fixes.json's entries ([]: none)

    def text(self, path: str) -> str:
        return self.files[path].decode()

    def json(self, path: str):
        return json.loads(self.files[path])

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()

    def os_release(self) -> dict[str, str]:
        """os-release(5) as a dict ({} when the image has none)."""
        path = next((p for p in OS_RELEASE if p in self.files), None)
        if path is None:
            return {}
        pairs = (line.split("=", 1) for line in self.text(path).splitlines() if "=" in line)
        return {k: v.strip().strip('"') for k, v in pairs}

    def fix_paths(self, entry: dict) -> tuple[str, str]:
        """The image's fix.json and the diff a manifest entry's fix was applied from: its port
        (ports/<profile>.diff) when the entry names one, else fix.diff."""
        folder = f"{PACK}/{entry['name']}"
        diff = f"{folder}/ports/{entry['port']}.diff" if entry.get("port") else f"{folder}/fix.diff"
        return f"{folder}/fix.json", diff

    def fix_facts(self, entry: dict) -> dict:
        """The entry's fix.json as its build applied it: with its port's written_against,
        verified and pre_sha256 when it names one."""
        fix = self.json(self.fix_paths(entry)[0])
        return {**fix, **fix["ports"][entry["port"]]} if entry.get("port") else fix

    def under(self, prefix: str) -> list[str]:
        return sorted(p for p in self.files if p == prefix or p.startswith(prefix.rstrip("/") + "/"))


def copy_destinations(dockerfile: str, target: str) -> list[str]:
    """The paths a rendered Dockerfile's COPY lines write in the image (our own files)."""
    out = []
    for args in COPY_LINE.findall(dockerfile):
        dest = args.split()[-1].replace("${GEMMA4_TARGET}", target)
        out.append(dest.rstrip("/") or "/")
    return out


def read(client, matrix: Matrix, target: str, ref: str) -> Contents:
    """Everything the SBOM and the provenance say about target's built image ref."""
    image = local_image(client, ref)
    if image is None:
        raise ImageError(f"no local image {ref}; build it first (`python build.py build {target}`)")
    labels = image.labels or {}
    if "io.gemma4-images.target" not in labels:
        raise ImageError(f"{ref} has no io.gemma4-images.target label: it was not built by `build.py build`")
    dockerfile = (ROOT / dockerfile_name(matrix.targets[target].family)).read_text()
    ours = copy_destinations(dockerfile, target)
    files = probe.files(client, ref, [DPKG_STATUS, *OS_RELEASE, RECORDS, *ours])
    for required in (DPKG_STATUS, f"{RECORDS}/build.json"):
        if required not in files:
            raise ImageError(f"{ref} has no {required}; rebuild it with `python build.py build {target}`")
    manifest = f"{RECORDS}/fixes.json"
    fixes = json.loads(files[manifest])["fixes"] if manifest in files else []
    attrs = image.attrs
    return Contents(
        ref=ref,
        id=image.id,
        repo_digests=attrs.get("RepoDigests") or [],
        created=attrs.get("Created", ""),
        docker_version=attrs.get("DockerVersion", ""),
        labels=labels,
        files=files,
        copied=ours,
        python=probe.python(client, ref, Path(cargo_auditable.__file__).read_text() + PROBE),
        fixes=fixes,
    )
