"""`build.py pin` against a real registry on 127.0.0.1: it records the digest the registry has for
a base's tag, keeps the rest of targets.yaml as it was, `--check` names a tag whose digest moved,
and a build then pulls exactly the pinned image (and labels it with that digest)."""

import difflib
import tempfile
from pathlib import Path

import local_registry
import pytest
from docker.errors import ImageNotFound

from gemma4_images.build import images
from gemma4_images.build.docker_build import base_digest, local_image
from gemma4_images.spec import facts, matrix
from tests.cli import build_py

pytestmark = pytest.mark.integration
TAG = "vllm/vllm-openai:v0.30.0-cu129"  # h100's base; h200 shares it through a YAML anchor
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


@pytest.fixture(scope="module")
def publish_base(client, rootfs, host, inline_build):
    """Factory: build a small image stamped `stamp` and push it as HOST/TAG; returns its digest."""
    ref = f"{host}/{TAG}"

    def publish(stamp: str) -> str:
        inline_build(DOCKERFILE, ref, {"BASE": rootfs, "STAMP": stamp})
        digest = None
        for chunk in client.api.push(ref.rsplit(":", 1)[0], tag=ref.rsplit(":", 1)[1], stream=True, decode=True):
            assert "error" not in chunk, chunk
            digest = (chunk.get("aux") or {}).get("Digest") or digest
        return digest

    yield publish
    for img in client.images.list(name=ref.rsplit(":", 1)[0]):
        client.images.remove(img.id, force=True)


@pytest.fixture(scope="module")
def targets_file(host):
    """targets.yaml with h100's base moved to the test registry (everything else as committed)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "targets.yaml"
        path.write_text(matrix.TARGETS_FILE.read_text().replace(f"image: {TAG}\n", f"image: {host}/{TAG}\n"))
        yield path


@pytest.fixture(scope="module")
def pinned(publish_base, targets_file):
    before = targets_file.read_text()
    digest = publish_base("first")
    run = build_py("pin", "h100", "--file", str(targets_file))
    assert run.returncode == 0, run.stdout + run.stderr
    return before, digest, run


def test_pin_records_the_registry_digest_and_nothing_else(host, targets_file, pinned):
    before, digest, run = pinned
    assert "UNPINNED" not in run.stdout and "MOVED" in run.stdout  # the committed digest is another one
    assert "pinned 1 base(s)" in run.stdout
    changed = [
        line for line in difflib.ndiff(before.splitlines(), targets_file.read_text().splitlines()) if line[:1] in "+-"
    ]
    assert len(changed) == 2, changed  # one digest line replaced, every comment kept
    assert changed[0].startswith("-       digest: sha256:58fdb6bb")
    assert changed[1].startswith(f"+       digest: {digest}  # pinned by `build.py pin` from {host} on ")
    loaded = matrix.load(targets_file)
    assert loaded.targets["h100"].base.digest == loaded.targets["h200"].base.digest == digest
    check = build_py("pin", "h100", "--check", "--file", str(targets_file))
    assert check.returncode == 0 and check.stdout.startswith(f"OK        {host}/{TAG} (h100): pinned at {digest}")


def test_check_names_a_tag_whose_digest_moved_and_changes_nothing(publish_base, host, targets_file, pinned):
    _, first, _ = pinned
    pinned_text = targets_file.read_text()
    second = publish_base("second")
    assert second != first
    run = build_py("pin", "h100", "--check", "--file", str(targets_file))
    assert run.returncode == 1
    assert f"MOVED     {host}/{TAG} (h100): targets.yaml has {first}, the registry now has {second}" in run.stdout
    assert "1 of 1 bases are not pinned at the registry's digest (1 moved)" in run.stderr
    assert targets_file.read_text() == pinned_text


def test_a_build_pulls_the_pinned_digest_and_labels_it(client, host, targets_file, pinned, publish_base):
    _, first, _ = pinned
    m = matrix.load(targets_file)
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
