#!/usr/bin/env python3
"""Port the pack's vLLM-level fixes to another build of vLLM's files (a wheel), as a port.

    scripts/port-vllm-fixes.py WHEEL --to PROFILE [--from vllm-0.30.0] [--label TEXT] [--accept-merge] [--write]

For a distribution whose files differ from the ones the fixes were written against (vllm-tpu
0.30.0 is a main-branch snapshot labelled 0.30.0, with no commit id). Each vllm fix of the
--from profile is rebased onto WHEEL's files in pack order by the same three-way merge as
scripts/port-fixes.py (git merge-file: base the PyPI vLLM file the fix was made against, with
the fixes before it; ours that file with the fix; theirs WHEEL's file with the earlier ports).
Reported per fix: `same file` (WHEEL's files are the ones fix.diff was written against: no port
needed), `exact`/`rebased cleanly` (a port), `CONFLICT` (exit 1, nothing written). For each
file, whether WHEEL's copy runs the same code as the upstream one (gemma4_images.spec.pycode: syntax
trees without docstrings): when it does, the fix's behaviour tests on vLLM speak for the port.

--write records each port in the pack: patches/<fix>/ports/<PROFILE>.diff and
fix.json "ports": {PROFILE: {written_against, verified, pre_sha256}}. The profile file itself
(patches/profiles/<PROFILE>.json, with the distribution it requires) is written by hand.
Exit status: 0 ported, 1 a conflict, 2 bad input.
"""

import argparse
import hashlib
import json
import os
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from gemma4_images.build import wheels  # noqa: E402
from gemma4_images.spec import pycode  # noqa: E402
from gemma4_images.spec.matrix import version_key  # noqa: E402
from gemma4_images.spec.modules import load_file  # noqa: E402

PACK = os.path.join(REPO, "patches")
pf = load_file("port_fixes", os.path.join(REPO, "scripts", "port-fixes.py"))
aa = pf.aa


def vllm_fixes(profile):
    prof = aa.load_profile(PACK, profile)
    return [
        aa.load_fix(PACK, name, name in prof["opt_in"])
        for name in prof["generic"] + prof["opt_in"]
        if aa.load_fix(PACK, name, name in prof["opt_in"])["package"] == "vllm"
    ]


def wheel_files(path, paths):
    with zipfile.ZipFile(path) as whl:
        names = set(whl.namelist())
        missing = sorted(p for p in paths if p not in names)
        if missing:
            raise pf.BadInput(f"{path} has no {', '.join(missing)}")
        return {p: whl.read(p) for p in paths}


def rebase_onto(source, vllm, theirs, label, accept_merge=False):
    """Every vllm fix of profile source rebased onto theirs ({path: bytes}, another build's files),
    in pack order: (results of port-fixes' rebase, the PyPI vllm files they were made against,
    the fixes' stacked images, the sha256 of theirs)."""
    fixes = vllm_fixes(source)
    paths = sorted({p for f in fixes for p in f["files"]})
    upstream = wheel_files(wheels.wheel(f"vllm=={vllm}"), paths)
    for fix in fixes:
        for path, want in fix["pre_sha256"].items():
            if hashlib.sha256(upstream[path]).hexdigest() != want:
                raise pf.BadInput(f"fix {fix['name']}: vllm {vllm}'s {path} is not the file it names")
    images = pf.stack(fixes, {p: aa.split_lines(upstream[p].decode()) for p in paths})
    new_tree = {p: aa.split_lines(theirs[p].decode()) for p in paths}
    results = pf.rebase(fixes, images, new_tree, label, accept_merge=accept_merge)
    sha = {p: hashlib.sha256(theirs[p]).hexdigest() for p in paths}
    return results, upstream, images, sha


def same_file(result, sha) -> bool:
    """theirs holds the very files the fix's diff was written against: it needs no port."""
    return all(sha[p] == result["fix"]["pre_sha256"][p] for p in result["fix"]["files"])


def report(result, vllm, upstream, theirs, images, log=print):
    """What the port of one fix found, file by file (upstream code changes and conflicting lines)."""
    name = result["fix"]["name"]
    for path, entry in result["files"].items():
        same = pycode.same_code(upstream[path], theirs[path])
        log(f"      {path}: {'same code as' if same else 'CODE DIFFERS from'} vllm {vllm}'s (docstrings aside)")
        if "post" in entry and entry["state"] != "conflict":
            fixed = aa.encode(images[name, path][1])
            agree = pycode.same_code(fixed, aa.encode(entry["post"]))
            log(f"      {'':{len(path)}}  ported: {'same code as' if agree else 'CODE DIFFERS from'} the fixed file")
        for change in entry.get("conflicts", []) + entry.get("accepted", []):
            log(f"      line {change['line']}: upstream now {''.join(change['upstream']).strip()!r}")
            log(f"      {'':>{len(str(change['line'])) + 5}} the fix read {''.join(change['base']).strip()!r}")


