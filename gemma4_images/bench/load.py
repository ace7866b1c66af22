"""Load, client faults and a stop during traffic, on one served CPU image."""

from __future__ import annotations

import time

from gemma4_images.bench.figures import TARGET, ratio
from gemma4_images.spec import matrix
from gemma4_images.spec.image_code import gemma4_bench as harness
from testkit import trained


def load_bench(log, m: matrix.Matrix, image: str | None = None, rounds: int = 3) -> dict:
    """The recipe's 64 concurrent streams plus 16 plain requests against one server, `rounds` times,
    against a single request measured in the same run; then hang-ups and a stop during traffic."""
    from gemma4_images.check import running, server, traffic

    image = image or m.tiny_tag(TARGET)
    # The CPU tier as targets.yaml runs it (the smoke's launch), with the tiny trained model.
    with server.serve(m, TARGET, image, str(trained.ensure())) as srv:
        url, served, container = srv.url, srv.served, srv.container
        traffic.run(url, served, **traffic.WARM_UP)
        alone = [traffic.run(url, served, **traffic.ALONE).latencies()[0] for _ in range(rounds)]
        rss_idle = running.rss_bytes(container)
        loads = [traffic.run(url, served, **traffic.RECIPE_LOAD) for _ in range(rounds)]
        rss_loaded = running.rss_bytes(container)
        faults = traffic.run(url, served, **traffic.HANG_UPS)
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
