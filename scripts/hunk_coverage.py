#!/usr/bin/env python3
"""Hunk coverage of the pack's vllm_gaudi fixes: drop each hunk of each fix in turn, run that
fix's tests (fix.json "tests") against the checkout, and report every hunk whose removal no
test notices.

    scripts/hunk_coverage.py [--record] [--jobs N] [--fix NAME ...] VLLM_GAUDI_SRC

Run by `scripts/check-fixes.sh --hunk-coverage` (`make check-fixes COVERAGE=1`), with PYTHON
naming an interpreter that has vllm 0.30.0 (the tests must not skip: they fail instead).

A mutant is the pack with one hunk taken out of one fix. A later fix of the same file that
still applies is rewritten to apply exactly on top of the mutant (its line numbers move); a
later fix that no longer applies (its context is the dropped hunk's lines) leaves the
mutant too, and the report says so. A hunk "is noticed" when at least one of its fix's
tests fails on the mutant. A hunk a CPU test cannot see is listed in fix.json
"hunks_gaudi_only" ({"match": text of the hunk, "why": ..., "gaudi": what a Gaudi run must
show}); it is reported, not counted as missed. --record writes the figure into each fix.json
("hunk_coverage"), for FIXES.md; only against the files the fixes were written against.

Exit status: 0 every hunk noticed or declared Gaudi-only; 1 otherwise (or a baseline run
fails); 2 usage.
"""

import argparse
import concurrent.futures
import difflib
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))
import fix_tests  # noqa: E402  (tests/fix_tests.py: the one pytest command of the fix tests)

PACK = os.path.join(REPO, "patches")
PROFILE = "vllm-gaudi-0.30.0"


