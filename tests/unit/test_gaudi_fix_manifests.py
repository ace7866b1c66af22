"""The vllm_gaudi fixes' manifests (patches/*/fix.json) point at tests that exist, carry the
first checks for a Gaudi 2 run, and a hunk-coverage figure that counts the hunks the diff has
now (a diff changed since the figure was recorded fails here until `make check-fixes
COVERAGE=1 RECORD=1` is run again). No checkout needed: this runs in plain CI."""

import json
import os
import re
import shutil

import pytest

from tests import gaudi_fixes_helpers as h

FIXES = h.gaudi_fixes()


@pytest.mark.parametrize("name", FIXES)
def test_manifest_names_tests_that_exist(name):
    fix = h.load_applier().load_fix(h.PACK, name, name == "gemma4-fast-prefill")  # validates the manifest
    assert fix["tests"], f"{name}: fix.json names no tests"
    for test in fix["tests"]:
        path, _, func = test.partition("::")
        assert os.path.isfile(os.path.join(h.REPO, path)), f"{name}: {path} does not exist"
        if func:
            with open(os.path.join(h.REPO, path), encoding="utf-8") as f:
                assert re.search(rf"^def {re.escape(func)}\(", f.read(), re.M), f"{name}: no {func}() in {path}"


@pytest.mark.parametrize("name", FIXES)
def test_manifest_coverage_counts_the_current_hunks(name):
    with open(os.path.join(h.PACK, name, "fix.json"), encoding="utf-8") as f:
        fix = json.load(f)
    hunks = sum(len(v) for v in h.load_applier().parse_diff(h.fix_diff(name), name).values())
    match = re.match(r"(\d+)/(\d+) hunks noticed", fix.get("hunk_coverage", ""))
    assert match, f"{name}: no hunk_coverage figure in fix.json"
    noticed, total = map(int, match.groups())
    assert total == hunks, f"{name}: the figure counts {total} hunks, fix.diff has {hunks}: re-record it"
    assert noticed + len(fix.get("hunks_gaudi_only", [])) == total, f"{name}: a hunk is neither noticed nor explained"
    assert fix.get("gaudi_checks"), f"{name}: no gaudi_checks (what a Gaudi 2 run must show first)"


@pytest.mark.parametrize(
    "field,value",
    [
        ("tests", "tests/unit/x.py"),
        ("tests", [""]),
        ("gaudi_checks", [3]),
        ("hunks_gaudi_only", [{"match": "x", "why": "y"}]),
    ],
)
def test_a_malformed_optional_field_is_refused(tmp_path, field, value):
    applier = h.load_applier()
    pack = tmp_path / "patches"
    shutil.copytree(h.PACK, pack)
    path = pack / "seeded-sampling" / "fix.json"
    fix = json.loads(path.read_text())
    fix[field] = value
    path.write_text(json.dumps(fix))
    with pytest.raises(applier.Failure, match=f"fix seeded-sampling: .*{field}"):
        applier.load_fix(str(pack), "seeded-sampling", False)
