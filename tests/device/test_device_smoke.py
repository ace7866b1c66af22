"""The accelerator tiers: the real model on real hardware through `build.py smoke`'s checks.
Each skips with a one-line reason where its accelerator is missing; nothing passes by default."""

import os

import pytest

from gemma4_images.build.docker_build import connect
from gemma4_images.check import running, smoke
from gemma4_images.spec import matrix

M = matrix.load()
DEVICE_TARGETS = [n for n, t in M.targets.items() if M.families[t.family].accelerator != "none"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.device, getattr(pytest.mark, n)]) for n in DEVICE_TARGETS]
)
def test_device_tier(name):
    client = connect()
    missing = running.device_missing(client, M.families[M.targets[name].family].present)
    if missing:
        pytest.skip(f"{name}: {missing}")
    if not os.environ.get("HF_TOKEN"):
        pytest.skip(f"{name}: HF_TOKEN is not set (the real model is gated on the hub)")
    report = smoke.run_smoke(client, M, name, model=M.project.model)
    assert report.ok, report.table() + "\n" + "\n".join(report.log_tail)


@pytest.mark.device
@pytest.mark.gaudi2
def test_gaudi2_fast_prefill_matches_stock():
    """000 "Verified": fast prefill against stock, offline, 64 prompts of 1,024 tokens, greedy:
    first token 64/64, 32-token continuations identical 64/64. gemma4-bench's check in the
    image (random-token prompts; the recipe used wikitext), each mode in its own process."""
    from gemma4_images.bench.suite import harness_json

    client = connect()
    missing = running.device_missing(client, M.families["gaudi"].present)
    if missing:
        pytest.skip(f"gaudi2: {missing}")
    if not os.environ.get("HF_TOKEN"):
        pytest.skip("gaudi2: HF_TOKEN is not set (the real model is gated on the hub)")
    kw = running.sdk_kwargs(M.targets["gaudi2"].run)
    env = {**kw.pop("environment"), "HF_TOKEN": os.environ["HF_TOKEN"]}
    out = client.containers.run(
        M.tag("gaudi2"),
        ["offline", "--cases", "", "--check-prompts", "64", "--json", "-"],
        entrypoint=["gemma4-bench"],
        environment=env,
        network_mode="host",
        remove=True,
        **kw,
    )
    result = harness_json(out.decode())
    assert result["errors"] == {}, result["errors"]
    check = result["correctness"]
    assert (check["n"], check["first_token_identical"], check["continuation_identical"]) == (64, 64, 64), check[
        "summary"
    ]
