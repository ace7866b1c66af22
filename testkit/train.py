"""Train the tiny Gemma 4 on the scripted exchanges, deterministically.

    python -m testkit.train OUT_DIR            # a model folder (config, weights, tokenizer, ...)
    python -m testkit.train --fixture          # regenerate the committed testkit/fixture/

The tiny random model's config, tokenizer and seeded initial weights (testkit.tiny_gemma4);
AdamW on the whole script at every step (full batch) for the language model, while the vision and
audio towers keep their seeded weights; float32 on the CPU with a fixed thread count: the same
torch build on the same kind of CPU gives the same bytes (CPU kernels are deterministic for a given
thread count; torch.use_deterministic_algorithms made a step over 10x slower, and is not needed).
The sequences are the ones vLLM feeds the model (testkit.prompts), rendered with both the template
the CPU image serves with and the folder's own, so the answers hold with and without the recipe's
--chat-template. Saved in bfloat16, the checkpoint dtype of the real model; before anything is
written, greedy decoding in bfloat16 and float32 must reproduce every scripted output exactly.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from testkit import tiny_gemma4

from . import exchanges, greedy, prompts
from .trained import FIXTURE, MANIFEST, SEED, WEIGHTS, assemble, replaceable

LR = 1e-2  # peak; linear warm-up, then cosine decay to 0 at the last step
WARMUP = 10
STEPS = 150
THREADS = 1  # fixed: CPU reductions' order (hence the bytes) depends on it; a second
# thread mostly waits at barriers on these small matrices, more so on a busy machine


class TrainingFailed(Exception):
    pass


def sequences(folder: Path) -> list[prompts.Prompt]:
    renderer = prompts.Renderer(folder)
    return [p for ex in exchanges.EXCHANGES for p in renderer.prompts(ex)]


def inputs_digest(seqs: list[prompts.Prompt]) -> str:
    """What the weights are a function of: this file's code, the model config and every training
    sequence (ids and media bytes). A fixture whose digest differs from today's is stale. The code
    counts as its syntax tree without docstrings and imports, so comments, formatting and where a
    module is imported from do not make the fixture stale; any change to what runs does."""
    import torch

    h = hashlib.sha256(code_digest(Path(__file__).read_text()).encode())
    config = tiny_gemma4.model_config().to_dict()
    config.pop("transformers_version", None)
    h.update(json.dumps(config, sort_keys=True).encode())
    for p in seqs:
        h.update(json.dumps([p.exchange, p.template, p.prompt_ids, p.target_ids]).encode())
        for key in sorted(p.media):
            h.update(key.encode() + p.media[key].to(torch.float32).numpy().tobytes())
    return h.hexdigest()


def code_digest(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [
                n
                for n in body
                if not isinstance(n, (ast.Import, ast.ImportFrom))
                and not (
                    isinstance(n, ast.Expr)
                    and isinstance(getattr(n, "value", None), ast.Constant)
                    and isinstance(n.value.value, str)
                )
            ] or [ast.Pass()]
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


BATCH = 8


def batches(seqs: list[prompts.Prompt]) -> list[list[prompts.Prompt]]:
    """Sequences of similar length together (right-padded: under causal attention the padding
    after a sequence changes nothing before it), a few forward passes a step instead of one each."""
    ordered = sorted(seqs, key=lambda p: len(p.prompt_ids) + len(p.target_ids))
    return [ordered[i : i + BATCH] for i in range(0, len(ordered), BATCH)]


def _frozen_image_features(model, group):
    """The image features, computed once: frozen, the vision tower gives the same every step (its
    attention over 2,520 patches would otherwise be most of a step's cost)."""
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    with torch.no_grad():
        feats = [
            model.get_image_features(p.media["pixel_values"], p.media["image_position_ids"]).pooler_output[0]
            for p in group
            if "pixel_values" in p.media
        ]
    return {"image": BaseModelOutputWithPooling(pooler_output=tuple(feats))} if feats else None


class Batch:
    def __init__(self, model, group: list[prompts.Prompt]):
        import torch

        length = max(len(p.prompt_ids) + len(p.target_ids) for p in group)
        self.ids = torch.full((len(group), length), tiny_gemma4.CONTROL_IDS["<pad>"])
        self.targets = []
        for row, p in enumerate(group):
            seq = p.prompt_ids + p.target_ids
            self.ids[row, : len(seq)] = torch.tensor(seq)
            start = len(p.prompt_ids) - 1  # the position that predicts the first target token
            self.targets.append((row, start, torch.tensor(p.target_ids)))
        sounds = [p for p in group if "input_features" in p.media]
        self.kwargs = {"mm_encoder_outputs": _frozen_image_features(model, group)}
        if sounds:
            self.kwargs.update(
                input_features=torch.cat([p.media["input_features"] for p in sounds]),
                input_features_mask=torch.cat([p.media["input_features_mask"] for p in sounds]),
            )

    def logits(self, model):
        """Per sequence: the logits at the positions that predict its target tokens, and the targets."""
        logits = model(input_ids=self.ids, **self.kwargs).logits.float()
        return [(logits[row, start : start + len(t)], t) for row, start, t in self.targets]

    def losses(self, model):
        """Per sequence: mean cross-entropy over its target tokens."""
        import torch

        return [torch.nn.functional.cross_entropy(lg, t) for lg, t in self.logits(model)]


def min_margin(model, data: list[Batch]) -> float:
    """The smallest lead of a target token's logit over the best other token, with the right prefix
    (teacher forcing). Above 0 everywhere means greedy decoding reproduces every target; how far
    above is the head-room left for another implementation's or dtype's rounding."""
    import torch

    worst = float("inf")
    with torch.no_grad():
        for batch in data:
            for lg, t in batch.logits(model):
                target = lg.gather(1, t[:, None])[:, 0]
                others = lg.scatter(1, t[:, None], float("-inf")).max(1).values
                worst = min(worst, (target - others).min().item())
    return worst


@contextlib.contextmanager
def fixed_threads(n: int = THREADS):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_model(seqs: list[prompts.Prompt], steps: int = STEPS, log=print):
    import torch
    from transformers import Gemma4ForConditionalGeneration

    torch.manual_seed(SEED)
    model = Gemma4ForConditionalGeneration(tiny_gemma4.model_config()).to(torch.float32).train()
    # The towers and their projections keep their seeded weights; the language model learns to read
    # what they output. Measured with this schedule: with the audio tower trained along, the two
    # tones were still a coin toss after 150 steps (at a constant 3e-3, told apart after ~280);
    # frozen, every target token is right after ~90 steps.
    m = model.model
    for module in (m.vision_tower, m.embed_vision, m.audio_tower, m.embed_audio):
        module.requires_grad_(False)
    data = [Batch(model, group) for group in batches(seqs)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / WARMUP if s < WARMUP else 0.5 * (1 + math.cos(math.pi * (s - WARMUP) / (steps - WARMUP))),
    )
    history = []
    start = time.monotonic()
    for step in range(1, steps + 1):
        optimizer.zero_grad()
        total = 0.0
        for batch in data:
            loss = sum(batch.losses(model)) / len(seqs)
            loss.backward()
            total += loss.item()
        optimizer.step()
        schedule.step()
        history.append(total)
        if step == 1 or step % 25 == 0 or step == steps:
            log(f"step {step:4d}  loss {total:.5f}  {time.monotonic() - start:.0f}s")
    model.eval()
    return model, history, min_margin(model, data)


def check(model, seqs, tokenizer) -> list[str]:
    """Greedy exactness in bfloat16 (what is saved and what the CPU tier serves) and float32."""
    import torch

    problems = []
    for dtype in (torch.bfloat16, torch.float32):
        problems += greedy.mismatches(model.to(dtype), seqs, lambda ids: tokenizer.decode(ids))
    return problems


def train(out_dir: Path, log=print) -> dict:
    """Write the trained model folder to out_dir (nothing is written unless training succeeded)."""
    import torch
    from transformers import GenerationConfig

    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "random"
        tiny_gemma4.write_tiny_gemma4(folder, seed=SEED)  # the tokenizer and processor to render with
        seqs = sequences(folder)
        digest = inputs_digest(seqs)
        log(
            f"{len(seqs)} sequences, {sum(len(p.prompt_ids) + len(p.target_ids) for p in seqs)} tokens; "
            f"inputs {digest[:12]}"
        )
        with fixed_threads():
            model, history, margin = train_model(seqs, STEPS, log)
            train_seconds = time.monotonic() - start
            model.generation_config = GenerationConfig.from_pretrained(str(folder))  # stops on <eos>, <turn|>
            problems = check(model, seqs, prompts.load_tokenizer(folder))
        if problems:
            raise TrainingFailed(
                "greedy decoding does not reproduce the script after "
                f"{STEPS} steps (final loss {history[-1]:.5f}):\n  " + "\n  ".join(problems)
            )
        model.to(torch.bfloat16).save_pretrained(Path(tmp) / "weights", safe_serialization=True)
        weights = Path(tmp) / "weights" / WEIGHTS
        manifest = {
            "inputs_sha256": digest,
            "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
            "seed": SEED,
            "lr": LR,
            "warmup": WARMUP,
            "steps": STEPS,
            "threads": THREADS,
            "final_loss": round(history[-1], 6),
            "min_logit_margin": round(margin, 3),
            "train_seconds": round(train_seconds, 1),
            "sequences": len(seqs),
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "transformers": __import__("transformers").__version__,
        }
        assemble(out_dir, weights, manifest)
    return manifest


def write_fixture(folder: Path, fixture: Path = FIXTURE) -> None:
    """Keep what the folder cannot rebuild by itself: the weights and how they were made."""
    fixture.mkdir(parents=True, exist_ok=True)
    for name in (WEIGHTS, MANIFEST):
        shutil.copyfile(folder / name, fixture / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("out_dir", nargs="?", type=Path)
    where.add_argument("--fixture", action="store_true", help=f"regenerate {FIXTURE}")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    if args.out_dir and not replaceable(args.out_dir):
        print(
            f"testkit.train: {args.out_dir} exists and is not a model folder this script wrote; "
            "give a new path (it is replaced whole)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.fixture:
            with tempfile.TemporaryDirectory() as tmp:
                manifest = train(Path(tmp) / "model", log)
                write_fixture(Path(tmp) / "model")
        else:
            manifest = train(args.out_dir, log)
    except TrainingFailed as e:
        print(f"testkit.train: {e}", file=sys.stderr)
        return 1
    print(json.dumps(manifest, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
