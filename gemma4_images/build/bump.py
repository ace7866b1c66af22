"""`build.py bump FAMILY|TARGET... --vllm VERSION`: build targets on another vLLM release, beside the
one they are on. Every fact bound to the release is worked out from the release itself, then written
at once (releases/vllm-VERSION.yaml, the stand-ins' locks, the fixes' ports and profile, the
rendered recipes and FIXES.md); a failed step puts back every file it had written.

Facts and where they come from:
- each family's vLLM distribution at VERSION must be on the package index (pypi.project);
- the transformers pin: the newest release that VERSION's own METADATA accepts and that was on the
  index when the family's vLLM VERSION was published (the rule that gives 0.30.0's 5.17.0: what
  vLLM's release images were built with);
- the audio extras: VERSION's `audio` extra; packages already pinned keep their pins, a new one is
  pinned at its newest release when VERSION was published;
- the upstream files (the chat template): the same members of vllm-VERSION.tar.gz, its sha256 from
  the index; each must be there, and its diff against the first release's is shown;
- base images, stand-in tags and what they stand for: the vendor's tags with v<old> replaced by
  v<VERSION> (vLLM's tag convention, targets.yaml cites it); digests null until `pin`;
- the stand-ins' locks: scripts/lock.sh for this release only (requirements/v<VERSION>/...);
- the fixes: each vLLM-level fix of the targets' profile rebased onto VERSION's files
  (scripts/port-vllm-fixes.py): the same file needs no port; a clean merge is written as a port; a
  conflict stops the bump unless a person wrote the port (patches/<fix>/ports/<profile>.diff and
  its fix.json entry) or dropped the fix (--drop FIX=WHY: the upstream change that fixed it, or why
  the family never runs its code; recorded in the release file). Then the new profile must apply
  to VERSION's files (apply_all.py --check).
"""

from __future__ import annotations

import datetime
import difflib
import functools
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from gemma4_images.build import pypi, wheels
from gemma4_images.build.pypi import sdist_member
from gemma4_images.generate import render
from gemma4_images.spec import matrix as matrix_mod
from gemma4_images.spec.matrix import ROOT, Matrix
from gemma4_images.spec.modules import load_file
from gemma4_images.spec.upstream import file_sha256

# What bump may write; it refuses to start while any of them has uncommitted changes.
WRITES = ("releases", "requirements", "patches", "image/recipes", "FIXES.md", "docker-bake.hcl")


class BumpError(Exception):
    """A step that failed (exit 1), or bad input (BadInput, exit 2); the tree is as it was."""

    code = 1


class BadInput(BumpError):
    code = 2


@functools.lru_cache(maxsize=None)
def _port_tool():
    return load_file("port_vllm_fixes", str(ROOT / "scripts" / "port-vllm-fixes.py"))


@dataclass
class Plan:
    version: str
    old: str  # the release the targets are taken from (the first release, the oldest of releases/)
    targets: list[str]
    families: list[str]
    release: dict  # releases/vllm-<version>.yaml as data
    profiles: dict[str, dict] = field(default_factory=dict)  # new profile name: its JSON
    ports: list = field(default_factory=list)  # (result, profile, label, sha, upstream, theirs, images)
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (fact, old, new)
    wheels: dict[str, Path] = field(default_factory=dict)  # new profile: the wheel whose files it must fit


def targets_named(m: Matrix, names: list[str]) -> list[str]:
    """Family names stand for their targets; target names and aliases for themselves."""
    out = []
    for name in names:
        out += m.family_targets(name) if name in m.families else [m.resolve(name)]
    return list(dict.fromkeys(out))


def uncommitted(root: Path = ROOT, paths: tuple[str, ...] = WRITES) -> list[str]:
    run = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--", *paths], capture_output=True, text=True
    )
    if run.returncode != 0:
        raise BumpError(f"cannot ask git which files changed: {run.stderr.strip()}")
    return [line[3:] for line in run.stdout.splitlines()]


def bumped(text: str, old: str, new: str, what: str) -> str:
    if f"v{old}" not in text:
        raise BumpError(f"{what} {text!r} does not name v{old}: cannot derive its v{new} name; write it by hand")
    return text.replace(f"v{old}", f"v{new}")


