"""Two containers of the CPU image as two "nodes" of the recipe page's multi_node_tp strategy (leader
and headless worker, host networking, loopback only), shared by the multi-node and full-size tests."""

from __future__ import annotations

from contextlib import contextmanager

from gemma4_images.check import running, server

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


@contextmanager
def two_nodes(m, image: str, model: str, env: dict | None = None, budget: float | None = None, **kw):
    """(leader, headless worker) serving model across both, the leader answering /health. env: more
    for both nodes; kw: container_for's options."""
    rendezvous = server.free_port()
    worker, _, args = server.container_for(m, TARGET, image, model, server.free_port(), node=True, **kw)
    with_env({**node_env(m, 1, rendezvous), **(env or {})})(worker)
    # The worker first, headless (no HTTP to wait for); the leader waits for it at the rendezvous.
    with server.started(worker, 0, "", args, 0, wait=False) as headless:
        leader_env = with_env({**node_env(m, 0, rendezvous), **(env or {})})
        with server.serve(m, TARGET, image, model, customize=leader_env, node=True, budget=budget, **kw) as leader:
            yield leader, headless
