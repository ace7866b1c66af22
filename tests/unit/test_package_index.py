"""What the build host reads from the package index and from vLLM's source archive, asked of a fake
index on 127.0.0.1: an index that cannot be read, answers something else or never answers is one
line in seconds (`bump --check`, `bump`); `bump` opens the new release's source archive and shows
how the chat template changed; `stage` names the archive and the member it lacks."""

import hashlib
import http.server
import io
import json
import os
import socket
import subprocess
import tarfile
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
TEMPLATE = "examples/tool_chat_template_gemma4.jinja"
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
        pypi.index_timeout()


# -- the chat template: vLLM's source archive --------------------------------------------------------


def sdist(version: str, files: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for rel, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"vllm-{version}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def vllm_releases(index, archives: dict[str, bytes]):
    """The vllm project's page listing each archive, and a matrix of 0.30.0 that takes its template
    from the first."""
    files = []
    for version, data in archives.items():
        name = f"vllm-{version}.tar.gz"
        index.pages[f"/files/{name}"] = ("application/octet-stream", data)
        files.append({"filename": name, "url": f"{index.url}/files/{name}", "hashes": {"sha256": sha(data)}})
    index.pages["/simple/vllm/"] = page("vllm", files, list(archives))
    old = next(iter(archives))
    src = SimpleNamespace(
        sdist=f"vllm-{old}.tar.gz", sdist_sha256=files[0]["hashes"]["sha256"], member=f"vllm-{old}/{TEMPLATE}"
    )
    return SimpleNamespace(upstream_files={TEMPLATE: src})


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bump_shows_how_the_chat_template_changed(index, capsys):
    m = vllm_releases(
        index,
        {
            "0.30.0": sdist("0.30.0", {TEMPLATE: "{{ bos_token }}\n{# tools #}\n"}),
            "0.40.0": sdist("0.40.0", {TEMPLATE: "{{ bos_token }}\n{# tools, strict #}\n"}),
        },
    )
    p = bump.Plan("0.40.0", "0.30.0", [], [], {})
    bump._upstream(p, m)
    said = capsys.readouterr().out
    assert f"upstream file {TEMPLATE} changed from vLLM 0.30.0 to 0.40.0" in said
    assert "  -{# tools #}" in said and "  +{# tools, strict #}" in said
    assert p.release["upstream_files"][TEMPLATE]["member"] == f"vllm-0.40.0/{TEMPLATE}"
    assert (f"upstream {TEMPLATE}", "vllm-0.30.0.tar.gz", "vllm-0.40.0.tar.gz (changed: diff above)") in p.changes


def test_bump_refuses_a_release_whose_archive_lacks_the_chat_template(index):
    m = vllm_releases(
        index,
        {
            "0.30.0": sdist("0.30.0", {TEMPLATE: "{{ bos_token }}\n"}),
            "0.40.0": sdist("0.40.0", {f"examples/templates/{TEMPLATE.split('/')[-1]}": "{{ bos_token }}\n"}),
        },
    )
    with pytest.raises(bump.BumpError) as refused:
        bump._upstream(bump.Plan("0.40.0", "0.30.0", [], [], {}), m)
    assert str(refused.value).startswith(f"vllm-0.40.0.tar.gz holds no file vllm-0.40.0/{TEMPLATE}, where ")


def test_stage_names_the_archive_and_the_member_it_lacks(tmp_path, monkeypatch):
    monkeypatch.setenv("GEMMA4_CACHE", str(tmp_path / "cache"))
    data = sdist("0.30.0", {"examples/other.jinja": ""})
    (tmp_path / "cache" / "sdists").mkdir(parents=True)
    (tmp_path / "cache" / "sdists" / "vllm-0.30.0.tar.gz").write_bytes(data)
    member = f"vllm-0.30.0/{TEMPLATE}"
    m = SimpleNamespace(
        upstream_files={TEMPLATE: SimpleNamespace(sdist="vllm-0.30.0.tar.gz", sdist_sha256=sha(data), member=member)}
    )
    with pytest.raises(upstream.UpstreamError) as refused:
        pypi.stage(m, tmp_path / "stage")
    assert str(refused.value).startswith(f"vllm-0.30.0.tar.gz holds no file {member} (upstream file {TEMPLATE}): ")
    assert not (tmp_path / "stage" / TEMPLATE).exists()
