"""Concurrent traffic against a running server, for the load and fault tests and `make bench`:
streaming and plain chat requests at once, some streaming clients hanging up mid-stream, each
request's status, latency and how its stream ended, and what the server's /metrics says.
Standard library only; loopback only."""

from __future__ import annotations

import http.client
import json
import re
import statistics
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field


@dataclass
class Outcome:
    kind: str  # stream | plain | disconnect
    status: int | None = None
    seconds: float = 0.0
    chunks: int = 0
    done: bool = False  # a stream ended with data: [DONE]
    error_event: str = ""  # the error a stream ended with, if any
    error: str = ""  # what went wrong on our side (connection, timeout)


@dataclass
class Load:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0

    def of(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    def latencies(self, kind: str | None = None) -> list[float]:
        return sorted(o.seconds for o in self.outcomes if o.status == 200 and kind in (None, o.kind))

    def summary(self) -> dict:
        lat = self.latencies()
        return {
            "requests": len(self.outcomes),
            "seconds": round(self.seconds, 2),
            "ok": sum(o.status == 200 and (o.kind != "stream" or o.done) for o in self.outcomes),
            "p50_s": round(percentile(lat, 50), 3) if lat else None,
            "p99_s": round(percentile(lat, 99), 3) if lat else None,
        }


# The scenarios the load benchmark measures and the runtime tests check, in one place (run's
# keyword arguments). WARM_UP first: the CPU sampler compiles on its first requests.
WARM_UP = {"streams": 2, "plain": 0}
ALONE = {"streams": 1, "plain": 0}
RECIPE_LOAD = {"streams": 64, "plain": 16}  # the recipe's --max-num-seqs 64, plus plain requests beside
HANG_UPS = {"streams": 16, "plain": 4, "hang_ups": 4, "max_tokens": 200}  # 4 clients leave mid-stream


def percentile(values: list[float], p: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, int(p) - 1))]


def chat_body(model: str, max_tokens: int, stream: bool, text: str = "Say hello.") -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
        "temperature": 0,
    }


def one_request(url: str, body: dict, kind: str, timeout: float, hang_up_after: int = 0) -> Outcome:
    """POST /v1/chat/completions; a stream is read event by event (hang_up_after > 0: the client
    closes the connection after that many events, as a client that goes away does)."""
    out, start = Outcome(kind), time.monotonic()
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        out.status = resp.status
        if not body.get("stream"):
            resp.read()
        else:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    out.done = True
                    break
                out.chunks += 1
                if '"error"' in data:
                    out.error_event = json.loads(data).get("error", {}).get("message", data)
                if hang_up_after and out.chunks >= hang_up_after:
                    break
    except (OSError, http.client.HTTPException) as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        out.seconds = time.monotonic() - start
    return out


def run(
    url: str,
    model: str,
    streams: int = 64,
    plain: int = 16,
    hang_ups: int = 0,
    max_tokens: int = 24,
    timeout: float = 600,
    during=None,
) -> Load:
    """streams + plain requests at once (hang_ups of the streams leave after two events); returns
    when every request has ended. during(): called once all requests are started (e.g. docker stop)."""
    load, threads, lock = Load(), [], threading.Lock()

    def go(kind, body, hang_up_after=0):
        outcome = one_request(url, body, kind, timeout, hang_up_after)
        with lock:
            load.outcomes.append(outcome)

    start = time.monotonic()
    for i in range(streams):
        kind = "disconnect" if i < hang_ups else "stream"
        threads.append(
            threading.Thread(target=go, args=(kind, chat_body(model, max_tokens, True), 2 if i < hang_ups else 0))
        )
    for _ in range(plain):
        threads.append(threading.Thread(target=go, args=("plain", chat_body(model, max_tokens, False))))
    for t in threads:
        t.start()
    if during:
        during()
    for t in threads:
        t.join()
    load.seconds = time.monotonic() - start
    return load


def metric(url: str, name: str) -> float | None:
    """The sum of a Prometheus metric's samples on /metrics (e.g. vllm:num_requests_running)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M)]
    return sum(values) if values else None


def wait_for_metric(url: str, name: str, want: float, budget: float = 60) -> float | None:
    deadline, value = time.monotonic() + budget, None
    while time.monotonic() < deadline:
        value = metric(url, name)
        if value == want:
            return value
        time.sleep(0.5)
    return value
