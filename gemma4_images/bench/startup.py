"""Start-up: our image against bare `vllm serve` on the same base, each to a healthy server."""

from __future__ import annotations

import shlex
from pathlib import Path

from gemma4_images.bench.figures import TARGET, TINY, ratio
from gemma4_images.build import localbase, owned, pypi
from gemma4_images.spec import matrix, upstream
from gemma4_images.spec.image_code import gemma4_bench as harness
from testkit import trained

STARTUP_ROUNDS = 3
STARTUP_MAX_RATIO = 1.03
# Both sides offline: our entrypoint sets HF_HUB_OFFLINE itself for a local model path.
STARTUP_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
WORKDIR = "/opt/gemma4-e2b"  # our images' WORKDIR, where the serve flags' files sit


def startup_commands(client, m: matrix.Matrix, image: str) -> tuple[list[str], list[str]]:
    """(our image's arguments, the bare base's arguments) for the same vLLM launch: the image's own
    launch with the CPU tier's flags; the bare run drops what only our image has (the baked BOS
    copy as --tokenizer) and names the model folder, as a user of the base alone would."""
    t = m.targets[TARGET]
    ours = [*t.smoke.args, "--host", "127.0.0.1", "--port", "{port}"]
    out = client.containers.run(
        image,
        ["--print-command", *ours],
        remove=True,
        network_mode="host",
        labels=owned.labels(),
        environment={"GEMMA4_MODEL": TINY},
    ).decode()
    launch = shlex.split(out.strip().splitlines()[-1])
    bare, skip = [], False
    for i, arg in enumerate(launch[2:]):  # after `vllm serve`
        if skip:
            skip = False
            continue
        if arg == "--tokenizer":
            skip = True
            continue
        bare.append(arg)
    return ours, bare


def time_to_health(
    image: str,
    args: list[str],
    entrypoint: list[str] | None,
    model: Path,
    budget: float = 600,
    files: dict[str, str] | None = None,
) -> float:
    """Seconds from the start of the container to the first 200 on /health (the server harness,
    check/server.started); the container is always removed. files: host path -> path under WORKDIR,
    mounted read-only (what the image would have copied)."""
    from gemma4_images.check.server import LoopbackContainer, NotHealthy, free_port, started

    port = free_port()
    args = [a.replace("{port}", str(port)) for a in args]
    container = LoopbackContainer(
        image, entrypoint=entrypoint, network_mode="host", shm_size="1g", working_dir=WORKDIR
    ).with_command(args)
    for key, value in {**STARTUP_ENV, "GEMMA4_MODEL": TINY}.items():
        container.with_env(key, value)
    container.with_volume_mapping(str(model), TINY, "ro")
    for host, rel in (files or {}).items():
        container.with_volume_mapping(host, f"{WORKDIR}/{rel}", "ro")
    try:
        with started(container, port, TINY, args, budget) as server:
            return server.seconds_to_healthy
    except NotHealthy as e:  # a benchmark that could not measure: bench says so in one line
        raise RuntimeError(f"{image}: {e}:\n" + "\n".join(e.log[-30:])) from None


def startup_bench(client, log, m: matrix.Matrix, image: str | None = None, rounds: int = STARTUP_ROUNDS) -> dict:
    """Alternating rounds (bare first) so that drift on the machine touches both sides alike."""
    image = image or m.tiny_tag(TARGET)
    base = localbase.cpu_base(client, m, log)
    model = trained.ensure()
    ours, bare = startup_commands(client, m, image)
    # The base lacks the file the recipe's --chat-template names (our image copies it in from
    # vLLM's sdist): the bare run gets it mounted at the same place.
    files = {str(p): str(p.relative_to(upstream.STAGE)) for p in pypi.stage(m)}
    times: dict[str, list[float]] = {"bare": [], "ours": []}
    for n in range(rounds):
        times["bare"].append(time_to_health(base, bare, ["vllm", "serve"], model, files=files))
        times["ours"].append(time_to_health(image, ours, None, model))
        log(f"bench: start-up round {n + 1}/{rounds}: bare {times['bare'][-1]:.1f} s, ours {times['ours'][-1]:.1f} s")
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    r = ratio(med["ours"], med["bare"])
    return {
        "image": image,
        "base": base,
        "rounds": times,
        "median": med,
        "ratio": r,
        "target": STARTUP_MAX_RATIO,
        "ok": r <= STARTUP_MAX_RATIO,
        "bare_args": bare,
        "ours_args": ours,
    }


def startup_section(st: dict) -> list[str]:
    rows = [("round", "bare `vllm serve` (s)", "our image (s)")]
    rows += [
        (str(i + 1), f"{b:.1f}", f"{o:.1f}") for i, (b, o) in enumerate(zip(st["rounds"]["bare"], st["rounds"]["ours"]))
    ]
    rows.append(("median", f"{st['median']['bare']:.1f}", f"{st['median']['ours']:.1f}"))
    return [
        "## Start-up: our image against bare `vllm serve` on the same base",
        "",
        f"Time from `docker run` to the first 200 on `/health`, the tiny model, the CPU tier's flags, "
        f"{len(st['rounds']['bare'])} alternating rounds (bare first). Bare: `{st['base']}` running "
        f"`vllm serve {' '.join(st['bare_args'])}`; ours: `{st['image']}` with the same launch plus what "
        "only it has (the entrypoint, the fixes pack applied, the baked BOS tokenizer copy as "
        "`--tokenizer`).",
        "",
        harness._markdown(rows),
        "",
        f"Ratio of medians, ours / bare: **{st['ratio']:.3f}** (target <= {st['target']}: "
        f"{'met' if st['ok'] else 'NOT met'}).",
        "",
    ]
