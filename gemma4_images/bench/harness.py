"""The serving harness (image/gemma4_bench.py, `gemma4-bench`) run in the CPU image with the tiny
model at tiny sizes, both modes, beside the recipe's own figures."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from gemma4_images.bench.figures import TARGET, TINY
from gemma4_images.build import images, localbase, owned
from gemma4_images.spec import matrix
from gemma4_images.spec.matrix import ROOT
from testkit import tiny_model, trained


def docker_bench_cmd(image: str, model: Path, mount_harness: bool, argv: list[str]) -> list[str]:
    cmd = [
        "docker",
        "run",
        "--rm",
        *owned.cli_flags(),
        "--network",
        "host",
        "--shm-size",
        "1g",
        "-e",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "-e",
        f"GEMMA4_MODEL={TINY}",
        "-v",
        f"{model}:{TINY}:ro",
    ]
    if mount_harness:
        cmd += ["-v", f"{ROOT / 'image' / 'gemma4_bench.py'}:/usr/local/bin/gemma4-bench:ro"]
    return cmd + ["--entrypoint", "gemma4-bench", image, *argv]


OFFLINE_TINY = [
    "offline",
    "--model",
    TINY,
    "--scale",
    "0.05",
    "--enforce-eager",
    "--max-model-len",
    "1024",
    "--check-prompts",
    "16",
    "--json",
    "-",
]
SERVED_TINY = [
    "served",
    "--concurrency",
    "8",
    "--prompt-tokens",
    "30",
    "--max-tokens",
    "16",
    "--token-low",
    "120",
    "--token-high",
    "250",
    "--startup-budget",
    "600",
    "--json",
    "-",
    "--",
    "--enforce-eager",
    "--max-model-len",
    "1024",
]


def harness_in_image(client, image: str) -> bool:
    try:
        client.containers.run(
            image,
            ["-f", "/usr/local/bin/gemma4-bench"],
            entrypoint=["test"],
            remove=True,
            network_mode="host",
            labels=owned.labels(),
        )
        return True
    except Exception:  # noqa: BLE001 - ContainerError: not there
        return False


def run_harness(client, image: str, argv: list[str], log, model: Path | None = None) -> tuple[dict, float, bool]:
    """gemma4-bench argv in image, with model (default: the tiny trained model) at /models/tiny."""
    shipped = harness_in_image(client, image)
    cmd = docker_bench_cmd(image, model or trained.ensure(), not shipped, argv)
    log(
        f"bench: {' '.join(argv[:1])} harness in {image}"
        + ("" if shipped else " (harness mounted: not in the image yet)")
    )
    start = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True)
    secs = time.monotonic() - start
    if run.returncode != 0:
        raise RuntimeError(
            f"gemma4-bench {argv[0]} failed ({run.returncode}):\n" + "\n".join(run.stderr.splitlines()[-20:])
        )
    return harness_json(run.stdout), secs, shipped


def harness_json(stdout: str) -> dict:
    """The result gemma4-bench prints with --json - (after its human-readable table)."""
    return json.loads(stdout[stdout.index("\n{") + 1 :] if not stdout.startswith("{") else stdout)


def serving_bench(client, log, m: matrix.Matrix, image: str | None = None) -> dict:
    image = image or m.tiny_tag(TARGET)
    if client.images.list(name=image) == []:
        localbase.cpu_base(client, m, log)
        images.build_target(client, m, TARGET, tokenizer_source=str(tiny_model.ensure()), tag=image, log=log)
    offline, off_s, shipped = run_harness(client, image, OFFLINE_TINY, log)
    served, srv_s, _ = run_harness(client, image, SERVED_TINY, log)
    offline.pop("continuations", None)
    return {
        "image": image,
        "harness_shipped": shipped,
        "offline": offline,
        "offline_s": off_s,
        "served": served,
        "served_s": srv_s,
    }