def plan(
    m: Matrix,
    names: list[str],
    version: str,
    drops: dict[str, str],
    accepts: tuple[str, ...] = (),
    log=print,
    overrides: dict[str, str] | None = None,
) -> Plan:
    old = m.project.vllm_version
    if version == old:
        raise BadInput(f"vLLM {version} is the first release, which bump starts from; bump moves to another one")
    if matrix_mod.version_key(version) < matrix_mod.version_key(old):
        # The first release names the plain reports and is what bump and load() start from.
        raise BadInput(f"vLLM {version} is older than the first release, {old}: bump moves forward from it")
    targets = targets_named(m, names)
    families = list(dict.fromkeys(m.targets[t].family for t in targets))
    for family in families:
        if not m.families[family].pypi:
            raise BadInput(
                f"the {family} family's vLLM is not on the package index (targets.yaml families.{family}.pypi "
                "is empty): bump cannot check its releases; write its release by hand"
            )
    existing = matrix_mod.release_file(version)
    release = yaml.safe_load(existing.read_text()) if existing.is_file() else {}
    release.setdefault("release", {}).setdefault("fixes", {})
    p = Plan(version, old, targets, families, release)
    uploaded, metas = {}, {}
    for family in families:
        for dist in m.families[family].pypi:
            proj = pypi.project(dist)
            if version not in proj.versions:
                raise BadInput(
                    f"{dist} {version} is not on the package index (its newest release: {proj.versions[-1]})"
                )
            uploaded[dist] = proj.uploaded(version)
        first = m.families[family].pypi[0]
        whl = wheels.wheel(f"{first}=={version}", python=_python_of(m, family))
        metas[family] = (first, whl, pypi.metadata(whl))
        release["release"].setdefault("distributions", {})[first] = {
            "wheel": whl.name,
            "sha256": file_sha256(whl),
            "published": uploaded[first],
        }
    published = min(uploaded.values())  # when the first of them was: what existed then is what it was built with
    _transformers(p, m, metas, published)
    _audio(p, m, metas, published)
    _upstream(p, m, log)
    _bases(p, m, overrides or {})
    _fixes(p, m, metas, drops, accepts, log)
    # The commands that wrote the file, in order: running them again on the release before it
    # writes the same facts (tests/integration/test_bump.py does).
    command = " ".join(
        ["python build.py bump", *names, "--vllm", version]
        + [f"--drop {shlex.quote(f'{fix}={why}')}" for fix, why in drops.items()]
        + [f"--override {shlex.quote(f'{req}={why}')}" for req, why in (overrides or {}).items()]
        + [f"--accept-merge {fix}" for fix in accepts]
    )
    commands = release["release"].setdefault("commands", [])
    if command not in commands:
        commands.append(command)
    release["release"].update({"from": old, "date": datetime.date.today().isoformat()})
    return p


def _python_of(m: Matrix, family: str) -> str:
    pythons = {s.python for s in m.standins.values() if s.family == family}
    return sorted(pythons)[0] if pythons else "3.11"


def _transformers(p: Plan, m: Matrix, metas: dict, published: str) -> None:
    specs = {}
    for family, (dist, _, meta) in metas.items():
        req = pypi.requirement_of(meta, "transformers")
        if req is None:
            raise BumpError(f"{dist} {p.version} does not require transformers: cannot choose its pin")
        specs[dist] = str(req.specifier)
    chosen = {pypi.project("transformers").newest(spec, before=published) for spec in specs.values()}
    if len(chosen) != 1 or None in chosen:
        raise BumpError(f"no one transformers release fits {specs} as published by {published}")
    pin = chosen.pop()
    project = p.release.setdefault("project", {})
    if project.get("transformers_version", pin) != pin:
        raise BumpError(
            f"the release file pins transformers {project['transformers_version']} for the families already on "
            f"{p.version}, these families' vLLM takes {pin}: bump them together"
        )
    project.update({"vllm_version": p.version, "transformers_version": pin})
    record = p.release["release"].setdefault("transformers", {})
    record.setdefault("requires", {}).update(specs)
    record["chosen"] = (
        "the newest release every one of these accepts that was on the index when the first of their "
        "vLLM distributions at this release was published"
    )
    p.changes.append(("transformers", m.project.transformers_version, pin))


