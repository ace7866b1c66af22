"""The model as an image, and no network at run time: the tiny trained model packed by
`build.py model-image`, pushed to a real registry, and served by the CPU tier from a volume filled
from that image while the serving container has no network at all (`--network none`), reached only
through `docker exec`. Every smoke check must pass there."""

import hashlib
import http.server
import io
import json
import os
import secrets
import shlex
import tarfile
import threading
import urllib.parse

import local_registry
import pytest
from docker.errors import NotFound
from test_no_secrets import places_holding

from gemma4_images.build import registry
from gemma4_images.check import server, smoke
from gemma4_images.publish import model_image
from testkit import exchanges, trained
from testkit.exec_forward import ExecForward
from tests.cli import build_py

pytestmark = pytest.mark.integration

MODEL_TAG = "gemma4-e2b-test/model:tiny"
VOLUME = "gemma4-e2b-test-model-tiny"


@pytest.fixture(scope="module")
def tiny_image(client):
    return model_image.build(client, str(trained.ensure()), name="tiny-gemma4-trained", tag=MODEL_TAG, log=print)


def image_files(client, ref: str, modes: dict | None = None) -> dict:
    """{path: bytes} of every file under /models in image ref (modes filled with each entry's)."""
    holder = client.containers.create(ref, command=["none"])
    try:
        stream, _ = holder.get_archive(model_image.MODELS_ROOT)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            members = tar.getmembers()
            if modes is not None:
                modes.update({t.name: t.mode for t in members})
            return {t.name: tar.extractfile(t).read() for t in members if t.isfile()}
    finally:
        holder.remove()


def test_model_image_holds_only_the_model_files(client, tiny_image):
    image = client.images.get(tiny_image.ref)
    assert len(image.attrs["RootFS"]["Layers"]) == 1 and image.attrs["Config"]["Cmd"] is None
    # The files, byte for byte, read back from the image itself.
    modes = {}
    files = image_files(client, tiny_image.ref, modes)
    folder = trained.ensure()
    prefix = "models/tiny-gemma4-trained/"
    assert files == {prefix + p.as_posix(): (folder / p).read_bytes() for p in model_image.model_files(folder)}
    assert all(mode & 0o004 for mode in modes.values())  # readable by the serving uid
    assert image.labels[model_image.LABELS["revision"]] == tiny_image.revision
    assert tiny_image.tag == "content-" + tiny_image.revision.split(":")[1][:12]


def test_cpu_tier_serves_the_model_image_with_no_network(client, m, cpu_image, tiny_image, no_new_containers):
    volume = model_image.docker_volume(client, tiny_image.ref, VOLUME)
    mount = lambda c: c.with_volume_mapping(volume, model_image.MODELS_ROOT, "ro").with_env(  # noqa: E731
        "GEMMA4_MODEL", tiny_image.path
    )
    try:
        # Not waited on by serve(): with no network, /health is reached through `docker exec` below.
        with server.serve(
            m,
            "xeon6",
            cpu_image,
            extra_args=["--served-model-name", m.project.model],
            network_mode="none",
            keep_compiles=False,
            wait=False,
            customize=mount,
        ) as srv:
            _serves_with_no_network(client, m, cpu_image, tiny_image, srv)
    finally:
        client.volumes.get(volume).remove(force=True)


