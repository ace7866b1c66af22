"""`docker run` lines per target, and reading what an image says about itself."""

from __future__ import annotations

import glob
import os
import re
import shlex
import subprocess

from gemma4_images.build.docker_build import DockerUnavailable
from gemma4_images.spec.image_code import gemma4_serve
from gemma4_images.spec.matrix import Matrix, MatrixError, Present, Run

HF_CACHE = "/root/.cache/huggingface"


def docker_flags(run: Run) -> list[str]:
    """A target's `run` fields (targets.yaml) as `docker run` options, in the recipes' order."""
    flags = [f"--runtime={run.runtime}"] if run.runtime else []
    flags += ["--gpus", run.gpus] if run.gpus else []
    for key, value in run.env.items():
        flags += ["-e", f"{key}={value}"]
    flags += ["--privileged"] if run.privileged else []
    flags += [f"--cap-add={c}" for c in run.cap_add]
    flags += [f"--device={d}" for d in run.devices]
    flags += [f"--group-add={g}" for g in run.group_add]
    flags += [f"--security-opt={s}" for s in run.security_opt]
    flags += [f"--ipc={run.ipc}"] if run.ipc else []
    flags += [f"--network={run.network}"] if run.network else []
    flags += [f"--shm-size={run.shm_size}"] if run.shm_size else []
    for host, container in run.volumes.items():
        flags += ["-v", f"{host}:{container}"]
    for name in run.pass_env:
        flags += ["-e", name]
    for mapping in run.publish:
        flags += ["-p", mapping]
    return flags


