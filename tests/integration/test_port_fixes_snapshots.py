"""scripts/port-fixes.py and the applier's decisions on the real vllm-gaudi snapshots in
../shared/upstream (main 091bbadd, which the pack was written against; releases/v0.26.0;
v0.27.0rc0), extracted to a temporary directory. No Docker, no vLLM: the fixes' tests on
the ported pack need vLLM 0.30.0 and run only in the last test, with GEMMA4_VLLM_PYTHON.

Facts about the snapshots used here, read from them (diff of the extracted trees):
- releases/v0.26.0 and v0.27.0rc0 differ from 091bbadd in vllm_gaudi/patches.py and
  vllm_gaudi/v1/worker/hpu_model_runner.py only, among the files the pack touches;
- v0.27.0rc0 patches.py line 281 joins 091bbadd's lines 281-282
  (`staticmethod(  # type: ignore[method-assign]` / `_hpu_gather_logprobs)`) into one,
  and that second line is the first context line of seeded-sampling's first hunk."""
import json
import os
import py_compile
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gemma4_images.modules import load_file

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PORT = REPO / "scripts" / "port-fixes.py"
SNAPSHOTS = REPO.parent / "shared" / "upstream"
ARCHIVES = {"main": "vllm-gaudi-main-091bbadd.tar.gz", "v0.26.0": "vllm-gaudi-releases-v0.26.0-b059f9c9.tar.gz",
            "v0.27.0rc0": "vllm-gaudi-v0.27.0rc0-d01a3cae.tar.gz"}
CHANGED = {"vllm_gaudi/patches.py", "vllm_gaudi/v1/worker/hpu_model_runner.py"}


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    missing = [name for name in ARCHIVES.values() if not (SNAPSHOTS / name).is_file()]
    if missing:
        pytest.fail(f"missing vllm-gaudi snapshot(s) {', '.join(missing)} in {SNAPSHOTS} (see the README.md there; "
                    "CI's clone sits beside ../shared as this one does)")
    root = tmp_path_factory.mktemp("upstream")
    for name in ARCHIVES.values():  # as vllm-gaudi-releases-v0.26.0-b059f9c9/vllm-gaudi: the port's label
        with tarfile.open(SNAPSHOTS / name) as tar:
            tar.extractall(root / name[:-len(".tar.gz")], filter="data")
    return {key: root / name[:-len(".tar.gz")] / "vllm-gaudi" for key, name in ARCHIVES.items()}


@pytest.fixture(scope="module")
def aa():
    return load_file("port_fixes", PORT).aa


