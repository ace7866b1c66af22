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

import json
import os
import time
from pathlib import Path

from gemma4_images.bench.figures import OUT, RESULTS, TARGET, Scenario, scenario_table
from gemma4_images.bench.harness import serving_bench
from gemma4_images.bench.load import load_bench
from gemma4_images.bench.rebuild import build_bench
from gemma4_images.bench.report import render_results
from gemma4_images.bench.standins import measure as measure_standins
from gemma4_images.bench.startup import STARTUP_ROUNDS, startup_bench
from gemma4_images.build import owned
from gemma4_images.spec import matrix
from testkit import tiny_model


def main(
    log=print,
    out: Path = OUT,
    build: bool = True,
    serving: bool = True,
    with_base: bool = False,
    startup: bool = True,
    load: bool = True,
    pod: bool = True,
    quickstart: bool = False,
    standins: bool = False,
    tests: bool = False,
    tests_fresh: bool = False,
    releases: bool = False,
    fullsize: bool = False,
    model_image: bool = False,
) -> dict:
    from gemma4_images.build.docker_build import OFFLINE, connect

    # Every figure is of local images (the stand-in bases): no registry is asked for a vendor base,
    # as the tests do (tests/conftest.py), unless the caller says otherwise.
    os.environ.setdefault(OFFLINE, "1")
    client = connect()
    owned.reap(client, log)
    m = matrix.load_default(TARGET)  # the CPU default, as `build.py build cpu` builds it
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
        results["load"] = load_bench(log, m)
        timings["load, faults and stop benchmark"] = time.monotonic() - t
    if pod:
        from gemma4_images.bench.pod import pod_bench

        t = time.monotonic()
        results["pod"] = pod_bench(log, m)
        timings["pod: memory at two KV sizes, start-up with the compile cache"] = time.monotonic() - t
    if quickstart:
        from gemma4_images.bench import quickstart

        t = time.monotonic()
        results["quickstart"] = quickstart.measure(log)
        timings["quick start, cold then warm"] = time.monotonic() - t
    if standins:
        t = time.monotonic()
        results["standins"] = measure_standins(client, m, log, str(tiny_model.ensure()))
        timings["stand-ins, no-cache base and image builds"] = time.monotonic() - t
    if fullsize:
        from gemma4_images.bench.fullsize import fullsize_bench

        t = time.monotonic()
        results["fullsize"] = fullsize_bench(client, log, m)
        timings["E2B's shape at full size: two starts, load, fast prefill"] = time.monotonic() - t
    if model_image:
        from gemma4_images.bench import model_image_fullsize

        t = time.monotonic()
        results["model_image"] = model_image_fullsize.measure(client, log, m)
        timings["E2B's shape as a model image: build, push, pull, volume, serve"] = time.monotonic() - t
    if releases:
        from gemma4_images.bench.releases import releases_bench

        t = time.monotonic()
        results["releases"] = releases_bench(client, log)
        timings["vLLM releases, start-up and load each"] = time.monotonic() - t
    if tests:
        from gemma4_images.bench import tests_time

        t = time.monotonic()
        results["tests"] = {**tests_time.measure(log), "fresh": (results.get("tests") or {}).get("fresh")}
        timings["make test, two lanes then one"] = time.monotonic() - t
    if tests_fresh:
        from gemma4_images.bench import tests_time

        t = time.monotonic()
        results.setdefault("tests", {})["fresh"] = tests_time.measure_fresh(client, log)
        timings["make test from an empty build cache"] = time.monotonic() - t
    timings["cpu"] = f"{os.cpu_count()} cores"
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    out.write_text(render_results(json.loads(RESULTS.read_text())))
    if build and results.get("build"):
        log(scenario_table([Scenario(**s) for s in results["build"]["scenarios"]]))
    log(f"wrote {out}")
    return results


if __name__ == "__main__":
    main()
