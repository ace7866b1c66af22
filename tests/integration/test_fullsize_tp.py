"""The full-size tier, multi_node_tp: random weights of E2B's shape served across two containers of
the CPU image with tensor parallelism 2 (after test_fullsize.py's server is gone: the two would not
fit in memory together)."""

from __future__ import annotations

import pytest

from gemma4_images.bench import fullsize
from gemma4_images.check import running, smoke
from tests.fullsize_tier import FIGURES
from tests.integration.multinode import two_nodes

pytestmark = [pytest.mark.integration, pytest.mark.fullsize]


def test_two_nodes_serve_e2b_shape_with_tensor_parallelism_2(m, e2b_shape):
    """multi_node_tp at E2B's size: two containers of the CPU image, tensor parallelism 2 (8 heads
    split 4 + 4), each node holding half of every split weight. Eager, as the smoke serves (a
    compiled start of each node would double the tier's time); each node's working set recorded."""
    image, folder = e2b_shape
    with two_nodes(
        m, image, str(folder), env={"VLLM_CPU_KVCACHE_SPACE": "1"}, budget=fullsize.BUDGET_S, keep_compiles=False
    ) as (leader, headless):
        checks = smoke.Checks(leader.url, leader.served, timeout=fullsize.REQUEST_TIMEOUT_S)
        for name in ("chat", "completion"):
            try:
                getattr(checks, name)()
            except smoke.CheckFailed as e:
                errors = smoke.server_errors(leader.log() + headless.log())
                raise AssertionError(f"{name}: {e}; the nodes' errors: {errors}") from None
        sets = [running.working_set_bytes(node.container) for node in (leader, headless)]
        worker_log = "\n".join(headless.log())
        smoke.startup_log(leader.log())
    assert "TP rank 1" in worker_log and "world size 2" in worker_log
    fullsize.write_figures(
        FIGURES,
        {
            "tp2_healthy_s": round(leader.seconds_to_healthy),
            "tp2_working_sets_gib": [round(s / 2**30, 2) for s in sets],
        },
    )
