"""The push's rules without an engine: names and tags, the dirty-revision refusal, the smoke gate,
pushed.json. The real push to a real registry is tests/integration/test_push.py."""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from docker.errors import ImageNotFound

from gemma4_images.build import registry
from gemma4_images.check.smoke import Check, Report
from gemma4_images.publish import publish
from gemma4_images.spec import matrix
from tests.cli import ROOT, build_py

M = matrix.load()
SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeImage:
    def __init__(self, id_="sha256:" + "1" * 64, revision=SHA, created="2026-01-01T00:00:00.000Z"):
        self.id, self.labels = id_, {"org.opencontainers.image.revision": revision} if revision else {}
        self.attrs = {"Created": created}


class FakeClient:
    def __init__(self, images):
        self._images = images

    @property
    def images(self):
        return self

    def get(self, ref):
        if ref not in self._images:
            raise ImageNotFound(ref)
        return self._images[ref]


@pytest.mark.parametrize(
    "registry, repo",
    [
        ("127.0.0.1:5000/ml", "127.0.0.1:5000/ml/gemma4-e2b"),
        ("127.0.0.1:5000", "127.0.0.1:5000/gemma4-e2b"),
        ("ghcr.io/org/team/", "ghcr.io/org/team/gemma4-e2b"),
        ("localhost/x", "localhost/x/gemma4-e2b"),
    ],
)
def test_repository(registry, repo):
    assert publish.repository(M, registry) == repo


def test_a_registry_must_name_its_host():
    with pytest.raises(publish.PushError, match="HOST"):
        publish.repository(M, "myteam")


def test_tags():
    assert publish.tags_for(M, "h100", "0123456", False) == ["h100-v0.30.0", "h100-v0.30.0-0123456"]
    assert publish.tags_for(M, "h100", "0123456", True)[-1] == "h100"


def test_revision_comes_from_the_image_label():
    assert publish.short_revision(FakeImage(), False) == "0123456"


def test_dirty_revision_is_refused_unless_allowed():
    image = FakeImage(revision=SHA + "-dirty")
    with pytest.raises(publish.PushError, match="uncommitted changes.*--allow-dirty"):
        publish.short_revision(image, False)
    assert publish.short_revision(image, True) == "0123456-dirty"


def test_unknown_revision_is_refused():
    with pytest.raises(publish.PushError, match="no git revision"):
        publish.short_revision(FakeImage(revision="unknown"), True)


@pytest.mark.parametrize(
    "host, scheme",
    [
        ("127.0.0.1:5000", "http"),
        ("127.1.2.3", "http"),
        ("localhost:5000", "http"),
        ("[::1]:5000", "http"),
        ("ghcr.io", "https"),
        ("10.0.0.5:5000", "https"),
    ],
)
def test_loopback_registries_speak_plain_http(host, scheme):
    assert registry.scheme(host) == scheme


# -- the smoke gate ------------------------------------------------------------------------------


def write_report(path, target="xeon6", image="gemma4-e2b:xeon6-v0.30.0", status="pass", **extra):
    Report(target=target, image=image, model="m", checks=[Check("ready", status)]).write(path)
    if extra:
        path.write_text(json.dumps({**json.loads(path.read_text()), **extra}))


@pytest.fixture
def gate(tmp_path):
    image = FakeImage()
    client = FakeClient({"gemma4-e2b:xeon6-v0.30.0": image})
    return lambda: publish.smoke_refusal(client, "xeon6", image, tmp_path), tmp_path / "smoke-xeon6.json"


def test_a_passing_report_for_this_image_clears_it(gate):
    check, path = gate
    write_report(path)
    assert check() is None


def test_missing_report(gate):
    check, _ = gate
    assert "no smoke report for xeon6" in check() and "build.py smoke xeon6" in check()


def test_failed_report(gate):
    check, path = gate
    write_report(path, status="fail")
    assert "failed (ready" in check()


def test_report_of_another_target_or_image(gate):
    check, path = gate
    write_report(path, target="h100")
    assert "is for target 'h100'" in check()
    write_report(path, image="gemma4-e2b:xeon6-v0.30.0-tiny")
    assert "tested gemma4-e2b:xeon6-v0.30.0-tiny" in check()
    write_report(path, image_id="sha256:" + "2" * 64)
    assert "not this image" in check()


def test_report_older_than_the_image_under_the_same_tag(gate):
    check, path = gate
    write_report(path)
    old = time.mktime(time.strptime("2025-06-01", "%Y-%m-%d"))
    os.utime(path, (old, old))
    assert "built (2026-01-01T00:00:00Z) after its smoke report" in check()


def test_unreadable_report(gate):
    check, path = gate
    path.write_text("{not json")
    assert "not valid JSON" in check()


# -- pushed.json ---------------------------------------------------------------------------------


def test_record_keeps_other_targets_and_replaces_the_same_one(tmp_path):
    path = tmp_path / "pushed.json"
    publish.record(
        [
            {"target": "h100", "repository": "r", "digest": "sha256:1"},
            {"target": "b200", "repository": "r", "digest": "sha256:2"},
        ],
        path,
    )
    publish.record([{"target": "h100", "repository": "r", "digest": "sha256:3"}], path)
    recorded = {(e["target"], e["digest"]) for e in json.loads(path.read_text())}
    assert recorded == {("b200", "sha256:2"), ("h100", "sha256:3")}
    assert publish.pushed_ref("h100", tmp_path) == "r@sha256:3"
    assert publish.pushed_ref("h100", tmp_path, repo="other") is None