def port(args):
    paths = sorted({p for f in vllm_fixes(args.source) for p in f["files"]})
    theirs = wheel_files(args.wheel, paths)
    label = args.label or os.path.basename(args.wheel)
    results, upstream, images, sha = rebase_onto(args.source, args.vllm, theirs, label, args.accept_merge)
    ports, conflicts = {}, []
    for result in results:
        name = result["fix"]["name"]
        if same_file(result, sha):
            print(f"  {'same file':<16} {name}")
            continue
        print(f"  {pf.STATES[result['state']]:<16} {name}")
        report(result, args.vllm, upstream, theirs, images)
        if result["state"] not in ("exact", "rebased"):
            conflicts.append(name)
            continue
        ports[name] = result
    if conflicts:
        print(f"port-vllm-fixes: {', '.join(conflicts)} conflict: nothing written", file=sys.stderr)
        return 1
    if args.write:
        for name, result in ports.items():
            write_port(result, args.to, args.vllm, label, sha, upstream, theirs, images)
        print(f"wrote {len(ports)} port(s) for profile {args.to}")
    return 0


def write_port(result, profile, vllm, label, sha, upstream, theirs, images):
    fix = result["fix"]
    folder = os.path.join(PACK, fix["name"])
    diff = "".join(pf.unified(p, result["files"][p]["pre"], result["files"][p]["post"]) for p in fix["files"])
    os.makedirs(os.path.join(folder, "ports"), exist_ok=True)
    with open(os.path.join(folder, "ports", f"{profile}.diff"), "w", encoding="utf-8") as f:
        f.write(diff)
    same = all(
        pycode.same_code(upstream[p], theirs[p])
        and pycode.same_code(aa.encode(images[fix["name"], p][1]), aa.encode(result["files"][p]["post"]))
        for p in fix["files"]
    )
    files = ", ".join(f"{p} sha256 {sha[p]}" for p in fix["files"])
    entry = {
        "written_against": f"{label}, {files}",
        "verified": (
            f"ported from the diff made against {aa.short_source(fix)} by scripts/port-vllm-fixes.py "
            f"({pf.STATES[result['state']]}, git merge-file"
            + (
                "; upstream changed lines of its context, taken as merged with --accept-merge"
                if any(result["files"][p].get("accepted") for p in fix["files"])
                else ""
            )
            + "). "
            + (
                f"Its file runs the same code as vllm {vllm}'s (equal syntax trees without docstrings: "
                "only docstrings and blank lines differ) and so does the ported result as against the "
                f"fixed vllm {vllm} file, so the fix's tests on vllm {vllm} speak for it "
                "(tests/unit/test_real_wheels.py checks both on the real wheels)"
                if same
                else "Its file's code differs from the one the fix was tested on: run the fix's tests on it"
            )
        ),
        "pre_sha256": {p: sha[p] for p in fix["files"]},
    }
    path = os.path.join(folder, "fix.json")
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    meta.setdefault("ports", {})[profile] = entry
    # By release, then name: the order FIXES.md lists them in, whichever family was ported first.
    meta["ports"] = dict(sorted(meta["ports"].items(), key=lambda kv: (version_key(kv[0].rsplit("-", 1)[-1]), kv[0])))
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", help="the wheel whose vllm/ files to port to")
    parser.add_argument("--to", required=True, help="the profile that applies the ports")
    parser.add_argument(
        "--from", dest="source", default="vllm-0.30.0", help="the profile to port (default vllm-0.30.0)"
    )
    parser.add_argument("--vllm", default="0.30.0", help="the PyPI vllm whose files the fixes were made against")
    parser.add_argument("--label", help="names the wheel's files in written_against (default: the wheel's name)")
    parser.add_argument(
        "--accept-merge",
        action="store_true",
        help="take git's clean merge where upstream changed lines of a fix's context (shown; read them first)",
    )
    parser.add_argument("--write", action="store_true", help="record the ports in the pack")
    args = parser.parse_args(argv)
    try:
        return port(args)
    except (pf.BadInput, aa.Failure) as err:
        print(f"port-vllm-fixes: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
