"""`make bench`: what a rebuild costs, what the image adds, and the serving harness run for real.

Build-system part: the CPU target on the local base, built from a temporary copy of the build
context (as tests/integration/test_layer_cache.py does), so edits never touch the repository:
cold build (nocache), no-change rebuild, one patch file edited, one entrypoint line edited. Each
reports steps and layers rebuilt, seconds and the ratio to the cold build measured in the same
run; a rebuild that misses its target names the first step rebuilt and which COPY source or ARG
changed. Then image size minus base size against the bytes the Dockerfile adds.

Serving part: image/gemma4_bench.py (`gemma4-bench`) in the CPU image with the tiny model at
tiny sizes, both modes. BENCHMARKS.md is regenerated with every figure and the recipe's own.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testkit import tiny_model, trained

from . import images, localbase, matrix, owned, upstream
from .image_code import gemma4_bench as harness  # the pure table helpers
from .matrix import ROOT

TARGET = "xeon6"
BENCH_TAG = "gemma4-e2b-bench/xeon6:build"
BASE_BENCH_TAG = "gemma4-e2b-bench/vllm-cpu:cold"
TINY = matrix.model_path("tiny")  # where every run mounts the tiny trained model
CONTEXT_ITEMS = ["image", "patches", ".dockerignore"]
FS_INSTRUCTIONS = ("COPY", "ADD", "RUN")
NOCHANGE_MAX_STEPS = 0
PATCH_MAX_RATIO = 0.05
SIZE_OVERHEAD_MAX = 0.01
OUT = ROOT / "BENCHMARKS.md"
# Every part's figures from its last run: a run of some parts keeps the others' (BENCHMARKS.md is
# rendered from this file, and a unit test fails when the two drift).
RESULTS = ROOT / "benchmarks.json"


# -- pure parts (unit-tested) --------------------------------------------------------------------


@dataclass
class Step:
    number: int
    instruction: str
    cached: bool
    seconds: float = 0.0

    @property
    def kind(self) -> str:
        return self.instruction.split(None, 1)[0].upper()

    @property
    def layer(self) -> bool:
        return self.kind in FS_INSTRUCTIONS


def parse_steps(lines: list[str], stamps: list[float] | None = None, end: float | None = None) -> list[Step]:
    """Steps of a classic-builder log (as docker_build.build logs them) and whether each came from
    the cache. Steps before and including FROM are never cached or rebuilt: they are left out.
    With the time each line arrived (stamps) and the end time, each step gets its seconds."""
    steps: list[Step] = []
    seen_from = False
    pending: list[Step] = []
    started: list[float] = []
    for i, raw in enumerate(lines):
        line = raw.strip()
        m = re.match(r"Step (\d+)/\d+ : (.*)", line)
        if m:
            step = Step(int(m.group(1)), m.group(2), False)
            if seen_from:
                steps.append(step)
                started.append(stamps[i] if stamps else 0.0)
            elif step.kind == "FROM":
                seen_from = True
            pending = [step]
        elif line == "---> Using cache" and pending:
            pending[0].cached = True
    if stamps and steps:
        for n, step in enumerate(steps):
            step.seconds = round((started[n + 1] if n + 1 < len(steps) else (end or started[n])) - started[n], 3)
    return steps


def slowest(steps: list[Step], n: int = 3) -> list[str]:
    top = sorted(rebuilt(steps), key=lambda s: s.seconds, reverse=True)[:n]
    return [
        f"{s.instruction.split(None, 1)[0]} {s.instruction.split(None, 1)[1][:40] if ' ' in s.instruction else ''}"
        f" ({s.seconds:.2f} s)"
        for s in top
    ]


def rebuilt(steps: list[Step]) -> list[Step]:
    return [s for s in steps if not s.cached]


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), text)


def why_rebuilt(step: Step, changed_files: list[str], before_args: dict, after_args: dict) -> str:
    """Why the classic builder missed the cache at step: what its COPY source or ARG changed."""
    words = step.instruction.split()
    if step.kind in ("COPY", "ADD"):
        srcs = [expand(w, after_args).rstrip("/") for w in words[1:-1] if not w.startswith("--")]
        hits = [f for f in changed_files for s in srcs if f == s or f.startswith(s + "/")]
        if hits:
            return f"its source changed: {', '.join(sorted(hits)[:5])}"
        return "its sources are unchanged: the cache was pruned, or a step above it missed"
    if step.kind == "ARG":
        name = words[1].split("=", 1)[0]
        if before_args.get(name) != after_args.get(name):
            return f"build arg {name} changed: {before_args.get(name)!r} -> {after_args.get(name)!r}"
        return f"build arg {name} is unchanged: the cache was pruned, or a step above it missed"
    changed = sorted(k for k in set(before_args) | set(after_args) if before_args.get(k) != after_args.get(k))
    if changed:
        return f"build args in scope changed: {', '.join(changed)}"
    return "no input of this step changed: the cache was pruned, or a step above it missed"


def step_label(created_by: str, width: int = 80) -> str:
    """A history entry's CreatedBy as the Dockerfile step it came from, shortened."""
    if "#(nop)" in created_by:
        text = created_by.split("#(nop)", 1)[1].strip()
    else:
        m = re.search(r"/bin/(?:ba)?sh (?:-o pipefail )?-c (.*)", created_by, re.S)
        text = "RUN " + (m.group(1) if m else created_by)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def ratio(seconds: float, baseline: float) -> float:
    return seconds / baseline if baseline > 0 else float("nan")


