"""The model image at E2B's size: `build.py model-image` of the random weights of E2B's shape
(testkit.e2b_shape, 10.2 GB), pushed to a loopback registry, removed here, pulled back, filled into a
volume and served by the CPU image with `--network none`, as docs/model-images.md describes. Each
step timed, the bytes of each copy counted. The folder is removed once its image is built (rewritten
in ~1 min when needed) and the registry once the pull is done, so at most three copies are on disk at
once (the pull: the registry's, the download, the pulled layer), not five."""

from __future__ import annotations

import shutil
import tempfile
import time
from contextlib import suppress
from pathlib import Path

from gemma4_images.bench import fullsize
from gemma4_images.bench.figures import TARGET
from gemma4_images.bench.pod import du
from gemma4_images.spec import matrix
from gemma4_images.spec.upstream import cache_dir

NAME = "e2b-shape"
TAG = "gemma4-e2b-test/model:e2b-shape"
VOLUME = "gemma4-e2b-test-model-e2b-shape"
MARGIN = 3 * 10**9  # the server's compile cache, the registry's and the engine's bookkeeping


def preflight(client, weights: int, present: Path | None) -> None:
    """RuntimeError, one line, unless each disk has room for the copies it holds at once. The peak is
    the pull (Docker 20.10 downloads a layer to a file, then unpacks it) beside the registry's copy,
    the folder and the local image already removed; the registry lives in the machine cache, the
    image, the download and the volume in Docker's data root."""
    cache, docker_root = cache_dir(), Path(client.info()["DockerRootDir"])
    folder = du(present) if present else 0  # removed once packed: its room counts as free
    if cache.stat().st_dev == docker_root.stat().st_dev:
        needs = {cache: 3 * weights + MARGIN}
    else:  # the folder, then the registry's copy; the image, then download + layer, then image + volume
        needs = {cache: weights + MARGIN // 2, docker_root: 2 * weights + MARGIN}
    for where, need in needs.items():
        free = shutil.disk_usage(where).free + (folder if where == cache else 0)
        if free < need:
            raise RuntimeError(
                f"the model image at E2B's size needs {need / 1e9:.1f} GB of free disk in {where}; {free / 1e9:.1f} "
                "GB (counting the cached folder it removes): remove images or caches first (`docker system df`)"
            )


def measure(client, log, m: matrix.Matrix) -> dict:
    from docker.errors import NotFound

    from gemma4_images.publish import loopback, model_image
    from testkit.e2b_shape import cache
    from testkit.e2b_shape import folder as shape

    if shutil.which("docker-registry") is None:  # checked before 10 GB are written, not after
        raise loopback.LoopbackError("docker-registry is not installed: `apt-get install docker-registry`")
    preflight(client, shape.Plan().weight_bytes, cache.cached())
    folder = cache.ensure()
    size = du(folder)
    image = fullsize.shape_image(client, m, folder, log)
    out: dict = {"folder_bytes": size}
    root = Path(tempfile.mkdtemp(prefix="gemma4-e2b-registry-", dir=cache_dir()))
    try:
        with suppress(NotFound):
            client.images.remove(TAG, force=True)
        t = time.monotonic()
        built = model_image.build(client, str(folder), name=NAME, tag=TAG, log=log)
        out["build_s"] = time.monotonic() - t
        attrs = client.images.get(built.ref).attrs
        out["image_bytes"], out["layers"] = attrs["Size"], len(attrs["RootFS"]["Layers"])
        log(f"bench: model image of E2B's shape built in {out['build_s']:.0f} s; removing {folder}")
        cache.remove()
        with loopback.registry(root, client) as host:
            t = time.monotonic()
            entry = model_image.push(client, built.ref, host, log=log, reports_dir=root / "reports")
            out["push_s"] = time.monotonic() - t
            out["registry_bytes"] = du(root / "data")
            ref = f"{entry['repository']}@{entry['digest']}"
            client.images.remove(built.ref, force=True)
            loopback.forget(client, host)
            t = time.monotonic()
            client.images.pull(ref).tag(TAG)  # kept under TAG when the registry's references go
            out["pull_s"] = time.monotonic() - t
        shutil.rmtree(root / "data")
        t = time.monotonic()
        model_image.docker_volume(client, TAG, VOLUME)
        out["volume_s"] = time.monotonic() - t
        out["volume_bytes"] = next(
            v["UsageData"]["Size"] for v in client.df()["Volumes"] if v["Name"] == VOLUME
        )  # what the engine copied, counted by the engine (`docker system df -v`)
        client.images.remove(TAG, force=True)
        out["serve"] = serve_with_no_network(log, m, image, built.path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        with suppress(Exception):
            client.volumes.get(VOLUME).remove(force=True)
        for img in client.images.list(name=TAG.split(":")[0]):
            client.images.remove(img.id, force=True)
    return out


def serve_with_no_network(log, m: matrix.Matrix, image: str, model_path: str) -> dict:
    """The recipe's launch from the model image's volume, read-only, on `--network none`: seconds
    to /health through `docker exec` (vLLM compiling into an empty compile cache) and one chat."""
    from gemma4_images.check import server, smoke
    from gemma4_images.publish import model_image
    from testkit.exec_forward import ExecForward

    def mount(container):
        container.with_volume_mapping(VOLUME, model_image.MODELS_ROOT, "ro").with_env("GEMMA4_MODEL", model_path)

    t = time.monotonic()
    with server.serve(
        m, TARGET, image, extra_args=["--served-model-name", m.project.model], network_mode="none",
        keep_compiles=False, wait=False, launch_only=True, eager=False, customize=mount, budget=fullsize.BUDGET_S,
    ) as srv:  # fmt: skip
        with ExecForward(srv.container.id, srv.port) as forward:
            server.wait_healthy(srv.container, forward.url, fullsize.BUDGET_S)
            healthy = time.monotonic() - t
            log(f"bench: E2B's shape from its model image, --network none: healthy in {healthy:.0f} s")
            chat = {"model": srv.served, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            status, answer = smoke.Checks(forward.url, srv.served).post("/v1/chat/completions", chat)
        errors = [line for line in srv.log() if "ERROR" in line or "Traceback" in line]
    if status != 200 or errors:
        raise RuntimeError(f"the model image's server answered {status} or logged errors: {(errors or [answer])[:3]}")
    return {"healthy_s": healthy, "completion_tokens": answer["usage"]["completion_tokens"]}


def section(f: dict) -> list[str]:
    from gemma4_images.spec.image_code import gemma4_bench

    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    steps = [  # what was timed, its figure's key, the bytes it moved and the bytes it left
        ("`build.py model-image` of the folder", "build_s", f["image_bytes"], gb(f["image_bytes"])),
        ("push to a loopback registry", "push_s", f["image_bytes"], gb(f["registry_bytes"]) + " stored"),
        ("pull by digest (local copy removed first)", "pull_s", f["image_bytes"], gb(f["image_bytes"])),
        ("fill the Docker volume from it", "volume_s", f["volume_bytes"], gb(f["volume_bytes"])),
    ]
    rows = [("step", "seconds", "bytes", "rate")]
    rows += [(what, f"{f[key]:.0f}", left, f"{moved / 1e6 / f[key]:.0f} MB/s") for what, key, moved, left in steps]
    rows.append(("recipe launch to /health, `--network none`", f"{f['serve']['healthy_s']:.0f}", "-", "-"))
    return [
        "## E2B's model image at its real size",
        "",
        f"`gemma4_images/bench/model_image_fullsize.py`: the random weights of E2B's shape "
        f"({gb(f['folder_bytes'])} in the folder) as `build.py model-image` packs them ({f['layers']} layer), "
        "pushed to Debian's docker-registry on loopback, pulled back by digest, filled into a volume and served "
        "by the CPU image from it as docs/model-images.md describes (vLLM compiling into an empty cache).",
        "",
        gemma4_bench._markdown(rows),
        "",
        f"Image / folder: **{f['image_bytes'] / f['folder_bytes']:.3f}x**; stored in the registry / image: "
        f"**{f['registry_bytes'] / f['image_bytes']:.3f}x** (gzip of random bf16). The server answered a chat "
        f"({f['serve']['completion_tokens']} tokens) with no network.",
        "",
    ]