def load_applier():
    spec = importlib.util.spec_from_file_location("apply_all", os.path.join(PACK, "apply_all.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


aa = load_applier()


def gaudi_fixes():
    prof = aa.load_profile(PACK, PROFILE)
    fixes = []
    for name in prof["generic"] + prof["opt_in"]:
        if os.path.isfile(os.path.join(PACK, name, "fix.json")):
            fix = aa.load_fix(PACK, name, name in prof["opt_in"])
            if fix["package"] == "vllm_gaudi":
                fixes.append(fix)
    return prof, fixes


def hunk_label(path, index, hunk):
    return f"{path} #{index + 1} {hunk.header}"


def hunk_text(hunk):
    return "".join(text for tag, text in hunk.lines if tag != " ")


def unified(path, before, after):
    """A unified diff of one file (difflib, 3 lines of context), as the applier reads it."""
    assert before[-1:] and before[-1].endswith("\n") and after[-1].endswith("\n"), f"{path}: no final newline"
    return "".join(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}", n=3))


def mutant(src, prof, fixes, fix, path, index, dest):
    """Write into dest a pack in which `fix` lacks hunk `index` of `path`; return the names of
    the later fixes that no longer apply on top of it (left out of the mutant's profile)."""
    shutil.copytree(PACK, dest)
    texts, dropped, seen = {}, [], False

    def text(p):
        if p not in texts:
            texts[p] = aa.read_lines(os.path.join(src, p))
        return texts[p]

    for other in fixes:
        name = other["name"]
        if name == fix["name"]:
            seen = True
            diff = {
                p: [h for i, h in enumerate(hunks) if not (p == path and i == index)]
                for p, hunks in other["diff"].items()
            }
        else:
            diff = other["diff"]
        before = {p: text(p) for p in diff}
        try:
            after = {p: aa.apply_hunks(before[p], hunks)[0] if hunks else before[p] for p, hunks in diff.items()}
        except aa.HunkError:
            assert seen and name != fix["name"], f"{name} does not apply to {src}"
            dropped.append(name)
            continue
        texts.update(after)
        if seen:  # this fix and the later ones: exact diffs against the mutant's files
            with open(os.path.join(dest, name, "fix.diff"), "w", encoding="utf-8") as f:
                f.write("".join(unified(p, before[p], after[p]) for p in sorted(diff) if before[p] != after[p]))
    with open(os.path.join(dest, "profiles", PROFILE + ".json"), "w", encoding="utf-8") as f:
        json.dump(
            dict(
                prof,
                generic=[n for n in prof["generic"] if n not in dropped],
                opt_in=[n for n in prof["opt_in"] if n not in dropped],
            ),
            f,
            indent=2,
        )
    return dropped


def run_tests(python, src, pack, tests):
    env = dict(os.environ, **fix_tests.environment(src, pack))
    cmd = fix_tests.command(python, tests, ["-x", "--tb=no"])
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    failed = [
        line.split(" ", 1)[1].split(" - ")[0]
        for line in run.stdout.splitlines()
        if line.startswith(("FAILED ", "ERROR "))
    ]
    summary = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
    return run.returncode, failed, summary


def gaudi_only(fix):
    """fix.json "hunks_gaudi_only": [{"match", "why", "gaudi"}]: {match: entry}."""
    return {entry["match"]: entry for entry in fix.get("hunks_gaudi_only", [])}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", metavar="VLLM_GAUDI_SRC")
    parser.add_argument("--record", action="store_true", help="write the figures into each fix.json")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--fix", action="append", default=[], help="only this fix (repeatable)")
    args = parser.parse_args(argv)
    src = os.path.abspath(args.src)
    if not os.path.isdir(os.path.join(src, "vllm_gaudi")):
        print(f"hunk coverage: {src} is not a vllm-gaudi checkout (no vllm_gaudi/ in it)", file=sys.stderr)
        return 2
    python = os.environ.get("PYTHON", "python3")
    prof, fixes = gaudi_fixes()
    unknown = set(args.fix) - {f["name"] for f in fixes}
    if unknown:
        print(f"hunk coverage: unknown fix(es) {sorted(unknown)}", file=sys.stderr)
        return 2
    chosen = [f for f in fixes if not args.fix or f["name"] in args.fix]
    manifests = {
        f["name"]: json.load(open(os.path.join(PACK, f["name"], "fix.json"), encoding="utf-8")) for f in chosen
    }
    exact = all(
        hashlib.sha256(open(os.path.join(src, p), "rb").read()).hexdigest() == want
        for f in chosen
        for p, want in f["pre_sha256"].items()
    )
    if args.record and not exact:
        print("hunk coverage: --record needs the files the fixes were written against (pre_sha256)", file=sys.stderr)
        return 2
    bad = 0
    with (
        tempfile.TemporaryDirectory(prefix="hunk-coverage.") as tmp,
        concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool,
    ):
        jobs = {}
        for fix in chosen:
            tests = manifests[fix["name"]].get("tests")
            if not tests:
                print(f"{fix['name']}: fix.json names no tests", file=sys.stderr)
                bad += 1
                continue
            jobs[(fix["name"], None)] = pool.submit(run_tests, python, src, PACK, tests)
            for path, hunks in fix["diff"].items():
                for index, _ in enumerate(hunks):
                    dest = os.path.join(tmp, f"{fix['name']}-{len(jobs)}")
                    dropped = mutant(src, prof, fixes, fix, path, index, dest)
                    jobs[(fix["name"], (path, index))] = (dropped, pool.submit(run_tests, python, src, dest, tests))
        for fix in chosen:
            name = fix["name"]
            if (name, None) not in jobs:
                continue
            rc, failed, summary = jobs[(name, None)].result()
            declared = gaudi_only(manifests[name])
            print(f"{name}: tests {' '.join(manifests[name]['tests'])}")
            if rc != 0:
                print(f"  BASELINE FAILS ({summary}): {', '.join(failed)}")
                bad += 1
                continue
            noticed = total = 0
            used = set()
            for path, hunks in fix["diff"].items():
                for index, hunk in enumerate(hunks):
                    total += 1
                    dropped, future = jobs[(name, (path, index))]
                    rc, failed, summary = future.result()
                    also = f" (without it {', '.join(dropped)} no longer applies and is left out)" if dropped else ""
                    marks = [m for m in declared if m in hunk_text(hunk)]
                    used.update(marks)
                    label = hunk_label(path, index, hunk)
                    if rc != 0:
                        noticed += 1
                        print(f"  noticed      {label}{also}: {', '.join(failed) or summary}")
                        if marks:
                            print("      declared Gaudi-only in fix.json, but a CPU test notices it: remove the entry")
                            bad += 1
                    elif marks:
                        print(f"  Gaudi-only   {label}{also}: {declared[marks[0]]['why']}")
                    else:
                        print(f"  NOT NOTICED  {label}{also}: no test fails without it")
                        bad += 1
            for mark in set(declared) - used:
                print(f"  fix.json hunks_gaudi_only entry matches no hunk: {mark!r}")
                bad += 1
            gaudi = len(used)
            figure = f"{noticed}/{total} hunks noticed by a CPU test" + (f", {gaudi} Gaudi-only" if gaudi else "")
            print(f"  {figure}")
            if args.record:
                path = os.path.join(PACK, name, "fix.json")
                manifests[name]["hunk_coverage"] = (
                    f"{figure} (scripts/check-fixes.sh --hunk-coverage: each hunk dropped in turn, the fix's tests "
                    f"run against the files it was written against)"
                )
                with open(path, "w", encoding="utf-8") as f:
                    f.write(json.dumps(manifests[name], indent=2, ensure_ascii=False) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