@dataclass
class Scenario:
    name: str
    seconds: float
    steps: int
    steps_rebuilt: int
    layers_rebuilt: int
    first_rebuilt: str | None
    ratio: float = 1.0
    target: str = ""
    ok: bool = True
    layers_ok: bool = True
    time_ok: bool = True
    why: str = ""
    rebuilt_steps: list[str] = field(default_factory=list)
    slowest: list[str] = field(default_factory=list)


def judge(s: Scenario, first_allowed: str | None, forbidden: tuple[str, ...] = ()) -> Scenario:
    """Marks s against its target: first_allowed None means nothing may be rebuilt."""
    if first_allowed is None:
        s.target = "0 layers rebuilt"
        s.ok = s.layers_ok = s.steps_rebuilt == NOCHANGE_MAX_STEPS
    else:
        s.target = f"first rebuilt `{first_allowed}`, <= {PATCH_MAX_RATIO:.0%} of cold"
        s.layers_ok = (s.first_rebuilt or "").startswith(first_allowed) and not any(
            r.startswith(f) for r in s.rebuilt_steps for f in forbidden
        )
        s.time_ok = s.ratio <= PATCH_MAX_RATIO
        s.ok = s.layers_ok and s.time_ok
    return s


def scenario_table(rows: list[Scenario]) -> str:
    table = [
        (
            "build",
            "steps rebuilt",
            "layers rebuilt",
            "seconds",
            "vs cold",
            "first step rebuilt",
            "target",
            "layers",
            "time",
        )
    ]
    for s in rows:
        table.append(
            (
                s.name,
                f"{s.steps_rebuilt}/{s.steps}",
                str(s.layers_rebuilt),
                f"{s.seconds:.1f}",
                f"{s.ratio:.1%}",
                f"`{s.first_rebuilt}`" if s.first_rebuilt else "-",
                s.target or "baseline",
                "-" if not s.target else "met" if s.layers_ok else "NOT met",
                "-" if not s.target or "%" not in s.target else "met" if s.time_ok else "NOT met",
            )
        )
    return harness._markdown(table)


def size_verdict(image_bytes: int, base_bytes: int, added_bytes: int) -> dict:
    delta = image_bytes - base_bytes
    overhead = delta - added_bytes
    limit = added_bytes * (1 + SIZE_OVERHEAD_MAX)
    return {
        "image": image_bytes,
        "base": base_bytes,
        "delta": delta,
        "added": added_bytes,
        "overhead": overhead,
        "overhead_pct": overhead / added_bytes * 100 if added_bytes else 0.0,
        "ok": delta <= limit,
    }


# -- the build benchmark -------------------------------------------------------------------------


