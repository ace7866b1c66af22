"""The reports folder, and the SBOM and provenance files of a built image in it, which `push` attaches.

`build` writes them after every build, so they are never older than the image; when the image, its
tag and what writes them are all unchanged since they were written (a no-change rebuild: the quick
start run again), they are kept instead of read out of the image again (~13 s on 2 cores)."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import metadata
from pathlib import Path

from gemma4_images.build.docker_build import local_image
from gemma4_images.check import image_contents
from gemma4_images.spec import platforms
from gemma4_images.spec.matrix import ROOT
from gemma4_images.spec.upstream import file_sha256


def write_document(path: Path, text: str) -> None:
    """Whole or not at all: a failed write leaves no half-made file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)


def key(name: str, platform: str | None = None, release: str | None = None) -> str:
    """What a target's reports are filed under for platform: the target, -v<release> for a vLLM
    release of releases/ (Matrix.report_release; the first release keeps the plain name), and another
    platform's tag suffix (reports/sbom-xeon6-arm64.cdx.json, reports/smoke-xeon6-v0.32.0.json)."""
    return name + (f"-v{release}" if release else "") + platforms.parse(platform).tag_suffix


REPORTS_ENV = "GEMMA4_REPORTS"


def folder() -> Path:
    """The reports folder every command writes and reads (smoke reports, SBOM, provenance,
    pushed.json, the node policy): the checkout's reports/ from any working directory, or the folder
    GEMMA4_REPORTS names (a CI job's artifacts)."""
    return Path(os.environ.get(REPORTS_ENV) or ROOT / "reports")


def sbom_path(name: str) -> Path:
    return folder() / f"sbom-{name}.cdx.json"


def provenance_path(name: str) -> Path:
    return folder() / f"provenance-{name}.intoto.json"


def write_sbom(contents, name: str, out: Path | None = None) -> str:
    from gemma4_images.publish import sbom

    document = sbom.make(contents)  # ImageError (no file written) when the fixes records disagree
    path = out or sbom_path(name)
    write_document(path, document)
    parsed = json.loads(document)
    return f"{path}: {len(parsed['components'])} components, {len(sbom.patches_in(parsed))} patches"


def contract_path(name: str) -> Path:
    return folder() / f"contract-{name}.cst.yaml"


def write_contract(m, target: str, path: Path) -> str:
    """The image's contract (spec/contract.py) as container-structure-test reads it."""
    import yaml

    from gemma4_images.spec import contract

    write_document(path, yaml.safe_dump(contract.config(m, target), sort_keys=False, width=1000))
    return str(path)


def write_provenance(contents, m, name: str, out: Path | None = None) -> str:
    from gemma4_images.publish import provenance

    path = out or provenance_path(name)
    write_document(path, provenance.to_json(provenance.statement(contents, m)))
    return str(path)


# What the documents are computed from besides the image: the code that reads the image and
# writes them, targets.yaml and the release files (and the code that reads them) for the
# provenance, and the libraries that write the SBOM's components and purls.
GENERATOR_FILES = [
    "gemma4_images/build/probe.py",
    "gemma4_images/check/image_contents.py",
    "gemma4_images/check/cargo_auditable.py",
    "gemma4_images/publish/sbom.py",
    "gemma4_images/publish/provenance.py",
    "gemma4_images/spec/matrix.py",
    "targets.yaml",
]
GENERATOR_LIBRARIES = ["cyclonedx-python-lib", "packageurl-python"]


def _generator() -> str:
    h = hashlib.sha256()
    for dist in GENERATOR_LIBRARIES:
        h.update(f"{dist}=={metadata.version(dist)}\n".encode())
    releases = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "releases").glob("vllm-*.yaml"))
    for rel in [*GENERATOR_FILES, *releases]:
        h.update(rel.encode() + b"\0" + (ROOT / rel).read_bytes())
    return h.hexdigest()


def _stamp_path(name: str) -> Path:
    return folder() / f".{name}.written-for.json"


def _stamp(name: str, image, ref: str) -> dict:
    return {
        "image": image.id,
        "ref": ref,
        # the provenance's subjects name them too (a push or pull adds one)
        "repo_digests": sorted(image.attrs.get("RepoDigests") or []),
        "generator": _generator(),
        "files": {p.name: file_sha256(p) if p.is_file() else None for p in (sbom_path(name), provenance_path(name))},
    }


def current(name: str, image, ref: str) -> bool:
    """Both documents exist as written for this image (id and repo digests) and tag, by this
    generator, and untouched since."""
    try:
        recorded = json.loads(_stamp_path(name).read_text())
    except (OSError, ValueError):
        return False
    now = _stamp(name, image, ref)
    return recorded == now and all(now["files"].values())


def current_for_tag(client, name: str, tag: str) -> bool:
    """current() for the image tag names now (before a build that may move it); False if none."""
    image = local_image(client, tag)
    return image is not None and current(name, image, tag)


def for_build(client, m, name: str, built: str, log, platform: str | None = None) -> None:
    """Write (or keep, when current) TARGET name's SBOM and provenance for the image built for
    platform (None: the default), filed under key(name, platform), and its contract."""
    image = client.images.get(built)
    filed = key(name, platform, m.report_release if m else None)
    if m is not None:
        log(write_contract(m, name, contract_path(filed)))
    if current(filed, image, built):
        log(f"{sbom_path(filed)} and {provenance_path(filed)} already describe {built} ({image.id[:19]}): kept")
        return
    _stamp_path(filed).unlink(missing_ok=True)
    contents = image_contents.read(client, m, name, built)
    try:
        log(write_sbom(contents, filed))
    except image_contents.ImageError as e:
        raise image_contents.ImageError(f"{e}; {built} was built, but its SBOM was not written") from e
    log(write_provenance(contents, m, filed))
    write_document(_stamp_path(filed), json.dumps(_stamp(filed, image, built), indent=1) + "\n")
