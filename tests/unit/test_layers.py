"""The package's import graph, read from the source: rendering sits below the engine, nothing
imports upward, and test support reaches the product only where a command serves the test model."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gemma4_images"
ENGINE = {"<docker>", "<testcontainers>"}
# Turning targets.yaml into text (Dockerfiles, recipes, bake file, manifests, pins) needs no engine.
PURE = ("matrix", "facts", "render", "bake", "k8s", "pin", "registry")


def imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1:
                out |= {module.split(".")[0]} if module else {a.name for a in node.names}
            elif module == "gemma4_images":
                out |= {a.name for a in node.names}
            elif module.startswith("gemma4_images."):
                out.add(module.split(".")[1])
            elif module.split(".")[0] in ("docker", "testcontainers", "testkit"):
                out.add(f"<{module.split('.')[0]}>")
        elif isinstance(node, ast.Import):
            out |= {
                f"<{a.name.split('.')[0]}>" for a in node.names if a.name.split(".")[0] in ("docker", "testcontainers")
            }
    return out


def graph() -> dict[str, set[str]]:
    return {p.stem: imports(p) for p in PACKAGE.glob("*.py")}


def reach(g: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in g.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_rendering_is_below_the_engine():
    g = graph()
    for module in PURE:
        assert not reach(g, module) & (ENGINE | {"docker_build", "images", "smoke"}), (module, sorted(reach(g, module)))


def test_nothing_imports_upward_and_there_are_no_cycles():
    g = graph()
    assert not [m for m, deps in g.items() if "cli" in deps], "cli is the top floor"
    assert [m for m in g if m in reach(g, m)] == [], "an import cycle"


def test_test_support_only_where_a_command_serves_the_test_model():
    g = graph()
    assert sorted(m for m, deps in g.items() if "<testkit>" in deps) == ["bench", "cli"]
