"""cosign signatures and attestations from `build.py push --cosign-key`, checked by cosign itself
(Debian trixie's 2.5.0, what admission controllers' libraries implement) and by `build.py verify
--cosign-key`, on a real registry on this machine (local_registry.py). The images are tiny FROM-scratch
stand-ins (one file, a label; the multi-GB CPU image would add minutes per push) and the SBOM and
provenance small stand-in documents:
what is under test is signing, attesting and verifying. Last, `build.py policy`'s
containers-policy.json (sigstoreSigned) read by Debian trixie's skopeo 1.18 (containers/image, what
podman and CRI-O check a pull with): bookworm's skopeo 1.9.3 has sigstore disabled ("Debian-local
change") and trixie's needs glibc 2.38, so it runs in a trixie root filesystem made here
(mmdebstrap, docker import), a test tool, not a product image."""

import base64
import gzip
import json
import os
import subprocess
import tempfile
from pathlib import Path

import local_registry
import pytest
from test_no_secrets import files_holding

from gemma4_images.build import owned
from gemma4_images.build import registry as registry_api
from gemma4_images.check.smoke import Check, Report
from gemma4_images.publish import cosign, publish
from tests.cli import build_py
from tests.cosign_keys import key_pair
from tests.cpu_default import KEY, NAME, TARGET

pytestmark = pytest.mark.integration
REVISION = "89abcdef0123456789abcdef0123456789abcdef"
SIGNED, UNSIGNED = "gemma4-e2b-test/sign:signed", "gemma4-e2b-test/sign:unsigned"
DOCKERFILE = """\
FROM scratch
COPY probe /probe
LABEL io.gemma4-images.test="signing stand-in" org.opencontainers.image.revision="{revision}"
"""
SBOM = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1, "components": [{"name": "stand-in"}]}
# Kept byte for byte: cosign's own slsaprovenance1 encoding renames metadata.invocationId.
PREDICATE = {
    "buildDefinition": {"buildType": "stand-in", "externalParameters": {"target": TARGET}},
    "runDetails": {"builder": {"id": "stand-in"}, "metadata": {"invocationId": "1"}},
}


def run_cosign(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [cosign.binary(), *args], capture_output=True, text=True, env={**os.environ, "COSIGN_YES": "true"}
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    root = tmp_path_factory.mktemp("cosign")
    key, pub = key_pair(root / "signer", "signer's password")
    (root / "password").write_text("signer's password\n")
    _, stranger = key_pair(root / "stranger", "")
    return {"key": key, "pub": pub, "password": root / "password", "stranger": stranger}


@pytest.fixture(scope="module")
def images(inline_build):
    dockerfile = DOCKERFILE.format(revision=REVISION)
    return (
        inline_build(dockerfile, SIGNED, files={"probe": "signed\n"}),
        inline_build(dockerfile, UNSIGNED, files={"probe": "not signed\n"}),
    )


@pytest.fixture
def registry(client, tmp_path):
    with local_registry.registry(tmp_path, client) as host:
        yield f"{host}/gemma4-e2b-test"


def reports(folder: Path, image: str, with_files: bool = True) -> Path:
    """A passing smoke report for image, and (with_files) stand-in SBOM and provenance documents."""
    folder.mkdir(exist_ok=True)
    Report(target=TARGET, image=image, model="tiny", checks=[Check("ready")]).write(folder / f"smoke-{KEY}.json")
    if not with_files:
        return folder
    (folder / f"sbom-{KEY}.cdx.json").write_text(json.dumps(SBOM) + "\n")
    statement = {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": PREDICATE,
    }
    (folder / f"provenance-{KEY}.intoto.json").write_text(json.dumps(statement) + "\n")
    return folder


def push(registry, image, folder: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "GEMMA4_REPORTS": str(folder)}
    run = build_py("push", TARGET, "--image", image, "--registry", registry, *extra, env=env)
    entries = json.loads((folder / "pushed.json").read_text()) if (folder / "pushed.json").is_file() else []
    return run, (entries[-1] if entries else {})


def signed_push(registry, image, folder, keys):
    run, entry = push(
        registry, image, folder, "--cosign-key", str(keys["key"]), "--cosign-password-file", str(keys["password"])
    )
    assert run.returncode == 0, run.stderr
    return entry


def verify(ref: str, pub: Path, *extra: str) -> subprocess.CompletedProcess:
    return build_py("verify", ref, "--cosign-key", str(pub), "--require-attachments", *extra)


def one_line_refusal(run: subprocess.CompletedProcess, says: str) -> None:
    """Exit 1, nothing on stdout, and the last line of the log the one error line naming the refusal."""
    assert run.returncode == 1 and run.stdout == "", run.stdout
    lines = run.stderr.splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:] and says in lines[-1], run.stderr


