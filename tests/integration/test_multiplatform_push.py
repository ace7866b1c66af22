"""Two platforms under one tag: push writes an OCI image index over each platform's image, each
image signed and its SBOM and provenance attested by cosign and the index signed; verify checks
the platform a pipeline asks for; the engine pulls each platform back by the index digest. On a
real registry on this machine (local_registry.py) with a throwaway cosign key.

The images are FROM-scratch stand-ins built for linux/amd64 and linux/arm64 (a file saying which,
a revision label; no RUN, so no emulator), not serving images: what is under test is the index,
its signatures and the per-platform choice. The real xeon6 images for both platforms go through
the same push in the linux/arm64 tier (test_arm64.py). The attested documents are small stand-ins."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import local_registry
import pytest

from gemma4_images.build import registry as registry_api
from gemma4_images.check.smoke import Check, Report
from gemma4_images.publish import cosign, index, publish, verify
from gemma4_images.spec.matrix import MatrixError
from tests.cli import build_py
from tests.cosign_keys import key_pair
from tests.cpu_default import NAME, SMOKE_OPTION, TARGET, key

pytestmark = pytest.mark.integration
REVISION = "fedcba9876543210fedcba9876543210fedcba98"
PLATFORMS = {p: key(p) for p in ("linux/amd64", "linux/arm64")}  # -> its reports' key
DOCKERFILE = """\
FROM scratch
COPY probe /probe
LABEL io.gemma4-images.test="multi-platform stand-in" org.opencontainers.image.revision="{revision}"
"""


@pytest.fixture(scope="module")
def images(inline_build):
    """{platform: tag} of the stand-ins; probe says the platform."""
    return {
        p: inline_build(
            DOCKERFILE.format(revision=REVISION),
            f"gemma4-e2b-test/multi:{p.split('/')[1]}",
            files={"probe": f"built for {p}\n"},
            platform=p,
        )
        for p in PLATFORMS
    }


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    private, public = key_pair(tmp_path_factory.mktemp("cosign") / "signer", "")
    return {"key": private, "public": public}


def write_reports(folder: Path, images: dict, platforms=PLATFORMS) -> Path:
    """A passing smoke report per platform, and stand-in SBOM and provenance documents that name
    their platform (so an attestation on the wrong image shows)."""
    folder.mkdir(parents=True, exist_ok=True)
    for p in platforms:
        key = PLATFORMS[p]
        Report(target=TARGET, image=images[p], model="tiny", checks=[Check("ready")]).write(
            folder / f"smoke-{key}.json"
        )
        sbom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "metadata": {"component": {"name": f"stand-in {p}"}}}
        (folder / f"sbom-{key}.cdx.json").write_text(json.dumps(sbom) + "\n")
        statement = {
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [],
            "predicateType": "https://slsa.dev/provenance/v1",
            "predicate": {"buildDefinition": {"buildType": f"stand-in {p}"}},
        }
        (folder / f"provenance-{key}.intoto.json").write_text(json.dumps(statement) + "\n")
    return folder


def push_both(client, m, host, images, folder, keys, logs) -> dict:
    """Both stand-ins pushed for xeon6 as its two platforms, signed and attested; the index's entry."""
    sources = {PLATFORMS[p]: tag for p, tag in images.items()}
    (entry,) = publish.push(
        client,
        m,
        [TARGET],
        f"{host}/gemma4-e2b-test",
        sources=sources,
        reports_dir=folder,
        cosign_key=keys["key"],
        log=logs.append,
    )
    return entry


@pytest.fixture(scope="module")
def release(client, m, images, keys, tmp_path_factory):
    """The two-platform push, signed: (registry root, host, the index entry, reports folder)."""
    root = tmp_path_factory.mktemp("multi")
    with local_registry.registry(root, client) as host:
        folder = write_reports(root / "reports", images)
        logs = []
        entry = push_both(client, m, host, images, folder, keys, logs)
        print("\n".join(logs))
        yield root, host, entry, folder


def version_ref(entry) -> str:
    return f"{entry['repository']}:{entry['tags'][0]}"


def per_platform(entry) -> dict:
    return {e["platform"]: e for e in entry["platforms"]}


def held_by_cosign(host: str, path: str, digest: str) -> tuple[int, int]:
    """How many signatures (.sig) and attestations (.att) cosign holds for digest."""
    counts = []
    for suffix in ("sig", "att"):
        tag = f"{digest.replace(':', '-')}.{suffix}"
        held = registry_api.manifest_digest(host, path, tag) is not None
        counts.append(len(json.loads(registry_api.get_manifest(host, path, tag)[0])["layers"]) if held else 0)
    return counts[0], counts[1]


