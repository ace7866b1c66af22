"""A port forward into a container that has no network: each TCP connection to a loopback port on
this host becomes one `docker exec -i` of a small Python relay inside the container, which connects
to the server on the container's own loopback. What `kubectl port-forward` does for a pod, with
`docker exec` as the tunnel; the container keeps `--network none`.

Test support: the serving container under test is real, only the path to it is this relay."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

# Runs inside the container (its Python: the serving image's own). stdin -> server, server -> stdout;
# either side closing ends the relay, and with it the exec.
RELAY = """\
import os, socket, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            break
        s.sendall(data)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    os.write(1, data)
"""


class ExecForward:
    """Listen on 127.0.0.1:<free port>; relay each connection to container_port inside container."""

    def __init__(self, container_id: str, container_port: int, python: str = "python3"):
        docker = shutil.which("docker")
        if docker is None:
            raise RuntimeError("the docker CLI is not on PATH (the relay runs `docker exec -i`)")
        # -S: the relay needs no site-packages, and a large venv makes site slow to import.
        self.command = [docker, "exec", "-i", container_id, python, "-S", "-c", RELAY, str(container_port)]
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._closed:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket):
        proc = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

        def up():
            try:
                while data := conn.recv(65536):
                    proc.stdin.write(data)
                    proc.stdin.flush()
            except OSError:
                pass
            finally:
                try:
                    proc.stdin.close()
                except OSError:
                    pass

        threading.Thread(target=up, daemon=True).start()
        try:
            while data := proc.stdout.read1(65536):
                conn.sendall(data)
        except OSError:
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes the upward thread's recv
            except OSError:
                pass
            conn.close()
            proc.wait()

    def close(self):
        self._closed = True
        self.listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
