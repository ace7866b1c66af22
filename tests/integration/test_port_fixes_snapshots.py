"""scripts/port-fixes.py and the applier's decisions on the real vllm-gaudi snapshots in
../shared/upstream (main 091bbadd, which the pack was written against; releases/v0.26.0;
v0.27.0rc0), extracted to a temporary directory. No Docker, no vLLM: the fixes' tests on
the ported packs need vLLM 0.30.0 and run only in the last three tests, with GEMMA4_VLLM_PYTHON.

Facts about the snapshots used here, read from them (diff of the extracted trees; checked by
test_the_snapshots_differ_from_091bbadd_as_stated_above):
- among the files the pack's vllm_gaudi fixes touch, releases/v0.26.0 and v0.27.0rc0 differ
  from 091bbadd in vllm_gaudi/patches.py, vllm_gaudi/v1/worker/hpu_model_runner.py and
  vllm_gaudi/attention/backends/hpu_attn.py, the last byte-identical in the two;
- that hpu_attn.py predates 091bbadd's gather-by-id for sliding-window decode: 091bbadd lines
  663-664 (`# Exception: sliding window with contiguous PA needs gather-by-id ...`) and the
  blank line 667 around the two `_set_fetch_by_id(..., False)` lines 665-666 are not there,
  nor is the sliding-window branch's `_set_fetch_by_id(self.k_cache, True)` (091bbadd line
  671; both have the prefill branch's, 628 and 626). gemma4-fast-prefill replaces lines 665-666
  and reads 663-664 and 667 as context: git merge-file sees both sides change those lines (a
  real conflict, which the applier confirms: that hunk does not apply even with --force);
- v0.27.0rc0 patches.py line 281 joins 091bbadd's lines 281-282
  (`staticmethod(  # type: ignore[method-assign]` / `_hpu_gather_logprobs)`) into one,
  and that second line is the first context line of seeded-sampling's first hunk."""

import json
import os
import py_compile
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gemma4_images.spec.modules import load_file
from tests import fix_tests

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PORT = REPO / "scripts" / "port-fixes.py"
SNAPSHOTS = REPO.parent / "shared" / "upstream"
ARCHIVES = {
    "main": "vllm-gaudi-main-091bbadd.tar.gz",
    "v0.26.0": "vllm-gaudi-releases-v0.26.0-b059f9c9.tar.gz",
    "v0.27.0rc0": "vllm-gaudi-v0.27.0rc0-d01a3cae.tar.gz",
}
PATCHES, HPU_RUNNER = "vllm_gaudi/patches.py", "vllm_gaudi/v1/worker/hpu_model_runner.py"
ATTN = "vllm_gaudi/attention/backends/hpu_attn.py"
CHANGED = {PATCHES, HPU_RUNNER, ATTN}
FAST = "gemma4-fast-prefill"
CARRIED = ("tests", "gaudi_checks", "hunks_gaudi_only")  # fix.json keys a port keeps as they are


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    missing = [name for name in ARCHIVES.values() if not (SNAPSHOTS / name).is_file()]
    if missing:
        pytest.fail(
            f"missing vllm-gaudi snapshot(s) {', '.join(missing)} in {SNAPSHOTS} (see the README.md there; "
            "CI's clone sits beside ../shared as this one does)"
        )
    root = tmp_path_factory.mktemp("upstream")
    for name in ARCHIVES.values():  # as vllm-gaudi-releases-v0.26.0-b059f9c9/vllm-gaudi: the port's label
        with tarfile.open(SNAPSHOTS / name) as tar:
            tar.extractall(root / name[: -len(".tar.gz")], filter="data")
    return {key: root / name[: -len(".tar.gz")] / "vllm-gaudi" for key, name in ARCHIVES.items()}


@pytest.fixture(scope="module")
def aa():
    return load_file("port_fixes", PORT).aa


def port(tree, out, *args, pack=REPO / "patches"):
    cmd = [sys.executable, str(PORT), str(tree), "--out", str(out), "--pack", str(pack), "--no-tests", *args]
    return subprocess.run(cmd, capture_output=True, text=True)


def states(out):
    return {f["name"]: f["state"] for f in json.loads((out / "port.json").read_text())["fixes"]}


def lines(path):
    return path.read_text().splitlines(keepends=True)


def decide(aa, pack, tree, force=False, names=None):
    """The applier's plan (the decision apply_all.py and check-fixes.sh both make) for the pack's
    vllm_gaudi fixes (only those named, if names), in pack order, on tree."""
    prof = aa.load_profile(str(pack), "vllm-gaudi-0.30.0")
    fixes = [
        aa.load_fix(str(pack), n, n in prof["opt_in"])
        for n in prof["generic"] + prof["opt_in"]
        if names is None or n in names
    ]
    return aa.plan([f for f in fixes if f["package"] == "vllm_gaudi"], str(tree), force=force)


