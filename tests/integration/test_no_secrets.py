"""No secret reaches an image: a build run with HF_TOKEN in its environment leaves the value in no
layer, history entry, label or env var. The scanner is shown to catch a leak first."""
import json
import os
import secrets
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from gemma4_images import localbase, matrix
from gemma4_images.docker_build import BuildSpec, build

pytestmark = pytest.mark.integration


def places_holding(client, image_ref: str, secret: str) -> list[str]:
    """Where secret appears: history, labels, env, or a file in a layer the base does not have."""
    image = client.images.get(image_ref)
    found = [f"history: {h['CreatedBy'][:80]}" for h in image.history() if secret in (h.get("CreatedBy") or "")]
    config = image.attrs["Config"]
    found += [f"label {k}" for k, v in (config.get("Labels") or {}).items() if secret in f"{k}={v}"]
    found += [f"env {e.split('=')[0]}" for e in config.get("Env") or [] if secret in e]
    base_layers = set()
    parent_labels = config.get("Labels") or {}
    base_name = parent_labels.get("org.opencontainers.image.base.name")
    if base_name:
        base_layers = set(client.images.get(base_name).attrs["RootFS"]["Layers"])
    needle = secret.encode()
    with tempfile.TemporaryFile() as saved:
        for chunk in image.save(named=False):
            saved.write(chunk)
        saved.seek(0)
        with tarfile.open(fileobj=saved) as outer:
            manifest = json.load(outer.extractfile("manifest.json"))[0]
            config_doc = json.load(outer.extractfile(manifest["Config"]))
            diff_ids = config_doc["rootfs"]["diff_ids"]
            for layer_path, diff_id in zip(manifest["Layers"], diff_ids):
                if diff_id in base_layers:
                    continue
                with tarfile.open(fileobj=outer.extractfile(layer_path)) as layer:
                    for member in layer:
                        if member.isfile() and needle in layer.extractfile(member).read():
                            found.append(f"file /{member.name}")
    return found


def test_scanner_catches_a_leak(client):
    secret = "hf_scan" + secrets.token_hex(8)
    rootfs = localbase.rootfs(client, print)
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(
            f"FROM {rootfs}\nARG T\nRUN echo \"$T\" > /leak\nLABEL org.opencontainers.image.base.name={rootfs} io.gemma4-images.test=\"deliberate leak\"\n")
        build(client, BuildSpec(dockerfile="Dockerfile", tag="gemma4-e2b-test/leaky:scan", context=Path(ctx),
                                buildargs={"T": secret}), print)
    found = places_holding(client, "gemma4-e2b-test/leaky:scan", secret)
    assert any(f.startswith("history") for f in found) and "file /leak" in found


def test_build_with_a_token_in_the_environment_leaks_nothing(client, standin_real):
    # The stand-in base keeps the scan small; every layer above it is the real Dockerfile's.
    secret = "hf_" + secrets.token_hex(16)
    tag = "gemma4-e2b-test/xeon6:secret-scan"
    env = {**os.environ, "HF_TOKEN": secret, "HUGGING_FACE_HUB_TOKEN": secret}
    run = subprocess.run([sys.executable, "build.py", "build", "cpu", "--tiny", "--tag", tag,
                          "--base-image", standin_real],
                         cwd=matrix.ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert secret not in run.stdout + run.stderr
    assert places_holding(client, tag, secret) == []
