"""Signed pushes with attachments, verified offline, on a real registry on this machine
(local_registry.py: Debian's docker-registry) with Debian's skopeo and a throwaway GnuPG key made
here. The images are tiny FROM-scratch stand-ins (one file, a label), not serving images: what is
under test is push, sign, attach and verify, and the multi-GB CPU image would add minutes per push.
The attached "SBOM" and "provenance" are small stand-in documents, not the generators' output."""

import contextlib
import json
import os
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import local_registry
import pytest
from test_no_secrets import files_holding

from gemma4_images.build import registry as registry_api
from gemma4_images.check.smoke import Check, Report
from gemma4_images.publish import attach, publish, signing, verify
from tests.cli import build_py
from tests.cpu_default import KEY, NAME, TARGET

pytestmark = pytest.mark.integration
REVISION = "89abcdef0123456789abcdef0123456789abcdef"
SIGNED, UNSIGNED = "gemma4-e2b-test/sign:signed", "gemma4-e2b-test/sign:unsigned"
DOCKERFILE = """\
FROM scratch
COPY probe /probe
LABEL io.gemma4-images.test="signing stand-in" org.opencontainers.image.revision="{revision}"
"""


def gpg(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["gpg", "--batch", *args], env={**os.environ, "GNUPGHOME": str(home)}, capture_output=True, check=True
    )


def make_key(home: Path, name: str) -> tuple[str, Path]:
    """A throwaway signing key with no passphrase in its own GnuPG home; (fingerprint, public key file)."""
    home.mkdir(mode=0o700)
    gpg(home, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@gemma4-images.invalid>", "ed25519", "sign", "1d")
    fpr = [
        line.split(":")[9]
        for line in gpg(home, "--with-colons", "-K").stdout.decode().splitlines()
        if line.startswith("fpr:")
    ][0]
    public = home.parent / f"{name}.pub.asc"
    public.write_bytes(gpg(home, "--armor", "--export", fpr).stdout)
    return fpr, public


def corrupt_signature_value(signed: bytes) -> bytes:
    """The same signed message with one bit of its signature value flipped, so that it parses and
    verifies as a bad signature, every time. Flipping a byte of the file itself does not: skopeo's
    (gpgme's) message is one compressed packet (RFC 4880 5.6: old-format tag 8, length to the end,
    then the algorithm byte), and a flipped byte in that deflate stream turned out a bad signature,
    a zlib error GnuPG reports as zero signatures, or (in the stream's padding bits) nothing at all,
    depending on where the byte fell (60 messages measured here: 53 bad, 7 zlib errors in the
    middle; 43 of 60 still good at the last byte). The inner packets end with the signature
    packet, whose last bytes are its signature value (RFC 4880 5.2.3)."""
    assert signed[0] == 0xA3, f"expected one compressed packet of indeterminate length, got {signed[:2].hex()}"
    algorithm = {1: -15, 2: 15}[signed[1]]  # ZIP is raw deflate, ZLIB has the zlib header (RFC 4880 9.3)
    inner = bytearray(zlib.decompress(signed[2:], algorithm))
    inner[-1] ^= 0x01
    packer = zlib.compressobj(wbits=algorithm)
    return signed[:2] + packer.compress(bytes(inner)) + packer.flush()


@contextlib.contextmanager
def gnupg_home(home: Path):
    """GNUPGHOME is home (where push's --sign-by finds the key) for the duration; then the agent gpg
    started for it is stopped and GNUPGHOME is what it was."""
    before = os.environ.get("GNUPGHOME")
    os.environ["GNUPGHOME"] = str(home)
    try:
        yield home
    finally:
        subprocess.run(["gpgconf", "--kill", "gpg-agent"])
        if before is None:
            os.environ.pop("GNUPGHOME")
        else:
            os.environ["GNUPGHOME"] = before


@pytest.fixture(scope="module")
def keys():
    """The signer's key (its GnuPG home is GNUPGHOME for this module) and a stranger's."""
    with tempfile.TemporaryDirectory() as root:
        root = Path(root)
        signer, stranger = make_key(root / "signer", "signer"), make_key(root / "stranger", "stranger")
        with gnupg_home(root / "signer"):
            yield {"fpr": signer[0], "public": signer[1], "stranger": stranger[1], "home": root / "signer"}
        # the stranger's home was only used to make its key
        subprocess.run(["gpgconf", "--kill", "gpg-agent"], env={**os.environ, "GNUPGHOME": str(root / "stranger")})


@pytest.fixture(scope="module")
def images(inline_build):
    dockerfile = DOCKERFILE.format(revision=REVISION)
    return (
        inline_build(dockerfile, SIGNED, files={"probe": "signed\n"}),
        inline_build(dockerfile, UNSIGNED, files={"probe": "not signed\n"}),
    )


@pytest.fixture
def registry(client, tmp_path):
    with local_registry.registry(tmp_path, client) as host:  # the stand-ins keep their own tags
        yield f"{host}/gemma4-e2b-test"


def reports(folder: Path, image: str, with_files: bool = True) -> Path:
    """A passing smoke report for image, and (with_files) stand-in SBOM and provenance documents."""
    folder.mkdir(exist_ok=True)
    Report(target=TARGET, image=image, model="tiny", checks=[Check("ready")]).write(folder / f"smoke-{KEY}.json")
    if with_files:
        sbom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "metadata": {"component": {"name": "stand-in"}}}
        (folder / f"sbom-{KEY}.cdx.json").write_text(json.dumps(sbom) + "\n")
        statement = {"_type": "https://in-toto.io/Statement/v1", "subject": [], "predicateType": "stand-in"}
        (folder / f"provenance-{KEY}.intoto.json").write_text(json.dumps(statement) + "\n")
    return folder