def test_the_index_names_each_platform_image_and_every_part_is_signed_and_attested(client, images, release):
    _, host, entry, folder = release
    path = entry["repository"].split("/", 1)[1]
    assert entry["media_type"] == index.OCI_INDEX
    assert entry["tags"] == [NAME, f"{NAME}-fedcba9"]
    parts = per_platform(entry)
    assert list(parts) == list(PLATFORMS)
    assert parts["linux/arm64"]["tags"] == [f"{NAME}-arm64", f"{NAME}-fedcba9-arm64"]
    assert parts["linux/amd64"]["tags"] == [f"{NAME}-amd64", f"{NAME}-fedcba9-amd64"]

    # What the registry holds under the target's tags is the index, naming each platform's push.
    body, media_type = registry_api.get_manifest(host, path, entry["tags"][0])
    assert media_type == index.OCI_INDEX and registry_api.sha256_digest(body) == entry["digest"]
    held = json.loads(body)
    assert [(d["platform"], d["digest"]) for d in held["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, parts["linux/amd64"]["digest"]),
        ({"architecture": "arm64", "os": "linux", "variant": "v8"}, parts["linux/arm64"]["digest"]),
    ]
    assert held["annotations"] == {index.REVISION: REVISION}

    # Each platform's image is signed and its own reports attested to it; the index is signed.
    for p, part in parts.items():
        assert part["image_id"] == client.images.get(images[p]).id
        assert part["cosign"]["signed"] == f"{entry['repository']}@{part['digest']}"
        assert [a["file"] for a in part["cosign"]["attestations"]] == [
            str(folder / f"sbom-{PLATFORMS[p]}.cdx.json"),
            str(folder / f"provenance-{PLATFORMS[p]}.intoto.json"),
        ]
        assert held_by_cosign(host, path, part["digest"]) == (1, 2)
    assert entry["cosign"] == {"signed": f"{entry['repository']}@{entry['digest']}", "attestations": []}
    assert held_by_cosign(host, path, entry["digest"]) == (1, 0)
    assert publish.pushed_ref(TARGET, folder) == f"{entry['repository']}@{entry['digest']}"


def test_each_platform_pulls_its_own_image_by_the_index_digest(client, images, release):
    _, host, entry, _ = release
    by_digest = f"{entry['repository']}@{entry['digest']}"
    for p, tag in images.items():
        # Docker 20.10 keeps one image per reference: the other platform's pull must go first.
        local_registry.forget(client, host)
        client.api.pull(by_digest, platform=p)
        pulled = client.images.get(by_digest)
        print(f"pull --platform {p} {by_digest}: {pulled.id} {pulled.attrs['Architecture']}")
        assert pulled.id == client.images.get(tag).id and p == f"linux/{pulled.attrs['Architecture']}"
    local_registry.forget(client, host)


def _verify(entry, keys, platform, **kw):
    return verify.verify(version_ref(entry), keys["public"], platform=platform, log=print, **kw)


def test_verify_checks_and_hands_over_the_platform_asked_for(release, keys, tmp_path):
    _, _, entry, _ = release
    parts = per_platform(entry)
    for p in PLATFORMS:
        out = tmp_path / p.replace("/", "-")
        result = _verify(entry, keys, p, attachments_dir=out, require_attestations=True)
        assert (result["digest"], result["index"], result["platform"]) == (parts[p]["digest"], entry["digest"], p)
        assert sorted(f.name for f in out.iterdir()) == ["cyclonedx.intoto.json", "slsaprovenance1.intoto.json"]
        for f in out.iterdir():
            statement = json.loads(f.read_text())
            assert p in json.dumps(statement["predicate"]), f
            assert statement["subject"][0]["digest"]["sha256"] == parts[p]["digest"].partition(":")[2]

    run = build_py("verify", version_ref(entry), "--cosign-key", str(keys["public"]), "--platform", "linux/arm64")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (
        f"verified {entry['repository']}:{entry['tags'][0]}@{entry['digest']} "
        f"(linux/arm64: {entry['repository']}:{entry['tags'][0]}@{parts['linux/arm64']['digest']})"
    )


def test_a_tampered_platform_manifest_is_refused_and_the_other_platform_still_verifies(release, keys):
    root, _, entry, _ = release
    arm = per_platform(entry)["linux/arm64"]["digest"]
    hexd = arm.partition(":")[2]
    stored = root / "data/docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"
    original = stored.read_bytes()
    # The registry's copy of the arm64 manifest now says another config size: other bytes, same name.
    tampered = original.replace(b'"size": ', b'"size": 1', 1)
    assert tampered != original
    stored.write_bytes(tampered)
    try:
        with pytest.raises(cosign.CosignError, match=f"the registry's manifest for {arm} is other bytes"):
            _verify(entry, keys, "linux/arm64")
        assert _verify(entry, keys, "linux/amd64")["platform"] == "linux/amd64"
    finally:
        stored.write_bytes(original)
    assert _verify(entry, keys, "linux/arm64")["digest"] == arm


def test_a_platform_without_its_own_signature_is_refused_though_the_index_is_signed(release, keys, tmp_path):
    """The index's signature alone does not clear a platform: a pull by the tag checks both."""
    root, _, entry, _ = release
    path = entry["repository"].split("/", 1)[1]
    arm = per_platform(entry)["linux/arm64"]["digest"]
    # The registry's tag of the arm64 image's signature, moved out of its storage.
    signed = root / "data/docker/registry/v2/repositories" / path / "_manifests/tags" / f"{arm.replace(':', '-')}.sig"
    shutil.move(signed, tmp_path / "kept")
    try:
        with pytest.raises(cosign.CosignError, match="no signatures found"):
            _verify(entry, keys, "linux/arm64")
        assert _verify(entry, keys, "linux/amd64")["platform"] == "linux/amd64"
    finally:
        shutil.move(tmp_path / "kept", signed)


def test_an_index_repointed_without_the_key_is_refused(release, keys):
    """Someone with write access to the registry swaps the platforms' places under the signed tag."""
    _, host, entry, _ = release
    path = entry["repository"].split("/", 1)[1]
    original, _ = registry_api.get_manifest(host, path, entry["digest"])
    held = json.loads(original)
    swapped = [{**d, "platform": other["platform"]} for d, other in zip(held["manifests"], held["manifests"][::-1])]
    forged = index.body(swapped, REVISION)
    index.put(host, path, entry["tags"][0], forged)
    try:
        for p in PLATFORMS:
            with pytest.raises(cosign.CosignError, match="refused by cosign verify: no signatures found"):
                _verify(entry, keys, p)
    finally:
        index.put(host, path, entry["tags"][0], original)
    assert _verify(entry, keys, "linux/amd64")["index"] == entry["digest"]


def test_the_registry_stores_no_index_naming_a_manifest_it_lacks(release):
    _, host, entry, _ = release
    path = entry["repository"].split("/", 1)[1]
    held = json.loads(registry_api.get_manifest(host, path, entry["digest"])[0])
    missing = [{**held["manifests"][0], "digest": "sha256:" + "0" * 64}]
    with pytest.raises(registry_api.RegistryError, match="manifest blob unknown"):
        index.put(host, path, "dangling", index.body(missing, REVISION))


def test_pushing_the_same_images_again_stores_and_signs_nothing_new(client, m, images, keys, release):
    _, host, entry, folder = release
    path = entry["repository"].split("/", 1)[1]
    logs = []
    again = push_both(client, m, host, images, folder, keys, logs)
    assert again["digest"] == entry["digest"] and again["pushed"] == [] and again["already_present"] == entry["tags"]
    # (The pull test forgot the engine's record of these pushes, so it may push them again: same digests.)
    assert [e["digest"] for e in again["platforms"]] == [e["digest"] for e in entry["platforms"]]
    for part in again["platforms"]:  # cosign keeps one signature and one attestation of each type
        assert held_by_cosign(host, path, part["digest"]) == (1, 2)
    assert held_by_cosign(host, path, entry["digest"]) == (1, 0)


def test_verify_platform_on_a_single_image_is_refused_unless_it_is_that_platform(client, m, images, keys, tmp_path):
    with local_registry.registry(tmp_path, client) as host:
        folder = write_reports(tmp_path / "reports", images, platforms=["linux/amd64"])
        (entry,) = publish.push(
            client,
            m,
            [TARGET],
            f"{host}/gemma4-e2b-test",
            platforms_wanted=["linux/amd64"],
            sources={PLATFORMS["linux/amd64"]: images["linux/amd64"]},
            reports_dir=folder,
            cosign_key=keys["key"],
            log=print,
        )
        assert "platforms" not in entry and entry["tags"] == [NAME, f"{NAME}-fedcba9"]
        assert _verify(entry, keys, "linux/amd64")["index"] is None
        with pytest.raises(cosign.CosignError) as refused:
            _verify(entry, keys, "linux/arm64")
        assert str(refused.value) == (
            f"{version_ref(entry)} refused: it is one linux/amd64 image, not an index holding linux/arm64"
        )


def _nothing_pushed(host):
    listed = subprocess.run(
        [registry_api.binary(), "repo", "ls", "--plain-http", host], capture_output=True, text=True, timeout=60
    )
    return listed.returncode == 0 and listed.stdout.strip() == ""


@pytest.mark.parametrize(
    "case",
    ["platform the target lacks", "wrong architecture", "two commits", "no arm64 smoke report"],
)
def test_refused_in_one_line_before_anything_is_pushed(client, m, own, images, inline_build, untagged, tmp_path, case):
    with local_registry.registry(tmp_path, client) as host:
        folder = write_reports(tmp_path / "reports", images)
        sources = {PLATFORMS[p]: tag for p, tag in images.items()}
        kw = {}
        if case == "platform the target lacks":
            kw = {"platforms_wanted": ["linux/arm64"]}
            with pytest.raises(MatrixError, match=r"^gaudi2 is not built for linux/arm64: its base is published for"):
                publish.push(client, own, ["gaudi2"], f"{host}/t", reports_dir=folder, **kw)
            assert _nothing_pushed(host)
            return
        if case == "wrong architecture":
            sources[PLATFORMS["linux/arm64"]] = images["linux/amd64"]
            expected = f"{images['linux/amd64']} is a linux/amd64 image, not linux/arm64; give the linux/arm64 image"
        elif case == "two commits":
            # Built anew after its reports, as on an empty build cache: the commits are refused first.
            other = inline_build(
                DOCKERFILE.format(revision="0" * 40),
                untagged("gemma4-e2b-test/multi:arm64-other-commit"),
                files={"probe": "other\n"},
                platform="linux/arm64",
            )
            sources[PLATFORMS["linux/arm64"]] = other
            for name in (
                f"sbom-{PLATFORMS['linux/arm64']}.cdx.json",
                f"provenance-{PLATFORMS['linux/arm64']}.intoto.json",
            ):
                os.utime(folder / name, (time.time() - 3600,) * 2)  # seconds apart on a slow machine
            Report(target=TARGET, image=other, model="tiny", checks=[Check("ready")]).write(
                folder / f"smoke-{PLATFORMS['linux/arm64']}.json"
            )
            expected = (
                f"xeon6: one index must hold images of one commit, but {images['linux/amd64']} from fedcba9, "
                f"{other} from 0000000; rebuild them from the same commit"
            )
        else:
            (folder / f"smoke-{PLATFORMS['linux/arm64']}.json").unlink()
            expected = (
                f"refusing to push {images['linux/arm64']}: no smoke report for xeon6 "
                f"({folder}/smoke-{PLATFORMS['linux/arm64']}.json); "
                f"run `python build.py smoke xeon6 --platform linux/arm64{SMOKE_OPTION}` first "
                "(or pass --skip-smoke)"
            )
        with pytest.raises(publish.PushError) as refused:
            publish.push(client, m, [TARGET], f"{host}/t", sources=sources, reports_dir=folder, **kw)
        assert str(refused.value) == expected
        assert _nothing_pushed(host) and not (folder / "pushed.json").exists()


def test_smoke_and_build_refuse_an_image_or_base_of_another_platform(client, images, tmp_path):
    # A smoke report is filed under the platform asked for, and push trusts it for that platform;
    # a base of another architecture would give an image of the one asked for its binaries.
    arm = images["linux/arm64"]
    # Containers of this image only: the other lane's containers come and go meanwhile.
    made = lambda: client.api.containers(all=True, filters={"ancestor": arm})  # noqa: E731
    said = f"{arm} is a linux/arm64 image, not linux/amd64; give the linux/amd64 image"
    smoke = build_py("smoke", TARGET, "--image", arm, "--report", str(tmp_path / "smoke.json"))
    assert (smoke.returncode, smoke.stdout, smoke.stderr) == (2, "", f"error: {said}\n")
    assert not (tmp_path / "smoke.json").exists() and made() == []
    tag = "gemma4-e2b-test/wrong-base:amd64"
    build = build_py("build", TARGET, "--tiny", "--base-image", arm, "--tag", tag, "--no-reports")
    assert (
        build.returncode != 0 and build.stdout == "" and build.stderr.strip().splitlines()[-1] == f"error: base {said}"
    )
    assert not client.images.list(tag)