def port(tree, out, *args, pack=REPO / "patches"):
    cmd = [sys.executable, str(PORT), str(tree), "--out", str(out), "--pack", str(pack), "--no-tests", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def states(out):
    return {f["name"]: f["state"] for f in json.loads((out / "port.json").read_text())["fixes"]}


def decide(aa, pack, tree, force=False):
    """The applier's plan (the decision apply_all.py and check-fixes.sh both make) for the pack's
    vllm_gaudi fixes, in pack order, on tree."""
    prof = aa.load_profile(str(pack), "v0.30.0")
    fixes = [aa.load_fix(str(pack), n, n in prof["opt_in"]) for n in prof["generic"] + prof["opt_in"]]
    return aa.plan([f for f in fixes if f["package"] == "vllm_gaudi"], str(tree), force=force)


def gaudi_fixes(aa):
    tree, report, _ = decide(aa, REPO / "patches", REPO / "patches")  # reads only the fix files
    return {e["fix"]["name"]: set(e["fix"]["files"]) for e in report}


def assert_exact(aa, pack, tree):
    """Every fix of pack applies to tree at its stated lines, on the files it was written against;
    the result compiles. Returns the patched files."""
    files, report, _ = decide(aa, pack, tree)
    assert [(e["fix"]["name"], e["state"], e["notes"], e["errors"]) for e in report if e["state"] != "apply"
            or e["notes"]] == []
    for path, lines in files.items():
        target = tree.parent / "compiled" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(aa.encode(lines))
        py_compile.compile(str(target), doraise=True)
    return files


def test_port_to_091bbadd_is_exact_and_keeps_the_pack(trees, tmp_path, aa):
    result = port(trees["main"], tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(states(tmp_path / "out").values()) == {"exact"}
    for name in gaudi_fixes(aa):
        for part in ("fix.json", "fix.diff"):
            assert (tmp_path / "out" / name / part).read_bytes() == (REPO / "patches" / name / part).read_bytes()


def test_port_to_v026_rebases_cleanly_and_the_new_pack_applies_exactly(trees, tmp_path, aa):
    out = tmp_path / "out"
    result = port(trees["v0.26.0"], out)
    assert result.returncode == 0, result.stdout + result.stderr
    fixes = gaudi_fixes(aa)
    assert states(out) == {n: "rebased" if files & CHANGED else "exact" for n, files in fixes.items()}
    assert sum(s == "rebased" for s in states(out).values()) == 6, "as measured in ../shared/upstream/README.md"
    ported = assert_exact(aa, out, trees["v0.26.0"])
    # Cross-check: the old pack still applies to v0.26.0 with --force, its hunks at offsets
    # (each uniquely and exactly, so the same change): the same files as the merge gives.
    forced, report, _ = decide(aa, REPO / "patches", trees["v0.26.0"], force=True)
    assert sum(bool(e["notes"]) for e in report) == 6 and all(e["state"] == "apply" for e in report)
    assert forced == ported
    for name in fixes:
        meta = json.loads((out / name / "fix.json").read_text())
        assert meta["pre_sha256"] == {p: aa.sha256(aa.read_lines(trees["v0.26.0"] / p)) for p in meta["files"]}
        if states(out)[name] == "rebased":
            assert meta["written_against"].startswith("vllm-gaudi releases-v0.26.0-b059f9c9: ported by")


def test_applier_and_check_fixes_refuse_the_same_fixes_on_v026(trees, aa):
    _, report, _ = decide(aa, REPO / "patches", trees["v0.26.0"])
    refused = {e["fix"]["name"] for e in report if e["state"] == "fails"}
    assert refused == {n for n, files in gaudi_fixes(aa).items() if files & CHANGED}
    for e in report:
        if e["state"] == "fails":
            assert any(f"is not the file fix {e['fix']['name']} was written against (vllm-gaudi main "
                       "091bbadda10bee4fd3f6d0efc1844d2610dd2707, sha256" in line for line in e["errors"]), e["errors"]
    check = subprocess.run([str(REPO / "scripts" / "check-fixes.sh"), str(trees["v0.26.0"])],
                           env=dict(os.environ, PYTHON=sys.executable), capture_output=True, text=True)
    assert check.returncode != 0
    not_exact = {line.split()[-1] for line in check.stdout.splitlines()
                 if line.startswith("  ") and line.split()[0] in ("FAILS", "OFFSET", "ALREADY")}
    assert not_exact == refused, check.stdout


def test_port_to_v027_reports_seeded_sampling_as_a_conflict(trees, tmp_path, aa):
    out = tmp_path / "out"
    result = port(trees["v0.27.0rc0"], out)
    assert result.returncode == 1, result.stdout + result.stderr
    got = states(out)
    assert got.pop("seeded-sampling") == "conflict"
    assert set(got.values()) <= {"exact", "rebased"}
    text = result.stdout
    report = text[text.index("CONFLICT         seeded-sampling"):].splitlines()
    assert report[1].startswith("      vllm_gaudi/patches.py: hunk @@ -291,6 +291,57 @@: upstream changed lines of its "
                                "context, now near line 290")
    assert report[2:6] == ["        the fix was made against:", "          |         _hpu_gather_logprobs)",
                           "        upstream now:",
                           "          |     _sampler_mod.Sampler.gather_logprobs = staticmethod(_hpu_gather_logprobs)"]
    assert not (out / "seeded-sampling" / "fix.json").exists()
    assert (out / "seeded-sampling" / "conflict" / "vllm_gaudi" / "patches.py").is_file()
    # the applier's own refusal of the old pack names the hunk and where its lines are now
    _, plan, _ = decide(aa, REPO / "patches", trees["v0.27.0rc0"])
    seeded = next(e for e in plan if e["fix"]["name"] == "seeded-sampling")
    assert any("hunk @@ -291,6 +291,57 @@" in line and "its lines now best match at line 290" in line
               and "found '    _sampler_mod.Sampler.gather_logprobs = staticmethod(_hpu_gather_logprobs)\\n'" in line
               for line in seeded["errors"]), seeded["errors"]


def test_port_to_v027_with_the_merge_accepted_applies_exactly(trees, tmp_path, aa):
    out = tmp_path / "out"
    result = port(trees["v0.27.0rc0"], out, "--accept-merge")
    assert result.returncode == 0, result.stdout + result.stderr
    assert states(out)["seeded-sampling"] == "rebased"
    files = assert_exact(aa, out, trees["v0.27.0rc0"])
    # Ported twice (091bbadd -> v0.26.0 -> v0.27.0rc0, the second port finding its upstream
    # files in the v0.26.0 snapshot by sha256) gives the same files as ported once.
    first, second = tmp_path / "via-v026", tmp_path / "via-v026-then-v027"
    assert port(trees["v0.26.0"], first).returncode == 0
    again = port(trees["v0.27.0rc0"], second, "--accept-merge", "--archives", str(SNAPSHOTS), pack=first)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "from vllm-gaudi-releases-v0.26.0-b059f9c9.tar.gz" in again.stdout
    assert assert_exact(aa, second, trees["v0.27.0rc0"]) == files


def test_ported_pack_passes_the_fixes_tests_on_091bbadd(trees, tmp_path):
    python = os.environ.get("GEMMA4_VLLM_PYTHON")
    if not python:
        pytest.skip("GEMMA4_VLLM_PYTHON (a python with vLLM 0.30.0 importable) is not set")
    cmd = [sys.executable, str(PORT), str(trees["main"]), "--out", str(tmp_path / "out"), "--python", python]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    tests = json.loads((tmp_path / "out" / "port.json").read_text())["tests"]
    assert tests["exit"] == 0 and tests["modules"]
    assert all(m["failed"] == 0 and m["skipped"] == 0 for m in tests["modules"].values()), tests