def _extra_name(entry: str) -> str:
    return entry.split("==")[0].split("[")[0].lower().replace("_", "-")


def _audio(p: Plan, m: Matrix, metas: dict, published: str) -> None:
    names = set()
    for family, (dist, _, meta) in metas.items():
        names |= {r.name.lower() for r in meta["extras"].get("audio", [])}
    pinned = {_extra_name(e): e for e in m.audio_extras}
    names = {n.replace("_", "-") for n in names}
    # Pins kept in their order; a package the extra adds, at its newest release when VERSION was.
    out = [entry for name, entry in pinned.items() if name in names]
    out += [f"{n}=={pypi.project(n).newest(before=published)}" for n in sorted(names - set(pinned))]
    # The release file's own list (families bumped to VERSION before these) is kept whole: the
    # extras are one list per release, and another family's may need what these do not.
    before = p.release.get("audio_extras") or []
    held = {_extra_name(e) for e in before}
    out = list(before) + [e for e in out if _extra_name(e) not in held]
    p.release["audio_extras"] = out
    p.changes.append(("audio extras", " ".join(before or m.audio_extras), " ".join(out)))


def _upstream(p: Plan, m: Matrix, log=print) -> None:
    """Each upstream file from the same member of VERSION's source archive: it must be there, and
    what changed in it since the first release is shown (it is served as it is)."""
    sdist = f"vllm-{p.version}.tar.gz"
    files = [f for f in pypi.project("vllm").files if f.filename == sdist]
    if not files:
        raise BumpError(
            f"{sdist} is not on the package index: the upstream files {', '.join(m.upstream_files)} come from it"
        )
    if not files[0].sha256:
        raise BumpError(f"the package index gives no sha256 for {sdist}: bump cannot pin it")
    out = {}
    for rel, src in m.upstream_files.items():
        member = src.member.replace(f"vllm-{p.old}/", f"vllm-{p.version}/")
        new = sdist_member(sdist, files[0].sha256, member)
        if new is None:
            raise BumpError(
                f"{sdist} holds no file {member}, where {src.sdist} holds upstream file {rel}: vLLM {p.version} "
                "moved or removed it; find where it went and what the recipe now names (bump cannot carry it over)"
            )
        old = sdist_member(src.sdist, src.sdist_sha256, src.member) or b""
        diff = list(
            difflib.unified_diff(
                old.decode(errors="replace").splitlines(),
                new.decode(errors="replace").splitlines(),
                f"{src.sdist}:{src.member}",
                f"{sdist}:{member}",
                lineterm="",
            )
        )
        if diff:
            log(f"upstream file {rel} changed from vLLM {p.old} to {p.version} (the images serve it as it is):")
            for line in diff:
                log(f"  {line}")
        out[rel] = {"sdist": sdist, "sdist_sha256": files[0].sha256, "member": member}
        p.changes.append((f"upstream {rel}", src.sdist, f"{sdist} ({'changed: diff above' if diff else 'same file'})"))
    p.release["upstream_files"] = out


