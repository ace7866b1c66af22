#!/usr/bin/env python3
"""Port the pack's vllm_gaudi fixes to another vllm-gaudi tree.

    scripts/port-fixes.py VLLM_GAUDI_SRC [--out DIR | --in-place] [--base DIR] [--no-tests]

Every fix is rebased with a three-way merge by `git merge-file`, in pack order:
  base   the file the fix's diff was made against: the upstream file its pre_sha256
         names, with the fixes before it in pack order applied (the pack is stacked);
  ours   base with the fix;
  theirs the new tree's file with the fixes before it already ported.
The upstream files are found by their sha256, in this order: --base DIRs, the new tree
itself, the new tree's git history at the commit named in `written_against`, and the
archives in --archives (default ../shared/upstream beside the repository).

The new pack (diffs, fix.json with the new tree's pre_sha256) goes to a new directory
(default .build/ported/LABEL), with port.json, the per-file record; then
scripts/check-fixes.sh runs the fixes' tests against the new tree with the new pack
(PYTHON as for check-fixes). Each fix is reported as exact (its diff applies unchanged
at its stated lines), rebased cleanly (the merge gave a new diff; its lines only moved),
conflict (with the conflicting lines: git merge-file found overlapping changes, or upstream
changed lines of the fix's context, which --accept-merge takes as merged), or blocked (a fix
before it that edits one of its files is not ported: its diff is stacked on that fix's).
The fixes that port are written (and checked to apply exactly) even when others conflict.
A ported fix.json keeps tests, gaudi_checks and hunks_gaudi_only; its hunk_coverage figure
was measured on the old files, so it is replaced by a note that it must be re-recorded
(scripts/hunk_coverage.py --record), and the test run leaves out the one check of that figure.
Standard library, git and the pack's own apply_all.py only; vLLM is never imported.
Exit status: 0 every fix ported and its tests pass, 1 a conflict or a failing test,
2 bad input (nothing written).
"""

import argparse
import difflib
import glob
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACK = os.path.join(REPO, "patches")
ARCHIVES = os.path.join(os.path.dirname(REPO), "shared", "upstream")
STALE_COVERAGE = "; before the port: "  # joins a ported fix's hunk_coverage note to the figure it replaces
RECORD_COVERAGE = (
    "record it with PYTHON=<python with vLLM 0.30.0> scripts/hunk_coverage.py --record {tree} "
    "once this pack is patches/"
)
# The check of test_gaudi_fix_manifests.py that a fix.json's hunk_coverage figure counts its
# hunks: not run by the port's test run while the port itself marks the figures stale.
COVERAGE_CHECK = "tests/unit/test_gaudi_fix_manifests.py::test_manifest_coverage_counts_the_current_hunks"
STATES = {"exact": "exact", "rebased": "rebased cleanly", "conflict": "CONFLICT", "blocked": "BLOCKED"}
# What check-fixes needs from the repository, copied beside the new pack (it runs on REPO/patches).
CHECK_TREE = ["scripts/check-fixes.sh", "tests", "testkit", "gemma4_images", "pytest.ini"]  # tests import testkit


