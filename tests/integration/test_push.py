"""Push to a real registry on this machine (local_registry.py: Debian's docker-registry on a free
loopback port)."""

import base64
import json
import tempfile
import time
from pathlib import Path

import docker
import local_registry
import pytest
from docker.errors import ImageNotFound

from gemma4_images.check.server import free_port
from gemma4_images.check.smoke import Check, Report
from gemma4_images.publish import publish
from tests.cpu_default import KEY, NAME, TARGET

pytestmark = pytest.mark.integration
TEST_IMAGE = "gemma4-e2b-test/push:roundtrip"
REVISION = "0123456789abcdef0123456789abcdef01234567"
DOCKERFILE = f"""\
ARG BASE
FROM ${{BASE}}
RUN echo "pushed and pulled back" > /gemma4-push-probe
LABEL io.gemma4-images.test="push round trip" org.opencontainers.image.revision="{REVISION}"
"""


@pytest.fixture(scope="module")
def registry(client):
    with tempfile.TemporaryDirectory() as root, local_registry.registry(Path(root), client) as host:
        yield f"{host}/gemma4-e2b-test"


@pytest.fixture(scope="module")
def image(rootfs, inline_build):
    """A small image on the local Debian base: a label and a file of its own. Kept for the layer
    cache; the registry's tags go with the registry."""
    return inline_build(DOCKERFILE, TEST_IMAGE, {"BASE": rootfs})


def smoke_report(reports: Path, image: str, status: str = "pass") -> Path:
    path = reports / f"smoke-{KEY}.json"
    Report(target=TARGET, image=image, model="tiny", checks=[Check("ready", status)]).write(path)
    return path


@pytest.fixture(scope="module")
def first_push(client, m, registry, image):
    reports = Path(tempfile.mkdtemp())
    smoke_report(reports, image)
    logs = []
    start = time.monotonic()
    entries = publish.push(
        client, m, [TARGET], registry, moving_tag=True, sources={KEY: image}, reports_dir=reports, log=logs.append
    )
    print(f"first push: {time.monotonic() - start:.1f}s; " + "; ".join(logs))
    return entries, reports, logs


def test_push_tags_records_and_the_registry_holds_the_digest(client, m, registry, image, first_push):
    entries, reports, _ = first_push
    repo = f"{registry}/gemma4-e2b"
    (entry,) = entries
    assert entry["tags"] == [NAME, f"{NAME}-0123456", "xeon6"]
    assert entry["digest"].startswith("sha256:") and entry["image_id"] == client.images.get(image).id
    assert set(entry["pushed"]) | set(entry["already_present"]) == set(entry["tags"])
    assert json.loads((reports / "pushed.json").read_text()) == entries
    host, name = repo.split("/", 1)
    for tag in entry["tags"]:
        assert publish.remote_digest(host, name, tag) == entry["digest"]
    assert publish.pushed_ref(TARGET, reports) == f"{repo}@{entry['digest']}"


def test_second_push_of_the_same_image_is_skipped(client, m, registry, image, first_push):
    entries, reports, _ = first_push
    logs = []
    start = time.monotonic()
    again = publish.push(
        client, m, [TARGET], registry, moving_tag=True, sources={KEY: image}, reports_dir=reports, log=logs.append
    )
    print(f"second push: {time.monotonic() - start:.1f}s")
    assert again[0]["pushed"] == [] and again[0]["already_present"] == entries[0]["tags"]
    assert again[0]["digest"] == entries[0]["digest"]
    # Each tag's line says so (the other lines are about signing: test_cosign.py).
    tag_lines = [
        line for line in logs if line.split(" ")[0] in {f"{entries[0]['repository']}:{t}" for t in entries[0]["tags"]}
    ]
    assert len(tag_lines) == len(entries[0]["tags"])
    assert all("already in the registry" in line for line in tag_lines)


