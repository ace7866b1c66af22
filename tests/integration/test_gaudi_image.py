"""The real Dockerfile.gaudi (stage 2) on a stand-in base: the real CPU base (vLLM 0.30.0's files
and what the build's self-check imports) plus a vllm-gaudi made of the upstream files the fixes
pack was written against (gaudi_standin.py). It proves the pipeline: the profile's version guard
and sha256 check, the pack applied in order, fixes.json, labels, the baked tokenizer and the
recipe's exact launch — not the fixes' behaviour on HPU."""

import json
import shlex
import tempfile
from pathlib import Path

import gaudi_standin
import pytest

from gemma4_images.build import images
from gemma4_images.build.docker_build import BuildSpec, build
from testkit import tiny_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def gaudi_base(client, own_cpu_base):
    def make(version):
        tag = f"gemma4-e2b-standin/vllm-gaudi-synth:{version.replace('+', '-')}"
        with tempfile.TemporaryDirectory() as ctx:
            gaudi_standin.write_context(Path(ctx), version)
            build(
                client,
                BuildSpec(dockerfile="Dockerfile", tag=tag, context=Path(ctx), buildargs={"BASE": own_cpu_base}),
                print,
            )
        return tag

    return make


@pytest.fixture(scope="module")
def gaudi_image(client, own, gaudi_base):
    return images.build_target(
        client,
        own,
        "gaudi2",
        base_override=gaudi_base("0.30.0+g058f107"),
        tokenizer_source=str(tiny_model.ensure()),
        tag="gemma4-e2b-test/gaudi2:standin",
        log=print,
    )


def run(client, image, args, **kw):
    return client.containers.run(image, args, remove=True, network_mode="host", **kw).decode()


def test_launch_is_the_gaudi_recipe_with_the_baked_tokenizer(client, own, gaudi_image):
    assert shlex.split(run(client, gaudi_image, ["--print-command"])) == own.recipe_launch("gaudi2")
    out = run(client, gaudi_image, ["-c", "ls /opt/gemma4-e2b/tokenizer"], entrypoint=["sh"])
    assert "tokenizer.json" in out.split()


def test_fixes_are_applied_recorded_and_labelled(client, own, gaudi_image):
    manifest = json.loads(run(client, gaudi_image, ["/etc/gemma4-e2b/fixes.json"], entrypoint=["cat"]))
    assert [f["name"] for f in manifest["fixes"]] == own.fixes("gaudi2")
    assert all(f["state"] == "applied" for f in manifest["fixes"])
    assert not manifest.get("forced")
    assert client.images.get(gaudi_image).labels["io.gemma4-images.fixes"] == ",".join(own.fixes("gaudi2"))


def test_recipe_environment_is_baked(client, gaudi_image):
    env = dict(e.split("=", 1) for e in client.images.get(gaudi_image).attrs["Config"]["Env"])
    assert (env["PT_HPU_LAZY_MODE"], env["VLLM_ENGINE_ITERATION_TIMEOUT_S"], env["VLLM_RPC_TIMEOUT"]) == (
        "1",
        "3600",
        "3600000",
    )
    assert "VLLM_SKIP_WARMUP" not in env


def test_runtime_choices_reach_the_launch(client, gaudi_image):
    out = run(
        client, gaudi_image, ["--print-command", "--max-num-seqs", "8"], environment={"GEMMA4_FEATURES": "+reasoning"}
    )
    assert out.strip().endswith("--reasoning-parser gemma4 --tokenizer /opt/gemma4-e2b/tokenizer --max-num-seqs 8")


def test_skip_warmup_stops_the_container(client, gaudi_image):
    container = client.containers.run(
        gaudi_image, [], environment={"VLLM_SKIP_WARMUP": "false"}, detach=True, network_mode="host"
    )
    try:
        assert container.wait(timeout=60)["StatusCode"] == 2
        assert b"any non-empty value" in container.logs()
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def wrong_commit_base(gaudi_base):
    """Made before the test's leftover counts start: rebuilding this fixed tag on a changed CPU base
    leaves its previous image `<none>`, which is not the failed build's leftover."""
    return gaudi_base("0.30.0+g1234567")


def test_wrong_vllm_gaudi_fails_the_build_untagged(own, wrong_commit_base, refused_build):
    failed = refused_build(
        "gaudi2",
        "gemma4-e2b-test/gaudi2:wrong-commit",
        view=own,
        base_override=wrong_commit_base,
        tokenizer_source=str(tiny_model.ensure()),
    )
    log = "\n".join(failed.tail) + failed.error
    assert "expected 058f107" in log and "1234567" in log
    assert "set fixes: null" in log
