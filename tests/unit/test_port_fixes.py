"""scripts/port-fixes.py on synthetic packs and trees: the three-way merge's verdicts, the
pack it writes, where it finds the upstream files, and its handling of the fixes' test run.

The command runs in a subprocess as a porter runs it; its results are judged with the pack's
own applier (patches/apply_all.py), never by reading the diffs it wrote. The real snapshots
are in tests/integration/test_port_fixes_snapshots.py."""

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from test_apply_all import edit, make_diff, ok, sha  # the applier tests' helpers (tests/unit is on the path)

from gemma4_images.spec.modules import load_file

REPO = Path(__file__).resolve().parents[2]
PORT = REPO / "scripts" / "port-fixes.py"

X, Y = "vllm_gaudi/v1/worker/x.py", "vllm_gaudi/y.py"
UPSTREAM = {X: "".join(f"x_{i} = {i}\n" for i in range(1, 41)), Y: "".join(f"y_{i} = {i}\n" for i in range(1, 21))}


def load_port():
    return load_file("port_fixes", PORT)


class Porting:
    """A pack of stacked vllm_gaudi fixes written against UPSTREAM, and a new tree to port to."""

    def __init__(self, tmp_path):
        self.tmp, self.pack, self.new = tmp_path, tmp_path / "pack", tmp_path / "new"
        self.base = tmp_path / "base"
        for path, text in UPSTREAM.items():
            for root in (self.base, self.new):
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                (root / path).write_text(text)
        after_one = edit(UPSTREAM[X], "x_10 = 10\n", "x_10 = 100\n")
        after_two = edit(edit(after_one, "x_12 = 12\n", "x_12 = 120\n"), "x_30 = 30\n", "x_30 = 30\nx_30b = 0\n")
        self.fixes = [
            ("fix-one", {X: (UPSTREAM[X], after_one)}),
            ("fix-two", {X: (after_one, after_two)}),  # on top of fix-one, as the pack is stacked
            ("fix-three", {Y: (UPSTREAM[Y], edit(UPSTREAM[Y], "y_5 = 5\n", "y_5 = 50\n"))}),
        ]
        (self.pack / "profiles").mkdir(parents=True)
        (self.pack / "profiles" / "vllm-gaudi-0.30.0.json").write_text(
            json.dumps(
                {
                    "name": "vllm-gaudi-0.30.0",
                    "description": "test",
                    "requires": {"vllm_gaudi": {"version": "0.30.0"}},
                    "generic": [n for n, _ in self.fixes],
                    "opt_in": [],
                }
            )
        )
        for name, changes in self.fixes:
            self.write_fix(name, changes)
        self.out = tmp_path / "out"

    def write_fix(self, name, changes, **optional):
        """fix.json (with the optional keys given) and fix.diff of a fix: {path: (before, after)}."""
        folder = self.pack / name
        folder.mkdir(exist_ok=True)
        (folder / "fix.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "why": f"test fix {name}",
                    "package": "vllm_gaudi",
                    "files": list(changes),
                    "opt_in": False,
                    "written_against": "vllm-gaudi main 1234567 (synthetic)",
                    "verified": "unit test",
                    "pre_sha256": {p: sha(UPSTREAM[p]) for p in changes},
                    **optional,
                }
            )
        )
        (folder / "fix.diff").write_text("".join(make_diff(p, b, a) for p, (b, a) in changes.items()))

    def upstream_change(self, path, old, new):
        (self.new / path).write_text(edit((self.new / path).read_text(), old, new))

    def run(self, *args, base=True):
        cmd = [
            sys.executable,
            str(PORT),
            str(self.new),
            "--pack",
            str(self.pack),
            "--out",
            str(self.out),
            "--archives",
            str(self.tmp / "no-archives"),
            "--no-tests",
            *(["--base", str(self.base)] if base else []),
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True)

    def report(self):
        return {f["name"]: f for f in json.loads((self.out / "port.json").read_text())["fixes"]}

    def applied(self, pack, names=None):
        """The new tree's files with pack applied by the applier in pack order (only the fixes
        named, if names): (files, report)."""
        aa = load_port().aa
        prof = aa.load_profile(str(pack), "vllm-gaudi-0.30.0")
        fixes = [aa.load_fix(str(pack), n, False) for n in prof["generic"] if names is None or n in names]
        tree, report, _ = aa.plan(fixes, str(self.new))
        return {p: "".join(lines) for p, lines in tree.items()}, report


