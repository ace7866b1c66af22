"""Layer order: editing one patch rebuilds the fixes layer and what follows it, never the layers
before it (the base, the entrypoint, the upstream files, the tokenizer copy)."""

import json
import shutil
import uuid

import pytest

from gemma4_images.build import images
from gemma4_images.spec import matrix
from testkit import tiny_model

pytestmark = pytest.mark.integration


def build_steps(client, m, base, context):
    lines = []
    images.build_target(
        client,
        m,
        "xeon6",
        base_override=base,
        tokenizer_source=str(tiny_model.ensure()),
        tag="gemma4-e2b-test/xeon6:layers",
        context=context,
        log=lines.append,
    )
    steps, cached = [], set()
    for line in lines:
        if line.strip().startswith("Step "):
            steps.append(line.strip().split(" : ", 1)[1])
        elif line.strip() == "---> Using cache":
            cached.add(steps[-1])
    return steps, cached


def test_a_patch_edit_rebuilds_only_from_the_fixes_layer(client, cpu_base, tmp_path):
    base = cpu_base
    context = tmp_path / "ctx"
    context.mkdir()
    for item in ["image", "patches", ".dockerignore", *[p.name for p in matrix.ROOT.glob("Dockerfile.*")]]:
        src = matrix.ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, context / item)
    m = matrix.load_default("xeon6")  # cpu_base's release
    build_steps(client, m, base, context)  # warm the cache
    steps, cached = build_steps(client, m, base, context)
    assert set(steps[2:]) <= cached, "a no-change rebuild must rebuild nothing"

    manifest = next(p for p in (context / "patches").glob("*/fix.json"))
    fix = json.loads(manifest.read_text())
    # A one-file edit in the pack, new on every run: the layer cache outlives test runs.
    fix["verified"] += f" (edited {uuid.uuid4()})"
    manifest.write_text(json.dumps(fix, indent=2))
    steps, cached = build_steps(client, m, base, context)
    first_rebuilt = next(s for s in steps[2:] if s not in cached)
    assert first_rebuilt.startswith("COPY patches/")
    before = steps[2 : steps.index(first_rebuilt)]
    assert any(s.startswith("COPY .build/tokenizer/") for s in before)
    assert set(before) <= cached