def _serves_with_no_network(client, m, cpu_image, tiny_image, srv):
    wrapped = srv.container
    wrapped.reload()
    assert wrapped.attrs["HostConfig"]["NetworkMode"] == "none"
    # The model comes from the image's volume alone: no folder of this host is mounted.
    assert [(v["Type"], v["Destination"], v["RW"]) for v in wrapped.attrs["Mounts"]] == [
        ("volume", model_image.MODELS_ROOT, False)
    ]
    # Nothing outside the container can be reached from inside it: not the hub, not this host.
    probe = wrapped.exec_run(
        ["python3", "-c", "import socket; socket.create_connection(('huggingface.co', 443), timeout=5)"]
    )
    assert probe.exit_code != 0 and b"gaierror" in probe.output, probe.output[-300:]
    with ExecForward(wrapped.id, srv.port) as forward:
        seconds = server.wait_healthy(wrapped, forward.url, m.targets["xeon6"].startup_budget_s)
        print(f"healthy after {seconds:.1f}s with --network none")
        printed = srv.launch().strip().splitlines()
        # The entrypoint put the hub client offline, says so, and vLLM runs with it.
        assert printed[0].startswith("export HF_HUB_OFFLINE=1"), printed
        environ = wrapped.exec_run(["cat", "/proc/1/environ"]).output.split(b"\0")
        assert b"HF_HUB_OFFLINE=1" in environ
        launch = shlex.split(printed[-1])
        assert tiny_image.path in launch
        report = smoke.Report(target="xeon6", image=cpu_image, model=tiny_image.path)
        smoke.run_checks(client, m, "xeon6", cpu_image, srv, report, exchanges.EXCHANGES, url=forward.url)
        assert {c.name: c.status for c in report.checks} == {c.name: "pass" for c in report.checks}, report.table()
        assert [a[2] for a in report.answers if a[0] == "chat"] == ["Paris."]
        # vLLM's usage report is off in the server's own environment (the entrypoint's default).
        # Only the setting is checkable here: vLLM's CPU worker never reports (report_usage_stats
        # is called by the GPU and XPU workers, vllm/v1/worker/gpu_worker.py), seen here with
        # VLLM_NO_USAGE_STATS=0: no usage_stats.json is written either way.
        assert b"VLLM_NO_USAGE_STATS=1" in environ


def test_model_image_cli_builds_tags_by_content_and_pushes_with_a_digest(client, tmp_path):
    secret = "hf_" + secrets.token_hex(16)
    env = {**os.environ, "HF_TOKEN": secret, "HUGGING_FACE_HUB_TOKEN": secret}
    env["GEMMA4_REPORTS"] = str(tmp_path / "reports")  # pushed.json there, not in the checkout's reports/
    folder = trained.ensure()
    root = tmp_path / "registry"
    root.mkdir()
    tag = "gemma4-e2b-test/model:cli"
    try:
        client.images.remove(tag, force=True)
    except NotFound:
        pass
    with local_registry.registry(root, client) as host:
        r = build_py(
            "model-image",
            str(folder),
            "--name",
            "tiny-gemma4-trained",
            "--tag",
            tag,
            "--registry",
            host,
            env=env,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert secret not in r.stdout + r.stderr
        # The token was in the build's environment and is in no layer, history entry, label or env.
        assert places_holding(client, tag, secret) == []
        revision = client.images.get(tag).labels[model_image.LABELS["revision"]]
        [entry] = json.loads((tmp_path / "reports" / "pushed.json").read_text())
        assert entry["target"] == "model:tiny-gemma4-trained"
        assert entry["repository"] == f"{host}/models/tiny-gemma4-trained"
        assert entry["tags"] == [model_image.tag_for(revision)] and entry["digest"].startswith("sha256:")
        assert f"{entry['repository']}@{entry['digest']}" in r.stdout
        # The registry serves that digest for that tag; a second run pushes nothing.
        assert registry.digest_of(f"{entry['repository']}:{entry['tags'][0]}") == entry["digest"]
        again = build_py(
            "model-image", str(folder), "--name", "tiny-gemma4-trained", "--tag", tag, "--registry", host, env=env
        )
        assert again.returncode == 0 and "not rebuilt" in again.stderr and "not pushed" in again.stderr, again.stderr


def _exists(client, ref):
    try:
        client.images.get(ref)
        return True
    except NotFound:
        return False


HUB_REPO = "acme/tiny-gemma4"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def stand_in_hub(folder, token: str):
    """STAND-IN for the Hugging Face hub on loopback: a gated repository HUB_REPO at HUB_COMMIT
    holding folder's files, answering the four requests huggingface_hub 2.4.0's model_info and
    snapshot_download make (model info, tree, HEAD and GET of each file) and 401 without the
    token. The client talking to it is the real one. Returns (server, [(method, path, auth)])."""
    files = [p.as_posix() for p in model_image.model_files(folder)]
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self, head: bool):
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            seen.append((self.command, path, self.headers.get("Authorization")))
            headers, body, code = {"Content-Type": "application/json"}, b"", 404
            file = path.removeprefix(f"/{HUB_REPO}/resolve/{HUB_COMMIT}/")
            if self.headers.get("Authorization") != f"Bearer {token}":
                code, body = 401, b'{"error": "Access to this gated model is restricted."}'
            elif path in (f"/api/models/{HUB_REPO}", f"/api/models/{HUB_REPO}/revision/main"):
                code, body = 200, json.dumps({"id": HUB_REPO, "sha": HUB_COMMIT}).encode()
            elif path == f"/api/models/{HUB_REPO}/tree/{HUB_COMMIT}":
                tree = [{"type": "file", "path": f, "size": (folder / f).stat().st_size, "oid": f} for f in files]
                code, body = 200, json.dumps(tree).encode()
            elif file in files:
                body = (folder / file).read_bytes()
                code, headers = 200, {"X-Repo-Commit": HUB_COMMIT, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}
            self.send_response(code)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def do_GET(self):
            self.answer(head=False)

        def do_HEAD(self):
            self.answer(head=True)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def hub_env(server, tmp_path, token=None):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.server_port}", HF_HOME=str(tmp_path / "hf-home"))
    return {**env, "HF_TOKEN": token} if token else env