@pytest.fixture
def porting(tmp_path):
    return Porting(tmp_path)


def expected(porting, changes):
    """What the fixes make of the new tree, written out by hand for each test."""
    return {path: edit_all(porting.new.joinpath(path).read_text(), edits) for path, edits in changes.items()}


def edit_all(text, edits):
    for old, new in edits:
        text = edit(text, old, new)
    return text


ALL_EDITS = {
    X: [("x_10 = 10\n", "x_10 = 100\n"), ("x_12 = 12\n", "x_12 = 120\n"), ("x_30 = 30\n", "x_30 = 30\nx_30b = 0\n")],
    Y: [("y_5 = 5\n", "y_5 = 50\n")],
}


# ---------------------------------------------------------------- verdicts
def test_same_tree_is_exact_and_the_pack_is_unchanged(porting):
    out = ok(porting.run()).stdout
    assert [line.split() for line in out.splitlines() if line.startswith("  ") and "fix-" in line] == [
        ["exact", "fix-one"],
        ["exact", "fix-two"],
        ["exact", "fix-three"],
    ]
    for name, _ in porting.fixes:
        for part in ("fix.json", "fix.diff"):
            assert (porting.out / name / part).read_bytes() == (porting.pack / name / part).read_bytes(), (name, part)
    assert {n: f["state"] for n, f in porting.report().items()} == dict.fromkeys(
        ["fix-one", "fix-two", "fix-three"], "exact"
    )


def test_moved_code_is_rebased_and_the_new_diffs_apply_exactly(porting):
    porting.upstream_change(X, "x_2 = 2\n", "x_2 = 2\nnew_1 = 1\nnew_2 = 2\n")  # moves every hunk of X by +2
    porting.upstream_change(X, "x_20 = 20\n", "")  # and the later one back by -1
    result = ok(porting.run())
    states = {n: f["state"] for n, f in porting.report().items()}
    assert states == {"fix-one": "rebased", "fix-two": "rebased", "fix-three": "exact"}, result.stdout
    assert "rebased cleanly  fix-two" in result.stdout and "hunks moved +2, +1 lines" in result.stdout
    files, report = porting.applied(porting.out)
    assert [e["state"] for e in report] == ["apply"] * 3
    assert not [n for e in report for n in e["notes"]], "the ported diffs land at their stated lines"
    assert not [u for e in report for u in e["unverified"]], "and name the new tree's files in pre_sha256"
    assert files == expected(porting, ALL_EDITS)
    meta = json.loads((porting.out / "fix-two" / "fix.json").read_text())
    assert meta["pre_sha256"] == {X: sha(porting.new.joinpath(X).read_text())}
    assert meta["written_against"].startswith("vllm-gaudi new: ported by scripts/port-fixes.py (rebased cleanly")
    assert "on top of fix-one" in meta["written_against"]
    assert porting.report()["fix-two"]["files"][X]["post_sha256"] == sha(files[X])
    assert porting.report()["fix-one"]["files"][X]["post_sha256"] == sha(expected(porting, {X: ALL_EDITS[X][:1]})[X]), (
        "post_sha256: the file after the fix, in pack order"
    )


