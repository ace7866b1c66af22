"""The accelerator tiers: the real model on real hardware through `build.py smoke`'s checks.
Each skips with a one-line reason where its accelerator is missing; nothing passes by default."""
import os

import pytest

from gemma4_images import matrix, smoke
from gemma4_images.docker_build import connect

M = matrix.load()
DEVICE_TARGETS = [n for n, t in M.targets.items() if M.families[t.family].accelerator != "none"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.device, getattr(pytest.mark, n)])
                                  for n in DEVICE_TARGETS])
def test_device_tier(name):
    client = connect()
    missing = smoke.device_missing(client, M.families[M.targets[name].family].accelerator)
    if missing:
        pytest.skip(f"{name}: {missing}")
    if not os.environ.get("HF_TOKEN"):
        pytest.skip(f"{name}: HF_TOKEN is not set (the real model is gated on the hub)")
    report = smoke.run_smoke(client, M, name, model=M.project.model)
    assert report.ok, report.table() + "\n" + "\n".join(report.log_tail)
