"""The one way the host looks inside an image without serving it: `python` runs a script with the
image's own Python in a throwaway container with no network and prints what it printed last as
JSON; `files` copies files out of a container that is created and never started. Both carry the
owner label (owned.py), so a killed run's container is reaped."""

from __future__ import annotations

import io
import json
import tarfile

from docker.errors import NotFound

from gemma4_images.build import owned
from gemma4_images.spec.facts import RECORDS


def python(client, image: str, script: str):
    """What `python3 -c script` printed on its last line, read as JSON. The script sees no network:
    what an image holds must not depend on what it could fetch."""
    out = client.containers.run(
        image, ["-c", script], entrypoint=["python3"], remove=True, network_mode="none", labels=owned.labels()
    )
    return json.loads(out.decode().strip().splitlines()[-1])


def files(client, image: str, paths: list[str]) -> dict[str, bytes]:
    """Regular files at or under paths, from a container created (never started, no network) on
    image. A path the image lacks is left out."""
    container = client.containers.create(image, network_mode="none", entrypoint=["/nonexistent"], labels=owned.labels())
    found: dict[str, bytes] = {}
    try:
        for path in paths:
            try:
                stream, _ = container.get_archive(path)
            except NotFound:
                continue
            parent = path.rstrip("/").rsplit("/", 1)[0]  # the archive names members from path's basename
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                for member in tar:
                    if member.isfile():
                        found[f"{parent}/{member.name}"] = tar.extractfile(member).read()
    finally:
        container.remove(force=True)
    return found


def build_json(client, image: str) -> dict:
    """The image's build.json (its facts as built), read without running it."""
    path = f"{RECORDS}/build.json"
    return json.loads(files(client, image, [path])[path])
