"""One harness for starting an image's server and waiting for it: `serve()` starts a built image as
targets.yaml says to run it (host networking, bound to 127.0.0.1, the model mounted), waits for
/health, yields where it answers and always removes the container. `build.py smoke`, the
benchmarks and the tests start their servers through it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# testcontainers reads these at import: Ryuk (its reaper) cannot be pulled here, and with host
# networking its host lookup must be loopback. Containers are removed by our own `finally`, and
# their owner label lets the next run remove any a SIGKILL left (owned.py).
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TC_HOST", "127.0.0.1")

from testcontainers.core.container import DockerContainer  # noqa: E402

from gemma4_images.build import emulation, owned
from gemma4_images.check import running
from gemma4_images.spec import platforms, upstream
from gemma4_images.spec.matrix import Matrix, model_path


class NotHealthy(Exception):
    """The server exited, or /health did not answer 200 within the budget."""


class LoopbackContainer(DockerContainer):
    """A container on the host network: its server is at 127.0.0.1 on the port it binds, labelled
    with its owner (owned.py) so that a run stopped before its `finally` leaves no stray for long."""

    def __init__(self, image: str, labels: dict[str, str] | None = None, **kw):
        super().__init__(image, labels={**(labels or {}), **owned.labels()}, **kw)

    def get_container_host_ip(self) -> str:
        return "127.0.0.1"

    def get_exposed_port(self, port) -> int:
        return int(port)

    @property
    def created(self) -> bool:
        """The engine made the container (start() can fail before that)."""
        return self._container is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


REQUEST_TIMEOUT_S = 120  # what a check waits for one answer from a server running natively


def http(
    method: str, url: str, body=None, raw: bytes | None = None, timeout: float = REQUEST_TIMEOUT_S
) -> tuple[int, object]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def container_for(
    matrix: Matrix,
    target: str,
    image: str,
    model: str | None,
    port: int,
    extra_args: list[str] = (),
    network_mode: str = "host",
    keep_compiles: bool = True,
    image_id: str | None = None,
    node: bool = False,
    eager: bool = True,
    launch_only: bool = False,
):
    """The container as targets.yaml says to run it, bound to 127.0.0.1:port, plus the model.
    network_mode "none": no network at all, reached through `docker exec` (the model-image proof).
    keep_compiles False: no host folder for the compile cache either (nothing of the host mounted).
    image_id: the image's id when the caller has it already (else looked up for the cache).
    node: one node of multi_node_tp (running.node_run: no host IPC namespace).
    eager False: without the smoke's --enforce-eager, so vLLM compiles as the recipe's launch and a
    pod do.
    launch_only: none of the smoke's own arguments either: the recipe's launch as `run` composes it."""
    t = matrix.targets[target]
    kw = running.sdk_kwargs(running.node_run(t.run) if node else t.run)
    env = {**kw.pop("environment"), **t.smoke.env, **emulation.serve_env(_architecture(image))}
    smoke_args = [] if launch_only else [a for a in t.smoke.args if eager or a != "--enforce-eager"]
    args = [*smoke_args, "--host", "127.0.0.1", "--port", str(port), *extra_args]
    if t.smoke.shm_size:
        kw["shm_size"] = t.smoke.shm_size
    if t.smoke.user:
        kw["user"] = t.smoke.user
    container = LoopbackContainer(image, network_mode=network_mode, **kw)
    keep = keep_compiles and t.smoke.compile_cache
    cache = compile_cache_dir(target, image_id or _image_id(image), t.smoke.user) if keep else None
    if cache:
        container.with_volume_mapping(str(cache), t.smoke.compile_cache, "rw")
    served = matrix.project.model
    if model and Path(model).exists():
        mount = model_path(Path(model).name)
        container.with_volume_mapping(str(Path(model).resolve()), mount, "ro")
        env["GEMMA4_MODEL"] = mount
        args += ["--served-model-name", served]
    elif model:
        env["GEMMA4_MODEL"] = served = model
        if os.environ.get("HF_TOKEN"):
            env["HF_TOKEN"] = os.environ["HF_TOKEN"]  # the container's env only, never an image's
    for key, value in env.items():
        container.with_env(key, value)
    return container.with_command(args), served, args


KEPT_COMPILE_CACHES = 8  # per target: the images smoked most recently on this machine


def _image_id(image: str) -> str:
    import docker

    return docker.from_env().images.get(image).id


def _architecture(image: str) -> str:
    import docker

    return docker.from_env().images.get(image).attrs.get("Architecture", "")


# A server under emulation answers slower by about what its start-up shows: 12.7x measured for the
# arm64 tier's start-up to /health under qemu 10 (BENCHMARKS.md, "linux/arm64 under qemu"); and its
# first sampled request compiles vLLM's CPU sampler with gcc, itself emulated.
EMULATED_SLOWDOWN = 15


def request_timeout(image: str) -> float:
    """How long a check waits for one answer from a server of image on this host."""
    architecture = _architecture(image)
    p = next((p for p in platforms.KNOWN.values() if p.architecture == architecture), None)
    emulated = p is not None and not emulation.native(p)
    return REQUEST_TIMEOUT_S * (EMULATED_SLOWDOWN if emulated else 1)


def compile_cache_dir(target: str, image_id: str, user: str | None) -> Path | None:
    """This machine's torch inductor cache for one image's smoke runs, writable by the smoke's
    user. One folder per image id: inductor's own keys (graph, torch's version and config, thread
    count) say nothing of the image's compiler or headers, so a changed image compiles once for
    itself (and fails the smoke if it cannot), while the same image run again finds its compile
    done. The parent is root's alone (0700), so no host user, uid 2000 included, reaches the
    folders the containers load compiled code from. None (no cache, a note) when this host user
    cannot give the folder to the container's user."""
    parent = upstream.cache_dir() / "smoke-compile" / target
    parent.mkdir(parents=True, exist_ok=True)
    parent.chmod(0o700)
    path = parent / image_id.removeprefix("sha256:")[:16]
    path.mkdir(exist_ok=True)
    os.utime(path)  # most recently used first, when the oldest go
    for old in sorted(parent.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)[KEPT_COMPILE_CACHES:]:
        shutil.rmtree(old, ignore_errors=True)
    if user is None:  # the container's root writes there as it is
        return path
    try:
        if path.stat().st_uid != int(user):
            os.chown(path, int(user), -1)
    except (ValueError, PermissionError) as e:
        print(f"note: {path} cannot be given to user {user} ({e}): no compile cache", file=sys.stderr)
        return None
    return path


