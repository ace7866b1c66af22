"""`build.py pin` against a real registry on 127.0.0.1: it records the digest the registry has for
a base's tag in its release file, keeps the rest of the file as it was, `--check` names a tag whose digest moved,
and a build then pulls exactly the pinned image (and labels it with that digest).

h100's base is published here as vLLM publishes it (targets.yaml's &vllm_release_images): an image
per architecture (`-x86_64-cu129`, `-aarch64-cu129`) joined in an index under the plain tag. The
arm64 image is a FROM-scratch stand-in (nothing runs it here)."""

import difflib
import shutil
import tempfile
from pathlib import Path

import local_registry
import pytest
from docker.errors import ImageNotFound

from gemma4_images.build import images
from gemma4_images.build.docker_build import base_digest, local_image
from gemma4_images.publish import index
from gemma4_images.spec import facts, matrix
from tests.cli import build_py

pytestmark = pytest.mark.integration
TAG = "vllm/vllm-openai:v0.30.0-cu129"  # h100's base, and h200's
FIRST_RELEASE = matrix.releases()[0]
FIRST = f"releases/vllm-{FIRST_RELEASE}.yaml"  # where TAG is written; the other releases' bases are not asked for
AMD64_TAG = "vllm/vllm-openai:v0.30.0-x86_64-cu129"
ARM64_TAG = "vllm/vllm-openai:v0.30.0-aarch64-cu129"  # h100's and h200's linux/arm64 base
DOCKERFILE = """\
ARG BASE
FROM ${BASE}
ARG STAMP
RUN echo "${STAMP}" > /gemma4-pin-probe
LABEL io.gemma4-images.test="pin"
"""


@pytest.fixture(scope="module")
def host(client):
    with tempfile.TemporaryDirectory() as root, local_registry.registry(Path(root), client) as host:
        yield host


def push(client, ref: str) -> str:
    digest = None
    for chunk in client.api.push(ref.rsplit(":", 1)[0], tag=ref.rsplit(":", 1)[1], stream=True, decode=True):
        assert "error" not in chunk, chunk
        digest = (chunk.get("aux") or {}).get("Digest") or digest
    return digest


@pytest.fixture(scope="module")
def publish_arm64(client, host, inline_build):
    """Factory: an arm64 stand-in marked `stamp` pushed as HOST/ARM64_TAG; returns its digest."""

    def publish(stamp: str) -> str:
        ref = f"{host}/{ARM64_TAG}"
        dockerfile = 'FROM scratch\nCOPY probe /probe\nLABEL io.gemma4-images.test="pin"\n'
        inline_build(dockerfile, ref, files={"probe": stamp}, platform="linux/arm64")
        return push(client, ref)

    return publish


@pytest.fixture(scope="module")
def publish_base(client, rootfs, host, inline_build, publish_arm64):
    """Factory: build a small image stamped `stamp`, push it as HOST/AMD64_TAG, and store an index
    of it and the arm64 stand-in as HOST/TAG; returns the index digest."""
    arm64 = publish_arm64("arm64 first\n")
    name = f"{host}/{TAG}".rsplit(":", 1)[0].split("/", 1)[1]

    def publish(stamp: str) -> str:
        inline_build(DOCKERFILE, f"{host}/{AMD64_TAG}", {"BASE": rootfs, "STAMP": stamp})
        amd64 = push(client, f"{host}/{AMD64_TAG}")
        entries = [
            index.descriptor(host, name, amd64, "linux/amd64"),
            index.descriptor(host, name, arm64, "linux/arm64"),
        ]
        return index.put(host, name, TAG.rsplit(":", 1)[1], index.body(entries, "0" * 40))

    yield publish
    for img in client.images.list(name=f"{host}/{TAG.split(':')[0]}"):
        client.images.remove(img.id, force=True)


