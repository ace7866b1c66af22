"""The recipe page's multi_node_tp strategy, run for real: two containers of the CPU image as two
"nodes" (leader and headless worker, host networking, loopback only), the tiny model served with
tensor parallelism 2 across them through vLLM's multiprocessing multi-node mode, and the full smoke
against the leader; then a group that loses a node: the node left reports unhealthy and exits
non-zero, so that `--restart on-failure`, systemd's Restart=on-failure and Kubernetes restart it."""

from __future__ import annotations

import time

import pytest
from docker.errors import APIError

from gemma4_images.check import smoke
from testkit import exchanges, trained
from tests.integration.multinode import TARGET, two_nodes

pytestmark = pytest.mark.integration


def test_two_nodes_serve_the_full_smoke_with_tensor_parallelism_across_them(client, m, cpu_image, no_new_containers):
    model = str(trained.ensure())
    report = smoke.Report(target=TARGET, image=cpu_image, model=model, image_id=client.images.get(cpu_image).id)
    with two_nodes(m, cpu_image, model) as (leader, headless):
        smoke.run_checks(client, m, TARGET, cpu_image, leader, report, exchanges.EXCHANGES, log=print)
        launch = leader.launch()
        worker_log = "\n".join(headless.log())
    status = {c.name: c.status for c in report.checks}
    assert status == {name: "pass" for name, _ in smoke.planned_checks(m, TARGET, [], True)}, [
        (c.name, c.detail) for c in report.checks if c.status != "pass"
    ]
    # Tensor parallelism 2 over 2 nodes of 1, as the entrypoint composed it from the strategy.
    assert "--tensor-parallel-size 2 --nnodes 2 --node-rank 0 --master-addr 127.0.0.1" in launch
    assert "TP rank 1" in worker_log and "world size 2" in worker_log
    assert "mq_connect_ip=127.0.0.1" in "\n".join(leader.final_log)


# The entrypoint's own bound (image/gemma4_serve.py: a check every WATCH_INTERVAL_S, then vLLM's
# shutdown for up to STOP_GRACE_S before SIGKILL), with room for a loaded machine.
EXIT_BUDGET_S = 90


def healthcheck(node) -> int | None:
    """What the image's HEALTHCHECK (and a Kubernetes exec probe) answers now (0: healthy); None: the
    container stopped before it could be asked. One asked as the container ends is killed with it."""
    try:
        return node.container.exec_run(["gemma4-serve", "--healthcheck"]).exit_code
    except APIError as e:
        if e.status_code == 409:  # "is not running"
            return None
        raise


@pytest.mark.parametrize("lost", ["leader", "worker"])
def test_a_node_whose_group_loses_a_node_reports_unhealthy_and_exits_non_zero(m, cpu_image, no_new_containers, lost):
    with two_nodes(m, cpu_image, str(trained.ensure())) as (leader, headless):
        gone, left = (leader, headless) if lost == "leader" else (headless, leader)
        assert healthcheck(left) == 0, "unhealthy while the group is whole"
        gone.container.kill()
        gone.container.wait()
        killed, answers = time.monotonic(), []
        while time.monotonic() - killed < EXIT_BUDGET_S:
            left.container.reload()
            if left.container.status != "running":
                break
            answers.append(healthcheck(left))
            time.sleep(1)
        seconds = time.monotonic() - killed
        state = left.container.attrs["State"]
        log = "\n".join(left.log())
    print(f"{lost} killed; {seconds:.1f} s on the other is {state['Status']} ({state['ExitCode']}): {answers}")
    assert state["Status"] == "exited", f"still {state['Status']} {EXIT_BUDGET_S} s after the {lost} was killed"
    assert state["ExitCode"] != 0, log[-3000:]
    assert 0 not in answers and 1 in answers, f"the healthcheck after the {lost} was gone: {answers}"
    assert "gemma4-serve: the group lost a node: its connection" in log, log[-3000:]
