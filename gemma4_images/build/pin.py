"""`build.py pin`: record the registry digest of every base image of every release (releases/
vllm-V.yaml), so builds pull `image@digest` instead of floating with the tag; `--check` reports
every tag whose digest moved.

A release file is edited as text, one `digest:` line per image, so its comments and layout stay as
they are; the edited file is read again and must give exactly the new digests."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from gemma4_images.build import registry
from gemma4_images.spec import matrix as matrix_mod
from gemma4_images.spec import reference


class PinError(Exception):
    pass


@dataclass
class Base:
    image: str  # the tag as its release file writes it
    recorded: str | None  # the digest the release file holds for it
    targets: list[str]  # whose base (or Gaudi stage 1) it is
    where: str = field(default="its release file")  # the release file, relative to the checkout


@dataclass
class Result:
    base: Base
    digest: str | None = None
    error: str | None = None
    platforms: dict[str, str] | None = None  # when the tag is an index: {os/arch: manifest digest}

    @property
    def state(self) -> str:
        if self.error:
            return "error"
        if self.digest is None:
            return "missing"
        if self.base.recorded is None:
            return "unpinned"
        return "ok" if self.digest == self.base.recorded else "moved"

    def line(self) -> str:
        b = self.base
        text = {
            "ok": f"pinned at {b.recorded}",
            "moved": f"{b.where} has {b.recorded}, the registry now has {self.digest}",
            "unpinned": f"not pinned; the registry has {self.digest}",
            "missing": "the registry has no such tag",
            "error": f"cannot resolve: {self.error}",
        }[self.state]
        if self.platforms:
            text += "; an index of " + ", ".join(f"{p} {d}" for p, d in self.platforms.items())
        return f"{self.state.upper():<9} {b.image} ({', '.join(b.targets)}): {text}"


def bases(matrix: matrix_mod.Matrix, names: list[str], where: str = "its release file") -> list[Base]:
    """Every registry image the named targets build on at matrix's release, once each: their bases
    (each platform's: `xeon6 linux/arm64`) and Gaudi's stage-1 image. A base that stage 1 builds
    here has no registry digest to pin."""
    found: dict[str, Base] = {}
    for name in names:
        t = matrix.targets[name]
        images = [(name, t.stage1)] if t.stage1 else [(name, t.base)]
        images += [(f"{name} {p}", img) for p, img in t.base.platforms.items()]
        for label, img in images:
            entry = found.setdefault(img.image, Base(img.image, img.digest, [], where))
            entry.targets.append(label)
    return list(found.values())


def resolve(entries: list[Base]) -> list[Result]:
    """Each base's registry digest; for a tag that is an index (a vendor's multi-platform tag),
    also the manifest it names for each platform. A tag two release files name is asked once."""
    asked: dict[str, dict] = {}
    for base in entries:
        if base.image not in asked:
            asked[base.image] = _ask(base.image)
    return [Result(base, **asked[base.image]) for base in entries]


def _ask(tag: str) -> dict:
    image = reference.Reference.split(tag)
    try:
        found = registry.manifest_head(image.host, image.repository, image.tag_or_latest)
        digest, media_type = found or (None, "")
        # Only an index is fetched whole: a manifest GET is what Docker Hub counts as a pull.
        is_index = media_type in registry.INDEX_TYPES
        held = registry.platform_manifests(image.host, image.repository, digest)[1] if is_index else None
        return {"digest": digest, "platforms": held}
    except registry.RegistryError as e:
        return {"error": str(e)}


def disagreements(matrix: matrix_mod.Matrix, names: list[str], results: list[Result]) -> list[str]:
    """Where a target's base tag is an index whose entry for one of the target's other platforms is
    not the manifest that platform's own tag has: the vendor's two tags disagree, so a pull by
    the plain tag and the build's pull by the per-platform tag would get different images (vLLM
    joins its per-architecture tags into the plain tag: targets.yaml's &vllm_release_images)."""
    by_image = {r.base.image: r for r in results}
    lines = []
    for name in names:
        t = matrix.targets[name]
        joined = by_image.get(t.base.image)
        for p, img in t.base.platforms.items():
            own = by_image.get(img.image)
            if not (joined and joined.platforms and own and own.digest) or p not in joined.platforms:
                continue
            if joined.platforms[p] != own.digest:
                lines.append(
                    f"MISMATCH  {name} {p}: the index {t.base.image} names {joined.platforms[p]}, "
                    f"but {img.image} has {own.digest}"
                )
    return lines


def write(path: Path, digests: dict[str, str], today: str | None = None) -> list[str]:
    """Set the digest line under each `image: <tag>` line of path (a release file); returns the
    images changed."""
    today = today or datetime.now(timezone.utc).strftime("%Y-%m-%d")
    lines = path.read_text().splitlines(keepends=True)
    changed = []
    for image, digest in digests.items():
        host = registry.api_host(reference.Reference.split(image).host)
        comment = f"  # pinned by `build.py pin` from {host} on {today}"
        hits = [
            i
            for i, line in enumerate(lines)
            if re.fullmatch(rf"\s*image:\s*{re.escape(image)}\s*(#.*)?", line.rstrip("\n"))
        ]
        if not hits:
            raise PinError(f"{path}: no `image: {image}` line to pin")
        for i in reversed(hits):
            indent = len(lines[i]) - len(lines[i].lstrip())
            at = _sibling(lines, i, indent, "digest:")
            new = f"{' ' * indent}digest: {digest}{comment}\n"
            if at is None:
                lines.insert(i + 1, new)
                changed.append(image)
            elif lines[at].split("#")[0].split(":", 1)[1].strip() != digest:
                lines[at] = new
                changed.append(image)
    text = "".join(lines)
    # The edit must mean exactly what was asked: read it back before anything is written.
    held = _digests(yaml.safe_load(text) or {})
    for image, digest in digests.items():
        if held.get(image) != {digest}:
            got = sorted(map(str, held.get(image, set())))
            raise PinError(f"{path}: pinning {image} would give digests {got}; edit its digest lines by hand")
    tmp = path.with_name(f".{path.name}.pin")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return sorted(set(changed))


def _digests(release: dict) -> dict[str, set]:
    """image -> the digests a release file's targets give it (their bases, each platform's, stage 1)."""
    held: dict[str, set] = {}
    for t in (release.get("targets") or {}).values():
        base = (t or {}).get("base") or {}
        for img in (base, (t or {}).get("stage1"), *(base.get("platforms") or {}).values()):
            if img and "image" in img:
                held.setdefault(img["image"], set()).add(img.get("digest"))
    return held


def _sibling(lines: list[str], i: int, indent: int, key: str) -> int | None:
    """The line of `key` in the same YAML mapping as line i (same indent; comments, blank lines and
    deeper lines skipped; the mapping ends at the first line indented less)."""
    for j in range(i + 1, len(lines)):
        stripped = lines[j].strip()
        if not stripped or stripped.startswith("#"):
            continue
        depth = len(lines[j]) - len(lines[j].lstrip())
        if depth < indent:
            return None
        if depth == indent and stripped.startswith(key):
            return j
    return None