def gaudi_fixes(aa):
    """{name: files} of the pack's vllm_gaudi fixes, in pack order."""
    _, report, _ = decide(aa, REPO / "patches", REPO / "patches")  # reads only the fix files
    return {e["fix"]["name"]: set(e["fix"]["files"]) for e in report}


def fix_hunks(aa, name, path):
    return aa.load_fix(str(REPO / "patches"), name, name == FAST)["diff"][path]


def assert_exact(aa, pack, tree, names=None):
    """Every fix of pack (those named, if names) applies to tree at its stated lines, on the
    files it was written against; the result compiles. Returns the patched files."""
    files, report, _ = decide(aa, pack, tree, names=names)
    assert [e["fix"]["name"] for e in report] == list(names or [e["fix"]["name"] for e in report])
    assert [
        (e["fix"]["name"], e["state"], e["notes"], e["errors"]) for e in report if e["state"] != "apply" or e["notes"]
    ] == []
    for path, text in files.items():
        target = tree.parent / "compiled" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(aa.encode(text))
        py_compile.compile(str(target), doraise=True)
    return files


def without(pack, name):
    """The pack's profile no longer names fix `name` (a ported pack lacking it, made usable)."""
    path = pack / "profiles" / "vllm-gaudi-0.30.0.json"
    prof = json.loads(path.read_text())
    prof["generic"], prof["opt_in"] = ([n for n in prof[k] if n != name] for k in ("generic", "opt_in"))
    path.write_text(json.dumps(prof))
    shutil.rmtree(pack / name)


def assert_fast_prefill_conflict(aa, trees, out, stdout, runner="rebased"):
    """gemma4-fast-prefill conflicts in hpu_attn.py (releases/v0.26.0 and v0.27.0rc0 have the
    same file there), its other files port (or hpu_model_runner.py is blocked, runner): git
    merge-file's block, in port.json and as printed."""
    files = next(f for f in json.loads((out / "port.json").read_text())["fixes"] if f["name"] == FAST)["files"]
    assert {p: f["state"] for p, f in files.items()} == {
        ATTN: "conflict",
        "vllm_gaudi/models/gemma4.py": "exact",
        "vllm_gaudi/v1/attention/backends/hpu_attn.py": "exact",
        HPU_RUNNER: runner,
    }
    (hunk,) = fix_hunks(aa, FAST, ATTN)
    base, upstream = lines(trees["main"] / ATTN)[662:667], lines(trees["v0.26.0"] / ATTN)[660:662]
    wants = base[:2] + [t for tag, t in hunk.lines if tag == "+"] + base[-1:]
    assert files[ATTN]["kind"] == "overlap"
    assert files[ATTN]["conflicts"] == [{"line": 661, "upstream": upstream, "base": base, "fix": wants}]
    report = stdout[stdout.index(f"CONFLICT         {FAST}") :].splitlines()
    shown = [f"      {ATTN}: git merge-file conflict at line 661 of the new tree's file:", "        upstream now:"]
    shown += [f"          | {t.rstrip()}" for t in upstream] + ["        the fix was made against:"]
    shown += [f"          | {t.rstrip()}" for t in base] + ["        the fix wants:"]
    shown += [f"          | {t.rstrip()}" for t in wants]
    assert report[1 : len(shown) + 1] == shown
    merged = (out / FAST / "conflict" / ATTN).read_text()
    assert merged.count("<<<<<<< vllm-gaudi ") == 1 and "\n>>>>>>> gemma4-fast-prefill\n" in merged
    assert (out / FAST / "conflict" / (ATTN + ".before")).read_bytes() == (trees["v0.26.0"] / ATTN).read_bytes()
    assert not (out / FAST / "fix.json").exists() and not (out / FAST / "fix.diff").exists()


