"""vLLM releases side by side: the start-up and load benchmarks of the CPU image at every release
xeon6 is built on (each of releases/), in one run, each against the first."""

from __future__ import annotations

from gemma4_images.bench.figures import TARGET, ratio
from gemma4_images.bench.load import load_bench
from gemma4_images.bench.startup import STARTUP_ROUNDS, startup_bench
from gemma4_images.build.docker_build import local_image
from gemma4_images.spec import matrix
from gemma4_images.spec.image_code import gemma4_bench as harness


def releases_bench(client, log, rounds: int = STARTUP_ROUNDS) -> dict:
    """Each release's tiny CPU image (built beforehand: `build.py build xeon6 --vllm V --tiny`)."""
    versions = matrix.releases_of(TARGET)
    views = {v: matrix.load(vllm=v) for v in versions}
    missing = [v.tiny_tag(TARGET) for v in views.values() if local_image(client, v.tiny_tag(TARGET)) is None]
    if missing:
        how = "; ".join(f"`python build.py build {TARGET} --vllm {v} --tiny`" for v in versions)
        raise RuntimeError(f"no local image {', '.join(missing)}: build each release's first ({how})")
    out = {}
    for version, view in views.items():
        log(f"bench: vLLM {version}")
        out[version] = {"startup": startup_bench(client, log, view, rounds=rounds), "load": load_bench(log, view)}
    return {"baseline": versions[0], "releases": out}


def section(r: dict) -> list[str]:
    base = r["releases"][r["baseline"]]
    rows = [
        (
            "vLLM",
            "image",
            "start-up, ours (s)",
            "bare `vllm serve` (s)",
            "ours / bare",
            f"start-up / {r['baseline']}",
            "one request (s)",
            "64+16 p50 / one",
            "64+16 p99 / one",
            f"p50 / {r['baseline']}",
            "RSS idle, loaded (MiB)",
        )
    ]
    for version, fig in r["releases"].items():
        st, ld = fig["startup"], fig["load"]
        last = ld["rounds"][-1]
        rows.append(
            (
                version,
                f"`{ld['image']}`",
                f"{st['median']['ours']:.1f}",
                f"{st['median']['bare']:.1f}",
                f"{st['ratio']:.3f}",
                f"{ratio(st['median']['ours'], base['startup']['median']['ours']):.2f}x",
                f"{ld['single_s']:.3f}",
                f"{ratio(last['p50_s'], ld['single_s']):.1f}x",
                f"{ratio(last['p99_s'], ld['single_s']):.1f}x",
                f"{ratio(last['p50_s'], base['load']['rounds'][-1]['p50_s']):.2f}x",
                f"{ld['rss_idle'] / 2**20:,.0f}, {ld['rss_loaded'] / 2**20:,.0f}",
            )
        )
    return [
        "## vLLM releases side by side (CPU image, tiny model)",
        "",
        f"Every release `{TARGET}` is built on, measured in one run (`make bench` with `--releases`): the "
        "start-up benchmark (medians of alternating rounds against bare `vllm serve` on that release's own "
        "base) and the load benchmark (the last of its rounds: 64 streams and 16 plain requests at once, "
        f"against one request alone). Columns marked `/ {r['baseline']}` compare a release with the first "
        "in the same run; the tiny model on 2 cores says how each release's server and our layer behave, "
        "not how fast Gemma 4 E2B runs.",
        "",
        harness._markdown(rows),
        "",
    ]