def signed_push(client, m, registry, image, folder: Path, keys, **kw):
    logs = []
    start = time.monotonic()
    (entry,) = publish.push(
        client,
        m,
        [TARGET],
        registry,
        sources={KEY: image},
        reports_dir=folder,
        sign_by=keys["fpr"],
        log=logs.append,
        **kw,
    )
    print(f"signed push: {time.monotonic() - start:.2f}s; " + "; ".join(logs))
    return entry, logs


def version_ref(entry) -> str:
    return f"{entry['repository']}:{entry['tags'][0]}"


def test_signed_push_attaches_records_and_verifies(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry, logs = signed_push(client, m, registry, images[0], folder, keys)
    host, path = entry["repository"].split("/", 1)

    # Each attachment is in the registry under its digest tag: same bytes, same digest as the file.
    assert [a["tag"] for a in entry["attachments"]] == [attach.tag_for(entry["digest"], s) for s in ("sbom", "att")]
    for item in entry["attachments"]:
        manifest, data = attach.fetch(host, path, item["tag"])
        original = Path(item["file"]).read_bytes()
        assert data == original and registry_api.sha256_digest(original) == item["blob_digest"]
        assert manifest["subject"]["digest"] == entry["digest"]
        assert manifest["artifactType"] == manifest["config"]["mediaType"] == item["media_type"]
        assert registry_api.manifest_digest(host, path, item["tag"]) == item["manifest_digest"]
        print(f"attachment {item['tag']}: {item['size']} bytes")

    # Every tag, the image's and the attachments', is signed; pushed.json says so.
    assert {s["identity"] for s in entry["signatures"]} == {
        f"{entry['repository']}:{t}" for t in entry["tags"] + [a["tag"] for a in entry["attachments"]]
    }
    assert all(Path(s["signature"]).is_file() and s["key"] == keys["fpr"] for s in entry["signatures"])
    assert json.loads((folder / "pushed.json").read_text()) == [entry]

    # The pipeline's check: signature and attachments under a policy naming only the public key.
    start = time.monotonic()
    out = tmp_path / "verified"
    result = verify.verify(
        version_ref(entry),
        key=keys["public"],
        signatures=str(folder / "signatures"),
        attachments_dir=out,
        require_attachments=True,
        log=print,
    )
    print(f"verify: {time.monotonic() - start:.2f}s")
    assert result["digest"] == entry["digest"]
    assert {a["file"]: (out / a["file"]).read_bytes() for a in result["attachments"]} == {
        Path(a["file"]).name: Path(a["file"]).read_bytes() for a in entry["attachments"]
    }


def test_build_py_push_signs_and_attaches_from_the_command_line(registry, images, keys, tmp_path):
    """The options as a release job passes them: the key and the reports folder from the environment."""
    reports(tmp_path / "reports", images[0])
    env = {**os.environ, "GEMMA4_SIGN_BY": keys["fpr"], "GEMMA4_REPORTS": str(tmp_path / "reports")}
    run = build_py("push", TARGET, "--image", images[0], "--registry", registry, env=env)
    assert run.returncode == 0, run.stderr
    (entry,) = json.loads((tmp_path / "reports" / "pushed.json").read_text())
    assert run.stdout.strip().splitlines()[-1] == f"{entry['repository']}@{entry['digest']}"
    assert len(entry["attachments"]) == 2 and len(entry["signatures"]) == len(entry["tags"]) + 2
    assert all(Path(s["signature"]).is_relative_to(tmp_path / "reports" / "signatures") for s in entry["signatures"])
    assert all(Path(s["signature"]).is_file() for s in entry["signatures"])


def test_verify_copies_only_an_accepted_image_on(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    sigs = str(folder / "signatures")
    accepted, refused = "gemma4-e2b-test/sign:verified", "gemma4-e2b-test/sign:refused"
    for tag in (accepted, refused):
        if client.images.list(name=tag):
            client.images.remove(tag)
    verify.verify(version_ref(entry), key=keys["public"], signatures=sigs, dest=f"docker-daemon:{accepted}")
    assert client.images.get(accepted).id == client.images.get(images[0]).id  # the same config, so the same image
    client.images.remove(accepted)

    publish.push(client, m, [TARGET], registry, sources={KEY: images[1]}, skip_smoke=True, reports_dir=tmp_path)
    with pytest.raises(signing.SigningError):
        verify.verify(version_ref(entry), key=keys["public"], signatures=sigs, dest=f"docker-daemon:{refused}")
    assert client.images.list(name=refused) == []


def test_a_pipeline_can_require_the_attachments(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    sigs = str(folder / "signatures")
    assert verify.verify(version_ref(entry), key=keys["public"], signatures=sigs)["attachments"] == []
    run = cli_verify(version_ref(entry), "--key", str(keys["public"]), "--signatures", sigs, "--require-attachments")
    assert run.returncode == 1 and run.stderr.strip().splitlines()[-1] == (
        f"error: {version_ref(entry)} refused: nothing attached as {attach.tag_for(entry['digest'], 'sbom')}, and "
        "--require-attachments wants the SBOM (.sbom) and the provenance (.att); push them with the image"
    )


def test_pushing_again_signs_nothing_twice(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    first, _ = signed_push(client, m, registry, images[0], folder, keys)
    again, _ = signed_push(client, m, registry, images[0], folder, keys)
    assert again["pushed"] == [] and again["signatures"] == first["signatures"]
    assert len(list((folder / "signatures").rglob("signature-*"))) == len(first["signatures"])


def cli_verify(ref: str, *args: str) -> subprocess.CompletedProcess:
    return build_py("verify", ref, *args)


def test_an_unsigned_image_under_the_signed_name_is_refused(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    sigs = str(folder / "signatures")
    assert cli_verify(version_ref(entry), "--key", str(keys["public"]), "--signatures", sigs).returncode == 0

    # Someone pushes another image under the same tags, without the key.
    (swapped,) = publish.push(
        client, m, [TARGET], registry, sources={KEY: images[1]}, skip_smoke=True, reports_dir=tmp_path, log=print
    )
    assert swapped["digest"] != entry["digest"] and swapped["signatures"] == []

    run = cli_verify(version_ref(entry), "--key", str(keys["public"]), "--signatures", sigs)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: {version_ref(entry)} refused: Source image rejected: A signature was required, but no signature exists"
    )
    # skopeo itself, as a pipeline runs it, under the same policy: refused, nothing copied.
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps(signing.policy_requiring(entry["repository"], keys["public"])))
    conf = signing.write_registries_d(tmp_path / "registries.d", entry["repository"].split("/")[0], sigs, False)
    copy = subprocess.run(
        ["skopeo", "--policy", str(policy), "--registries.d", str(conf), "copy", "--src-tls-verify=false"]
        + [f"docker://{version_ref(entry)}", f"dir:{tmp_path / 'pulled'}"],
        capture_output=True,
        text=True,
    )
    assert copy.returncode != 0 and "A signature was required, but no signature exists" in copy.stderr
    # The signed image is still accepted by its digest: its signature names its repository.
    assert (
        verify.verify(f"{entry['repository']}@{entry['digest']}", key=keys["public"], signatures=sigs)["digest"]
        == entry["digest"]
    )


def test_a_tampered_signature_is_refused(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    for sig in entry["signatures"]:
        path = Path(sig["signature"])
        path.write_bytes(corrupt_signature_value(path.read_bytes()))
    with pytest.raises(signing.SigningError) as refused:
        verify.verify(version_ref(entry), key=keys["public"], signatures=str(folder / "signatures"), log=print)
    # One signature per tag of the digest, each refused as a signature that does not verify.
    message = str(refused.value)
    head = f"{version_ref(entry)} refused: Source image rejected: None of the signatures were accepted, reasons: "
    assert message.startswith(head) and "\n" not in message
    reasons = message.removeprefix(head).split("; ")
    assert len(reasons) == len(entry["tags"])
    assert set(reasons) == {"Invalid GPG signature: the signature does not verify with that key"}


def test_a_signature_by_another_key_is_refused(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    with pytest.raises(signing.SigningError) as refused:
        verify.verify(version_ref(entry), key=keys["stranger"], signatures=str(folder / "signatures"), log=print)
    print(refused.value)
    assert str(refused.value).startswith(f"{version_ref(entry)} refused: Source image rejected: ")
    assert "\n" not in str(refused.value)


def test_an_attachment_replaced_without_the_key_is_refused(client, m, registry, images, keys, tmp_path):
    folder = reports(tmp_path / "reports", images[0])
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    host, path = entry["repository"].split("/", 1)
    # The provenance (checked after the SBOM, which stays genuine) is swapped for an unsigned one.
    forged = tmp_path / "forged.intoto.json"
    forged.write_text('{"_type": "https://in-toto.io/Statement/v1", "subject": []}\n')
    attach.attach(host, path, entry["digest"], attach.Attachment(forged, attach.IN_TOTO_JSON, "att"))
    out = tmp_path / "verified"
    with pytest.raises(signing.SigningError) as refused:
        verify.verify(
            version_ref(entry), key=keys["public"], signatures=str(folder / "signatures"), attachments_dir=out
        )
    att_tag = attach.tag_for(entry["digest"], "att")
    assert str(refused.value) == (
        f"{entry['repository']}:{att_tag} refused: Source image rejected: "
        "A signature was required, but no signature exists"
    )
    assert not out.exists()  # not even the genuine SBOM is written out from a refused check


def test_a_signed_attachment_for_another_image_is_refused(client, m, registry, images, keys, tmp_path):
    """An attachment signed with the right key under this image's tag but naming another image as
    its subject (a release mistake, or a replay) is refused by verify's subject check."""
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    (other,) = publish.push(
        client, m, [TARGET], f"{registry}/other", sources={KEY: images[1]}, skip_smoke=True, reports_dir=tmp_path
    )
    host, path = entry["repository"].split("/", 1)
    sbom = attach.Attachment(tmp_path / "other.cdx.json", attach.CYCLONEDX_JSON, "sbom")
    sbom.path.write_text('{"bomFormat": "CycloneDX"}\n')
    registry_api.push_blob(host, path, attach.EMPTY_CONFIG)
    registry_api.push_blob(host, path, sbom.path.read_bytes())
    wrong = {"mediaType": attach.OCI_MANIFEST, "digest": other["digest"], "size": 1}
    tag = attach.tag_for(entry["digest"], "sbom")
    digest = registry_api.put_manifest(
        host, path, tag, attach.manifest_for(sbom, sbom.path.read_bytes(), wrong), attach.OCI_MANIFEST
    )
    signing.sign(host, path, tag, digest, keys["fpr"], folder / "signatures")
    with pytest.raises(signing.SigningError) as refused:
        verify.verify(version_ref(entry), key=keys["public"], signatures=str(folder / "signatures"))
    assert str(refused.value) == (
        f"{entry['repository']}:{tag} refused: it is signed but attached to {other['digest']}, not {entry['digest']}"
    )


def test_a_push_without_the_files_attaches_nothing_and_says_so(client, m, registry, images, tmp_path):
    folder = reports(tmp_path / "reports", images[0], with_files=False)
    logs = []
    (entry,) = publish.push(
        client, m, [TARGET], registry, sources={KEY: images[0]}, reports_dir=folder, log=logs.append
    )
    host, path = entry["repository"].split("/", 1)
    assert entry["attachments"] == [] and entry["signatures"] == []
    for suffix, name in (("sbom", f"sbom-{KEY}.cdx.json"), ("att", f"provenance-{KEY}.intoto.json")):
        tag = attach.tag_for(entry["digest"], suffix)
        assert f"no {folder / name} for {KEY}: nothing attached as {tag}" in logs
        assert registry_api.manifest_digest(host, path, tag) is None
    assert f"{entry['repository']}: not signed (no --sign-by key)" in logs


@pytest.mark.parametrize("case", ["attachment older than the image", "unknown signing key"])
def test_refused_before_anything_is_pushed(client, m, registry, images, keys, tmp_path, case):
    folder = reports(tmp_path / "reports", images[0])
    sbom = folder / f"sbom-{KEY}.cdx.json"
    if case == "attachment older than the image":
        os.utime(sbom, (0, 0))
        sign_by, expected = (
            None,
            (
                f"refusing to push {images[0]}: {sbom} was written before the image was built; "
                "regenerate it for this image (or remove it to push without it)"
            ),
        )
    else:
        sign_by, expected = (
            "nobody@nowhere.invalid",
            (
                f"--sign-by nobody@nowhere.invalid: GnuPG has no secret key for it in {keys['home']}; import the "
                "signing key there (or set GNUPGHOME to the home that holds it)"
            ),
        )
    with pytest.raises(publish.PushError) as refused:
        publish.push(client, m, [TARGET], registry, sources={KEY: images[0]}, reports_dir=folder, sign_by=sign_by)
    assert str(refused.value) == expected
    host, path = f"{registry}/gemma4-e2b".split("/", 1)
    assert registry_api.manifest_digest(host, path, NAME) is None


def test_the_signing_key_reaches_no_image(client, m, registry, images, keys, tmp_path, inline_build):
    """Signing happens after the build, outside it: the signed image holds no private key. The
    scan is shown to find the key first, in an image that deliberately copies it in."""
    secrets = [path.read_bytes() for path in (keys["home"] / "private-keys-v1.d").glob("*.key")]
    assert secrets
    dockerfile = 'FROM scratch\nCOPY keys /root/.gnupg/private-keys-v1.d\nLABEL io.gemma4-images.test="key leak"\n'
    leaky = inline_build(dockerfile, "gemma4-e2b-test/sign:leaky", files={"keys": keys["home"] / "private-keys-v1.d"})
    assert any(files_holding(client, client.images.get(leaky), [], s) for s in secrets)

    folder = reports(tmp_path / "reports", images[0], with_files=False)
    entry, _ = signed_push(client, m, registry, images[0], folder, keys)
    pulled = client.images.get(f"{entry['repository']}@{entry['digest']}")
    assert [f for s in secrets for f in files_holding(client, pulled, [], s)] == []
