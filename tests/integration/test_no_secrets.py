"""No secret reaches an image: a build run with HF_TOKEN in its environment leaves the value in no
layer, history entry, label or env var. The scanner is shown to catch a leak first."""

import json
import os
import secrets
import tarfile
import tempfile
from pathlib import Path

import pytest

from gemma4_images.build import localbase
from tests.cli import build_py

pytestmark = pytest.mark.integration


def places_holding(client, image_ref: str, secret: str) -> list[str]:
    """Where secret appears: history, labels, env, or a file in a layer the base does not have."""
    image = client.images.get(image_ref)
    found = [f"history: {h['CreatedBy'][:80]}" for h in image.history() if secret in (h.get("CreatedBy") or "")]
    config = image.attrs["Config"]
    found += [f"label {k}" for k, v in (config.get("Labels") or {}).items() if secret in f"{k}={v}"]
    found += [f"env {e.split('=')[0]}" for e in config.get("Env") or [] if secret in e]
    base_name = (config.get("Labels") or {}).get("org.opencontainers.image.base.name")
    base_layers = client.images.get(base_name).attrs["RootFS"]["Layers"] if base_name else []
    found += [f"file /{name}" for name in files_holding(client, image, base_layers, secret.encode())]
    return found


def files_holding(client, image, base_layers: list[str], needle: bytes) -> list[str]:
    """Files holding needle in the layers image adds on top of its base. Read from the storage
    driver's own diff folders where it is overlay2 (the base's gigabytes are skipped, not read),
    else from `docker save`."""
    layers = image.attrs["RootFS"]["Layers"]
    assert layers[: len(base_layers)] == base_layers, "the image is not built on the base it names"
    added = len(layers) - len(base_layers)
    driver = image.attrs["GraphDriver"]
    if driver["Name"] == "overlay2":
        # UpperDir is the top layer; LowerDir lists the others from the top down.
        dirs = [driver["Data"]["UpperDir"], *driver["Data"].get("LowerDir", "").split(":")][:added]
        return [
            str(path.relative_to(folder))
            for folder in map(Path, dirs)
            for path in folder.rglob("*")
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes()
        ]
    found = []
    with tempfile.TemporaryFile() as saved:
        for chunk in image.save(named=False):
            saved.write(chunk)
        saved.seek(0)
        with tarfile.open(fileobj=saved) as outer:
            manifest = json.load(outer.extractfile("manifest.json"))[0]
            for layer_path in manifest["Layers"][len(base_layers) :]:
                with tarfile.open(fileobj=outer.extractfile(layer_path)) as layer:
                    found += [
                        member.name
                        for member in layer
                        if member.isfile() and needle in layer.extractfile(member).read()
                    ]
    return found


def test_scanner_catches_a_leak(client, inline_build):
    secret = "hf_scan" + secrets.token_hex(8)
    rootfs = localbase.rootfs(client, print)
    inline_build(
        f'FROM {rootfs}\nARG T\nRUN echo "$T" > /leak\n'
        f'LABEL org.opencontainers.image.base.name={rootfs} io.gemma4-images.test="deliberate leak"\n',
        "gemma4-e2b-test/leaky:scan",
        {"T": secret},
    )
    found = places_holding(client, "gemma4-e2b-test/leaky:scan", secret)
    assert any(f.startswith("history") for f in found) and "file /leak" in found


def test_build_with_a_token_in_the_environment_leaks_nothing(client, cpu_base):
    # Every layer above the base is the real Dockerfile's; the base's own layers are not scanned.
    secret = "hf_" + secrets.token_hex(16)
    tag = "gemma4-e2b-test/xeon6:secret-scan"
    env = {**os.environ, "HF_TOKEN": secret, "HUGGING_FACE_HUB_TOKEN": secret}
    run = build_py(
        "build",
        "cpu",
        "--tiny",
        "--tag",
        tag,
        "--base-image",
        cpu_base,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert secret not in run.stdout + run.stderr
    assert places_holding(client, tag, secret) == []
