"""`build.py release` (what `make release` and the release pipelines run) for the CPU row, end to
end on this machine: the tiny model's image built, smoke-tested, pushed to a real registry on
loopback (local_registry.py) signed and attested by cosign, and verified there."""

import json
import os

import local_registry
import pytest

from gemma4_images.publish import reports as reports_mod
from tests.cli import build_py
from tests.cosign_keys import key_pair

pytestmark = pytest.mark.integration


@pytest.fixture
def keys(tmp_path):
    return key_pair(tmp_path / "keys", "")


def test_release_builds_smokes_pushes_signed_and_verifies_the_cpu_image(
    client, m, cpu_image, keys, tmp_path, no_new_containers
):
    reports = tmp_path / "reports"
    env = {**os.environ, "GEMMA4_REPORTS": str(reports)}
    (tmp_path / "registry").mkdir()
    with local_registry.registry(tmp_path / "registry", client) as host:
        # --allow-dirty: a checkout under work has changes; what is under test is the chain of steps
        args = ["--registry", f"{host}/ml", "--cosign-key", str(keys[0]), "--tiny", "--allow-dirty"]
        run = build_py("release", "cpu", *args, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        (entry,) = json.loads((reports / "pushed.json").read_text())
        assert entry["image_id"] == client.images.get(cpu_image).id
        assert [a["type"] for a in entry["cosign"]["attestations"]] == ["cyclonedx", "slsaprovenance1"]
        # every step ran, in order: the smoke's table, the pushed digest, then verify's line
        out = run.stdout
        assert out.index("all checks passed") < out.index(f"{entry['repository']}@{entry['digest']}")
        assert out.strip().splitlines()[-1] == (f"verified {entry['repository']}:{entry['tags'][0]}@{entry['digest']}")
        key = reports_mod.key(m.resolve("cpu"), release=m.report_release)
        assert json.loads((reports / f"smoke-{key}.json").read_text())["image"] == cpu_image


def test_release_without_the_public_key_stops_before_building(keys, tmp_path):
    keys[1].unlink()
    run = build_py("release", "cpu", "--registry", "127.0.0.1:1/ml", "--cosign-key", str(keys[0]), "--tiny")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip() == f"error: no public key {keys[1]} beside --cosign-key: give it with --cosign-pub"