def copy_context(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for item in [*CONTEXT_ITEMS, *[p.name for p in ROOT.glob("Dockerfile.*")]]:
        src = ROOT / item
        if src.exists():
            (shutil.copytree if src.is_dir() else shutil.copy)(src, dest / item)
    return dest


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def timed_build(client, m, base: str, context: Path, tokenizer: str, nocache: bool) -> tuple[float, list[Step], dict]:
    lines, stamps, captured = [], [], {}

    def record(line):
        lines.append(line)
        stamps.append(time.monotonic())

    start = time.monotonic()
    images.build_target(
        client,
        m,
        TARGET,
        base_override=base,
        tokenizer_source=tokenizer,
        tag=BENCH_TAG,
        nocache=nocache,
        context=context,
        log=record,
        on_spec=lambda spec: captured.update(spec.buildargs),
    )
    end = time.monotonic()
    return end - start, parse_steps(lines, stamps, end), captured


def scenario(name, seconds, steps, cold_s, changed, before_args, after_args) -> Scenario:
    again = rebuilt(steps)
    s = Scenario(
        name,
        round(seconds, 2),
        len(steps),
        len(again),
        sum(1 for x in again if x.layer),
        again[0].instruction if again else None,
        ratio(seconds, cold_s),
        rebuilt_steps=[x.instruction for x in again],
        slowest=slowest(steps),
    )
    if again:
        s.why = why_rebuilt(again[0], changed, before_args, after_args)
    return s


def build_bench(client, log, m: matrix.Matrix, base: str | None = None, with_base: bool = False) -> dict:
    """with_base also times a no-cache build of the local base (minutes on 2 cores), under a
    bench tag that is removed afterwards: the shared base is left as it is."""
    base_cold_s = None
    if with_base and not base:
        log(f"bench: cold build of the local base as {BASE_BENCH_TAG} (no cache)")
        t = time.monotonic()
        localbase.cpu_base(client, m, log, tag=BASE_BENCH_TAG, nocache=True)
        base_cold_s = time.monotonic() - t
        client.images.remove(BASE_BENCH_TAG, noprune=False)
    base = base or localbase.cpu_base(client, m, log)
    tokenizer = str(tiny_model.ensure())
    rows: list[Scenario] = []
    with tempfile.TemporaryDirectory(prefix="gemma4-bench-") as tmp:
        ctx = copy_context(Path(tmp) / "ctx")
        log(f"bench: cold build of {TARGET} on {base} (no cache)")
        cold_s, steps, args0 = timed_build(client, m, base, ctx, tokenizer, nocache=True)
        cold = Scenario(
            "cold (no cache)",
            round(cold_s, 2),
            len(steps),
            len(rebuilt(steps)),
            sum(1 for x in rebuilt(steps) if x.layer),
            steps[0].instruction if steps else None,
            slowest=slowest(steps),
        )
        rows.append(cold)

        hashes = tree_hashes(ctx)
        log("bench: no-change rebuild")
        secs, steps, args1 = timed_build(client, m, base, ctx, tokenizer, nocache=False)
        new = tree_hashes(ctx)
        rows.append(judge(scenario("no change", secs, steps, cold_s, diff(hashes, new), args0, args1), None))

        manifest = sorted((ctx / "patches").glob("*/fix.json"))[0]
        fix = json.loads(manifest.read_text())
        fix["verified"] += " (edited by make bench)"
        manifest.write_text(json.dumps(fix, indent=2))
        log(f"bench: rebuild after editing {manifest.relative_to(ctx)}")
        hashes, secs, steps, args2 = new, *timed_build(client, m, base, ctx, tokenizer, nocache=False)
        new = tree_hashes(ctx)
        rows.append(
            judge(
                scenario("one patch file", secs, steps, cold_s, diff(hashes, new), args1, args2),
                "COPY patches/",
                forbidden=("COPY .build/tokenizer/", "COPY image/gemma4_serve.py"),
            )
        )

        entry = ctx / "image" / "gemma4_serve.py"
        text = entry.read_text().splitlines(keepends=True)
        at = next(i for i, line in enumerate(text) if line.startswith("from __future__"))
        text.insert(at, "# edited by make bench\n")
        entry.write_text("".join(text))
        log("bench: rebuild after editing one entrypoint line")
        hashes, secs, steps, args3 = new, *timed_build(client, m, base, ctx, tokenizer, nocache=False)
        new = tree_hashes(ctx)
        s = scenario("one entrypoint line", secs, steps, cold_s, diff(hashes, new), args2, args3)
        s.target = "first rebuilt `COPY image/gemma4_serve.py` (everything after it follows)"
        s.ok = s.layers_ok = (s.first_rebuilt or "").startswith("COPY image/gemma4_serve.py")
        rows.append(s)

        size = image_size(client, base, ctx)
    for s in rows[1:]:
        if not s.layers_ok:
            log(f"bench: REGRESSION in '{s.name}': first rebuilt `{s.first_rebuilt}` because {s.why}")
        elif not s.time_ok:
            log(
                f"bench: '{s.name}' took {s.ratio:.1%} of the cold build (target <= {PATCH_MAX_RATIO:.0%}); "
                f"the steps it rebuilt were the right ones, from `{s.first_rebuilt}` ({s.why})"
            )
    return {
        "base": base,
        "tag": BENCH_TAG,
        "cold_s": cold_s,
        "base_cold_s": base_cold_s,
        "scenarios": [asdict(s) for s in rows],
        "size": size,
    }


def diff(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _dir_bytes(path: Path) -> int:
    """Bytes of the files a COPY of path sends (.dockerignore drops **/__pycache__)."""
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        if path.is_dir()
        else path.stat().st_size
        if path.exists()
        else 0
    )


def image_size(client, base: str, ctx: Path) -> dict:
    """Image minus base against the bytes the Dockerfile adds: copied files, and the files the
    fixes rewrote plus the records the RUN steps write (read back from the image)."""
    img, base_img = client.images.get(BENCH_TAG), client.images.get(base)
    copied = {
        "entrypoint (image/gemma4_serve.py)": _dir_bytes(ctx / "image" / "gemma4_serve.py"),
        "upstream files (.build/upstream/examples/)": _dir_bytes(ctx / ".build" / "upstream" / "examples"),
        f"tokenizer copy (.build/tokenizer/{TARGET}/)": _dir_bytes(ctx / ".build" / "tokenizer" / TARGET),
        "fixes pack (patches/)": _dir_bytes(ctx / "patches"),
        "recipe (recipe.json)": _dir_bytes(ctx / "image" / "recipes" / f"{TARGET}.json"),
    }
    bench_file = ctx / "image" / "gemma4_bench.py"
    dockerfile = (ctx / matrix.dockerfile_name("cpu")).read_text()
    if "gemma4_bench.py" in dockerfile:
        copied["bench harness (image/gemma4_bench.py)"] = _dir_bytes(bench_file)
    script = (
        "import json,os,importlib.util as u;f=json.load(open('/etc/gemma4-e2b/fixes.json'));"
        "paths=[os.path.join(os.path.dirname(os.path.dirname(u.find_spec(fx['package']).origin)),rel)"
        " for fx in f['fixes'] for rel in fx.get('files',{})];"
        "print(json.dumps({'rewritten':sum(os.path.getsize(p) for p in paths if os.path.exists(p)),"
        "'files':len(paths),'records':sum(os.path.getsize(p) for p in "
        "['/etc/gemma4-e2b/fixes.json','/etc/gemma4-e2b/build.json'])}))"
    )
    out = client.containers.run(
        BENCH_TAG, ["-c", script], entrypoint=["python3"], remove=True, network_mode="host", labels=owned.labels()
    ).decode()
    inside = json.loads(out.strip().splitlines()[-1])
    added = dict(copied)
    extras = installed_since(client, base, BENCH_TAG)
    if extras:
        added[f"audio extras installed ({', '.join(sorted(extras))})"] = sum(extras.values())
    added[f"files the fixes rewrote ({inside['files']})"] = inside["rewritten"]
    added["fixes.json + build.json"] = inside["records"]
    layers = [
        {"step": (h.get("CreatedBy") or "")[-90:], "bytes": h.get("Size", 0)} for h in img.history() if h.get("Size")
    ]
    base_ids = {h["Id"] for h in base_img.history() if h.get("Id") and h["Id"] != "<missing>"}
    ours = [h for h in img.history() if h.get("Id") not in base_ids]
    verdict = size_verdict(img.attrs["Size"], base_img.attrs["Size"], sum(added.values()))
    return {
        **verdict,
        "parts": added,
        "layers": [
            {"step": step_label(h.get("CreatedBy") or ""), "bytes": h.get("Size", 0)} for h in ours if h.get("Size")
        ]
        or layers,
    }


DIST_BYTES = (
    "import importlib.metadata as m, json, os; print(json.dumps({d.metadata['Name']: "
    "sum(os.path.getsize(p) for p in map(d.locate_file, d.files or []) if os.path.isfile(p)) "
    "for d in m.distributions()}))"
)


def installed_since(client, base: str, image: str) -> dict[str, int]:
    """Python distributions the image has and its base does not, with the bytes of their files."""

    def dists(ref):
        out = client.containers.run(
            ref, ["-c", DIST_BYTES], entrypoint=["python3"], remove=True, network_mode="host", labels=owned.labels()
        )
        return json.loads(out.decode().strip().splitlines()[-1])

    before, after = dists(base), dists(image)
    return {name: size for name, size in after.items() if name not in before}


# -- the serving harness in the CPU image --------------------------------------------------------


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


def run_harness(client, image: str, argv: list[str], log) -> tuple[dict, float, bool]:
    shipped = harness_in_image(client, image)
    cmd = docker_bench_cmd(image, trained.ensure(), not shipped, argv)
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


# -- start-up: our image against bare `vllm serve` on the same base -------------------------------

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
    client,
    image: str,
    args: list[str],
    entrypoint: list[str] | None,
    model: Path,
    budget: float = 600,
    files: dict[str, str] | None = None,
) -> float:
    """Seconds from `docker run` to the first 200 on /health; the container is always removed.
    files: host path -> path under WORKDIR, mounted read-only (what the image would have copied)."""
    from .server import free_port, http

    port = free_port()
    start = time.monotonic()
    container = client.containers.run(
        image,
        [a.replace("{port}", str(port)) for a in args],
        entrypoint=entrypoint,
        detach=True,
        network_mode="host",
        labels=owned.labels(),
        shm_size="1g",
        environment={**STARTUP_ENV, "GEMMA4_MODEL": TINY},
        volumes={
            str(model): {"bind": TINY, "mode": "ro"},
            **{host: {"bind": f"{WORKDIR}/{rel}", "mode": "ro"} for host, rel in (files or {}).items()},
        },
        working_dir=WORKDIR,
    )
    try:
        while time.monotonic() - start < budget:
            try:
                if http("GET", f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                    return time.monotonic() - start
            except OSError:
                pass
            container.reload()
            if container.status == "exited":
                raise RuntimeError(
                    f"{image} exited before /health answered:\n" + container.logs().decode(errors="replace")[-2000:]
                )
            time.sleep(0.5)
        raise RuntimeError(f"{image}: /health did not answer within {budget:.0f} s")
    finally:
        container.remove(force=True)


def startup_bench(client, log, m: matrix.Matrix, image: str | None = None, rounds: int = STARTUP_ROUNDS) -> dict:
    """Alternating rounds (bare first) so that drift on the machine touches both sides alike."""
    image = image or m.tiny_tag(TARGET)
    base = localbase.cpu_base(client, m, log)
    model = trained.ensure()
    ours, bare = startup_commands(client, m, image)
    # The base lacks the file the recipe's --chat-template names (our image copies it in from
    # vLLM's sdist): the bare run gets it mounted at the same place.
    files = {str(p): str(p.relative_to(upstream.STAGE)) for p in upstream.stage(m)}
    times: dict[str, list[float]] = {"bare": [], "ours": []}
    for n in range(rounds):
        times["bare"].append(time_to_health(client, base, bare, ["vllm", "serve"], model, files=files))
        times["ours"].append(time_to_health(client, image, ours, None, model))
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


# -- load, client faults and a stop during traffic ------------------------------------------------


def load_bench(client, log, m: matrix.Matrix, image: str | None = None, rounds: int = 3) -> dict:
    """The recipe's 64 concurrent streams plus 16 plain requests against one server, `rounds` times,
    against a single request measured in the same run; then hang-ups and a stop during traffic."""
    from . import running, traffic
    from .server import free_port, wait_healthy

    model, port = trained.ensure(), free_port()
    url, served = f"http://127.0.0.1:{port}", m.project.model
    image, t = image or m.tiny_tag(TARGET), m.targets[TARGET]
    container = client.containers.run(
        image,
        [*t.smoke.args, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served],
        detach=True,
        network_mode="host",
        labels=owned.labels(),
        shm_size="1g",
        environment={**STARTUP_ENV, "GEMMA4_MODEL": TINY},
        volumes={str(model): {"bind": TINY, "mode": "ro"}},
    )
    try:
        wait_healthy(container, url, 600)
        traffic.run(url, served, streams=2, plain=0)  # warm-up (the sampler compiles)
        alone = [traffic.run(url, served, streams=1, plain=0).latencies()[0] for _ in range(rounds)]
        rss_idle = running.rss_bytes(container)
        loads = [traffic.run(url, served, streams=64, plain=16) for _ in range(rounds)]
        rss_loaded = running.rss_bytes(container)
        faults = traffic.run(url, served, streams=16, plain=4, hang_ups=4, max_tokens=200)
        running_after = traffic.wait_for_metric(url, "vllm:num_requests_running", 0.0, budget=60)
        stop = {}

        def stop_now():
            time.sleep(3)
            start = time.monotonic()
            container.stop(timeout=10)
            stop["seconds"] = time.monotonic() - start

        during = traffic.run(url, served, streams=6, plain=2, max_tokens=3000, during=stop_now)
        container.reload()
        stop["exit"] = container.attrs["State"]["ExitCode"]
    finally:
        container.remove(force=True)
    single = sorted(alone)[len(alone) // 2]
    rows = [ld.summary() for ld in loads]
    log(f"bench: load p50 {[r['p50_s'] for r in rows]} s vs one request {single:.3f} s")
    return {
        "image": image,
        "single_s": single,
        "rounds": rows,
        "rss_idle": rss_idle,
        "rss_loaded": rss_loaded,
        "hang_ups": {
            "others_ok": sum(o.done for o in faults.of("stream")) + sum(o.status == 200 for o in faults.of("plain")),
            "others": len(faults.of("stream")) + len(faults.of("plain")),
            "running_after": running_after,
        },
        "stop": {
            **stop,
            "ended_503": sum(
                o.error_event == "the server is shutting down" or o.status == 503 for o in during.outcomes
            ),
            "requests": len(during.outcomes),
        },
    }


def load_section(ld: dict) -> list[str]:
    rows = [("round", "requests ok", "p50 (s)", "p99 (s)", "p50 / one request", "p99 / one request")]
    for i, r in enumerate(ld["rounds"]):
        rows.append(
            (
                str(i + 1),
                f"{r['ok']}/{r['requests']}",
                f"{r['p50_s']:.3f}",
                f"{r['p99_s']:.3f}",
                f"{ratio(r['p50_s'], ld['single_s']):.1f}x",
                f"{ratio(r['p99_s'], ld['single_s']):.1f}x",
            )
        )
    h, st = ld["hang_ups"], ld["stop"]
    mib = ld["rss_loaded"] / 2**20
    return [
        "## Load, client faults and a stop during traffic (CPU image, tiny model)",
        "",
        f"`{ld['image']}`, the CPU tier's flags. Each round: 64 streaming chat requests (the recipe's "
        f"`--max-num-seqs 64`) and 16 plain ones at once, 24 tokens each, after one request alone "
        f"({ld['single_s']:.3f} s, median of the rounds) in the same run.",
        "",
        harness._markdown(rows),
        "",
        f"Server RSS (every process in the container): {ld['rss_idle'] / 2**20:,.0f} MiB idle, "
        f"{mib:,.0f} MiB after the rounds ({ratio(ld['rss_loaded'], ld['rss_idle']):.3f}x).",
        "",
        f"A quarter of 16 streaming clients hung up after two events: the other {h['others_ok']}/{h['others']} "
        f"requests completed and `vllm:num_requests_running` went back to {h['running_after']:.0f}.",
        "",
        f"`docker stop` during 8 long requests: exited {st['exit']} after {st['seconds']:.1f} s (docker's "
        f'timeout 10 s); {st["ended_503"]}/{st["requests"]} requests ended with the 503 "the server is '
        f'shutting down" (shutdown-ends-requests).',
        "",
    ]


# -- BENCHMARKS.md -------------------------------------------------------------------------------


def recipe_offline_table(ours: dict | None) -> str:
    rows = [
        (
            "Case (recipe sizes)",
            "Stock",
            "Fast prefill",
            "fast/stock",
            "Measured on",
            "ours: fast/stock (tiny model, CPU)",
        )
    ]
    for name, (stock, fast) in harness.RECIPE_OFFLINE.items():
        title, inp, out, bs = harness.CASES[name]
        r = (ours or {}).get("ratios", {}).get(name)
        rows.append(
            (
                f"{title} ({inp:,} in, {out} out), bs {bs}",
                f"{harness.fmt_tps(stock)} tok/s",
                harness.fmt_tps(fast),
                f"{fast / stock:.2f}x",
                "recipe 000: 1x Gaudi 2, vllm-gaudi 058f107",
                f"{r:.2f}x" if r else "-",
            )
        )
    return harness._markdown(rows)


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


def render_results(results: dict) -> str:
    return render(
        results.get("build"),
        results.get("serving"),
        results.get("timings", {}),
        results.get("startup"),
        results.get("load"),
        results.get("quickstart"),
        results.get("standins"),
    )


def quickstart_section(q: dict) -> list[str]:
    names = list(dict.fromkeys([*q["cold"]["steps"], *q["warm"]["steps"]]))
    rows = [("step", "cold s", "warm s")]
    rows += [(n, f"{q['cold']['steps'].get(n, 0):.0f}", f"{q['warm']['steps'].get(n, 0):.0f}") for n in names]

    def verdict(r):
        met = "met" if r["seconds"] <= r["target_s"] else "NOT met"
        runs = r.get("runs_s")
        of = f", the median of {len(runs)} runs: {', '.join(f'{x:.0f}' for x in runs)} s" if runs else ""
        return f"{r['seconds']:.0f} s (target <= {r['target_s']} s: {met}{of})"

    return [
        "## Quick start: cold and warm",
        "",
        f"`make quickstart` in a fresh clone (commit {q['commit']}) against a second Docker daemon with an "
        "empty data root and empty project, uv and pip caches (`gemma4_images/quickstart_time.py`), then the "
        "same command again (warm; the table's warm column is the median run): the Debian packages and the "
        "local torch wheel folder are what this machine kind has anyway. "
        f"Cold: {verdict(q['cold'])}; warm: {verdict(q['warm'])}.",
        "",
        harness._markdown([*rows, ("total", f"{q['cold']['seconds']:.0f}", f"{q['warm']['seconds']:.0f}")]),
        "",
    ]


def render(
    build: dict | None,
    serving: dict | None,
    timings: dict,
    startup: dict | None = None,
    load: dict | None = None,
    quickstart: dict | None = None,
    standins: dict | None = None,
) -> str:
    from . import standin_bench

    out = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`gemma4_images/bench.py`); do not edit. Every ratio is against a "
        "baseline measured in the same run: these machines are noisy, so absolute seconds are for "
        "reading, not for comparing across runs.",
        "",
    ]
    if build:
        out += [
            "## Build system",
            "",
            f"Target `{TARGET}` (Dockerfile.cpu) on `{build['base']}`, built from a temporary copy of the "
            f"build context with the tiny model's tokenizer. Cold = every step of Dockerfile.cpu rebuilt "
            f"(`nocache`); the base itself is not rebuilt (it is a separate build, "
            f"`python build.py base cpu`). Steps count every instruction after FROM; layers count "
            f"COPY/ADD/RUN.",
            "",
            scenario_table([Scenario(**s) for s in build["scenarios"]]),
            "",
        ]
        if build.get("base_cold_s"):
            whole = build["base_cold_s"] + build["cold_s"]
            out += [
                f"Against a cold build that includes the local base ({build['base_cold_s']:.0f} s + "
                f"{build['cold_s']:.1f} s): "
                + ", ".join(f"{s['name']} {s['seconds'] / whole:.1%}" for s in build["scenarios"][1:])
                + ".",
                "",
            ]
        out += ["Where the time went (slowest rebuilt steps):", ""]
        out += [f"- {s['name']}: {'; '.join(s['slowest']) or '-'}" for s in build["scenarios"]]
        out.append("")
        for s in build["scenarios"][1:]:
            if s["why"]:
                out.append(
                    f"- {s['name']}: first rebuilt `{s['first_rebuilt']}` because {s['why']}"
                    + ("" if s["layers_ok"] else " **(regression: the wrong layer was rebuilt)**")
                    + (
                        ""
                        if s["time_ok"]
                        else f"; it took {s['ratio']:.1%} of the cold build, over the {PATCH_MAX_RATIO:.0%} target"
                    )
                )
        sz = build["size"]
        mib = lambda b: f"{b / 2**20:,.2f} MiB"  # noqa: E731
        out += [
            "",
            "### What the image adds",
            "",
            f"Image {mib(sz['image'])} - base {mib(sz['base'])} = **{mib(sz['delta'])}**; bytes the "
            f"Dockerfile adds: **{mib(sz['added'])}**; overhead {sz['overhead']:,} bytes "
            f"({sz['overhead_pct']:.2f}% of added; target <= 1%: {'met' if sz['ok'] else 'NOT met'}).",
            "",
            harness._markdown([("added", "bytes"), *[(k, f"{v:,}") for k, v in sz["parts"].items()]]),
            "",
            "Per layer (from the image history, non-empty layers of ours):",
            "",
            harness._markdown([("step", "bytes"), *[(f"`{x['step']}`", f"{x['bytes']:,}") for x in sz["layers"]]]),
            "",
        ]
    if quickstart:
        out += quickstart_section(quickstart)
    if standins:
        out += standin_bench.section(standins)
    if startup:
        out += startup_section(startup)
    if load:
        out += load_section(load)
    out += [
        "## Serving: the recipe's published figures",
        "",
        "From recipe 000 (Performance), single runs on one Gaudi 2 card, vllm-gaudi releases/v0.30.0 "
        "(058f107), vLLM ced6857a, Gaudi SW 1.24.1, prompt batch cap 1. `gemma4-bench offline` at its "
        "default sizes reproduces this table; only a Gaudi 2 can check these numbers. The last column is "
        "ours, from the tiny-model CPU run below at 5% of the recipe's sizes: it proves the harness runs, "
        "it says nothing about Gemma 4 E2B speed.",
        "",
        recipe_offline_table(serving and serving["offline"]),
        "",
        "Served (recipe 000, 1x Gaudi 2, 64 concurrent ~600-token prompts, two recorded rounds per mode):",
        "",
        harness.served_table({"modes": harness.RECIPE_SERVED}),
        "",
        f"Fast prefill correctness (recipe 000, Gaudi 2): {harness.RECIPE_CORRECTNESS}.",
        "",
    ]
    if serving:
        off, srv = serving["offline"], serving["served"]
        out += [
            "## Serving: this machine (CPU image, tiny trained model)",
            "",
            f"`{serving['image']}`, {timings.get('cpu', '2-core CPU')}; harness "
            + (
                "shipped in the image"
                if serving["harness_shipped"]
                else "mounted from image/gemma4_bench.py (the image predates it)"
            )
            + ". Tiny sizes, so the "
            "figures prove the harness runs end to end; at millisecond batch latencies the fast/stock "
            "ratios are noise and differ from run to run:",
            "",
            "```",
            "gemma4-bench " + " ".join(OFFLINE_TINY[:-2]),
            "gemma4-bench " + " ".join(SERVED_TINY).replace(" --json -", ""),
            "```",
            "",
            harness.offline_table(off),
            "",
            f"Fast prefill vs stock, greedy: {off.get('correctness', {}).get('summary', 'not run')}.",
            "",
            harness.served_table(srv),
            "",
        ]
        if srv.get("outputs"):
            o = srv["outputs"]
            out += [
                f"Served outputs, fast vs stock: first 40 characters {o['first_40_chars_identical']}/{o['n']}, "
                f"whole {o['identical']}/{o['n']}.",
                "",
            ]
    out += [
        "## How long `make bench` took here",
        "",
        harness._markdown([("part", "seconds"), *[(k, f"{v:.0f}") for k, v in timings.items() if k != "cpu"]]),
        "",
    ]
    return "\n".join(out)