def test_overlapping_change_is_a_conflict_with_its_lines_and_blocks_later_fixes(porting):
    porting.upstream_change(X, "x_10 = 10\n", "x_10 = 10  # changed upstream\n")
    result = porting.run()
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout
    assert (
        "CONFLICT         fix-one" in out and "BLOCKED          fix-two" in out and "exact            fix-three" in out
    )
    assert f"{X}: git merge-file conflict at line 10 of the new tree's file:" in out
    lines = out[out.index("git merge-file conflict") :].splitlines()
    assert lines[1:7] == [
        "        upstream now:",
        "          | x_10 = 10  # changed upstream",
        "        the fix was made against:",
        "          | x_10 = 10",
        "        the fix wants:",
        "          | x_10 = 100",
    ]
    assert f"{X}: not ported: fix-one conflicts in this file; resolve that first" in out
    assert "tests: not run (resolve the conflicts first)" in out
    folder = porting.out / "fix-one"
    assert not (folder / "fix.json").exists() and not (folder / "fix.diff").exists()
    merged = (folder / "conflict" / X).read_text()
    assert "<<<<<<< vllm-gaudi new\nx_10 = 10  # changed upstream\n||||||| fix-one was made against\n" in merged
    assert (folder / "conflict" / (X + ".before")).read_text() == porting.new.joinpath(X).read_text()
    refused = subprocess.run(
        [
            sys.executable,
            str(REPO / "patches" / "apply_all.py"),
            "--profile",
            "vllm-gaudi-0.30.0",
            "--pack",
            str(porting.out),
            "--list",
        ],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 1 and "fix-one" in refused.stdout and "UNUSABLE" in refused.stdout


def test_a_fix_stacked_on_a_conflicting_fix_in_another_file_is_blocked(porting):
    """fix-one conflicts in X and merges cleanly in Y; fix-three's diff of Y is made on top of
    fix-one's, so without fix-one it cannot be ported either (it would not apply)."""
    y_one = edit(UPSTREAM[Y], "y_5 = 5\n", "y_5 = 50\n")
    porting.write_fix(
        "fix-one", {X: (UPSTREAM[X], edit(UPSTREAM[X], "x_10 = 10\n", "x_10 = 100\n")), Y: (UPSTREAM[Y], y_one)}
    )
    porting.write_fix("fix-three", {Y: (y_one, edit(y_one, "y_7 = 7\n", "y_7 = 70\n"))})
    porting.upstream_change(X, "x_10 = 10\n", "x_10 = 10  # changed upstream\n")
    result = porting.run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert {n: f["state"] for n, f in porting.report().items()} == {
        "fix-one": "conflict",
        "fix-two": "blocked",
        "fix-three": "blocked",
    }, result.stdout
    assert (
        f"{Y}: not ported: fix-one, before it in pack order, edits this file and is not ported "
        "(it conflicts); resolve that first" in result.stdout
    )
    assert porting.report()["fix-three"]["files"][Y] == {
        "state": "blocked",
        "by": "fix-one",
        "pre_sha256": sha(UPSTREAM[Y]),
        "before_sha256": sha(UPSTREAM[Y]),
    }
    assert not (porting.out / "fix-three" / "fix.json").exists()


def test_a_conflict_leaves_the_other_fixes_written_and_checked(porting):
    porting.upstream_change(X, "x_10 = 10\n", "x_10 = 10  # changed upstream\n")
    porting.upstream_change(Y, "y_1 = 1\n", "y_1 = 1\ny_1b = 0\n")  # fix-three rebases
    result = porting.run()
    assert result.returncode == 1
    assert (
        "written: fix-three (1 of 3 fixes); checked: it applies exactly to the new tree at the stated lines"
        in result.stdout
    ), result.stdout
    files, report = porting.applied(porting.out, ["fix-three"])
    assert [e["state"] for e in report] == ["apply"] and not report[0]["notes"] + report[0]["unverified"]
    assert files == expected(porting, {Y: ALL_EDITS[Y]})


def test_the_optional_keys_are_carried_and_hunk_coverage_is_marked_stale(porting):
    optional = {
        "tests": ["tests/unit/test_x.py::test_it"],
        "gaudi_checks": ["a Gaudi 2 shows it"],
        "hunks_gaudi_only": [{"match": "x_30b = 0", "why": "HPU only", "gaudi": "it shows"}],
        "hunk_coverage": "1/2 hunks noticed by a CPU test (synthetic)",
    }
    after_one = edit(UPSTREAM[X], "x_10 = 10\n", "x_10 = 100\n")
    porting.write_fix(
        "fix-two",
        {X: (after_one, edit(edit(after_one, "x_12 = 12\n", "x_12 = 120\n"), "x_30 = 30\n", "x_30 = 30\nx_30b = 0\n"))},
        **optional,
    )
    porting.write_fix("fix-three", {Y: (UPSTREAM[Y], edit(UPSTREAM[Y], "y_5 = 5\n", "y_5 = 50\n"))}, **optional)
    porting.upstream_change(X, "x_2 = 2\n", "x_2 = 2\nnew = 0\n")
    out = ok(porting.run()).stdout
    assert (
        f"hunk coverage: not re-recorded for fix-two (their fix.json says so): record it with PYTHON=<python "
        f"with vLLM 0.30.0> scripts/hunk_coverage.py --record {porting.new} once this pack is patches/" in out
    )
    ported = json.loads((porting.out / "fix-two" / "fix.json").read_text())
    assert {k: ported[k] for k in ("tests", "gaudi_checks", "hunks_gaudi_only")} == {
        k: optional[k] for k in ("tests", "gaudi_checks", "hunks_gaudi_only")
    }
    assert ported["hunk_coverage"].startswith("not re-recorded since the port to vllm-gaudi new: ")
    assert "scripts/hunk_coverage.py --record <vllm-gaudi new> once this pack is patches/" in ported["hunk_coverage"]
    assert ported["hunk_coverage"].endswith("before the port: 1/2 hunks noticed by a CPU test (synthetic)")
    load_port().aa.load_fix(str(porting.out), "fix-two", False)  # the applier takes it
    # fix-three is exact on the very file it was written against: its fix.json, figure included, stays
    kept = [(pack / "fix-three" / "fix.json").read_bytes() for pack in (porting.out, porting.pack)]
    assert kept[0] == kept[1]


def test_changed_context_is_a_conflict_unless_the_merge_is_accepted(porting):
    porting.upstream_change(X, "x_28 = 28\n", "x_28 = 28  # context line changed upstream\n")
    result = porting.run()
    assert result.returncode == 1
    out = result.stdout
    assert "CONFLICT         fix-two" in out and "exact            fix-one" in out
    assert f"{X}: hunk @@ -28,6 +28,7 @@: upstream changed lines of its context, now near line 28" in out
    lines = out[out.index("upstream changed lines") :].splitlines()
    assert lines[1:5] == [
        "        the fix was made against:",
        "          | x_28 = 28",
        "        upstream now:",
        "          | x_28 = 28  # context line changed upstream",
    ]
    assert (porting.out / "fix-two" / "conflict" / X).read_text().count("x_30b = 0\n") == 1, "git's clean merge"

    porting.out = porting.tmp / "accepted"
    out = ok(porting.run("--accept-merge")).stdout
    assert "rebased cleanly  fix-two" in out and "upstream changed its context; git's merge taken" in out
    files, report = porting.applied(porting.out)
    assert [e["state"] for e in report] == ["apply"] * 3 and not [n for e in report for n in e["notes"]]
    assert files == expected(porting, ALL_EDITS)


# ---------------------------------------------------------------- the upstream files
def test_upstream_files_come_from_an_archive_found_by_sha256(porting, tmp_path):
    porting.upstream_change(X, "x_1 = 1\n", "x_1 = 1\nx_1b = 0\n")
    archives = tmp_path / "archives"
    archives.mkdir()
    with tarfile.open(archives / "vllm-gaudi-main-1234567.tar.gz", "w:gz") as tar:
        tar.add(porting.base, arcname="vllm-gaudi")
    with tarfile.open(archives / "vllm-gaudi-other.tar.gz", "w:gz") as tar:
        tar.add(porting.new, arcname="vllm-gaudi")  # same paths, other content: passed over by sha256
    result = ok(porting.run("--archives", str(archives), base=False))
    assert f"upstream {X} (sha256 {sha(UPSTREAM[X])[:12]}): from vllm-gaudi-main-1234567.tar.gz" in result.stdout
    assert f"upstream {Y} (sha256 {sha(UPSTREAM[Y])[:12]}): from the new tree" in result.stdout
    assert porting.applied(porting.out)[0] == expected(porting, ALL_EDITS)


def test_upstream_files_come_from_the_new_trees_git_history(porting):
    git = ["git", "-C", str(porting.new), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "upstream"], check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    for name, _ in porting.fixes:  # the pack names the commit it was written against
        meta = json.loads((porting.pack / name / "fix.json").read_text())
        meta["written_against"] = f"vllm-gaudi main {commit}"
        (porting.pack / name / "fix.json").write_text(json.dumps(meta))
    porting.upstream_change(X, "x_1 = 1\n", "x_1 = 1\nx_1b = 0\n")
    subprocess.run(git + ["commit", "-qam", "next"], check=True)
    result = ok(porting.run(base=False))
    assert (
        f"upstream {X} (sha256 {sha(UPSTREAM[X])[:12]}): from git history of the new tree ({commit})" in result.stdout
    )
    assert porting.applied(porting.out)[0] == expected(porting, ALL_EDITS)


def test_missing_upstream_file_is_one_line_and_nothing_is_written(porting):
    porting.upstream_change(X, "x_1 = 1\n", "x_1 = 1\nx_1b = 0\n")
    result = porting.run(base=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "port-fixes: error: no copy of the upstream file"
    )
    assert f"{X} (sha256 {sha(UPSTREAM[X])})" in result.stderr and "pass --base DIR" in result.stderr
    assert not porting.out.exists() and not list(porting.tmp.glob(".port-fixes.*"))


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("out exists", "already exists: remove it, or choose another --out"),
        ("not a tree", "is not a vllm-gaudi tree (no vllm_gaudi/ in it)"),
        ("file gone", f"has no {X}, which the fixes edit: port them by hand"),
        ("not stacked", "fix fix-two: vllm_gaudi/v1/worker/x.py: hunk @@"),
    ],
)
def test_bad_input_exits_2_with_one_line(porting, breakage, message):
    if breakage == "out exists":
        porting.out.mkdir()
    elif breakage == "not a tree":
        porting.new = porting.tmp / "empty"
        porting.new.mkdir()
    elif breakage == "file gone":
        (porting.new / X).unlink()
    else:  # fix-two's diff made against upstream, not on top of fix-one: its context has x_10 = 10
        after = edit(UPSTREAM[X], "x_11 = 11\n", "x_11 = 110\n")
        (porting.pack / "fix-two" / "fix.diff").write_text(make_diff(X, UPSTREAM[X], after))
    result = porting.run()
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert breakage == "out exists" or not porting.out.exists()


