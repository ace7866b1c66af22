"""The compile-cache volume every pod mounts (generate/k8s.py), on the CPU image as the pod sets it
(VLLM_CACHE_ROOT from the rendered manifest): vLLM compiling as the recipe's launch does, the first
start compiles into the volume and the next one takes the compiled model from it instead of
compiling again (the pack's cpu-compile-cache-load; the image without the pack logs "Compiling
model again due to a load failure" and compiles again). Tiny trained model, loopback only; the
start-up seconds are BENCHMARKS.md's ("What a pod needs"), not asserted here."""

import pytest
import yaml

from gemma4_images.check import server, smoke
from gemma4_images.generate import k8s
from testkit import exchanges, trained

pytestmark = pytest.mark.integration


def pod_cache_env(m) -> dict[str, str]:
    (c,) = next(yaml.safe_load_all(k8s.render_k8s(m, "xeon6")))["spec"]["template"]["spec"]["containers"]
    mount = next(v["mountPath"] for v in c["volumeMounts"] if v["name"] == "compile-cache")
    env = {e["name"]: e["value"] for e in c["env"] if e["name"] == "VLLM_CACHE_ROOT"}
    assert env == {"VLLM_CACHE_ROOT": mount}
    return env


def two_starts(m, image: str, volume) -> list[list[str]]:
    """The start-up log of two servers of image, one after the other, on the same cache volume."""
    env = pod_cache_env(m)
    volume.chmod(0o777)  # what fsGroup makes of the pod's volume for uid 2000

    def on_volume(container):
        container.with_volume_mapping(str(volume), env["VLLM_CACHE_ROOT"], "rw")
        for key, value in env.items():
            container.with_env(key, value)

    logs = []
    for _ in range(2):
        # Nothing of this machine's own compile caches (keep_compiles): only the pod's volume.
        with server.serve(
            m, "xeon6", image, str(trained.ensure()), eager=False, keep_compiles=False, customize=on_volume
        ) as srv:
            # The scripted answer exactly: the loaded model computes what the compiled one did.
            assert smoke.Checks(srv.url, srv.served, script=exchanges.EXCHANGES).chat().endswith("'Paris.'")
            logs.append(srv.log())
    return logs


def test_the_second_start_loads_what_the_first_compiled_into_the_volume(m, cpu_image, tmp_path):
    cold, warm = two_starts(m, cpu_image, tmp_path)
    saved = smoke.COMPILE_SAVED.findall("\n".join(cold))
    assert saved and all(path.startswith(pod_cache_env(m)["VLLM_CACHE_ROOT"]) for path in saved)
    warm_text = "\n".join(warm)
    assert sorted(smoke.COMPILE_LOADED.findall(warm_text)) == sorted(saved), "the warm start compiled again"
    assert smoke.COMPILE_LOAD_FAILED not in warm_text and not smoke.COMPILE_SAVED.search(warm_text)
    smoke.startup_log(warm)