def test_cosign_verifies_what_push_signed_and_attested(registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry = signed_push(registry, images[0], folder, keys)
    by_digest = f"{entry['repository']}@{entry['digest']}"
    assert entry["cosign"]["signed"] == by_digest
    assert [a["type"] for a in entry["cosign"]["attestations"]] == ["cyclonedx", "slsaprovenance1"]

    # cosign itself, as a pipeline or an admission controller's library checks it
    flags = ["--key", str(keys["pub"]), "--insecure-ignore-tlog=true", "--allow-http-registry"]
    assert run_cosign("verify", *flags, by_digest).returncode == 0
    for kind, predicate in [("cyclonedx", SBOM), ("slsaprovenance1", PREDICATE)]:
        got = run_cosign("verify-attestation", *flags, "--type", kind, by_digest)
        assert got.returncode == 0, got.stderr
        statement = json.loads(base64.b64decode(json.loads(got.stdout.splitlines()[-1])["payload"]))
        assert statement["predicate"] == predicate
        assert statement["subject"][0]["digest"]["sha256"] == entry["digest"].partition(":")[2]

    # and build.py verify, by tag, writing the attested statements out
    out = tmp_path / "attested"
    tag = f"{entry['repository']}:{entry['tags'][0]}"
    run = verify(tag, keys["pub"], "--attachments-dir", str(out))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"verified {entry['repository']}:{entry['tags'][0]}@{entry['digest']}"
    assert json.loads((out / "cyclonedx.intoto.json").read_text())["predicate"] == SBOM


def test_an_unsigned_image_a_retagged_one_and_a_strangers_key_are_refused(registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry = signed_push(registry, images[0], folder, keys)
    tag = f"{entry['repository']}:{entry['tags'][0]}"
    one_line_refusal(verify(tag, keys["stranger"]), "refused by cosign verify")

    # the same tag moved to another image, pushed without a signature
    unsigned = reports(tmp_path / "unsigned", images[1])
    run, moved = push(registry, images[1], unsigned)
    assert run.returncode == 0 and moved["digest"] != entry["digest"] and moved["tags"][0] == entry["tags"][0]
    one_line_refusal(verify(tag, keys["pub"]), "no signatures found")


def test_a_tampered_attestation_is_refused(registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry = signed_push(registry, images[0], folder, keys)
    host, path = entry["repository"].split("/", 1)
    # The SBOM's DSSE envelope rewritten in the registry: a component added to its statement, the
    # signature kept (what someone without the key can do).
    tag = entry["digest"].replace(":", "-") + ".att"
    data, media_type = registry_api.get_manifest(host, path, tag)
    manifest = json.loads(data)
    for layer in manifest["layers"]:
        envelope = json.loads(registry_api.get_blob(host, path, layer["digest"]))
        statement = json.loads(base64.b64decode(envelope["payload"]))
        if statement["predicateType"] != "https://cyclonedx.org/bom":
            continue
        statement["predicate"]["components"].append({"name": "smuggled"})
        envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
        body = json.dumps(envelope).encode()
        layer["digest"], layer["size"] = registry_api.push_blob(host, path, body), len(body)
    registry_api.put_manifest(host, path, tag, json.dumps(manifest).encode(), media_type)
    one_line_refusal(
        verify(f"{entry['repository']}@{entry['digest']}", keys["pub"]),
        "refused by cosign verify-attestation --type cyclonedx",
    )


def test_push_refuses_a_missing_key_or_a_wrong_password_before_pushing(registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    run, _ = push(registry, images[0], folder, "--cosign-key", str(tmp_path / "nothing.key"))
    assert run.returncode == 1 and "--cosign-key" in run.stderr and "no such file" in run.stderr, run.stderr
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not the signer's\n")
    run, _ = push(registry, images[0], folder, "--cosign-key", str(keys["key"]), "--cosign-password-file", str(wrong))
    assert run.returncode == 1 and f"cosign cannot use {keys['key']}" in run.stderr, run.stderr
    assert not (folder / "pushed.json").exists()


def test_a_push_without_a_key_or_without_reports_says_what_it_left_out(client, m, registry, images, keys, tmp_path):
    # No key: pushed, nothing signed; the log says so and cosign finds no signature.
    logs = []
    folder = reports(tmp_path / "plain", images[0])
    (entry,) = publish.push(
        client, m, [TARGET], registry, sources={KEY: images[0]}, reports_dir=folder, log=logs.append
    )
    by_digest = f"{entry['repository']}@{entry['digest']}"
    assert "cosign" not in entry and f"{by_digest}: not signed or attested (no --cosign-key)" in logs, logs
    one_line_refusal(verify(by_digest, keys["pub"]), "no signatures found")
    # A key but no SBOM or provenance: signed, nothing attested, each missing file named; a
    # pipeline that wants the attestations refuses it.
    logs = []
    bare = reports(tmp_path / "bare", images[0], with_files=False)
    (entry,) = publish.push(
        client,
        m,
        [TARGET],
        registry,
        sources={KEY: images[0]},
        reports_dir=bare,
        cosign_key=keys["key"],
        cosign_password_file=keys["password"],
        log=logs.append,
    )
    assert entry["cosign"] == {"signed": by_digest, "attestations": []}
    for name in (f"sbom-{KEY}.cdx.json", f"provenance-{KEY}.intoto.json"):
        assert f"no {bare / name} for {KEY}: nothing attested" in logs, logs
    assert build_py("verify", by_digest, "--cosign-key", str(keys["pub"])).returncode == 0
    one_line_refusal(verify(by_digest, keys["pub"]), "--require-attachments wants the SBOM and the provenance")


def test_pushing_again_adds_no_second_signature_or_attestation(client, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry = signed_push(registry, images[0], folder, keys)
    again = signed_push(registry, images[0], folder, keys)
    assert again["digest"] == entry["digest"] and again["pushed"] == []
    host, path = entry["repository"].split("/", 1)
    tag = entry["digest"].replace(":", "-")
    layers = {
        s: len(json.loads(registry_api.get_manifest(host, path, f"{tag}.{s}")[0])["layers"]) for s in ("sig", "att")
    }
    assert layers == {"sig": 1, "att": 2}, layers


def test_a_report_older_than_the_image_is_refused_before_anything_is_pushed(
    client, m, registry, images, keys, tmp_path
):
    folder = reports(tmp_path / "reports", images[0])
    sbom = folder / f"sbom-{KEY}.cdx.json"
    os.utime(sbom, (0, 0))
    with pytest.raises(publish.PushError) as refused:
        publish.push(client, m, [TARGET], registry, sources={KEY: images[0]}, reports_dir=folder)
    assert str(refused.value) == (
        f"refusing to push {images[0]}: {sbom} was written before the image was built; "
        "regenerate it for this image (or remove it to push without it)"
    )
    host, path = f"{registry}/gemma4-e2b".split("/", 1)
    assert registry_api.manifest_digest(host, path, NAME) is None


def blobs_holding(root: Path, secret: bytes) -> list[Path]:
    """The registry's blobs (under its storage root) holding secret, gzip-compressed layers opened."""
    found = []
    for blob in (root / "data").rglob("data"):
        data = blob.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        if secret in data:
            found.append(blob)
    return found


def test_the_signing_key_and_its_password_reach_no_image_or_registry_blob(
    client, registry, images, keys, tmp_path, inline_build
):
    """Signing happens after the build, outside it. Both scans are shown to find the key, in an image
    that deliberately copies it in, pushed last."""
    secrets = [keys["key"].read_bytes(), keys["password"].read_text().strip().encode()]
    entry = signed_push(registry, images[0], reports(tmp_path / "reports", images[0]), keys)
    pushed = client.images.get(f"{entry['repository']}@{entry['digest']}")
    assert [f for s in secrets for f in files_holding(client, pushed, [], s)] == []
    # Every blob the registry stored: the image's, the signature's, the attestations'.
    assert len(list((tmp_path / "data").rglob("data"))) >= 6
    assert [b for s in secrets for b in blobs_holding(tmp_path, s)] == []

    leaky = inline_build(
        'FROM scratch\nCOPY cosign.key /cosign.key\nLABEL io.gemma4-images.test="key leak"\n',
        "gemma4-e2b-test/sign:leaky",
        files={"cosign.key": keys["key"]},
    )
    assert files_holding(client, client.images.get(leaky), [], secrets[0])
    client.images.get(leaky).tag(f"{registry}/leaky", "1")
    try:
        for chunk in client.api.push(f"{registry}/leaky", tag="1", stream=True, decode=True):
            assert "error" not in chunk, chunk
    finally:
        client.images.remove(f"{registry}/leaky:1")
    assert blobs_holding(tmp_path, secrets[0])


# -- the node side: containers-policy.json with sigstoreSigned ---------------------------------

SKOPEO = "skopeo=1.18.0+ds1-1+b5"  # trixie's, the release that reads sigstore signatures
TOOL = "gemma4-e2b-test/skopeo:1.18.0-trixie"


@pytest.fixture(scope="module")
def skopeo(client):
    """The trixie skopeo image, made once per machine (about a minute, 240 MB)."""
    try:
        client.images.get(TOOL)
        return TOOL
    except Exception:  # noqa: BLE001 (not here yet: made below)
        pass
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        subprocess.run(
            ["mmdebstrap", "--quiet", "--variant=minbase", f"--include={SKOPEO},ca-certificates", "trixie", str(tar)],
            check=True,
        )
        client.api.import_image_from_file(
            str(tar), repository=TOOL.split(":")[0], tag=TOOL.split(":")[1],
            changes=['LABEL io.gemma4-images.test="trixie skopeo, for the sigstoreSigned policy"'],
        )  # fmt: skip
    return TOOL


def pull_under_policy(client, skopeo, folder: Path, ref: str) -> tuple[int, str]:
    """skopeo copy ref out of the registry under folder's policy.json and registries.d: what a node
    with them in /etc/containers/ does on a pull. (exit code, output)."""
    args = ["skopeo", "--policy", "/p/policy.json", "--registries.d", "/p/registries.d", "copy"]
    container = client.containers.run(
        skopeo,
        [*args, "--src-tls-verify=false", f"docker://{ref}", "dir:/tmp/out"],
        detach=True,
        network_mode="host",
        volumes={str(folder): {"bind": "/p", "mode": "ro"}},
        labels=owned.labels(),
    )
    try:
        code = container.wait(timeout=120)["StatusCode"]
        return code, container.logs().decode()
    finally:
        container.remove(force=True)


def policy_for(tmp_path: Path, repository: str, pub: Path) -> Path:
    folder = tmp_path / pub.parent.name
    run = build_py("policy", repository, "--cosign-key", str(pub), "--out", str(folder))
    assert run.returncode == 0, run.stderr
    return folder


def test_the_policy_admits_the_signed_image_and_refuses_the_rest(client, skopeo, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry = signed_push(registry, images[0], folder, keys)
    tag = f"{entry['repository']}:{entry['tags'][0]}"
    ours = folder / "containers"  # what push wrote beside its reports, from the private key
    rendered = policy_for(tmp_path, entry["repository"], keys["pub"])  # and `build.py policy`, from cosign.pub
    assert (ours / "policy.json").read_text() == (rendered / "policy.json").read_text()
    code, said = pull_under_policy(client, skopeo, ours, tag)
    assert code == 0, said
    code, said = pull_under_policy(client, skopeo, ours, f"{entry['repository']}@{entry['digest']}")
    assert code == 0, said

    # another key's policy: the signature is there, not by that key
    code, said = pull_under_policy(client, skopeo, policy_for(tmp_path, entry["repository"], keys["stranger"]), tag)
    assert code != 0 and "Source image rejected" in said, said

    # the tag moved to an image pushed without a signature
    run, moved = push(registry, images[1], reports(tmp_path / "unsigned", images[1]))
    assert run.returncode == 0 and moved["tags"][0] == entry["tags"][0] and moved["digest"] != entry["digest"]
    code, said = pull_under_policy(client, skopeo, ours, tag)
    assert code != 0 and "A signature was required, but no signature exists" in said, said


def test_another_repository_is_rejected_whatever_it_carries(client, skopeo, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry = signed_push(registry, images[0], folder, keys)
    other = policy_for(tmp_path, entry["repository"] + "-other", keys["pub"])
    code, said = pull_under_policy(client, skopeo, other, f"{entry['repository']}@{entry['digest']}")
    assert code != 0 and "Running image" in said and "is rejected by policy" in said, said


@pytest.mark.parametrize(
    "repository, key, says",
    [
        ("127.0.0.1:5000/r:tag", "pub", "without a tag or digest"),
        ("127.0.0.1:5000/R", "pub", "is not a valid image reference"),
        ("127.0.0.1:5000/r", "key", "is not a cosign public key (PEM)"),
        ("127.0.0.1:5000/r", "missing", "No such file or directory"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(keys, tmp_path, repository, key, says):
    given = {"pub": keys["pub"], "key": keys["key"], "missing": tmp_path / "none.pub"}[key]
    run = build_py("policy", repository, "--cosign-key", str(given), "--out", str(tmp_path / "out"))
    assert run.returncode == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "out").exists()
