"""BENCHMARKS.md, rendered from benchmarks.json (every part's figures from its last run)."""

from __future__ import annotations

from gemma4_images.bench.figures import PATCH_MAX_RATIO, TARGET, Scenario, scenario_table
from gemma4_images.bench.fullsize import section as fullsize_section
from gemma4_images.bench.harness import OFFLINE_TINY, SERVED_TINY
from gemma4_images.bench.load import load_section
from gemma4_images.bench.model_image_fullsize import section as model_image_section
from gemma4_images.bench.pod import section as pod_section
from gemma4_images.bench.quickstart import quickstart_section
from gemma4_images.bench.releases import section as releases_section
from gemma4_images.bench.standins import section as standins_section
from gemma4_images.bench.startup import startup_section
from gemma4_images.bench.tests_time import section as tests_section
from gemma4_images.spec.image_code import gemma4_bench as harness


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


def render_results(results: dict) -> str:
    return render(
        results.get("build"),
        results.get("serving"),
        results.get("timings", {}),
        results.get("startup"),
        results.get("load"),
        results.get("quickstart"),
        results.get("standins"),
        results.get("tests"),
        results.get("arm64"),
        results.get("releases"),
        results.get("pod"),
        results.get("fullsize"),
        results.get("model_image"),
    )


def build_section(build: dict) -> list[str]:
    """The rebuild scenarios, where their time went, and what the image adds."""
    out = [
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
    return out


def recipe_section(serving: dict | None) -> list[str]:
    """The recipe's own published figures, with ours beside them where the tiny run has some."""
    return [
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


def serving_section(serving: dict, timings: dict) -> list[str]:
    """The serving harness run here: the CPU image and the tiny trained model."""
    out = []
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
    return out


UP_TO_DATE_S = 10  # a build step shorter than this rebuilt nothing (the engine only checked its cache)


def arm64_section(record: dict) -> list[str]:
    """The linux/arm64 tier's figures under qemu (tests/platform-tier.json, written by `make
    test-arm64` when it passes), against the amd64 image's full smoke in the same run."""
    f = record["figures"]
    cuda = "cuda_base_s" in f  # recorded by the tiers that build the arm64 CUDA image

    def build(seconds: float) -> str:
        # A run that found every layer built says so rather than giving a build time of seconds.
        return f"{seconds:.0f} s" if seconds >= UP_TO_DATE_S else f"{seconds:.0f} s (up to date: nothing rebuilt)"

    def compared(what: str, arm: float, amd: float) -> tuple[str, str, str, str]:
        return (what, f"{arm:.0f} s", f"{amd:.0f} s", f"{arm / amd:.1f}x")

    cuda_rows = (
        [
            (
                "b300 CUDA stand-in base build (root filesystem and wheelhouse cached)",
                build(f["cuda_base_s"]),
                "-",
                "-",
            ),
            (
                "b300 tiny image build (audio extras, fixes, self-check and launch check)",
                build(f["cuda_image_build_s"]),
                "-",
                "-",
            ),
        ]
        if cuda
        else []
    )
    rows = [
        ("step", "arm64 under qemu", "amd64 natively", "ratio"),
        ("stand-in base build (root filesystem and wheelhouse cached)", build(f["base_s"]), "-", "-"),
        ("xeon6 tiny image build", build(f["image_build_s"]), "-", "-"),
        *cuda_rows,
        compared("start-up to /health", f["seconds_to_healthy"], f["amd64_seconds_to_healthy"]),
        compared("`build.py smoke cpu --tiny`: start, every check, stop", f["smoke_s"], f["amd64_smoke_s"]),
        ("push both platforms as one signed index (loopback registry)", f"{f['push_both_s']:.0f} s", "-", "-"),
        ("pull by the index digest (layers here)", f"{f['pull_arm64_s']:.1f} s", f"{f['pull_amd64_s']:.1f} s", "-"),
    ]
    return [
        "## linux/arm64 under qemu",
        "",
        f"`make test-arm64` (tests/integration/test_arm64.py) at commit {record['passed_at_commit']}: the arm64 CPU "
        f"stand-in ({f['base_gb']:.2f} GB) and the xeon6 tiny image ({f['image_gb']:.2f} GB) built and smoke-tested "
        "under qemu 10 on this x86_64 machine (every check of the full smoke, the tiny model's scripted answers "
        "exact), then pushed with the amd64 image as one signed index and pulled back by its digest for each "
        "platform; the amd64 column is the amd64 image's full smoke in the same run"
        + (
            f". The b300 image for arm64 built on its CUDA stand-in ({f['cuda_base_gb']:.2f} GB: PyPI's aarch64 "
            f"vllm 0.30.0 and CUDA 13.0 torch), {f['cuda_image_gb']:.2f} GB, nothing run on a GPU"
            if cuda
            else ""
        )
        + ". Emulation speed says nothing of an Arm server's.",
        "",
        harness._markdown(rows),
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
    tests: dict | None = None,
    arm64: dict | None = None,
    releases: dict | None = None,
    pod: dict | None = None,
    fullsize: dict | None = None,
    model_image: dict | None = None,
) -> str:
    """BENCHMARKS.md: each part that has figures, in the page's order."""
    out = [
        "# Benchmarks",
        "",
        "Generated by `make bench` (`gemma4_images/bench/`); do not edit. Every ratio is against a "
        "baseline measured in the same run: these machines are noisy, so absolute seconds are for "
        "reading, not for comparing across runs.",
        "",
    ]
    parts = [
        (build, build_section),
        (quickstart, quickstart_section),
        (standins, standins_section),
        (tests, tests_section),
        (arm64, arm64_section),
        (startup, startup_section),
        (load, load_section),
        (pod, pod_section),
        (fullsize, fullsize_section),
        (model_image, model_image_section),
        (releases, releases_section),
    ]
    out += [line for figures, section in parts if figures for line in section(figures)]
    out += recipe_section(serving)
    if serving:
        out += serving_section(serving, timings)
    out += [
        "## How long `make bench` took here",
        "",
        harness._markdown([("part", "seconds"), *[(k, f"{v:.0f}") for k, v in timings.items() if k != "cpu"]]),
        "",
    ]
    return "\n".join(out)