def test_in_place_rewrites_the_pack_only_when_every_fix_ports(porting):
    porting.upstream_change(X, "x_10 = 10\n", "x_10 = 10  # changed upstream\n")
    before = {p: p.read_bytes() for p in porting.pack.rglob("*") if p.is_file()}
    assert porting.run("--in-place").returncode == 1
    assert {p: p.read_bytes() for p in porting.pack.rglob("*") if p.is_file()} == before
    (porting.new / X).write_text(UPSTREAM[X].replace("x_2 = 2\n", "x_2 = 2\nnew = 0\n"))
    porting.out = porting.tmp / "second"
    ok(porting.run("--in-place"))
    files, report = porting.applied(porting.pack)
    assert not [n for e in report for n in e["notes"] + e["unverified"]]
    assert files == expected(porting, ALL_EDITS)


# ---------------------------------------------------------------- the test run
STANDIN_CHECK = """#!/usr/bin/env bash
# STAND-IN for scripts/check-fixes.sh: runs the stand-in test modules with "$PYTHON" -m pytest
# and its PYTEST_ADDOPTS, in the scratch copy port-fixes makes, on the tree given.
set -e
cd "$(dirname "$0")/.."
test -f patches/fix-one/fix.json
VLLM_GAUDI_SRC="$1" "$PYTHON" -m pytest -q -p no:cacheprovider tests/unit
"""