def test_a_hub_id_is_downloaded_with_the_token_tagged_by_its_commit_and_the_token_written_nowhere(client, tmp_path):
    secret = "hf_" + secrets.token_hex(16)
    folder = trained.ensure()
    server, seen = stand_in_hub(folder, secret)
    tag = "gemma4-e2b-test/model:from-hub"
    try:
        r = build_py("model-image", HUB_REPO, "--revision", "main", "--tag", tag, env=hub_env(server, tmp_path, secret))
    finally:
        server.shutdown()
    assert r.returncode == 0, r.stdout + r.stderr
    image = client.images.get(tag)
    assert image.labels[model_image.LABELS["revision"]] == HUB_COMMIT
    assert image.labels[model_image.LABELS["source"]] == f"https://huggingface.co/{HUB_REPO}"
    assert image_files(client, tag) == {
        f"models/tiny-gemma4/{p.as_posix()}": (folder / p).read_bytes() for p in model_image.model_files(folder)
    }
    # The token went with every request, and into no output, image or file the download left.
    assert {auth for _, path, auth in seen if path.startswith(("/api/models", f"/{HUB_REPO}"))} == {f"Bearer {secret}"}
    assert secret not in r.stdout + r.stderr and places_holding(client, tag, secret) == []
    left = [p for p in (tmp_path / "hf-home").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert left == []


def test_a_hub_id_without_the_right_token_fails_in_one_line_and_makes_nothing(client, tmp_path):
    wrong = "hf_" + secrets.token_hex(16)
    server, seen = stand_in_hub(trained.ensure(), "hf_" + secrets.token_hex(16))
    try:
        r = build_py(
            "model-image", HUB_REPO, "--tag", "gemma4-e2b-test/model:hub", env=hub_env(server, tmp_path, wrong)
        )
    finally:
        server.shutdown()
    assert r.returncode == 1 and seen
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: cannot download {HUB_REPO}@main from http://127.0.0.1:"), lines
    assert "Traceback" not in r.stderr and wrong not in r.stdout + r.stderr
    assert not _exists(client, "gemma4-e2b-test/model:hub")


def test_docker_volume_is_refilled_from_the_image_it_is_given(client, rootfs, tmp_path):
    volume, refs = "gemma4-e2b-test-model-refill", {}
    for text in ("one", "two"):
        (tmp_path / text).mkdir()
        (tmp_path / text / "config.json").write_text(text)
        refs[text] = model_image.build(
            client, str(tmp_path / text), name="refill", tag=f"gemma4-e2b-test/model:{text}"
        ).ref
    try:
        for text, ref in refs.items():
            model_image.docker_volume(client, ref, volume)
            # What a container mounting the volume sees, read with the engine's archive API (the
            # logs of a container that exits at once can come back empty).
            reader = client.containers.create(
                rootfs, ["true"], volumes={volume: {"bind": model_image.MODELS_ROOT, "mode": "ro"}}
            )
            try:
                stream, _ = reader.get_archive(f"{model_image.MODELS_ROOT}/refill/config.json")
                with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                    assert tar.extractfile("config.json").read().decode() == text
            finally:
                reader.remove()
    finally:
        client.volumes.get(volume).remove(force=True)
