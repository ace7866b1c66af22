"""What the build host reads from the package index, asked of a fake index on 127.0.0.1: an index
that cannot be read, answers something else or never answers is one line in seconds (`bump --check`,
`bump`)."""

import http.server
import json
import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from gemma4_images import cli
from gemma4_images.build import bump, pypi
from gemma4_images.spec import matrix, upstream
from tests.cli import ROOT, command

JSON_API = "application/vnd.pypi.simple.v1+json"
DISTRIBUTIONS = sorted({d for f in matrix.load().families.values() for d in f.pypi} | {"transformers"})


def page(name: str, files=(), versions=()) -> tuple[str, bytes]:
    return JSON_API, json.dumps({"meta": {"api-version": "1.1"}, "name": name, "files": files, "versions": versions})


@pytest.fixture
def index(tmp_path, monkeypatch):
    """pages: path -> (content type, body), or None for a page that never answers."""
    pages, done = {}, threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path not in pages:
                self.send_error(404)
                return
            if pages[self.path] is None:
                done.wait(60)  # no answer while the test runs
                return
            kind, body = pages[self.path]
            body = body.encode() if isinstance(body, str) else body
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    env = {
        "PIP_INDEX_URL": f"{url}/simple",
        "GEMMA4_INDEX_TIMEOUT": "1",
        "GEMMA4_CACHE": str(tmp_path / "cache"),
    }
    for var in [v for v in os.environ if "proxy" in v.lower()]:  # the index is on loopback
        monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    pypi.project.cache_clear()
    yield SimpleNamespace(url=url, pages=pages)
    done.set()
    server.shutdown()
    server.server_close()
    pypi.project.cache_clear()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_hashes(name):
    return page(name, [{"filename": f"{name}-0.40.0.tar.gz", "url": "x"}], ["0.40.0"])


# (what the index does to every distribution's page, what the one line says)
BROKEN = {
    "unreachable": (None, "Connection refused"),
    "not JSON": (lambda name: ("text/html", "<html>simple</html>"), "it answered text/html, not a JSON object"),
    "JSON, not an object": (lambda name: (JSON_API, "[]"), "not the JSON simple API (PEP 691)"),
    "no release": (page, "has no release on the package index"),
    "files without hashes": (no_hashes, "has no `hashes` dict"),
    "never answers": (lambda name: None, "timed out in 1 s (GEMMA4_INDEX_TIMEOUT sets how long to wait)"),
}


def serve_broken(index, monkeypatch, case):
    make, says = BROKEN[case]
    if make is None:
        monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{closed_port()}/simple")
    for name in DISTRIBUTIONS:
        index.pages[f"/simple/{name}/"] = make(name) if make else None
    return says


@pytest.mark.parametrize("case", BROKEN)
def test_bump_check_with_a_broken_index_is_one_line_in_seconds(index, monkeypatch, case):
    says = serve_broken(index, monkeypatch, case)
    start = time.monotonic()
    r = subprocess.run(command("bump", "--check"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line, line
    assert took < 15, f"{took:.0f} s"  # one timeout of 1 s, not 120 s per distribution


@pytest.mark.parametrize("case", BROKEN)
def test_bump_with_a_broken_index_is_one_line_and_changes_nothing(index, monkeypatch, case):
    says = serve_broken(index, monkeypatch, case)
    # In this process, so that the checkout's own uncommitted files (a refusal of their own) do not count.
    monkeypatch.setattr(bump, "uncommitted", lambda: [])
    start = time.monotonic()
    r = CliRunner().invoke(cli.cli, ["bump", "cpu", "--vllm", "0.40.0"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.exception  # no other exception
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and says in line and line.endswith("; nothing was changed"), line
    assert time.monotonic() - start < 15


def test_a_timeout_that_is_not_a_number_of_seconds_is_one_line(monkeypatch):
    monkeypatch.setenv("GEMMA4_INDEX_TIMEOUT", "soon")
    with pytest.raises(upstream.UpstreamError, match="GEMMA4_INDEX_TIMEOUT='soon': give the seconds"):
        upstream.index_timeout()