def main(
    log=print,
    out: Path = OUT,
    build: bool = True,
    serving: bool = True,
    with_base: bool = False,
    startup: bool = True,
    load: bool = True,
    quickstart: bool = False,
    standins: bool = False,
) -> dict:
    from .docker_build import connect

    client = connect()
    owned.reap(client, log)
    m = matrix.load()
    results: dict = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    timings: dict = results.setdefault("timings", {})
    if build:
        t = time.monotonic()
        results["build"] = build_bench(client, log, m, with_base=with_base)
        timings["build benchmark (4 builds + size)"] = time.monotonic() - t
    if serving:
        t = time.monotonic()
        results["serving"] = serving_bench(client, log, m)
        timings["offline harness, tiny sizes, both modes"] = results["serving"]["offline_s"]
        timings["served harness, tiny sizes, both modes"] = results["serving"]["served_s"]
        timings["serving benchmark total"] = time.monotonic() - t
    if startup:
        t = time.monotonic()
        results["startup"] = startup_bench(client, log, m)
        timings[f"start-up benchmark ({STARTUP_ROUNDS} rounds x 2)"] = time.monotonic() - t
    if load:
        t = time.monotonic()
        results["load"] = load_bench(client, log, m)
        timings["load, faults and stop benchmark"] = time.monotonic() - t
    if quickstart:
        from . import quickstart_time

        t = time.monotonic()
        results["quickstart"] = quickstart_time.measure(log)
        timings["quick start, cold then warm"] = time.monotonic() - t
    if standins:
        from . import standin_bench

        t = time.monotonic()
        results["standins"] = standin_bench.measure(client, m, log, str(tiny_model.ensure()))
        timings["stand-ins, no-cache base and image builds"] = time.monotonic() - t
    timings["cpu"] = f"{__import__('os').cpu_count()} cores"
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    out.write_text(render_results(json.loads(RESULTS.read_text())))
    if build and results.get("build"):
        log(scenario_table([Scenario(**s) for s in results["build"]["scenarios"]]))
    log(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
