"""The recipe page's multi_node_tp strategy, run for real: two containers of the CPU image as two
"nodes" (leader and headless worker, host networking, loopback only), the tiny model served with
tensor parallelism 2 across them through vLLM's multiprocessing multi-node mode, and the full smoke
against the leader."""

from __future__ import annotations

import pytest

from gemma4_images.check import running, server, smoke
from testkit import exchanges, trained

pytestmark = pytest.mark.integration

TARGET = "xeon6"


def node_env(m, rank: int, rendezvous: int) -> dict[str, str]:
    # What `build.py run --strategy multi_node_tp` passes, plus VLLM_HOST_IP: vLLM would otherwise
    # hand the worker the host's first non-loopback address for its message queues (seen:
    # mq_connect_ip=192.0.2.2), and nothing here may leave the loopback.
    env = running.strategy_env(m, TARGET, "multi_node_tp", 2, rank, "127.0.0.1", rendezvous)
    return {**env, "VLLM_HOST_IP": "127.0.0.1"}


def with_env(env: dict):
    def customize(container):
        for key, value in env.items():
            container.with_env(key, value)

    return customize


def test_two_nodes_serve_the_full_smoke_with_tensor_parallelism_across_them(client, m, cpu_image, no_new_containers):
    model = str(trained.ensure())
    rendezvous = server.free_port()
    worker, _, args = server.container_for(m, TARGET, cpu_image, model, server.free_port(), node=True)
    with_env(node_env(m, 1, rendezvous))(worker)
    report = smoke.Report(target=TARGET, image=cpu_image, model=model, image_id=client.images.get(cpu_image).id)
    # The worker first, headless (no HTTP to wait for); the leader waits for it at the rendezvous.
    with server.started(worker, 0, "", args, 0, wait=False) as headless:
        leader_env = with_env(node_env(m, 0, rendezvous))
        with server.serve(m, TARGET, cpu_image, model, customize=leader_env, node=True) as leader:
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
