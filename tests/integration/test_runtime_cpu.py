"""The CPU image under load, client faults, engine death and `docker stop`, run as the rendered CPU
Kubernetes manifest runs it (no cluster here): its pod securityContext (uid 2000, fsGroup, every
capability dropped, no privilege escalation, a read-only root filesystem with /tmp on an emptyDir),
its /dev/shm size, env (with its KV cache size), its memory request enforced as a limit, its HF
and compile cache volumes, and its readiness probe. Tiny model, loopback only; every wait is
bounded."""

import os
import shutil
import tempfile
import time
import urllib.request

import pytest
import yaml

from gemma4_images.check import running, server, smoke, traffic
from gemma4_images.generate import k8s
from testkit import tiny_model
from tests import stuck_engine

pytestmark = pytest.mark.integration
MODEL = "google/gemma-4-E2B-it"
STOP_TIMEOUT = 10  # docker's default


def pod_spec(m):
    return next(yaml.safe_load_all(k8s.render_k8s(m, "xeon6")))["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def locked(client, m, cpu_image):
    spec = pod_spec(m)
    (c,) = spec["containers"]
    pod_sc, sc = spec["securityContext"], c["securityContext"]
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    port = server.free_port()
    cache = tempfile.mkdtemp()
    # What fsGroup does to the volume: group-owned by the pod's fsGroup, group-writable.
    os.chown(cache, 0, pod_sc["fsGroup"])
    os.chmod(cache, 0o2775)
    container = server.LoopbackContainer(
        cpu_image,
        network_mode="host",
        user=str(pod_sc["runAsUser"]),
        group_add=[str(pod_sc["fsGroup"])],
        cap_drop=sc["capabilities"]["drop"],
        security_opt=["no-new-privileges"],
        privileged=False,
        read_only=sc["readOnlyRootFilesystem"],
        shm_size=shm.replace("Gi", "g"),
        # The pod's memory request as a hard limit: the pod's VLLM_CPU_KVCACHE_SPACE keeps vLLM
        # inside it (without it vLLM's CPU worker reserves 90% of the host's memory).
        mem_limit=c["resources"]["requests"]["memory"].replace("Gi", "g"),
    )
    # The pod's /tmp emptyDir. exec: docker mounts tmpfs noexec by default, and torch.compile (the
    # CPU sampler) loads the shared objects it builds there (seen failing without).
    container.with_tmpfs_mount(k8s.TMP, "exec,size=2g")
    container.with_volume_mapping(str(tiny_model.ensure()), "/models/tiny", "ro")
    container.with_volume_mapping(cache, k8s.HF_HOME, "rw")
    compiled = tempfile.mkdtemp()  # the pod's compile-cache volume, as fsGroup leaves it
    os.chown(compiled, 0, pod_sc["fsGroup"])
    os.chmod(compiled, 0o2775)
    container.with_volume_mapping(compiled, k8s.COMPILE_CACHE, "rw")
    for key, value in {**env, "GEMMA4_MODEL": "/models/tiny"}.items():
        container.with_env(key, value)
    args = ["--enforce-eager", "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL]
    container.with_command(args)
    try:
        with server.started(container, port, MODEL, args, m.targets["xeon6"].startup_budget_s, wait=False) as srv:
            ready_before = srv.container.exec_run(c["readinessProbe"]["exec"]["command"]).exit_code
            server.wait_healthy(srv.container, srv.url, m.targets["xeon6"].startup_budget_s)
            yield srv.container, srv.url, c, ready_before
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(compiled, ignore_errors=True)


def test_it_serves_as_the_manifest_says(locked):
    wrapped, url, c, ready_before = locked
    config = wrapped.attrs["HostConfig"]
    assert config["ReadonlyRootfs"] and config["CapDrop"] == ["ALL"] and not config["Privileged"]
    assert config["Memory"] == int(c["resources"]["requests"]["memory"].removesuffix("Gi")) * 2**30
    status = wrapped.exec_run(["sh", "-c", "id -u; grep CapEff /proc/1/status"]).output.decode()
    assert status.split()[0] == "2000" and "CapEff:\t0000000000000000" in status
    assert ready_before != 0, "ready before the server started"
    assert wrapped.exec_run(c["readinessProbe"]["exec"]["command"]).exit_code == 0
    with urllib.request.urlopen(url + "/health", timeout=5) as r:
        assert r.status == 200  # what the liveness and startup probes ask
    # The cache volume is the writable HF_HOME for the non-root uid; the root filesystem is not.
    assert wrapped.exec_run(["sh", "-c", f"touch {k8s.HF_HOME}/probe && rm {k8s.HF_HOME}/probe"]).exit_code == 0
    assert wrapped.exec_run(["sh", "-c", "touch /opt/gemma4-e2b/probe"]).exit_code != 0
    smoke.startup_log(wrapped.logs().decode(errors="replace").splitlines())
    checks = smoke.Checks(url, MODEL)
    checks.chat()
    assert checks.audio_input().startswith("200")


def test_64_streams_and_plain_requests_at_once_all_complete(locked):
    wrapped, url = locked[:2]
    traffic.run(url, MODEL, **traffic.WARM_UP)
    alone = traffic.run(url, MODEL, **traffic.ALONE)
    rss_idle = running.rss_bytes(wrapped)
    load = traffic.run(url, MODEL, **traffic.RECIPE_LOAD)
    rss_loaded = running.rss_bytes(wrapped)
    assert len(load.outcomes) == traffic.RECIPE_LOAD["streams"] + traffic.RECIPE_LOAD["plain"], "a request was lost"
    assert [o for o in load.outcomes if o.status != 200 or o.error] == []
    assert all(o.done and not o.error_event for o in load.of("stream"))
    s = load.summary()
    print(
        f"load: {s}; one request alone {alone.summary()['p50_s']} s; RSS {rss_idle / 2**20:.0f} -> "
        f"{rss_loaded / 2**20:.0f} MiB"
    )


def test_clients_that_hang_up_mid_stream_leave_the_others_and_the_engine_clean(locked):
    url = locked[1]
    load = traffic.run(url, MODEL, **traffic.HANG_UPS)
    left = load.of("disconnect")
    assert len(left) == traffic.HANG_UPS["hang_ups"] and all(o.chunks == 2 for o in left)
    assert all(o.status == 200 and o.done for o in load.of("stream")), load.of("stream")
    assert all(o.status == 200 and not o.error for o in load.of("plain")), load.of("plain")
    # The engine lets go of the requests whose clients left: nothing stays running.
    assert traffic.wait_for_metric(url, "vllm:num_requests_running", 0.0, budget=60) == 0.0
    smoke.Checks(url, MODEL).good_request_still_works()


def test_no_zombie_processes_while_serving(locked):
    wrapped = locked[0]
    assert [p for p in running.processes(wrapped) if p[1] == "Z"] == []


def test_engine_death_stops_health_and_the_container(locked):
    wrapped, url = locked[:2]
    engine = stuck_engine.engine_core_pid(wrapped)
    assert wrapped.exec_run(["sh", "-c", f"kill -9 {engine}"], user="2000").exit_code == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        wrapped.reload()
        if wrapped.status == "exited":
            break
        time.sleep(0.5)
    assert wrapped.status == "exited", "the container kept running after its engine died"
    with pytest.raises(OSError):
        smoke.http("GET", url + "/health", timeout=5)
    # vLLM (0.30.0 and 0.32.0) shuts its API server down when the engine core dies, with status 0 (recorded, not
    # chosen): restart policies that restart only on failure will not restart it.
    print(f"exit code after engine death: {wrapped.attrs['State']['ExitCode']}")


def test_docker_stop_during_traffic_exits_cleanly_within_the_timeout(locked):
    wrapped, url = locked[:2]
    wrapped.start()  # the same container again, after the engine-death test
    server.wait_healthy(wrapped, url, 600)
    timing, load = stuck_engine.stop_with_engine_stuck(wrapped, url, MODEL, 6, 2, STOP_TIMEOUT)
    assert stuck_engine.unclean_stop(wrapped, timing, load, STOP_TIMEOUT) == []
    print(f"docker stop during traffic: {timing['stop_s']:.1f} s, exit 0")