def test_round_trip_remove_pull_by_digest_labels_intact(client, m, registry, image, first_push):
    entry = first_push[0][0]
    original = client.images.get(image)
    client.images.remove(original.id, force=True)
    with pytest.raises(ImageNotFound):
        client.images.get(original.id)
    ref = f"{entry['repository']}@{entry['digest']}"
    start = time.monotonic()
    pulled = client.images.pull(ref)
    print(f"pull by digest: {time.monotonic() - start:.1f}s")
    assert pulled.id == original.id
    assert pulled.labels["io.gemma4-images.test"] == "push round trip"
    assert pulled.labels["org.opencontainers.image.revision"] == REVISION
    out = client.containers.run(ref, ["cat", "/gemma4-push-probe"], remove=True, network_mode="host")
    assert out == b"pushed and pulled back\n"
    pulled.tag(TEST_IMAGE)  # back for the layer cache


@pytest.mark.parametrize("case", ["missing", "failed", "other image"])
def test_push_without_a_passing_smoke_report_is_refused(client, m, registry, image, tmp_path, case):
    if case == "failed":
        smoke_report(tmp_path, image, status="fail")
    elif case == "other image":
        smoke_report(tmp_path, m.tag(TARGET) + "-tiny")
    with pytest.raises(publish.PushError) as refused:
        publish.push(client, m, [TARGET], registry, sources={KEY: image}, reports_dir=tmp_path, log=print)
    message = str(refused.value)
    assert message.startswith(f"refusing to push {image}:") and "\n" not in message
    assert "--skip-smoke" in message
    assert not (tmp_path / "pushed.json").exists()


def test_skip_smoke_pushes_with_a_loud_warning(client, m, registry, image, tmp_path):
    logs = []
    entries = publish.push(
        client, m, [TARGET], registry, skip_smoke=True, sources={KEY: image}, reports_dir=tmp_path, log=logs.append
    )
    assert entries[0]["digest"].startswith("sha256:")
    assert logs[0].startswith("WARNING: pushing") and "WITHOUT a passing smoke test" in logs[0]


def test_registry_down_is_one_clear_line(client, m, image, tmp_path):
    smoke_report(tmp_path, image)
    host = f"127.0.0.1:{free_port()}"
    with pytest.raises(publish.RegistryUnavailable) as down:
        publish.push(client, m, [TARGET], host, sources={KEY: image}, reports_dir=tmp_path, log=print)
    assert str(down.value) == f"cannot push to {host}: connection refused — is the registry running?"


def test_registry_that_refuses_the_upload_is_one_line(client, m, image, tmp_path):
    """A read-only registry answers the API but refuses uploads: the error comes inside the
    engine's push stream, not as an exception, and must still stop the push."""
    smoke_report(tmp_path / "reports", image)
    with local_registry.registry(tmp_path, client, readonly=True) as host:
        with pytest.raises(publish.PushError) as refused:
            publish.push(client, m, [TARGET], host, sources={KEY: image}, reports_dir=tmp_path / "reports", log=print)
    message = str(refused.value)
    assert message.startswith(f"pushing {host}/gemma4-e2b:{NAME} failed: ") and "\n" not in message
    assert "405" in message
    assert not (tmp_path / "reports" / "pushed.json").exists()


def test_a_registry_that_wants_a_login_names_the_fix_and_leaves_no_tags(client, m, image, tmp_path, monkeypatch):
    smoke_report(tmp_path / "reports", image)
    with local_registry.registry(tmp_path, client, login=("gemma4", "s3cret-pass")) as host:
        tags_before = set(client.images.get(image).tags)
        with pytest.raises(publish.PushError) as refused:
            publish.push(client, m, [TARGET], host, sources={KEY: image}, reports_dir=tmp_path / "reports", log=print)
        message = str(refused.value)
        assert "\n" not in message and "no basic auth credentials" in message
        assert f"run `docker login {host}`" in message
        assert set(client.images.get(image).tags) == tags_before  # the tags push made are gone
        assert not (tmp_path / "reports" / "pushed.json").exists()

        # The fix it names works: with that login stored, the same push goes through.
        config = tmp_path / "docker-config"
        config.mkdir()
        auth = base64.b64encode(b"gemma4:s3cret-pass").decode()
        (config / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        monkeypatch.setenv("DOCKER_CONFIG", str(config))
        logged_in = docker.from_env()
        entries = publish.push(
            logged_in, m, [TARGET], host, sources={KEY: image}, reports_dir=tmp_path / "reports", log=print
        )
        assert entries[0]["digest"].startswith("sha256:")
