"""`python -m testkit.train` regenerates the committed fixture: the same bytes on the platform that
made it (same torch, same CPU capability), the same behaviour anywhere.

Training takes ~2-3.5 min on a busy 2-core machine, so the regenerated folder is kept in the machine
cache under the digest of everything the weights depend on (testkit.train.inputs_digest): a change
to the script retrains once, an unchanged script reuses it.
"""

import hashlib
import subprocess
import sys

import pytest

from gemma4_images.spec.matrix import ROOT
from gemma4_images.spec.upstream import cache_dir
from testkit import greedy, prompts, tiny_model, train, trained

pytestmark = pytest.mark.slow  # torch or tokenizers work: `make test-fast` leaves it out


@pytest.fixture(scope="module")
def seqs():
    return train.sequences(trained.ensure())


@pytest.fixture(scope="module")
def regenerated(seqs):
    out = cache_dir() / f"tiny-gemma4-trained-regen-{train.inputs_digest(seqs)[:16]}"
    if not (out / trained.MANIFEST).exists():
        run = subprocess.run(
            [sys.executable, "-m", "testkit.train", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1800
        )
        assert run.returncode == 0, run.stderr[-3000:]
    return out


def _sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_regeneration_gives_the_same_folder_and_the_same_answers(regenerated, seqs):
    fixture, again = trained.fixture_manifest(), trained.fixture_manifest(regenerated)
    assert again["inputs_sha256"] == fixture["inputs_sha256"], "the fixture is stale (see test_trained_model)"
    made = trained.ensure()
    # Everything but the weights, the manifest and the cache's own record (testkit.tiny_model's
    # MADE_FROM, of the machine cache, not of the model) is byte-identical.
    for path in made.iterdir():
        if path.name not in (trained.WEIGHTS, trained.MANIFEST, tiny_model.MADE_FROM):
            assert (regenerated / path.name).read_bytes() == path.read_bytes(), path.name
    assert again["weights_sha256"] == _sha(regenerated / trained.WEIGHTS)
    same_platform = all(again[k] == fixture[k] for k in ("torch", "cpu_capability", "transformers"))
    if same_platform:
        assert again["weights_sha256"] == fixture["weights_sha256"]
    else:  # other kernels round differently: the bytes may differ, the answers must not
        import torch
        from transformers import Gemma4ForConditionalGeneration

        decode = prompts.load_tokenizer(regenerated).decode
        for dtype in (torch.bfloat16, torch.float32):
            model = Gemma4ForConditionalGeneration.from_pretrained(str(regenerated), dtype=dtype).eval()
            assert greedy.mismatches(model, seqs, decode) == []