def _bases(p: Plan, m: Matrix, overrides: dict[str, str]) -> None:
    """Each target's base and stand-in at the release; overrides ({requirement: why}) replace what
    the family's vLLM pins in its stand-ins' locks, each reason recorded in the release file."""
    # The first release's overrides of a stand-in's pins hold at this one too (with their reasons) until
    # a person drops them; a new one adds its own.
    record = yaml.safe_load(matrix_mod.release_file(p.old).read_text()).get("release") or {}
    reasons = record.get("overrides") or {}
    kept = {
        r: reasons.get(r, f"as at vLLM {p.old}")
        for t in p.targets
        for plat in m.platforms(t)
        for r in _overrides_of(m, t, plat)
    }
    if kept or overrides:
        p.release["release"].setdefault("overrides", {}).update({**kept, **(overrides or {})})
    standins = p.release.setdefault("standins", {})
    targets = p.release.setdefault("targets", {})
    for name in p.targets:
        t = m.targets[name]
        # Only what the release changes: matrix.release_overlay keeps the rest of targets.yaml's base.
        base = {"image": bumped(t.base.image, p.old, p.version, f"{name}'s base"), "digest": None}
        for plat, image in t.base.platforms.items():
            base.setdefault("platforms", {})[plat] = {
                "image": bumped(image.image, p.old, p.version, f"{name}'s {plat} base"),
                "digest": None,
            }
        targets.setdefault(name, {})["base"] = base
        targets[name].setdefault("fixes", None)  # a release file says it; _fixes gives the profile
        p.changes.append((f"{name} base", t.base.image, base["image"]))
        for plat in m.platforms(name):
            key = m.base_on(name, plat).standin
            if not key:
                continue
            s = m.standins[key]
            # requirements/cpu-base.lock -> requirements/v<VERSION>/cpu-base.lock (the Dockerfile
            # COPYs it by its name)
            new_lock = Path("requirements") / f"v{p.version}" / Path(s.lock).relative_to("requirements")
            standins[key] = {
                "tag": bumped(s.tag, p.old, p.version, f"stand-in {key}'s tag"),
                "stands_for": bumped(s.stands_for, p.old, p.version, f"stand-in {key}'s stands_for"),
                "lock": str(new_lock),
                **({"overrides": sorted(set(s.overrides) | set(overrides))} if s.overrides or overrides else {}),
            }
            p.changes.append((f"stand-in {key}", s.tag, standins[key]["tag"]))


def _overrides_of(m: Matrix, name: str, platform: str) -> list[str]:
    standin = m.standin(name, platform)
    return standin.overrides if standin else []


def _fixes(p: Plan, m: Matrix, metas: dict, drops: dict[str, str], accepts, log) -> None:
    tool = _port_tool()
    profiles = {m.targets[n].fixes.profile for n in p.targets if m.targets[n].fixes}
    for old_profile in sorted(profiles):
        if p.old not in old_profile:
            raise BumpError(f"fixes profile {old_profile!r} does not name {p.old}: cannot name its {p.version} profile")
        new_profile = old_profile.replace(p.old, p.version)
        family = next(
            m.targets[n].family for n in p.targets if m.targets[n].fixes and m.targets[n].fixes.profile == old_profile
        )
        dist, whl, _ = metas[family]
        prof = matrix_mod.load_profile(old_profile)
        fixes = tool.vllm_fixes(old_profile)
        unknown = sorted((set(drops) | set(accepts)) - {f["name"] for f in fixes})
        if unknown:
            raise BadInput(f"{', '.join(unknown)}: not a vLLM fix of profile {old_profile} (--drop, --accept-merge)")
        paths = sorted({q for f in fixes for q in f["files"]})
        theirs = tool.wheel_files(str(whl), paths)
        label = f"PyPI {dist} {p.version}"
        # A merge where upstream changed lines of a fix's context is clean but unread: it stops
        # the bump below unless the fix is named by --accept-merge.
        results, upstream, images, sha = tool.rebase_onto(old_profile, p.old, theirs, label, accept_merge=True)
        # Per profile: one release's families can need different ports of the same fix.
        record = p.release["release"]["fixes"].setdefault(new_profile, {})
        for result in results:
            fix = result["fix"]
            name = fix["name"]
            # A port already in the pack for this profile: a person's, or one an earlier bump wrote
            # (of another family, whose files are the same: one profile serves both).
            kept = fix.get("ports", {}).get(new_profile)
            accepted = any(e.get("accepted") for e in result["files"].values())
            merged = result["state"] in ("exact", "rebased") and (name in accepts or not accepted)
            state = tool.pf.STATES[result["state"]] + (
                " (upstream changed lines of its context: git's merge taken with --accept-merge)" if accepted else ""
            )
            if name in drops:
                record[name] = {"state": "dropped", "why": drops[name]}
            elif tool.same_file(result, sha):
                record[name] = {"state": "same file"}
            elif kept:
                if any(kept["pre_sha256"].get(q) != sha[q] for q in fix["files"]):
                    raise BumpError(
                        f"fix {name}: its port for {new_profile} (patches/{name}/ports/{new_profile}.diff) was made "
                        f"on other files than {dist} {p.version}'s; port it again"
                    )
                # The merge's own diff when the kept port is that (the state comes from the files,
                # not from history); else a person made it.
                diff = (ROOT / "patches" / name / "ports" / f"{new_profile}.diff").read_text()
                ours = "".join(
                    tool.pf.unified(q, result["files"][q]["pre"], result["files"][q]["post"]) for q in fix["files"]
                )
                record[name] = {"state": state if merged and diff == ours else "ported by hand"}
            elif merged:
                record[name] = {"state": state}
                p.ports.append((result, new_profile, label, sha, upstream, theirs, images))
            else:
                where = "; ".join(
                    f"{path} line {c['line']}"
                    for path, entry in result["files"].items()
                    for c in (entry.get("conflicts", []) + entry.get("accepted", []))[:1]
                ) or ", ".join(result["files"])
                tool.report(result, p.old, upstream, theirs, images, log=lambda line: print(line, file=sys.stderr))
                raise BumpError(
                    f"fix {name} conflicts with {dist} {p.version}'s files ({where}): port it by hand as "
                    f"patches/{name}/ports/{new_profile}.diff with its fix.json ports entry "
                    "(scripts/port-vllm-fixes.py shows the merge), take git's merge with --accept-merge "
                    f"{name} if upstream only changed lines around it (above: read them first), or drop it with "
                    f"--drop {name}=WHY if {p.version} fixed it or the family never runs it"
                )
            log(f"  {name:<30} {record[name]['state']}")
        kept = [f for f in prof["generic"] + prof["opt_in"] if f not in drops]
        p.profiles[new_profile] = {
            "name": new_profile,
            "description": (
                f"{prof['description'].split(' (')[0].replace(p.old, p.version)}: vLLM {p.version} "
                f"(written by build.py bump from {old_profile}; a build without a commit id is vouched for by the "
                "sha256 of the files the fixes touch, each fix's own or its port's)"
            ),
            "requires": {"vllm": {"version": p.version}},
            "generic": [f for f in prof["generic"] if f in kept],
            "opt_in": [f for f in prof["opt_in"] if f in kept],
        }
        for name in p.targets:
            t = m.targets[name]
            if t.fixes and t.fixes.profile == old_profile:
                p.release["targets"].setdefault(name, {})["fixes"] = {
                    "profile": new_profile,
                    "opt_in": [f for f in t.fixes.opt_in if f not in drops],
                }
        p.wheels[new_profile] = whl
        p.changes.append(("fixes profile", old_profile, new_profile))