def test_port_to_091bbadd_is_exact_and_keeps_the_pack(trees, tmp_path, aa):
    result = port(trees["main"], tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert set(states(tmp_path / "out").values()) == {"exact"}
    for name in gaudi_fixes(aa):
        for part in ("fix.json", "fix.diff"):
            assert (tmp_path / "out" / name / part).read_bytes() == (REPO / "patches" / name / part).read_bytes()


def test_the_snapshots_differ_from_091bbadd_as_stated_above(trees, aa):
    fixes = gaudi_fixes(aa)
    touched = set().union(*fixes.values())
    for key in ("v0.26.0", "v0.27.0rc0"):
        differ = {p for p in touched if (trees[key] / p).read_bytes() != (trees["main"] / p).read_bytes()}
        assert differ == CHANGED, key
    assert (trees["v0.26.0"] / ATTN).read_bytes() == (trees["v0.27.0rc0"] / ATTN).read_bytes()
    main, old = lines(trees["main"] / ATTN), lines(trees["v0.26.0"] / ATTN)
    assert [t.strip() for t in main[662:667]] == [
        "# Exception: sliding window with contiguous PA needs gather-by-id because",
        "# window_block_list contains scattered block IDs (not identity layout).",
        "_set_fetch_by_id(self.k_cache, False)",
        "_set_fetch_by_id(self.v_cache, False)",
        "",
    ]
    assert [t.strip() for t in old[660:663]] == [
        "_set_fetch_by_id(self.k_cache, False)",
        "_set_fetch_by_id(self.v_cache, False)",
        "if self.sliding_window and \\",
    ]
    by_id = "_set_fetch_by_id(self.k_cache, True)"  # prefill; and in 091bbadd the sliding-window decode
    assert [i + 1 for i, t in enumerate(main) if by_id in t] == [628, 671]
    assert [i + 1 for i, t in enumerate(old) if by_id in t] == [626]
    main, rc0 = lines(trees["main"] / PATCHES), lines(trees["v0.27.0rc0"] / PATCHES)
    assert rc0[280] == main[280].split("  #")[0] + main[281].strip() + "\n"
    first = fix_hunks(aa, "seeded-sampling", PATCHES)[0]
    assert first.side(False)[0] == main[281], "the first context line of seeded-sampling's first hunk"


def test_port_to_v026_rebases_all_but_fast_prefill_and_those_apply_exactly(trees, tmp_path, aa):
    out = tmp_path / "out"
    result = port(trees["v0.26.0"], out)
    assert result.returncode == 1, result.stdout + result.stderr
    fixes = gaudi_fixes(aa)
    clean = [n for n in fixes if n != FAST]
    assert states(out) == {
        n: "conflict" if n == FAST else "rebased" if files & CHANGED else "exact" for n, files in fixes.items()
    }
    assert sum(s == "rebased" for s in states(out).values()) == 5
    assert_fast_prefill_conflict(aa, trees, out, result.stdout)
    assert f"written: {', '.join(clean)} (7 of 8 fixes); checked: they apply exactly" in result.stdout
    ported = assert_exact(aa, out, trees["v0.26.0"], clean)
    # Cross-check with the applier alone: the pack's own diffs with --force on v0.26.0 apply the
    # same 7 fixes, 5 of them at offsets (each uniquely and exactly, so the same change), giving
    # the same files as the merge; gemma4-fast-prefill does not apply even forced.
    _, report, _ = decide(aa, REPO / "patches", trees["v0.26.0"], force=True)
    assert {e["fix"]["name"]: (e["state"], bool(e["notes"])) for e in report} == {
        n: ("fails" if n == FAST else "apply", bool(fixes[n] & CHANGED) and n != FAST) for n in fixes
    }
    assert decide(aa, REPO / "patches", trees["v0.26.0"], force=True, names=clean)[0] == ported
    for name in clean:
        meta, original = (json.loads((pack / name / "fix.json").read_text()) for pack in (out, REPO / "patches"))
        assert meta["pre_sha256"] == {p: aa.sha256(aa.read_lines(trees["v0.26.0"] / p)) for p in meta["files"]}
        assert {k: meta.get(k) for k in CARRIED} == {k: original.get(k) for k in CARRIED}
        if states(out)[name] == "rebased":
            assert meta["written_against"].startswith("vllm-gaudi releases-v0.26.0-b059f9c9: ported by")
            assert meta["hunk_coverage"].startswith("not re-recorded since the port to vllm-gaudi releases-v0.26.0")
            assert meta["hunk_coverage"].endswith("before the port: " + original["hunk_coverage"])
        else:  # exact on the very files it was written against: its fix.json stays, figure included
            assert meta == original


def test_applier_and_check_fixes_refuse_the_same_fixes_on_v026(trees, aa):
    _, report, _ = decide(aa, REPO / "patches", trees["v0.26.0"])
    refused = {e["fix"]["name"] for e in report if e["state"] == "fails"}
    assert refused == {n for n, files in gaudi_fixes(aa).items() if files & CHANGED}
    for e in report:
        if e["state"] == "fails":
            assert any(
                f"is not the file fix {e['fix']['name']} was written against (vllm-gaudi main "
                "091bbadda10bee4fd3f6d0efc1844d2610dd2707, sha256" in line
                for line in e["errors"]
            ), e["errors"]
    check = subprocess.run(
        [str(REPO / "scripts" / "check-fixes.sh"), str(trees["v0.26.0"])],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
    )
    assert check.returncode != 0
    not_exact = {
        line.split()[-1]
        for line in check.stdout.splitlines()
        if line.startswith("  ") and line.split()[0] in ("FAILS", "OFFSET", "ALREADY")
    }
    assert not_exact == refused, check.stdout


def test_port_to_v027_reports_seeded_sampling_and_fast_prefill_as_conflicts(trees, tmp_path, aa):
    out = tmp_path / "out"
    result = port(trees["v0.27.0rc0"], out)
    assert result.returncode == 1, result.stdout + result.stderr
    got = states(out)
    assert (got.pop("seeded-sampling"), got.pop(FAST)) == ("conflict", "conflict")
    assert set(got.values()) <= {"exact", "rebased"}
    # its hpu_model_runner.py diff is stacked on seeded-sampling's, which is not ported
    assert_fast_prefill_conflict(aa, trees, out, result.stdout, runner="blocked")
    assert (
        f"      {HPU_RUNNER}: not ported: seeded-sampling, before it in pack order, edits this file and is not "
        "ported (it conflicts); resolve that first" in result.stdout
    )
    header = fix_hunks(aa, "seeded-sampling", PATCHES)[0].header
    seeded = json.loads((out / "port.json").read_text())["fixes"]
    seeded = next(f for f in seeded if f["name"] == "seeded-sampling")["files"]
    assert seeded[PATCHES]["kind"] == "context" and seeded[HPU_RUNNER]["state"] == "rebased"
    assert seeded[PATCHES]["conflicts"] == [
        {
            "hunk": header,
            "line": 290,
            "base": ["        _hpu_gather_logprobs)\n"],
            "upstream": [lines(trees["v0.27.0rc0"] / PATCHES)[280]],
        }
    ]
    text = result.stdout
    report = text[text.index("CONFLICT         seeded-sampling") :].splitlines()
    assert report[1].startswith(
        f"      {PATCHES}: hunk {header}: upstream changed lines of its context, now near line 290"
    )
    assert report[2:6] == [
        "        the fix was made against:",
        "          |         _hpu_gather_logprobs)",
        "        upstream now:",
        "          |     _sampler_mod.Sampler.gather_logprobs = staticmethod(_hpu_gather_logprobs)",
    ]
    assert not (out / "seeded-sampling" / "fix.json").exists()
    assert (out / "seeded-sampling" / "conflict" / PATCHES).is_file()
    assert_exact(aa, out, trees["v0.27.0rc0"], [n for n in gaudi_fixes(aa) if n not in ("seeded-sampling", FAST)])
    # the applier's own refusal of the old pack names the hunk and where its lines are now
    _, plan, _ = decide(aa, REPO / "patches", trees["v0.27.0rc0"])
    refusal = next(e for e in plan if e["fix"]["name"] == "seeded-sampling")
    assert any(
        f"hunk {header}" in line
        and "its lines now best match at line 290" in line
        and "found '    _sampler_mod.Sampler.gather_logprobs = staticmethod(_hpu_gather_logprobs)\\n'" in line
        for line in refusal["errors"]
    ), refusal["errors"]


def test_port_to_v027_with_the_merge_accepted_applies_seeded_sampling_exactly(trees, tmp_path, aa):
    out = tmp_path / "out"
    result = port(trees["v0.27.0rc0"], out, "--accept-merge")
    assert result.returncode == 1, "gemma4-fast-prefill's overlap is not a merge to accept"
    assert states(out)["seeded-sampling"] == "rebased" and states(out)[FAST] == "conflict"
    header = fix_hunks(aa, "seeded-sampling", PATCHES)[0].header
    assert (
        f"{PATCHES}: hunk {header}: upstream changed its context; git's merge taken (--accept-merge)" in result.stdout
    )
    clean = [n for n in gaudi_fixes(aa) if n != FAST]
    files = assert_exact(aa, out, trees["v0.27.0rc0"], clean)
    # git's merge put the fix's code right after upstream's one-line assignment, where the fix
    # put it after the two-line one, and registered its patch in the plugin hook
    patched = files[PATCHES]
    at = patched.index("    _sampler_mod.Sampler.gather_logprobs = staticmethod(_hpu_gather_logprobs)\n")
    assert patched[at + 1 : at + 4] == ["\n", "\n", "class SeededDraws:\n"]
    assert patched[patched.index("        _patch_gather_logprobs()\n") + 1] == "        _patch_random_sample()\n"
    # Ported twice (091bbadd -> v0.26.0 -> v0.27.0rc0, the second port finding its upstream
    # files in the v0.26.0 snapshot by sha256) gives the same files as ported once. The first
    # port's pack lacks gemma4-fast-prefill (it conflicts), so its profile stops naming it.
    first, second = tmp_path / "via-v026", tmp_path / "via-v026-then-v027"
    assert port(trees["v0.26.0"], first).returncode == 1
    without(first, FAST)
    again = port(trees["v0.27.0rc0"], second, "--accept-merge", "--archives", str(SNAPSHOTS), pack=first)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "from vllm-gaudi-releases-v0.26.0-b059f9c9.tar.gz" in again.stdout
    assert assert_exact(aa, second, trees["v0.27.0rc0"], clean) == files


@pytest.fixture
def vllm_python():
    python = os.environ.get("GEMMA4_VLLM_PYTHON")
    if not python:
        pytest.skip("GEMMA4_VLLM_PYTHON (a python with vLLM 0.30.0 importable) is not set")
    return python


def test_ported_pack_passes_the_fixes_tests_on_091bbadd(trees, tmp_path, vllm_python):
    cmd = [sys.executable, str(PORT), str(trees["main"]), "--out", str(tmp_path / "out"), "--python", vllm_python]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    tests = json.loads((tmp_path / "out" / "port.json").read_text())["tests"]
    assert tests["exit"] == 0 and tests["modules"] and tests["deselected"] == []
    assert all(m["failed"] == 0 and m["skipped"] == 0 for m in tests["modules"].values()), tests


def test_a_rebased_pack_passes_the_fixes_tests_with_its_coverage_marked_stale(trees, tmp_path, aa, vllm_python):
    """Every real snapshot has a conflict, so a clean rebase with the tests run is made here:
    091bbadd with a line added at the top of hpu_model_runner.py (every fix of it moves by +1)."""
    tree = tmp_path / "moved" / "vllm-gaudi"
    shutil.copytree(trees["main"], tree)
    (tree / HPU_RUNNER).write_text("# a line added above the module\n" + (tree / HPU_RUNNER).read_text())
    out = tmp_path / "out"
    cmd = [sys.executable, str(PORT), str(tree), "--out", str(out), "--python", vllm_python]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    moved = [n for n, files in gaudi_fixes(aa).items() if HPU_RUNNER in files]
    assert [n for n, s in states(out).items() if s == "rebased"] == moved
    tests = json.loads((out / "port.json").read_text())["tests"]
    assert tests["exit"] == 0 and all(m["failed"] == 0 and m["skipped"] == 0 for m in tests["modules"].values())
    assert tests["modules"]["test_gaudi_fix_manifests"]["passed"] > 0, "its other checks ran"
    assert f"hunk coverage: not re-recorded for {', '.join(moved)}" in result.stdout
    # the check the port left out: on the ported pack it fails for exactly the rebased fixes
    check = subprocess.run(
        fix_tests.command(
            vllm_python, ["tests/unit/test_gaudi_fix_manifests.py::test_manifest_coverage_counts_the_current_hunks"]
        ),
        cwd=REPO,
        env=dict(os.environ, **fix_tests.environment(pack=out, no_skip=False)),
        capture_output=True,
        text=True,
    )
    failed = {line.split("[")[1].split("]")[0] for line in check.stdout.splitlines() if line.startswith("FAILED ")}
    assert failed == set(moved), check.stdout


def test_the_fixes_ported_to_v027_with_the_merge_accepted_pass_their_tests_there(trees, tmp_path, aa, vllm_python):
    """The seven fixes that port to v0.27.0rc0 (seeded-sampling through git's accepted merge)
    run the tests their fix.json names against v0.27.0rc0's own files."""
    out = tmp_path / "out"
    assert port(trees["v0.27.0rc0"], out, "--accept-merge").returncode == 1  # gemma4-fast-prefill conflicts
    without(out, FAST)
    names = [n for n in gaudi_fixes(aa) if n != FAST]
    tests = sorted({t for n in names for t in json.loads((out / n / "fix.json").read_text())["tests"]})
    assert any(t.startswith("tests/unit/test_gaudi_fix_sampling.py::test_fixed_seeded") for t in tests)
    env = dict(os.environ, **fix_tests.environment(src=trees["v0.27.0rc0"], pack=out))
    run = subprocess.run(
        fix_tests.command(vllm_python, tests),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
