"""`docker stop` while requests are in flight and vLLM's engine cannot answer: the scenario of the
shutdown-ends-requests fix, shared by its test on the CPU image (tests/integration/test_runtime_cpu.py)
and its negative control on the image without the pack (tests/integration/test_smoke_cpu.py).

On SIGTERM vLLM 0.30.0's API server asks its engine to abort the requests and kills the engine
process at once (abort mode, shutdown timeout 0: vllm/v1/utils.py shutdown()). What then reaches
the open requests is a race: the aborts (streams end cleanly), the engine's death ("EngineCore
encountered an issue"), or nothing, and uvicorn waits for their connections until SIGKILL. Here,
unpatched and left to the race, most stops hung and one CI run exited 0 1.3 s in. Stopping the
engine core (SIGSTOP) first, as an engine stuck in a long step would be, takes the clean abort out
of the race: unpatched, a stop then either hangs or ends the requests with the engine's death, on
every run; patched, each request ends with the fix's 503."""

from __future__ import annotations

import time

from gemma4_images.check import running, traffic

SHUTDOWN_503 = "the server is shutting down"  # the message the fix ends requests with


def engine_core_pid(container) -> int:
    table = running.processes(container)
    pids = [pid for pid, _, comm in table if comm.startswith("VLLM::EngineCor")]
    assert len(pids) == 1, f"not one vLLM engine core process: {table}"
    return pids[0]


def stop_with_engine_stuck(container, url: str, model: str, streams: int, plain: int, stop_timeout: int):
    """Traffic of streams + plain long requests; once all are running, SIGSTOP the engine core and
    `docker stop -t stop_timeout`. Returns (timing, load): timing has running (the metric when the
    engine was stopped) and stop_s."""
    timing = {}

    def stop():
        timing["running"] = traffic.wait_for_metric(url, "vllm:num_requests_running", streams + plain)
        pid = engine_core_pid(container)
        assert container.exec_run(["sh", "-c", f"kill -STOP {pid}"], user="2000").exit_code == 0
        start = time.monotonic()
        container.stop(timeout=stop_timeout)
        timing["stop_s"] = time.monotonic() - start

    load = traffic.run(url, model, streams=streams, plain=plain, max_tokens=3000, timeout=60, during=stop)
    container.reload()
    assert timing["running"] == streams + plain, f"not every request was running when the engine stopped: {timing}"
    return timing, load


def unclean_stop(container, timing: dict, load: traffic.Load, stop_timeout: int) -> list[str]:
    """What keeps the stop from being the fix's: exit 0 within the timeout, every stream ended with
    the 503 error event and [DONE], every plain request with a 503. Empty when it is."""
    problems = []
    code = container.attrs["State"]["ExitCode"]
    if code != 0 or timing["stop_s"] >= stop_timeout:
        problems.append(f"exit {code} after {timing['stop_s']:.1f} s (stop timeout {stop_timeout} s)")
    for o in load.outcomes:
        if o.kind == "stream" and not (o.status == 200 and o.done and o.error_event == SHUTDOWN_503):
            problems.append(f"stream: status {o.status}, [DONE] {o.done}, error event {o.error_event!r}, {o.error}")
        if o.kind == "plain" and o.status != 503:
            problems.append(f"plain request: status {o.status}, {o.error}")
    return problems