def sdk_kwargs(run: Run) -> dict:
    """The same fields as Docker SDK keyword arguments (containers.run / testcontainers). Ports and
    the network are left out: the smoke tier always uses host networking on 127.0.0.1."""
    from docker.types import DeviceRequest

    kw: dict = {"environment": {**run.env, **{n: os.environ.get(n, "") for n in run.pass_env}}}
    if run.runtime:
        kw["runtime"] = run.runtime
    if run.gpus:
        # --gpus all; a count or device list is not used by any recipe.
        kw["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if run.privileged:
        kw["privileged"] = True
    for key, values in (("cap_add", run.cap_add), ("group_add", run.group_add), ("security_opt", run.security_opt)):
        if values:
            kw[key] = list(values)
    if run.devices:
        kw["devices"] = [f"{d}:{d}" for d in run.devices]
    if run.ipc:
        kw["ipc_mode"] = run.ipc
    if run.shm_size:
        kw["shm_size"] = run.shm_size
    if run.volumes:
        kw["volumes"] = {host: {"bind": container, "mode": "rw"} for host, container in run.volumes.items()}
    return kw


def device_missing(client, present: Present) -> str | None:
    """Why the family's device is not on this host (targets.yaml families.<f>.present), or None."""
    if present.docker_runtime and present.docker_runtime not in (client.info().get("Runtimes") or {}):
        return f"the {present.docker_runtime} container runtime is not in `docker info`"
    if present.paths and not any(glob.glob(p) for p in present.paths):
        return f"no device at {' or '.join(present.paths)}"
    return None


def run_args(
    matrix: Matrix,
    name: str,
    image: str | None = None,
    env: dict[str, str] | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The recipe's `docker run` for a target: its device flags, the HF cache, then the image."""
    run = matrix.targets[name].run
    if (env or {}).get("GEMMA4_STRATEGY") == "multi_node_tp":
        run = node_run(run)
    args = ["docker", "run", "--rm", *docker_flags(run)]
    args += ["-v", f"$HOME/.cache/huggingface:{HF_CACHE}"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return args + [image or matrix.tag(name), *(extra or [])]


def cli_has_image(ref: str) -> bool:
    """Whether the engine `docker run` talks to holds ref, asked through the same docker CLI (its
    DOCKER_HOST and context), never a registry; one line (DockerUnavailable) when it cannot say."""
    try:
        r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True)
    except FileNotFoundError:
        raise DockerUnavailable("no docker CLI on PATH: `build.py run` runs `docker run`; install docker.io") from None
    if r.returncode == 0:
        return True
    if "no such image" in r.stderr.lower():
        return False
    raise DockerUnavailable(f"docker image inspect {ref} failed: {(r.stderr.strip().splitlines() or ['no reason'])[0]}")


def node_run(run: Run) -> Run:
    """The target's `run` fields for one node of multi_node_tp. The host's network: the nodes reach
    each other on ports vLLM picks at start (its message queues, the collectives), not only the
    rendezvous port, as vLLM's multi-node Docker examples run it (and the API needs no -p). No host
    IPC namespace: two nodes on one host sharing it hang at start-up, right after vLLM's CPU
    communicator is set up (measured: both nodes of the CPU image with --ipc=host, 90 s and no
    /health; without it, healthy in 26 s); /dev/shm is sized as in a pod instead."""
    return run.model_copy(update={"network": "host", "publish": [], "ipc": None, "shm_size": run.shm_size or "16g"})


def check_strategy(matrix: Matrix, name: str, strategy: str, nodes: int | None) -> str:
    """strategy, when target name's recipe allows it with nodes (None: not given), else a MatrixError
    naming the bad input."""
    if strategy not in matrix.strategies:
        raise MatrixError(f"--strategy {strategy!r} is not a strategy; valid: {', '.join(matrix.strategies)}")
    why = matrix.targets[name].serve.unsupported_strategies.get(strategy)
    if why:
        raise MatrixError(f"--strategy {strategy} is not available on {name}: {why}")
    if strategy == "single_node_tp" and nodes not in (None, 1):
        raise MatrixError("--nodes, --node-rank and --master-addr are for --strategy multi_node_tp")
    if strategy == "multi_node_tp" and nodes is None:
        raise MatrixError("multi_node_tp needs --nodes N, the nodes it spans (N >= 2)")
    if strategy == "multi_node_tp" and nodes < 2:
        raise MatrixError(f"--nodes {nodes}: multi_node_tp spans 2 nodes or more; give --nodes N (N >= 2)")
    if strategy == "multi_node_tp":
        heads = matrix.project.attention_heads
        tp = int(gemma4_serve.flag_value(matrix.targets[name].serve.args, "--tensor-parallel-size") or 1) * nodes
        if heads.count % tp:
            fit = ", ".join(str(n) for n in range(2, heads.count + 1) if heads.count % n == 0)
            raise MatrixError(
                f"--nodes {nodes}: tensor parallelism {tp} does not divide {matrix.project.model}'s "
                f"{heads.count} attention heads ({heads.source}); give --nodes {fit}"
            )
    return strategy


def strategy_env(
    matrix: Matrix,
    name: str,
    strategy: str,
    nodes: int | None = None,
    rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
) -> dict[str, str]:
    """The entrypoint's environment for one node of the recipe page's strategy (what
    gemma4_serve.strategy_args reads), or a MatrixError naming the bad input."""
    if check_strategy(matrix, name, strategy, nodes) == "single_node_tp":
        if rank or master_addr:
            raise MatrixError("--nodes, --node-rank and --master-addr are for --strategy multi_node_tp")
        return {}
    if rank is None or not 0 <= rank < nodes:
        raise MatrixError(f"--node-rank {rank}: give this node's rank, 0 to {nodes - 1} (0 serves the API)")
    if not master_addr:
        raise MatrixError("multi_node_tp needs --master-addr, the address node 0 is reached at")
    env = {
        "GEMMA4_STRATEGY": strategy,
        "GEMMA4_NODES": str(nodes),
        "GEMMA4_NODE_RANK": str(rank),
        "GEMMA4_MASTER_ADDR": master_addr,
    }
    return env | ({"GEMMA4_MASTER_PORT": str(master_port)} if master_port is not None else {})


def run_line(*a, **kw) -> str:
    # $HOME stays unquoted so the user's shell expands it.
    return " ".join(arg if arg.startswith("$HOME/") else shlex.quote(arg) for arg in run_args(*a, **kw))


def describe(image) -> dict:
    """Labels, build.json and recipe of a local image, read without running a server."""
    attrs = image.attrs
    config = attrs.get("Config") or {}
    return {
        "id": image.id,
        "tags": image.tags,
        "size_mb": round(attrs.get("Size", 0) / 1e6, 1),
        "labels": config.get("Labels") or {},
        "entrypoint": config.get("Entrypoint"),
        "healthcheck": config.get("Healthcheck"),
        "env": config.get("Env"),
    }


def rss_bytes(container) -> int:
    """Resident memory of every process in a running container (the server and its engine)."""
    out = container.exec_run(["sh", "-c", "cat /proc/[0-9]*/status 2>/dev/null"]).output.decode()
    return sum(int(kb) * 1024 for kb in re.findall(r"^VmRSS:\s+(\d+) kB", out, re.M))


def working_set_bytes(container) -> int:
    """The container's memory as the kubelet counts it against requests, limits and eviction: the
    cgroup's usage less its inactive file pages (cgroup v1 names them total_inactive_file, v2
    inactive_file). Unlike rss_bytes, pages shared by the server's processes count once."""
    memory = container.stats(stream=False)["memory_stats"]
    stats = memory.get("stats", {})
    return memory["usage"] - stats.get("total_inactive_file", stats.get("inactive_file", 0))


def processes(container) -> list[tuple[int, str, str]]:
    """(pid, state, command) of every process in a running container; state Z is a zombie."""
    out = container.exec_run(["sh", "-c", "for s in /proc/[0-9]*/stat; do cat $s 2>/dev/null; echo; done"]).output
    rows = []
    for line in out.decode(errors="replace").splitlines():
        m = re.match(r"(\d+) \((.*)\) (\S)", line)
        if m:
            rows.append((int(m.group(1)), m.group(3), m.group(2)))
    return rows