REPO = "registry.example/ns/gemma4-e2b"
MALFORMED = {
    "not JSON": "{not json",
    "an object, not a list": json.dumps({"target": "xeon6", "repository": REPO, "digest": "sha256:1"}),
    "an entry that is a string": json.dumps(["xeon6"]),
    "an entry without its repository": json.dumps([{"target": "xeon6", "digest": "sha256:1"}]),
    "platforms that are a string": json.dumps(
        [{"target": "xeon6", "repository": REPO, "digest": "sha256:1", "platforms": "linux/amd64"}]
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_k8s_with_a_malformed_pushed_json_is_one_line_naming_the_file(tmp_path, case):
    path = tmp_path / "reports" / publish.PUSHED_FILE
    path.parent.mkdir()
    path.write_text(MALFORMED[case])
    # cwd: where the code before GEMMA4_REPORTS read it from
    r = build_py("k8s", "xeon6", cwd=tmp_path, env={**os.environ, "GEMMA4_REPORTS": str(path.parent)})
    assert r.returncode == 1 and r.stdout == "", r.stdout
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}") and "correct it, or move it aside" in line, line


@pytest.mark.parametrize("case", MALFORMED)
def test_a_push_never_writes_over_a_malformed_pushed_json(tmp_path, case):
    path = tmp_path / publish.PUSHED_FILE
    path.write_text(MALFORMED[case])
    pushed = []
    with pytest.raises(publish.PushError, match=f"^{path}"):
        publish.run_steps(
            None, [lambda created: pushed.append(1) or {"target": "xeon6", "repository": REPO}], REPO, tmp_path
        )
    assert pushed == [] and path.read_text() == MALFORMED[case]  # refused before anything was pushed


def test_pushed_json_is_the_checkouts_whatever_the_working_directory(tmp_path):
    # A checkout of this code (its own reports/ folder) run from another folder, whose reports/ is not it.
    checkout, elsewhere = tmp_path / "checkout", tmp_path / "elsewhere"
    checkout.mkdir()
    # The code copied (python follows a symlinked build.py to the real checkout), what it reads linked.
    shutil.copytree(ROOT / "gemma4_images", checkout / "gemma4_images", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "build.py", checkout)
    for item in ROOT.iterdir():
        if item.name not in ("build.py", "gemma4_images", "reports", ".git", ".venv", ".build"):
            (checkout / item.name).symlink_to(item)
    digest = "sha256:" + "e" * 64
    publish.record(
        [{"target": "xeon6", "repository": REPO, "digest": digest}], checkout / "reports" / publish.PUSHED_FILE
    )
    publish.record(
        [{"target": "xeon6", "repository": "elsewhere.example/gemma4-e2b", "digest": digest}],
        elsewhere / "reports" / publish.PUSHED_FILE,
    )
    env = {k: v for k, v in os.environ.items() if k != "GEMMA4_REPORTS"}
    r = subprocess.run(
        [sys.executable, str(checkout / "build.py"), "k8s", "xeon6"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert f"image: {REPO}@{digest}" in r.stdout


def test_a_recorded_image_id_is_exact_whatever_the_dates(gate):
    check, path = gate
    write_report(path, image="gemma4-e2b:gone", image_id="sha256:" + "1" * 64)
    old = time.mktime(time.strptime("2025-06-01", "%Y-%m-%d"))
    os.utime(path, (old, old))
    assert check() is None


# -- several platforms under one tag (the real push, index and verify: test_multiplatform_push.py) --


def part(platform, revision=SHA, source=None):
    return publish.Part(platform, source or f"img-{platform}", FakeImage(revision=revision))


def test_one_platform_keeps_the_local_tag_suffix_and_writes_no_index():
    (arm,) = (release := publish.plan_release(M, "xeon6", [part("linux/arm64")], True, False)).parts
    assert not release.multi and release.tags == []
    assert arm.tags == ["xeon6-v0.30.0-arm64", "xeon6-v0.30.0-0123456-arm64", "xeon6-arm64"]
    (amd,) = publish.plan_release(M, "xeon6", [part("linux/amd64")], False, False).parts
    assert amd.tags == ["xeon6-v0.30.0", "xeon6-v0.30.0-0123456"]


def test_two_platforms_get_arch_tags_and_the_target_tags_go_to_the_index():
    release = publish.plan_release(M, "xeon6", [part("linux/amd64"), part("linux/arm64")], True, False)
    assert release.multi and release.revision == SHA
    assert release.tags == ["xeon6-v0.30.0", "xeon6-v0.30.0-0123456", "xeon6"]
    assert [p.tags for p in release.parts] == [
        ["xeon6-v0.30.0-amd64", "xeon6-v0.30.0-0123456-amd64"],
        ["xeon6-v0.30.0-arm64", "xeon6-v0.30.0-0123456-arm64"],
    ]


def test_an_index_of_two_commits_is_refused():
    parts = [part("linux/amd64"), part("linux/arm64", revision="f" * 40)]
    with pytest.raises(publish.PushError, match="one index must hold images of one commit, but img-linux/amd64"):
        publish.plan_release(M, "xeon6", parts, False, False)


def test_the_index_is_the_same_bytes_for_the_same_images():
    from gemma4_images.publish import index
    from gemma4_images.spec import platforms

    d = [{"mediaType": "m", "digest": "sha256:" + "a" * 64, "size": 1, "platform": platforms.parse("linux/arm64").oci}]
    assert index.body(d, SHA) == index.body(json.loads(json.dumps(d)), SHA)
    held = json.loads(index.body(d, SHA))
    assert held["mediaType"] == index.OCI_INDEX and held["annotations"] == {index.REVISION: SHA}
    assert held["manifests"][0]["platform"] == {"architecture": "arm64", "os": "linux", "variant": "v8"}
    assert platforms.parse("linux/amd64").oci == {"architecture": "amd64", "os": "linux"}
