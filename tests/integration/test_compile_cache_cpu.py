"""The compile-cache volume every pod mounts (generate/k8s.py), on the CPU image as the pod sets it
(VLLM_CACHE_ROOT from the rendered manifest): vLLM compiling as the recipe's launch does, the first
start compiles into the volume and the next one takes the compiled model from it instead of
compiling again (the pack's cpu-compile-cache-load; the image without the pack logs "Compiling
model again due to a load failure" and compiles again). Tiny trained model, loopback only; the
start-up seconds are BENCHMARKS.md's ("What a pod needs"), not asserted here."""

import pytest
import yaml

from gemma4_images.build import probe
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


# The flags of a Xeon 6 E-core (Sierra Forest): AVX2 with FMA and AVX-VNNI, no AVX-512, no AMX.
E_CORE_CPUINFO = "processor\t: 0\nmodel name\t: an E-core\nflags\t\t: fpu sse4_2 avx fma avx2 avx_vnni\n"


def starts(m, image: str, volume, cpuinfos: list[str | None]) -> list[list[str]]:
    """The start-up log of a server of image per entry of cpuinfos, one after the other, on the same
    cache volume; an entry is the /proc/cpuinfo that start sees (None: this machine's)."""
    env = pod_cache_env(m)
    volume.chmod(0o777)  # what fsGroup makes of the pod's volume for uid 2000
    logs = []
    for i, cpuinfo in enumerate(cpuinfos):
        fake = volume.parent / f"cpuinfo-{i}"
        if cpuinfo:
            fake.write_text(cpuinfo)

        def on_volume(container, cpuinfo=cpuinfo, fake=fake):
            container.with_volume_mapping(str(volume), env["VLLM_CACHE_ROOT"], "rw")
            if cpuinfo:  # what the entrypoint and inductor read of the CPU (vec ISA choice)
                container.with_volume_mapping(str(fake), "/proc/cpuinfo", "ro")
            for key, value in env.items():
                container.with_env(key, value)

        # Nothing of this machine's own compile caches (keep_compiles): only the pod's volume.
        with server.serve(
            m, "xeon6", image, str(trained.ensure()), eager=False, keep_compiles=False, customize=on_volume
        ) as srv:
            # The scripted answer exactly: the loaded model computes what the compiled one did.
            assert smoke.Checks(srv.url, srv.served, script=exchanges.EXCHANGES).chat().endswith("'Paris.'")
            logs.append(srv.log())
    return logs


def test_the_second_start_loads_what_the_first_compiled_into_the_volume(m, cpu_image, tmp_path):
    """Then a start on a CPU of other instruction sets (an E-core's /proc/cpuinfo: AVX2, no AVX-512 or
    AMX) loads nothing the first compiled: its kernels are for another instruction set
    (cpu_cache_env, image/gemma4_serve.py), so it compiles into a folder of its own, and answers
    right. (ATEN_CPU_CAPABILITY=avx2 cannot stand for it on an AMX host: vLLM still picks its AMX
    kernels, which then refuse to run, "pack_vnni2 is only supported when avx512 is supported".)"""
    volume = tmp_path / "cache"
    volume.mkdir()
    cold, warm, other = starts(m, cpu_image, volume, [None, None, E_CORE_CPUINFO])
    root = pod_cache_env(m)["VLLM_CACHE_ROOT"]
    saved = smoke.COMPILE_SAVED.findall("\n".join(cold))
    assert saved and all(path.startswith(root + "/cpu-") for path in saved)
    warm_text = "\n".join(warm)
    assert sorted(smoke.COMPILE_LOADED.findall(warm_text)) == sorted(saved), "the warm start compiled again"
    assert smoke.COMPILE_LOAD_FAILED not in warm_text and not smoke.COMPILE_SAVED.search(warm_text)
    smoke.startup_log(warm)
    other_text = "\n".join(other)
    assert not smoke.COMPILE_LOADED.search(other_text), "a CPU of other instruction sets loaded the first's kernels"
    again = smoke.COMPILE_SAVED.findall(other_text)
    folder = {p[len(root) :].split("/")[1] for p in saved}
    assert again and folder.isdisjoint(p[len(root) :].split("/")[1] for p in again), (saved, again)
    assert all("-avx2-" in p for p in again), again
    smoke.startup_log(other)


@pytest.mark.parametrize("aten", [None, "avx2", "default"])
def test_the_folder_names_the_capability_torch_runs_at(client, cpu_image, aten):
    """The entrypoint reads the CPU's flags, not torch (it is standard library only): the capability
    in its folder name is the one torch reports in the image, on this machine, with and without
    ATEN_CPU_CAPABILITY."""
    script = (
        "import json, os, types; "
        + (f"os.environ['ATEN_CPU_CAPABILITY'] = {aten!r}; " if aten else "")
        + "serve = types.ModuleType('serve'); serve.__file__ = '/usr/local/bin/gemma4-serve'; "
        "exec(open(serve.__file__).read(), serve.__dict__); import torch; "
        "print(json.dumps([torch.backends.cpu.get_cpu_capability().lower(), serve.cpu_isa(dict(os.environ))]))"
    )
    torch_says, folder = probe.python(client, cpu_image, script)
    assert folder.split("-")[1] == torch_says, folder
