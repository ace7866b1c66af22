"""The metric an autoscaler scales vLLM replicas on (vllm:num_requests_waiting, as vLLM's
production-stack does with KEDA) moves as it must: the CPU image served with --max-num-seqs 2 and
driven past it, /metrics read throughout. Waiting rises while running stays at the cap, and both
fall back to 0 once the requests end."""

from __future__ import annotations

import threading
import time

import pytest

from gemma4_images.check import server, traffic
from testkit import trained

pytestmark = pytest.mark.integration

CAP = 2  # --max-num-seqs: how many requests the engine runs at once
REQUESTS = 16


def test_waiting_requests_rise_past_the_cap_and_fall_back(m, cpu_image, no_new_containers):
    samples: list[tuple[float, float, float]] = []
    done = threading.Event()
    with server.serve(m, "xeon6", cpu_image, str(trained.ensure()), extra_args=["--max-num-seqs", str(CAP)]) as srv:
        traffic.run(srv.url, srv.served, **traffic.WARM_UP)

        def sample():
            while not done.is_set():
                waiting = traffic.metric(srv.url, "vllm:num_requests_waiting")
                running = traffic.metric(srv.url, "vllm:num_requests_running")
                samples.append((time.monotonic(), waiting, running))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            load = traffic.run(srv.url, srv.served, streams=REQUESTS, plain=0, max_tokens=64)
        finally:
            done.set()
            sampler.join()
        after = (
            traffic.wait_for_metric(srv.url, "vllm:num_requests_waiting", 0.0, budget=30),
            traffic.wait_for_metric(srv.url, "vllm:num_requests_running", 0.0, budget=30),
        )
    assert all(o.done for o in load.outcomes), [o for o in load.outcomes if not o.done]
    peak_waiting = max(w for _, w, _ in samples)
    peak_running = max(r for _, _, r in samples)
    print(f"peak waiting {peak_waiting:.0f}, peak running {peak_running:.0f}, {len(samples)} samples")
    assert peak_running == CAP  # the engine ran as many as it may, no more
    assert peak_waiting >= REQUESTS - CAP - 2  # the rest queued (a request or two may still be arriving)
    assert after == (0.0, 0.0)
