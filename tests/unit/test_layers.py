"""The package's import graph, read from the source: each stage package imports only from the
stages above it (gemma4_images/__init__.py lists them in order), nothing below the build stage
touches the engine, and test support reaches the product only where a command serves the test
model."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gemma4_images"
# The stages in import order: each may import itself and those before it. cli is the top floor.
STAGES = ["spec", "generate", "build", "check", "publish", "bench", "cli"]
ENGINE = {"<docker>", "<testcontainers>"}


def stage_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def imports(path: Path) -> set[str]:
    """What a module imports, as stages of the package, or <docker>, <testcontainers>, <testkit>."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the package imports absolutely)"
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            top, _, rest = name.partition(".")
            if top == "gemma4_images":
                out.add(rest.split(".")[0])
            elif top in ("docker", "testcontainers", "testkit"):
                out.add(f"<{top}>")
    return out


def graph() -> dict[str, set[str]]:
    """{module path relative to the package: what it imports}."""
    return {str(p.relative_to(PACKAGE)): imports(p) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def test_every_module_is_in_a_stage():
    loose = [m for m in graph() if stage_of(PACKAGE / m) not in STAGES]
    assert loose == [], f"modules outside the stages {STAGES}: {loose}"


def test_each_stage_imports_only_from_the_stages_above_it():
    upward = []
    for module, deps in graph().items():
        rank = STAGES.index(stage_of(PACKAGE / module))
        upward += [(module, d) for d in deps if not d.startswith("<") and STAGES.index(d) > rank]
    assert upward == [], f"imports from a later stage: {upward}"


def test_spec_and_generate_need_no_engine():
    # Turning targets.yaml into text (Dockerfiles, recipes, bake file, manifests) needs no engine.
    g = graph()
    engine = [m for m, deps in g.items() if stage_of(PACKAGE / m) in ("spec", "generate") and deps & ENGINE]
    assert engine == []


def test_test_support_only_where_a_command_serves_the_test_model():
    g = graph()
    assert sorted({stage_of(PACKAGE / m) for m, deps in g.items() if "<testkit>" in deps}) == ["bench", "cli"]
