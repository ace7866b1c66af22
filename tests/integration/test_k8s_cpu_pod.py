"""The CPU manifest's promises, kept by the real CPU image (tiny model, no cluster here): it serves
under the pod's securityContext (uid 2000, no capabilities, no privilege escalation, /dev/shm of
the rendered size, the cache volume at HF_HOME), and the rendered readiness probe says "not ready"
before the model is served and "ready" after."""
import os
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from gemma4_images import k8s, tiny_model
from gemma4_images.smoke import free_port

pytestmark = pytest.mark.integration


def manifest(m):
    return next(yaml.safe_load_all(k8s.render_k8s(m, "xeon6")))["spec"]["template"]["spec"]


def test_cpu_pod_serves_unprivileged_and_its_readiness_probe_works(client, m, cpu_image):
    spec = manifest(m)
    (c,) = spec["containers"]
    pod_sc, sc = spec["securityContext"], c["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    shm = next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"]
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    port = free_port()
    with tempfile.TemporaryDirectory() as cache:
        # What fsGroup does to the volume: group-owned by the pod's fsGroup, group-writable.
        os.chown(cache, 0, pod_sc["fsGroup"])
        os.chmod(cache, 0o2775)
        container = client.containers.run(
            cpu_image, ["--enforce-eager", "--served-model-name", m.project.model,
                        "--host", "127.0.0.1", "--port", str(port)],
            detach=True, network_mode="host",
            user=str(pod_sc["runAsUser"]), group_add=[str(pod_sc["fsGroup"])],
            cap_drop=["ALL"], security_opt=["no-new-privileges"], privileged=False,
            shm_size=shm.replace("Gi", "g"),
            # This 2-core builder's RAM: as the CPU smoke tier sets it.
            environment={**env, "GEMMA4_MODEL": "/models/tiny", "VLLM_CPU_KVCACHE_SPACE": "1"},
            volumes={str(tiny_model.ensure()): {"bind": "/models/tiny", "mode": "ro"},
                     cache: {"bind": k8s.HF_HOME, "mode": "rw"}})
        try:
            ready = c["readinessProbe"]["exec"]["command"]
            assert container.exec_run(ready).exit_code != 0, "ready before the server started"
            status = container.exec_run(["sh", "-c", "id -u; grep CapEff /proc/1/status"]).output.decode()
            assert status.split()[0] == "2000" and "CapEff:\t0000000000000000" in status
            deadline = time.monotonic() + m.targets["xeon6"].startup_budget_s
            while True:
                container.reload()
                assert container.status == "running", container.logs(tail=40).decode(errors="replace")
                result = container.exec_run(ready)
                if result.exit_code == 0:
                    break
                assert time.monotonic() < deadline, result.output.decode(errors="replace")
                time.sleep(2)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                assert r.status == 200          # what the liveness and startup probes ask
            # The cache volume is the writable HF_HOME for the non-root uid.
            assert container.exec_run(["sh", "-c", f"touch {k8s.HF_HOME}/probe"]).exit_code == 0
        finally:
            container.remove(force=True)
            Path(cache, "probe").unlink(missing_ok=True)
