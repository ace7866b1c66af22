"""The build benchmark: the CPU target built from a temporary copy of the build context (as
tests/integration/test_layer_cache.py does), so edits never touch the repository: cold build
(nocache), no-change rebuild, one patch file edited, one entrypoint line edited. Each reports steps
and layers rebuilt, seconds and the ratio to the cold build measured in the same run; a rebuild that
misses its target names the first step rebuilt and which COPY source or ARG changed. Then image
size minus base size against the bytes the Dockerfile adds."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from gemma4_images.bench.figures import (
    BASE_BENCH_TAG,
    BENCH_TAG,
    CONTEXT_ITEMS,
    PATCH_MAX_RATIO,
    TARGET,
    Scenario,
    Step,
    judge,
    parse_steps,
    ratio,
    rebuilt,
    size_verdict,
    slowest,
    step_label,
    why_rebuilt,
)
from gemma4_images.build import images, localbase, probe
from gemma4_images.spec import matrix
from gemma4_images.spec.matrix import ROOT
from testkit import tiny_model


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

        size = image_size(client, m, base, ctx)
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


def image_size(client, m: matrix.Matrix, base: str, ctx: Path) -> dict:
    """Image minus base against the bytes the Dockerfile adds: copied files, and the files the
    fixes rewrote plus the records the RUN steps write (read back from the image)."""
    img, base_img = client.images.get(BENCH_TAG), client.images.get(base)
    copied = {
        "entrypoint (image/gemma4_serve.py)": _dir_bytes(ctx / "image" / "gemma4_serve.py"),
        "upstream files (.build/upstream/examples/)": _dir_bytes(ctx / ".build" / "upstream" / "examples"),
        f"tokenizer copy (.build/tokenizer/{TARGET}/)": _dir_bytes(ctx / ".build" / "tokenizer" / TARGET),
        "fixes pack (patches/)": _dir_bytes(ctx / "patches"),
        "recipe (recipe.json)": _dir_bytes(ctx / m.recipe_file(TARGET)),
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
    inside = probe.python(client, BENCH_TAG, script)
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

    before, after = probe.python(client, base, DIST_BYTES), probe.python(client, image, DIST_BYTES)
    return {name: size for name, size in after.items() if name not in before}