@pytest.fixture(scope="module")
def targets_file(host):
    """targets.yaml and releases/ with h100's base moved to the test registry (everything else as
    committed); the file pin edits is FIRST beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "targets.yaml"
        shutil.copy(matrix.TARGETS_FILE, path)
        shutil.copytree(matrix.RELEASES, Path(tmp) / "releases")
        release = Path(tmp) / FIRST
        text = release.read_text()
        for tag in (TAG, ARM64_TAG):
            text = text.replace(f"image: {tag}\n", f"image: {host}/{tag}\n")
        release.write_text(text)
        yield path


def loaded(targets_file: Path) -> matrix.Matrix:
    return matrix.load(targets_file, releases_dir=targets_file.parent / "releases")


@pytest.fixture(scope="module")
def pinned(publish_base, targets_file):
    before = (targets_file.parent / FIRST).read_text()
    digest = publish_base("first")
    run = build_py("pin", "h100", "--vllm", FIRST_RELEASE, "--file", str(targets_file))
    assert run.returncode == 0, run.stdout + run.stderr
    return before, digest, run


def test_pin_records_the_registry_digest_and_nothing_else(host, targets_file, pinned):
    before, digest, run = pinned
    # The committed default digest is another registry's; the arm64 one is not pinned in the commit.
    assert "MOVED     " in run.stdout and f"UNPINNED  {host}/{ARM64_TAG} (h100 linux/arm64)" in run.stdout
    assert "pinned 2 base(s)" in run.stdout  # the index under the plain tag, and the arm64 image's own tag
    changed = [
        line
        for line in difflib.ndiff(before.splitlines(), (targets_file.parent / FIRST).read_text().splitlines())
        if line[:1] in "+-"
    ]
    # two digest lines replaced in h100's entry and the same two in h200's (the same tags), every comment kept
    assert len(changed) == 8, changed
    m = loaded(targets_file)
    arm64 = m.targets["h100"].base.platforms["linux/arm64"].digest
    for at in (0, 4):
        assert changed[at].startswith("-       digest: sha256:58fdb6bb")
        assert changed[at + 1].startswith(f"+       digest: {digest}  # pinned by `build.py pin` from {host} on ")
        assert changed[at + 2] == "-           digest: null"
        assert changed[at + 3].startswith(f"+           digest: {arm64}  # pinned by `build.py pin` from {host} on ")
    assert m.targets["h100"].base.digest == m.targets["h200"].base.digest == digest
    assert m.targets["h200"].base.platforms["linux/arm64"].digest == arm64
    assert (targets_file.read_text()) == matrix.TARGETS_FILE.read_text()  # targets.yaml holds no digest
    check = build_py("pin", "h100", "--vllm", FIRST_RELEASE, "--check", "--file", str(targets_file))
    assert check.returncode == 0, check.stderr
    lines = check.stdout.splitlines()
    # What the index names for each platform is shown; its arm64 entry is the arm64 tag's image.
    assert lines[0].startswith(f"OK        {host}/{TAG} (h100): pinned at {digest}; an index of linux/amd64 sha256:")
    assert lines[0].endswith(f", linux/arm64 {arm64}")
    assert lines[1] == f"OK        {host}/{ARM64_TAG} (h100 linux/arm64): pinned at {arm64}"


def test_check_names_a_tag_whose_digest_moved_and_changes_nothing(publish_base, host, targets_file, pinned):
    _, first, _ = pinned
    pinned_text = (targets_file.parent / FIRST).read_text()
    second = publish_base("second")
    assert second != first
    run = build_py("pin", "h100", "--vllm", FIRST_RELEASE, "--check", "--file", str(targets_file))
    assert run.returncode == 1
    assert f"MOVED     {host}/{TAG} (h100): {FIRST} has {first}, the registry now has {second}" in run.stdout
    assert "1 of 2 bases are not pinned at the registry's digest (1 moved)" in run.stderr
    assert (targets_file.parent / FIRST).read_text() == pinned_text


def test_a_build_pulls_the_pinned_digest_and_labels_it(client, host, targets_file, pinned, publish_base):
    _, first, _ = pinned
    m = loaded(targets_file)
    ref = m.targets["h100"].base.ref
    assert ref == f"{host}/{TAG}@{first}"
    for img in client.images.list(name=f"{host}/{TAG.split(':')[0]}"):
        client.images.remove(img.id, force=True)
    with pytest.raises(ImageNotFound):
        client.images.get(ref)
    base = images.resolve_base(client, m, "h100", None, print)  # pulls image@digest
    assert base == ref
    pulled = local_image(client, ref)
    probe = client.containers.run(ref, ["cat", "/gemma4-pin-probe"], remove=True, network_mode="host")
    assert probe == b"first\n"  # the pinned image, not the moved tag
    digest = base_digest(pulled, base)
    assert digest == first
    assert facts.facts(m, "h100", base, digest)["GEMMA4_BASE_DIGEST"] == first  # -> base.digest label


def test_check_names_a_platform_tag_that_the_index_does_not_name(publish_arm64, host, targets_file, pinned):
    """The vendor moves its arm64 tag but not the plain tag's index: a pull by the plain tag and the
    arm64 build's pull would get different images. (Last in this module: it moves the arm64 tag.)"""
    first = loaded(targets_file).targets["h100"].base.platforms["linux/arm64"].digest
    second = publish_arm64("arm64 second\n")
    run = build_py("pin", "h100", "--vllm", FIRST_RELEASE, "--check", "--file", str(targets_file))
    assert run.returncode == 1
    assert f"MOVED     {host}/{ARM64_TAG} (h100 linux/arm64): {FIRST} has {first}, the registry now has {second}" in (
        run.stdout
    )
    assert f"MISMATCH  h100 linux/arm64: the index {host}/{TAG} names {first}, but {host}/{ARM64_TAG} has {second}" in (
        run.stdout
    )
    assert run.stderr.count("\n") == 1 and "1 platform(s) where a vendor's multi-platform tag" in run.stderr
