"""A real registry on this machine, for the tests and the benchmarks: Debian's docker-registry (the
distribution registry 2.8), started with its own config on a free loopback port and stopped after.
The daemon treats 127.0.0.0/8 as an insecure registry by default, so no daemon setting is needed."""

import contextlib
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from gemma4_images.check.server import free_port


class LoopbackError(RuntimeError):
    """The registry could not be started; the message is one line with the fix."""


def start_registry(root: Path, readonly: bool = False, login: tuple[str, str] | None = None):
    """docker-registry serving on 127.0.0.1:<free port> from root; returns (process, host). With
    login (user, password) it requires that htpasswd login (apache2-utils' htpasswd makes the file)."""
    exe = shutil.which("docker-registry")
    if exe is None:
        raise LoopbackError(
            "docker-registry is not installed: `apt-get install docker-registry` (scripts/setup-host.sh)"
        )
    port = free_port()
    maintenance = "\n  maintenance:\n    readonly:\n      enabled: true" if readonly else ""
    auth = ""
    if login:
        if shutil.which("htpasswd") is None:
            raise LoopbackError("htpasswd is not installed: `apt-get install apache2-utils` (scripts/setup-host.sh)")
        subprocess.run(["htpasswd", "-Bbc", str(root / "htpasswd"), *login], check=True, capture_output=True)
        auth = f"auth:\n  htpasswd:\n    realm: gemma4-test\n    path: {root / 'htpasswd'}\n"
    config = root / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}{maintenance}\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}"
    )
    with open(root / "registry.log", "w") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([exe, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)
    host = f"127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://{host}/v2/", timeout=1)
            return proc, host
        except urllib.error.HTTPError as e:
            if e.code == 401 and login:
                return proc, host
            stop_registry(proc)
            raise LoopbackError(f"docker-registry on {host} answered /v2/ with HTTP {e.code}") from None
        except OSError:
            if proc.poll() is not None:
                raise LoopbackError(f"docker-registry exited: {(root / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)
    stop_registry(proc)
    raise LoopbackError(f"docker-registry did not answer on {host} within 10 s")


def stop_registry(proc):
    proc.terminate()
    proc.wait(timeout=10)


def forget(client, host: str) -> None:
    """Remove every local reference to images under host: the tags a push or a pull made and the
    digest references (`<none>` rows in `docker images`) a pull by digest leaves. The images
    themselves stay while another tag (a stand-in's own) holds them."""
    from docker.errors import NotFound

    for img in client.images.list():
        for ref in (*img.tags, *img.attrs.get("RepoDigests", [])):
            if ref.startswith(f"{host}/"):
                with contextlib.suppress(NotFound):
                    client.images.remove(ref)


@contextlib.contextmanager
def registry(root: Path, client=None, readonly: bool = False, login: tuple[str, str] | None = None):
    """start_registry as a context manager yielding its host: stopped after whatever happens, and
    (given the engine's client) every local reference to its images removed (forget)."""
    proc, host = start_registry(root, readonly=readonly, login=login)
    try:
        yield host
    finally:
        stop_registry(proc)
        if client is not None:
            forget(client, host)