STANDIN_TESTS = """
import os
FIX = "fix-one"  # the module names the fixes it tests

def test_sees_the_new_tree():
    assert os.path.isdir(os.path.join(os.environ["VLLM_GAUDI_SRC"], "vllm_gaudi"))

def test_fails():
    raise AssertionError("stand-in failure")

def test_skips():
    import pytest
    pytest.skip("stand-in skip")
"""


def standin_repo(tmp_path, modules):
    """A repository holding the stand-in check-fixes.sh and the test modules given."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "check-fixes.sh").write_text(STANDIN_CHECK)
    (repo / "scripts" / "check-fixes.sh").chmod(0o755)
    (repo / "tests" / "unit").mkdir(parents=True)
    for name, text in modules.items():
        (repo / "tests" / "unit" / name).write_text(text)
    return repo


def test_test_run_is_reported_per_module_and_its_exit_kept(porting, tmp_path):
    """port-fixes' handling of the run, with a named stand-in for check-fixes.sh."""
    repo = standin_repo(tmp_path, {"test_gaudi_fix_standin.py": STANDIN_TESTS})
    port = load_port()
    log = tmp_path / "check.log"
    tests = port.run_tests(str(porting.pack), str(porting.new), sys.executable, str(log), repo=str(repo))
    assert tests["exit"] == 1
    assert tests["modules"] == {
        "test_gaudi_fix_standin": {
            "passed": 1,
            "failed": 1,
            "skipped": 1,
            "reasons": ["AssertionError: stand-in failure"],
            "fixes": ["fix-one"],
        }
    }
    assert "1 failed, 1 passed, 1 skipped" in log.read_text()
    assert port.tests_of("fix-one", tests) == "test_gaudi_fix_standin.py 1 passed, 1 failed, 1 skipped"
    assert port.tests_of("fix-two", tests).startswith("no test module names it")


STANDIN_MANIFESTS = """
FIX = "fix-one"

def test_manifest_names_tests_that_exist():
    pass

def test_manifest_coverage_counts_the_current_hunks():
    raise AssertionError("stand-in: no hunk_coverage figure in fix.json")
"""


def test_test_run_leaves_out_the_coverage_figure_check_when_the_port_marks_it_stale(porting, tmp_path):
    """With the figures marked stale the port runs check-fixes without that one check (its
    node id deselected), and says so; the other checks of the module still run."""
    repo = standin_repo(tmp_path, {"test_gaudi_fix_manifests.py": STANDIN_MANIFESTS})
    port = load_port()
    run = [str(porting.pack), str(porting.new), sys.executable, str(tmp_path / "check.log")]
    assert port.run_tests(*run, repo=str(repo))["exit"] == 1
    tests = port.run_tests(*run, repo=str(repo), deselect=[port.COVERAGE_CHECK])
    assert tests["exit"] == 0 and tests["deselected"] == [port.COVERAGE_CHECK]
    assert tests["modules"]["test_gaudi_fix_manifests"]["passed"] == 1
    assert sum(c["passed"] + c["failed"] + c["skipped"] for c in tests["modules"].values()) == 1
