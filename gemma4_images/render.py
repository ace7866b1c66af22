"""Render the generated files (Dockerfile.<family>, image/recipes/<target>.json) and check drift."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2

from .entrypoint import BUILD_FACTS
from .matrix import ROOT, TOKENIZER_PATH, Matrix

TEMPLATES = ROOT / "templates"


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def dockerfile_name(family: str) -> str:
    return f"Dockerfile.{family}"


def render_all(matrix: Matrix) -> dict[str, str]:
    """Every generated file, as {path relative to the repo: content}."""
    env = _env()
    out: dict[str, str] = {}
    for family in matrix.families:
        names = matrix.family_targets(family)
        if not names:
            continue
        targets = [matrix.targets[n] for n in names]
        out[dockerfile_name(family)] = env.get_template(f"{family}.Dockerfile.j2").render(
            family=family,
            targets=names,
            default_base=targets[0].base.ref,
            env=targets[0].env,
            start_period=max(t.startup_budget_s for t in targets),
            # GEMMA4_TARGET is declared earlier, where the recipe file is chosen.
            build_args=[a for a in BUILD_FACTS.values() if a != "GEMMA4_TARGET"],
            labels=BUILD_FACTS,
            tokenizer_path=TOKENIZER_PATH,
        )
        stage1 = [t.stage1 for t in targets if t.stage1]
        if stage1:
            out[dockerfile_name(f"{family}-vllm")] = env.get_template(f"{family}-vllm.Dockerfile.j2").render(
                stage1=stage1[0])
    for name in matrix.targets:
        out[f"image/recipes/{name}.json"] = json.dumps(matrix.recipe(name), indent=2) + "\n"
    return out


def write(matrix: Matrix, root: Path = ROOT) -> list[str]:
    """Write every generated file; returns the paths whose content changed."""
    changed = []
    for rel, content in render_all(matrix).items():
        path = root / rel
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            changed.append(rel)
    return changed


def drift(matrix: Matrix, root: Path = ROOT) -> list[str]:
    """Generated files that differ from what is committed (or are missing), and stale leftovers."""
    rendered = render_all(matrix)
    stale = [rel for rel, content in rendered.items()
             if not (root / rel).exists() or (root / rel).read_text() != content]
    leftovers = [str(p.relative_to(root)) for p in sorted((root / "image" / "recipes").glob("*.json"))
                 if str(p.relative_to(root)) not in rendered]
    return stale + leftovers