HEADER = """\
# vLLM {version}: the facts bound to the vLLM release, at {version}. Written by `python build.py
# bump` (gemma4_images/build/bump.py says where each comes from); `build.py ... --vllm {version}`
# lays this file over targets.yaml (gemma4_images/spec/matrix.py release_overlay), which holds what
# no release changes; only the targets listed are built on {version}.
# `release` records how the file was made: the distributions read, the transformers requirement
# and what each vLLM-level fix needed.
"""


class Files:
    """Every file bump writes, with what it held before, to put back on failure."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.before: dict[Path, bytes | None] = {}

    def keep(self, path: Path) -> None:
        path = self.root / path
        if path not in self.before:
            self.before[path] = path.read_bytes() if path.exists() else None

    def write(self, path: Path, text: str) -> None:
        self.keep(path)
        full = self.root / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)

    def restore(self) -> None:
        for path, data in self.before.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)  # a folder a removal emptied and took
                path.write_bytes(data)
        for path in self.before:  # folders bump made and left empty
            self.prune(path)

    def prune(self, path: Path) -> None:
        """Remove the empty folders above path, up to the root."""
        for parent in path.relative_to(self.root).parents:
            folder = self.root / parent
            if parent != Path(".") and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run, its output captured, with the child in a process group of its own: when bump
    stops (a signal: owned.Stopped) or fails while the child runs, the whole group is killed (lock.sh's
    uv too, which subprocess.run would leave running) and gone before bump puts its files back."""
    with subprocess.Popen(
        cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    ) as child:
        try:
            out, err = child.communicate()
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)  # start_new_session: the group's id is the child's pid
            child.wait()
            deadline = time.monotonic() + GROUP_EXIT_S
            while _group_running(child.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            raise
    return subprocess.CompletedProcess(cmd, child.returncode, out, err)


GROUP_EXIT_S = 10  # for killed processes to exit (one in uninterruptible I/O finishes its system call first)


def _group_running(pgid: int) -> bool:
    """Whether a process of group pgid still runs; a zombie (dead, not yet reaped by whoever adopted
    it) does not. proc(5): /proc/PID/stat's fields after the command name are state, ppid, pgrp."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except OSError:  # gone meanwhile
            continue
        if int(pgrp) == pgid and state != "Z":
            return True
    return False


def write(p: Plan, log=print, root: Path = ROOT) -> list[str]:
    files = Files(root)
    try:
        files.write(
            Path("releases") / f"vllm-{p.version}.yaml",
            HEADER.format(version=p.version) + yaml.safe_dump(p.release, sort_keys=False, width=100),
        )
        for name, prof in p.profiles.items():
            files.write(Path("patches/profiles") / f"{name}.json", json.dumps(prof, indent=2) + "\n")
        tool = _port_tool()
        for result, profile, label, sha, upstream, theirs, images in p.ports:
            folder = Path("patches") / result["fix"]["name"]
            files.keep(folder / "fix.json")
            files.keep(folder / "ports" / f"{profile}.diff")
            tool.write_port(result, profile, p.old, label, sha, upstream, theirs, images)
        view = matrix_mod.load(vllm=p.version)
        for key, s in view.standins.items():
            files.keep(Path(s.lock))
        run = _run(["bash", "scripts/lock.sh"], cwd=root, env={**os.environ, "RELEASE": p.version})
        if run.returncode != 0:
            raise BumpError(
                f"scripts/lock.sh for {p.version} failed: {(run.stderr or run.stdout).strip().splitlines()[-1]}"
            )
        opt_in = sorted({f for n in p.targets for f in view.targets[n].opt_in_fixes})
        for profile, whl in p.wheels.items():
            with tempfile.TemporaryDirectory(prefix="gemma4-bump-") as wheel_root:
                with zipfile.ZipFile(whl) as z:
                    z.extractall(wheel_root)
                check = _run(
                    [sys.executable, "patches/apply_all.py", "--profile", profile, "--check", "--root", wheel_root]
                    + opt_in,
                    cwd=root,
                )
            if check.returncode != 0:
                raise BumpError(
                    f"profile {profile} does not apply to {p.version}'s files: {check.stderr.strip().splitlines()[-1]}"
                )
        own = matrix_mod.load()
        for rel in render.render_all(own):
            files.keep(Path(rel))
        render.write(own)
    except BaseException:
        files.restore()
        raise
    return sorted(
        str(path.relative_to(root))
        for path, data in files.before.items()
        if not path.exists() or path.read_bytes() != data
    )


def table(p: Plan) -> str:
    changes = list(dict.fromkeys(p.changes))  # targets sharing a stand-in name it once
    width = max(len(f) for f, _, _ in changes)
    rows = [f"{'fact':<{width}}  {p.old:<40}  {p.version}"]
    rows += [f"{f:<{width}}  {a:<40}  {b}" for f, a, b in changes if a != b]
    same = [f for f, a, b in changes if a == b]
    if same:
        rows.append(f"unchanged: {', '.join(same)}")
    return "\n".join(rows)


def behind(views: dict[str, Matrix], log=print) -> list[str]:
    """For each family with a vLLM on the index: its newest release here against the index's newest."""
    out = []
    families = {}
    for version, view in views.items():
        for t in view.targets.values():
            families.setdefault(t.family, set()).add(version)
    own = next(iter(views.values()))
    for family, versions in families.items():
        for dist in own.families[family].pypi:
            newest = pypi.project(dist).versions[-1]
            here = max(versions, key=matrix_mod.version_key)
            state = "current" if matrix_mod.version_key(here) >= matrix_mod.version_key(newest) else "BEHIND"
            log(f"{family:<6} {dist:<14} here {here:<8} index {newest:<8} {state}")
            if state == "BEHIND" and dist == own.families[family].pypi[0]:
                out.append(f"{family} ({dist} {newest}; here {here}): `python build.py bump {family} --vllm {newest}`")
    return out