def load_applier(pack):
    spec = importlib.util.spec_from_file_location("_port_apply_all", os.path.join(pack, "apply_all.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


aa = load_applier(PACK)  # its diff parser and exact applier; one home for the diff rules


class BadInput(aa.Failure):
    code = 2


def sha256(data):
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------- the upstream files
def directory_reader(root):
    def read(path, want):
        full = os.path.join(root, path)
        if os.path.isfile(full):
            with open(full, "rb") as f:
                return f.read()

    return read


def git_reader(tree, commits):
    """`git show COMMIT:path` for each commit written_against names, if tree is in a git repository."""
    if (
        not commits
        or subprocess.run(["git", "-C", tree, "rev-parse", "--git-dir"], capture_output=True).returncode != 0
    ):
        return None

    def read(path, want):
        for commit in commits:
            out = subprocess.run(["git", "-C", tree, "show", f"{commit}:./{path}"], capture_output=True)
            if out.returncode == 0 and sha256(out.stdout) == want:
                return out.stdout

    return read


def archive_reader(archive, paths):
    """The members of a .tar.gz snapshot that end with one of paths (read in one pass)."""
    found = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            hit = [p for p in paths if member.isfile() and member.name.endswith("/" + p)]
            if hit:
                found.setdefault(hit[0], []).append(tar.extractfile(member).read())
    return lambda path, want: next((d for d in found.get(path, []) if sha256(d) == want), None)


def find_originals(wanted, bases, archives, tree=None, commits=()):
    """{path: (bytes, where)} for {path: sha256}: the upstream file each fix's pre_sha256 names."""
    readers = [(f"--base {b}", directory_reader(b)) for b in bases]
    readers += [("the new tree", directory_reader(tree))] if tree else []
    git = git_reader(tree, commits) if tree else None
    if git:
        readers.append((f"git history of the new tree ({', '.join(commits)})", git))
    found_archives = sorted(glob.glob(os.path.join(archives, "*.tar.gz"))) if archives else []
    for archive in found_archives:
        readers.append((os.path.basename(archive), archive_reader(archive, list(wanted))))
    if archives and not found_archives:
        readers.append((f"no *.tar.gz in {archives}", lambda path, want: None))
    found, missing = {}, []
    for path, want in sorted(wanted.items()):
        for where, read in readers:
            data = read(path, want)
            if data is not None and sha256(data) == want:
                found[path] = (data, where)
                break
        else:
            missing.append(f"{path} (sha256 {want})")
    if missing:
        raise BadInput(
            f"no copy of the upstream file(s) the pack was written against: {'; '.join(missing)}; "
            f"looked in: {', '.join(w for w, _ in readers)}; pass --base DIR (a vllm-gaudi tree of "
            f"{', '.join(commits) or 'that commit'}) or --archives DIR"
        )
    return found


def upstream_files(pack=PACK, profile="vllm-gaudi-0.30.0", archives=ARCHIVES):
    """{path: bytes}: the upstream files the pack's vllm_gaudi fixes were written against,
    found in the snapshot archives by their pre_sha256 (for a stand-in vllm-gaudi made of them)."""
    _, _, wanted = load_pack(pack, profile)
    return {path: data for path, (data, _) in find_originals(wanted, [], archives).items()}


# ---------------------------------------------------------------- rebasing
def stack(fixes, upstream):
    """{(fix, path): (before, after)}: each fix's pre- and post-image, applying the pack in
    order to the upstream files; every hunk must land at its stated line."""
    current, images = dict(upstream), {}
    for fix in fixes:
        for path, hunks in fix["diff"].items():
            try:
                after, notes = aa.apply_hunks(current[path], hunks)
            except aa.HunkError as err:
                notes = [str(err)]
            if notes:
                raise BadInput(
                    f"fix {fix['name']}: {path}: {notes[0]}: its diff is not made on top of the "
                    "fixes before it in pack order, on the file its pre_sha256 names"
                )
            images[fix["name"], path] = (current[path], after)
            current[path] = after
    return images


def merge3(theirs, base, ours, labels):
    """git merge-file --diff3 on line lists: (merged lines, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="port-fixes.") as tmp:
        names = []
        for name, lines in zip(("theirs", "base", "ours"), (theirs, base, ours)):
            names.append(os.path.join(tmp, name))
            with open(names[-1], "wb") as f:
                f.write(aa.encode(lines))
        cmd = ["git", "merge-file", "-p", "--diff3"]
        for label in labels:
            cmd += ["-L", label]
        out = subprocess.run(cmd + names, capture_output=True)
    if not 0 <= out.returncode <= 127:  # negative (255) is an error, else the number of conflicts
        raise aa.Failure(f"git merge-file failed: {out.stderr.decode(errors='replace').strip()}")
    return aa.split_lines(out.stdout.decode("utf-8", "surrogateescape")), out.returncode


def conflicts_in(merged, labels):
    """Conflict blocks of a --diff3 merge: [{line (in the new tree's file), upstream, base, fix}]."""
    marks = [f"<<<<<<< {labels[0]}", f"||||||| {labels[1]}", "=======", f">>>>>>> {labels[2]}"]
    blocks, block, part, line = [], None, None, 0
    for text in merged:
        bare = text.rstrip("\n")
        if block is None and bare == marks[0]:
            block, part = {"line": line + 1, "upstream": [], "base": [], "fix": []}, "upstream"
        elif block is not None and bare in marks[1:3]:
            part = "base" if bare == marks[1] else "fix"
        elif block is not None and bare == marks[3]:
            blocks.append(block)
            block = None
        elif block is not None:
            block[part].append(text)
            line += part == "upstream"
        else:
            line += 1
    return blocks


def unified(path, before, after):
    """A diff -u of two line lists, with the no-newline marker."""
    out = []
    for line in difflib.unified_diff(before, after, "a/" + path, "b/" + path, n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def context_changes(pre, hunks):
    """The hunks whose lines (context included) are nowhere in pre as they are: upstream
    changed lines around the fix. For each, where its lines best fit now and what differs."""
    changes = []
    for hunk in hunks:
        old = hunk.side(False)
        if any(pre[i : i + len(old)] == old for i in range(len(pre) - len(old) + 1)):
            continue  # found as it is, at its line or moved
        start = (aa.best_match(pre, old, hunk.old_start - 1) or (hunk.old_start - 1,))[0]
        diff = list(difflib.ndiff(old, pre[max(start, 0) : start + len(old)]))
        changes.append(
            {
                "hunk": hunk.header,
                "line": start + 1,
                "base": [d[2:] for d in diff if d.startswith("- ")],
                "upstream": [d[2:] for d in diff if d.startswith("+ ")],
            }
        )
    return changes


def rebase(fixes, images, new_tree, label, accept_merge=False):
    """Port every fix in pack order onto new_tree ({path: lines}, the new tree's files).

    A file conflicts when git merge-file finds overlapping changes, or when it merges cleanly
    but upstream changed lines inside the fix's diff (its context): the applier would refuse
    that diff and the fix was written reading those lines, so a person looks (accept_merge:
    take git's merge). A fix that is not ported leaves all its files as they were for the
    fixes after it, and blocks every later fix on any of them: their diffs are stacked on it."""
    current, blocked, results = dict(new_tree), {}, []
    for fix in fixes:
        name, files, ported = fix["name"], {}, {}
        for path, hunks in fix["diff"].items():
            before, after = images[name, path]
            pre = current[path]
            if path in blocked:
                files[path] = {"state": "blocked", "by": blocked[path][0], "reason": blocked[path][1], "pre": pre}
                continue
            labels = (f"vllm-gaudi {label}", f"{name} was made against", name)
            merged, count = merge3(pre, before, after, labels)
            entry = files[path] = {"pre": pre, "post": merged}
            changed = [] if count else context_changes(pre, hunks)
            if count or (changed and not accept_merge):
                entry.update(
                    state="conflict",
                    kind="overlap" if count else "context",
                    conflicts=conflicts_in(merged, labels) if count else changed,
                )
                continue
            try:
                as_is, notes = aa.apply_hunks(pre, hunks)
            except aa.HunkError:
                as_is, notes = None, ["does not apply as it is"]
            entry["state"] = "exact" if not notes and as_is == merged else "rebased"
            entry["moved"] = (
                moved(hunks, aa.parse_diff(unified(path, pre, merged), path)[path]) if merged != pre else "no change"
            )
            entry["accepted"] = changed  # context changes taken with accept_merge
            ported[path] = merged
        states = {f["state"] for f in files.values()}
        state = next(s for s in ("conflict", "blocked", "rebased", "exact") if s in states)
        if state in ("exact", "rebased"):
            current.update(ported)
        else:  # the later fixes on any of its files are stacked on it
            for path, f in files.items():
                if path not in blocked:
                    blocked[path] = (
                        name,
                        f"{name} conflicts in this file"
                        if f["state"] == "conflict"
                        else f"{name}, before it in pack order, edits this file and is not ported "
                        f"(it {'conflicts' if state == 'conflict' else 'is blocked'})",
                    )
        results.append({"fix": fix, "state": state, "files": files})
    return results


def moved(old, new):
    """How far each hunk moved (its start line), or how the merge regrouped them."""
    if len(old) != len(new):  # diff -u joins hunks whose context overlaps, splits others
        return f"{len(old)} hunks became {len(new)} (upstream changed the lines between them)"
    return "hunks moved " + ", ".join(f"{n.old_start - o.old_start:+d}" for o, n in zip(old, new)) + " lines"


# ---------------------------------------------------------------- writing the new pack
def keeps_manifest(result, upstream_sha):
    """A fix exact on the very files it was written against keeps its fix.json as it is."""
    fix = result["fix"]
    return result["state"] == "exact" and {p: upstream_sha[p] for p in fix["files"]} == fix["pre_sha256"]


def stale_coverage(results, upstream_sha):
    """The ported fixes whose fix.json records a hunk coverage that the port makes stale."""
    return [
        r["fix"]["name"]
        for r in results
        if r["state"] in ("exact", "rebased")
        and "hunk_coverage" in r["fix"]["json"]
        and not keeps_manifest(r, upstream_sha)
    ]


def ported_manifest(result, label, upstream_sha, on_top, tested):
    """fix.json for a ported fix: the same keys (tests, gaudi_checks, hunks_gaudi_only as they
    are), the new tree's sha256, where it came from, and hunk_coverage marked as not re-recorded
    (None: the fix is exact on the very files it was written against, so its fix.json stays)."""
    fix, meta, files = result["fix"], dict(result["fix"]["json"]), result["files"]
    if keeps_manifest(result, upstream_sha):
        return None
    new_sha = {p: upstream_sha[p] for p in fix["files"]}
    meta["written_against"] = (
        f"vllm-gaudi {label}: ported by scripts/port-fixes.py ({STATES[result['state']]}, git merge-file) "
        f"from the diff made against {aa.short_source(fix)}"
        + (f" (on top of {', '.join(on_top)}, which precede it in pack order)" if on_top else "")
    )
    meta["verified"] = (
        f"Ported to vllm-gaudi {label} by scripts/port-fixes.py; scripts/check-fixes.sh there "
        f"with the ported pack: {tested}. Before the port, against {aa.short_source(fix)}: " + fix["verified"]
    )
    meta["pre_sha256"] = new_sha
    if "hunk_coverage" in meta:  # measured on the files the fix was written against, hunk by hunk
        figure = meta["hunk_coverage"].partition(STALE_COVERAGE)[2] or meta["hunk_coverage"]
        meta["hunk_coverage"] = (
            f"not re-recorded since the port to vllm-gaudi {label}: a port changes the files the hunks are tested "
            f"on and can regroup the hunks; {RECORD_COVERAGE.format(tree=f'<vllm-gaudi {label}>')}{STALE_COVERAGE}"
            f"{figure}"
        )
    if "post_sha256" in meta:  # a pack whose fix.json records it: the file after this fix, in pack order
        meta["post_sha256"] = {p: sha256(aa.encode(files[p]["post"])) for p in fix["files"]}
    return meta


def write_fixes(out, results, label, upstream_sha, tests=None):
    """The ported fixes' fix.diff and fix.json in out (a copy of the pack). A conflicting or
    blocked fix gets no fix.json/fix.diff, so the applier refuses the pack, and a conflicting
    one gets conflict/PATH (git's merge) and conflict/PATH.before (the file it merged into)."""
    for result in results:
        fix, folder = result["fix"], os.path.join(out, result["fix"]["name"])
        on_top = [r["fix"]["name"] for r in results[: results.index(result)] if set(r["files"]) & set(fix["files"])]
        if result["state"] in ("conflict", "blocked"):
            for name in ("fix.json", "fix.diff"):
                if os.path.exists(os.path.join(folder, name)):
                    os.unlink(os.path.join(folder, name))
            for path, entry in result["files"].items():
                if entry["state"] == "conflict":
                    for suffix, lines in (("", entry["post"]), (".before", entry["pre"])):
                        target = os.path.join(folder, "conflict", path + suffix)
                        os.makedirs(os.path.dirname(target), exist_ok=True)
                        with open(target, "wb") as f:
                            f.write(aa.encode(lines))
            continue
        if result["state"] != "exact":
            text = "".join(unified(p, result["files"][p]["pre"], result["files"][p]["post"]) for p in fix["diff"])
            with open(os.path.join(folder, "fix.diff"), "wb") as f:
                f.write(text.encode("utf-8", "surrogateescape"))
        tested = tests_of(fix["name"], tests) if tests else "not run"
        meta = ported_manifest(result, label, upstream_sha, on_top, tested)
        if meta is None:
            continue
        with open(os.path.join(folder, "fix.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")


def record(results, label, upstream_sha, tests):
    """port.json: per fix and file, the state and the sha256 before and after it, in pack order."""
    fixes = []
    for r in results:
        files = {}
        for path, f in r["files"].items():
            entry = files[path] = {
                "state": f["state"],
                "pre_sha256": upstream_sha[path],
                "before_sha256": sha256(aa.encode(f["pre"])),
            }
            if f["state"] in ("exact", "rebased"):
                entry["post_sha256"] = sha256(aa.encode(f["post"]))
            for key in ("by", "kind", "conflicts", "accepted"):
                if f.get(key):
                    entry[key] = f[key]
        fixes.append({"name": r["fix"]["name"], "state": r["state"], "files": files})
    return {"label": label, "fixes": fixes, "tests": tests}


def verify(out, fixes, tree):
    """The new pack, read back by the applier, applies to the new tree at its stated lines."""
    ported = [aa.load_fix(out, f["name"], f["opt_in"]) for f in fixes]
    _, report, _ = aa.plan(ported, tree)
    bad = [
        f"{e['fix']['name']}: {line}"
        for e in report
        if e["state"] != "apply" or e["notes"]
        for line in e["errors"] + e["notes"]
    ]
    if bad:
        raise aa.Failure(
            "the ported pack does not apply exactly to the new tree (a bug of port-fixes): " + "; ".join(bad)
        )


# ---------------------------------------------------------------- the fixes' tests
def run_tests(out, tree, python, log, repo=REPO, deselect=()):
    """scripts/check-fixes.sh against the new tree with the new pack. check-fixes reads the pack
    beside itself, so it runs from a scratch copy of what it needs with the new pack as patches/;
    pytest's junit report (PYTEST_ADDOPTS, with --deselect for each of deselect) gives the
    results per test module."""
    scratch = tempfile.mkdtemp(prefix="port-fixes-check.")
    try:
        for part in CHECK_TREE:
            src, dst = os.path.join(repo, part), os.path.join(scratch, part)
            if not os.path.exists(src):
                continue
            if os.path.isdir(src):
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache"))
            else:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(src, dst)
        shutil.copytree(out, os.path.join(scratch, "patches"))
        junit = os.path.join(scratch, "junit.xml")
        addopts = [os.environ.get("PYTEST_ADDOPTS", ""), f"--junitxml={junit}"] + [f"--deselect={d}" for d in deselect]
        env = dict(os.environ, PYTHON=python, PYTEST_ADDOPTS=" ".join(addopts).strip())
        started = time.monotonic()
        with open(log, "w", encoding="utf-8") as f:
            proc = subprocess.run(
                [os.path.join(scratch, "scripts", "check-fixes.sh"), tree], env=env, stdout=f, stderr=subprocess.STDOUT
            )
        tests = {
            "command": "scripts/check-fixes.sh",
            "python": python,
            "exit": proc.returncode,
            "seconds": round(time.monotonic() - started),
            "modules": junit_modules(junit),
            "deselected": list(deselect),
        }
        for module, counts in tests["modules"].items():
            counts["fixes"] = fixes_named(os.path.join(repo, "tests", "unit", module + ".py"), out)
        return tests
    finally:
        shutil.rmtree(scratch)


def junit_modules(path):
    """{test module: {passed, failed, skipped, reasons}} from pytest's junit XML (absent: {})."""
    import xml.etree.ElementTree as ET

    if not os.path.exists(path):
        return {}
    modules = {}
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").split(".")[-1] or "?"
        counts = modules.setdefault(module, {"passed": 0, "failed": 0, "skipped": 0, "reasons": []})
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            reason = (bad.get("message") or "").splitlines()[0][:200] if bad.get("message") else "?"
            if reason not in counts["reasons"] and len(counts["reasons"]) < 3:
                counts["reasons"].append(reason)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return modules


def fixes_named(module_path, pack):
    """The fixes of pack a test module names (its tests apply them by name)."""
    if not os.path.isfile(module_path):
        return []
    with open(module_path, encoding="utf-8") as f:
        text = f.read()
    return sorted(
        {m for m in re.findall(r'"([a-z0-9]+(?:-[a-z0-9]+)+)"', text) if os.path.isdir(os.path.join(pack, m))}
    )


def counts_text(c):
    return ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "skipped") if c[k]) or "no tests"


def tests_of(name, tests):
    """What the test run says about one fix: the modules that name it."""
    mine = {m: c for m, c in tests["modules"].items() if name in c["fixes"]}
    if not mine:
        return f"no test module names it (check-fixes exit {tests['exit']})"
    return "; ".join(f"{m}.py {counts_text(c)}" for m, c in sorted(mine.items()))


# ---------------------------------------------------------------- report
def print_report(results):
    for r in results:
        print(f"  {STATES[r['state']]:<16} {r['fix']['name']}")
        for path, f in r["files"].items():
            if f["state"] == "rebased":
                print(f"      {path}: {f['moved']}")
            elif f["state"] == "blocked":
                print(f"      {path}: not ported: {f['reason']}; resolve that first")
            for c in f.get("accepted", []):
                print(
                    f"      {path}: hunk {c['hunk']}: upstream changed its context; git's merge taken (--accept-merge)"
                )
            for c in f.get("conflicts", []):
                if f["kind"] == "overlap":
                    print(f"      {path}: git merge-file conflict at line {c['line']} of the new tree's file:")
                    parts = (
                        ("upstream", "upstream now"),
                        ("base", "the fix was made against"),
                        ("fix", "the fix wants"),
                    )
                else:
                    print(
                        f"      {path}: hunk {c['hunk']}: upstream changed lines of its context, now near line "
                        f"{c['line']} (git merges it cleanly; review, then --accept-merge takes that merge):"
                    )
                    parts = (("base", "the fix was made against"), ("upstream", "upstream now"))
                for part, title in parts:
                    print(f"        {title}:")
                    for text in c[part][:12] or ["(nothing)\n"]:
                        print(f"          | {text.rstrip(chr(10))}")
                    if len(c[part]) > 12:
                        print(f"          | ... {len(c[part]) - 12} more line(s)")


def print_tests(tests, log):
    if not tests.get("modules"):
        print(f"tests: check-fixes exit {tests['exit']} before any test ran; see {log}")
        return
    verdict = "passed" if tests["exit"] == 0 else f"FAILED (exit {tests['exit']})"
    print(
        f"tests: scripts/check-fixes.sh on the new tree with the ported pack, {tests['python']}: "
        f"{verdict} in {tests['seconds']} s; log {log}"
    )
    for module, c in sorted(tests["modules"].items()):
        print(f"  {module + '.py':<36} {counts_text(c):<32} ({', '.join(c['fixes'])})")
        for reason in c["reasons"]:
            print(f"      {reason}")
    for node in tests.get("deselected", []):
        print(f"  not run: {node} (the port marks the hunk coverage figures stale)")


def default_label(tree):
    """The new tree's git commit, else its directory name (a snapshot's parent, e.g.
    vllm-gaudi-releases-v0.26.0-b059f9c9/vllm-gaudi gives releases-v0.26.0-b059f9c9)."""
    out = subprocess.run(
        ["git", "-C", tree, "describe", "--always", "--tags", "--dirty"], capture_output=True, text=True
    )
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip()
    name = os.path.basename(tree)
    name = os.path.basename(os.path.dirname(tree)) if name == "vllm-gaudi" else name
    return name[len("vllm-gaudi-") :] if name.startswith("vllm-gaudi-") else name


# ---------------------------------------------------------------- the command
def load_pack(pack, profile):
    """The profile's vllm_gaudi fixes in pack order, each with its fix.json as written."""
    prof = aa.load_profile(pack, profile)
    fixes = []
    for name in prof["generic"] + prof["opt_in"]:
        fix = aa.load_fix(pack, name, name in prof["opt_in"])
        with open(os.path.join(pack, name, "fix.json"), encoding="utf-8") as f:
            fix["json"] = json.load(f)
        if fix["package"] == "vllm_gaudi":
            fixes.append(fix)
    if not fixes:
        raise BadInput(f"profile {profile} of {pack} has no vllm_gaudi fix")
    wanted = {}
    for fix in fixes:
        for path, want in fix["pre_sha256"].items():
            if wanted.setdefault(path, want) != want:
                raise BadInput(
                    f"fix {fix['name']}: pre_sha256 of {path} is {want}, but an earlier fix names "
                    f"{wanted[path]}: the pack's fixes must agree on the upstream file"
                )
    return prof, fixes, wanted


def port(args):
    tree = os.path.abspath(args.vllm_gaudi_src)
    if not os.path.isdir(os.path.join(tree, "vllm_gaudi")):
        raise BadInput(f"{args.vllm_gaudi_src} is not a vllm-gaudi tree (no vllm_gaudi/ in it)")
    label = args.label or default_label(tree)
    out = os.path.abspath(args.out or os.path.join(REPO, ".build", "ported", re.sub(r"[^\w.+-]", "_", label)))
    if os.path.exists(out):
        raise BadInput(f"{out} already exists: remove it, or choose another --out")
    prof, fixes, wanted = load_pack(args.pack, args.profile)
    missing = [p for p in sorted(wanted) if not os.path.isfile(os.path.join(tree, p))]
    if missing:
        raise BadInput(f"{tree} has no {', '.join(missing)}, which the fixes edit: port them by hand")
    commits = sorted({c for fix in fixes for c in re.findall(r"\b[0-9a-f]{7,40}\b", aa.short_source(fix))})
    upstream = find_originals(wanted, args.base, args.archives, tree, commits)
    print(f"port-fixes: {len(fixes)} vllm_gaudi fixes of profile {prof['name']} ({args.pack}) -> {tree} ({label})")
    for path, (data, where) in upstream.items():
        print(f"  upstream {path} (sha256 {sha256(data)[:12]}): from {where}")
    images = stack(fixes, {p: aa.split_lines(d.decode("utf-8", "surrogateescape")) for p, (d, _) in upstream.items()})
    new_tree = {p: aa.read_lines(os.path.join(tree, p)) for p in wanted}
    upstream_sha = {p: sha256(aa.encode(lines)) for p, lines in new_tree.items()}
    results = rebase(fixes, images, new_tree, label, args.accept_merge)
    clean = all(r["state"] in ("exact", "rebased") for r in results)
    print_report(results)

    os.makedirs(os.path.dirname(out), exist_ok=True)
    stage = tempfile.mkdtemp(prefix=".port-fixes.", dir=os.path.dirname(out))
    try:  # everything is made in stage, then renamed to out: an interrupted run leaves no out
        staged = os.path.join(stage, "pack")
        shutil.copytree(args.pack, staged, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        write_fixes(staged, results, label, upstream_sha)
        tests = None
        ported = [r["fix"] for r in results if r["state"] in ("exact", "rebased")]
        if ported:
            verify(staged, ported, tree)
            print(
                f"written: {', '.join(f['name'] for f in ported)} ({len(ported)} of {len(fixes)} fixes); checked: "
                f"{'it applies' if len(ported) == 1 else 'they apply'} exactly to the new tree at the stated lines"
            )
        stale = stale_coverage(results, upstream_sha)
        if clean and not args.no_tests:
            tests = run_tests(
                staged,
                tree,
                args.python,
                os.path.join(staged, "check-fixes.log"),
                deselect=[COVERAGE_CHECK] if stale else [],
            )
            write_fixes(staged, results, label, upstream_sha, tests)  # verified names the test run
            print_tests(tests, os.path.join(out, "check-fixes.log"))
        else:
            print("tests: not run (" + ("--no-tests" if clean else "resolve the conflicts first") + ")")
        if stale:
            print(
                f"hunk coverage: not re-recorded for {', '.join(stale)} (their fix.json says so): "
                + RECORD_COVERAGE.format(tree=tree)
            )
        with open(os.path.join(staged, "port.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(record(results, label, upstream_sha, tests), indent=2, sort_keys=True) + "\n")
        os.replace(staged, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    code = 0 if clean and (tests is None or tests["exit"] == 0) else 1
    print(
        f"wrote {out}"
        + (
            ""
            if clean
            else " (incomplete: a conflicting fix has conflict/ in place of "
            "fix.diff and fix.json; the applier refuses this pack)"
        )
    )
    if args.in_place and code == 0:
        for r in results:
            for name in ("fix.diff", "fix.json"):
                shutil.copy2(os.path.join(out, r["fix"]["name"], name), os.path.join(args.pack, r["fix"]["name"], name))
        print(f"and copied the ported fixes into {args.pack} (--in-place)")
    elif args.in_place:
        print(f"{args.pack} left as it was: --in-place needs every fix ported and its tests passing")
    return code


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("vllm_gaudi_src", metavar="VLLM_GAUDI_SRC", help="the vllm-gaudi tree to port to")
    parser.add_argument("--out", help="new pack directory (must not exist; default .build/ported/LABEL)")
    parser.add_argument(
        "--in-place",
        action="store_true",
        help="also copy the ported fix files into --pack, if every fix ports and its tests pass",
    )
    parser.add_argument("--pack", default=PACK, help="the pack to port (default: patches/)")
    parser.add_argument("--profile", default="vllm-gaudi-0.30.0", help="its profile (default vllm-gaudi-0.30.0)")
    parser.add_argument(
        "--base",
        action="append",
        default=[],
        metavar="DIR",
        help="a vllm-gaudi tree holding the files the pack was written against",
    )
    parser.add_argument("--archives", default=ARCHIVES, help=f"snapshot .tar.gz directory (default {ARCHIVES})")
    parser.add_argument("--label", help="names the new tree in written_against (default: git describe or dir name)")
    parser.add_argument(
        "--accept-merge",
        action="store_true",
        help="take git's clean merge where upstream changed a fix's context lines",
    )
    parser.add_argument("--no-tests", action="store_true", help="do not run check-fixes on the result")
    parser.add_argument(
        "--python",
        default=os.environ.get("PYTHON") or "python3",
        help="python for the tests (default $PYTHON or python3)",
    )
    args = parser.parse_args(argv)
    args.pack = os.path.abspath(args.pack)
    try:
        return port(args)
    except aa.Failure as err:
        print(f"port-fixes: error: {err}", file=sys.stderr)
        return err.code


if __name__ == "__main__":
    sys.exit(main())