def wait_healthy(wrapped, url: str, budget: float) -> float:
    """Seconds until url/health answers 200 from the (docker-py) container, or NotHealthy."""
    start = time.monotonic()
    while time.monotonic() - start < budget:
        wrapped.reload()
        if wrapped.status not in ("created", "running"):
            raise NotHealthy(f"the container exited ({wrapped.attrs['State'].get('ExitCode')}) before /health answered")
        try:
            if http("GET", url + "/health", timeout=5)[0] == 200:
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.5)
    raise NotHealthy(f"/health did not answer 200 within the startup budget of {budget:.0f}s")


@dataclass
class Server:
    """A started server: where it answers, the model name it serves, the arguments it was given
    after the image name, and its container (docker-py's, for exec, logs and stop)."""

    url: str
    served: str
    args: list[str]
    container: object
    seconds_to_healthy: float | None = None
    final_log: list[str] = field(default_factory=list)  # the whole log, once the container is gone

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log(self) -> list[str]:
        return self.container.logs().decode(errors="replace").splitlines()

    def launch(self) -> str:
        """What the entrypoint runs for these arguments (`gemma4-serve --print-command`)."""
        return self.container.exec_run(["gemma4-serve", "--print-command", *self.args]).output.decode()


@contextmanager
def started(container: LoopbackContainer, port: int, served: str, args: list[str], budget: float, wait: bool = True):
    """Start container (its server binding 127.0.0.1:port), wait for /health unless wait is False,
    yield the Server, and always remove the container; its whole log is in final_log afterwards.
    seconds_to_healthy counts from the start request. NotHealthy, carrying the log, if /health
    never answers. Every server here runs through this: serve() for a target's image as
    targets.yaml runs it, the bench for a bare `vllm serve` on the base, the tests for a pod spec."""
    server = None
    begun = time.monotonic()
    try:
        container.start()
        server = Server(f"http://127.0.0.1:{port}", served, args, container.get_wrapped_container())
        if wait:
            try:
                wait_healthy(server.container, server.url, budget)
            except NotHealthy as e:
                e.log = server.log()
                raise
            server.seconds_to_healthy = time.monotonic() - begun
        yield server
    finally:
        if container.created:
            if server is not None:
                server.final_log = server.log()
            container.stop()


@contextmanager
def serve(
    matrix: Matrix,
    target: str,
    image: str,
    model: str | None = None,
    *,
    extra_args: list[str] = (),
    budget: float | None = None,
    wait: bool = True,
    customize=None,
    **kw,
):
    """Start image as targets.yaml runs target (container_for's options in kw) with model, through
    started(). customize(container), if given, adds mounts and env before the start."""
    port = free_port()
    container, served, args = container_for(matrix, target, image, model, port, extra_args, **kw)
    if customize:
        customize(container)
    with started(container, port, served, args, budget or matrix.targets[target].startup_budget_s, wait) as server:
        yield server
