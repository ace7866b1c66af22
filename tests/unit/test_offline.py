"""GEMMA4_OFFLINE: no registry off the machine is asked for a base (an air-gapped build host, and
this test suite, which sets it in tests/conftest.py); the local vendor base or the stand-in is
used, else one line names the way out. A fake engine records every pull it is asked for."""

import pytest
from docker.errors import ImageNotFound

from gemma4_images.build import docker_build, images
from gemma4_images.spec import matrix

M = matrix.load()


class FakeImages:
    def __init__(self, present=()):
        self.present, self.pulled = set(present), []

    def get(self, ref):
        if ref not in self.present:
            raise ImageNotFound(ref)
        return type("Image", (), {"attrs": {"Os": "linux", "Architecture": "amd64"}, "id": "sha256:x"})()

    def pull(self, name, tag=None, **kw):
        self.pulled.append(f"{name}:{tag}")


class FakeEngine:
    def __init__(self, present=()):
        self.images = FakeImages(present)


@pytest.mark.parametrize(
    "value, off",
    [("1", True), ("yes", True), ("TRUE", True), ("0", False), ("false", False), ("no", False), ("", False)],
)
def test_what_turns_it_on(monkeypatch, value, off):
    monkeypatch.setenv(docker_build.OFFLINE, value)
    assert docker_build.offline() is off


@pytest.mark.parametrize("value", ["on", "2", "offline", "y"])
def test_any_other_value_is_refused_in_one_line_before_a_registry_is_asked(monkeypatch, value):
    # Silently online would send an air-gapped host's build to docker.io after all.
    monkeypatch.setenv(docker_build.OFFLINE, value)
    engine = FakeEngine()
    with pytest.raises(matrix.MatrixError) as e:
        docker_build.pull(engine, "vllm/vllm-openai-cpu:v0.30.0-x86_64")
    assert str(e.value) == (
        f"GEMMA4_OFFLINE={value!r} is neither on (1, true, yes) nor off (0, false, no or empty); set one of those"
    )
    assert engine.images.pulled == []


@pytest.mark.parametrize(
    "ref, asked",
    [
        ("vllm/vllm-openai-cpu:v0.30.0-x86_64", False),
        ("registry.example:5000/ml/base:1", False),
        ("127.0.0.1:5000/ml/base:1", True),
        ("localhost:5000/base:1", True),
        ("[::1]:5000/base:1", True),
    ],
)
def test_offline_only_a_loopback_registry_is_asked(ref, asked, monkeypatch):
    monkeypatch.setenv(docker_build.OFFLINE, "1")
    engine = FakeEngine()
    reason = docker_build.pull(engine, ref)
    assert bool(engine.images.pulled) is asked
    assert (reason is None) is asked
    if not asked:
        assert reason.startswith("GEMMA4_OFFLINE is set")


def test_offline_the_stand_in_is_built_on_without_asking_the_registry(monkeypatch):
    monkeypatch.setenv(docker_build.OFFLINE, "1")
    t = M.targets["xeon6"]
    standin = M.standin("xeon6", None).tag
    engine, said = FakeEngine(present=[standin]), []
    assert images.resolve_base(engine, M, "xeon6", None, said.append) == standin
    assert engine.images.pulled == []
    assert said == [
        f"cannot pull {t.base.ref} (GEMMA4_OFFLINE is set: docker.io is not asked); using the local stand-in {standin}"
    ]


@pytest.mark.parametrize(
    "target, way_out",
    [("b200", "build the local stand-in with `python build.py base b200`"), ("h100", "pass --base-image")],
)
def test_offline_without_the_base_or_its_stand_in_says_the_way_out(target, way_out, monkeypatch):
    monkeypatch.setenv(docker_build.OFFLINE, "1")
    engine = FakeEngine()
    with pytest.raises(images.BaseUnavailable) as e:
        images.resolve_base(engine, M, target, None, print)
    assert engine.images.pulled == []
    assert "GEMMA4_OFFLINE is set" in str(e.value) and way_out in str(e.value).lower()
