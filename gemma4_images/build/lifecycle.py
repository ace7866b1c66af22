"""A release's life after `bump` added it: `promote` makes it a family's default (targets.yaml
`defaults`), `retire` removes it: its release file, its stand-ins' locks, its fixes profiles and
their ports, its recipes, and nothing else; the generated files are rendered again. Both refuse
uncommitted changes to what they write, and put every file back when a step fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gemma4_images.build.bump import WRITES, BadInput, BumpError, Files, uncommitted

__all__ = ["BadInput", "BumpError", "promote", "retire"]
from gemma4_images.generate import render
from gemma4_images.spec import matrix as matrix_mod
from gemma4_images.spec.matrix import ROOT

PROFILES = Path("patches") / "profiles"


def _clean(root: Path, also: tuple[str, ...] = ()) -> None:
    dirty = uncommitted(root, (*WRITES, "README.md", *also))
    if dirty:
        raise BadInput(f"uncommitted changes to files this writes: {', '.join(dirty)}; commit or stash them first")


def _rendered(files: Files, root: Path) -> None:
    """Render every generated file again from the tree as it now is (kept first, to put back)."""
    own = matrix_mod.load(root / "targets.yaml", releases_dir=root / "releases")
    others = [
        matrix_mod.load(root / "targets.yaml", v, root / "releases")
        for v in matrix_mod.releases(root / "targets.yaml", root / "releases")
        if v != own.project.vllm_version
    ]
    for rel, content in render.render_all(own, others, root).items():
        if not (root / rel).is_file() or (root / rel).read_text() != content:
            files.write(Path(rel), content)


def promote(family: str, version: str, source: str, root: Path = ROOT) -> list[str]:
    """defaults.<family> becomes vLLM version, with source (why): one edit of targets.yaml, then
    load() checks that the release builds every target of the family."""
    _clean(root, ("targets.yaml",))
    path = root / "targets.yaml"
    text = path.read_text()
    entry = rf"^defaults:\n(?:[ #].*\n|\n)*?  {re.escape(family)}:\n    vllm: (\S+).*\n    source: (.*)\n(?!     )"
    block = re.search(entry, text, re.M)
    if block is None:  # e.g. a source folded over lines: the one edit cannot be made safely
        raise BadInput(
            f"targets.yaml's defaults.{family} is not two one-line keys (vllm, then source): edit it by hand"
        )
    if block[1] == version:
        raise BadInput(f"vLLM {version} is already the {family} family's default")
    if not source.strip():
        raise BadInput(f"say why vLLM {version} is the {family} family's default: --source '<recipe line, proof>'")
    files = Files(root)
    try:
        start, end = block.span(1)
        s_start, s_end = block.span(2)
        files.write(Path("targets.yaml"), text[:start] + version + text[end:s_start] + _scalar(source) + text[s_end:])
        _rendered(files, root)
    except BaseException:
        files.restore()
        raise
    return _changed(files, root)


def retire(version: str, root: Path = ROOT) -> list[str]:
    """Remove vLLM version's release: refused for the first release and for a family's default."""
    _clean(root)
    targets_file, releases_dir = root / "targets.yaml", root / "releases"
    own = matrix_mod.load(targets_file, releases_dir=releases_dir)
    if version == own.project.vllm_version:  # load() without a release is at the first one
        raise BadInput(
            f"vLLM {version} is the first release: bump starts from it, and its fixes are the pack's own "
            "diffs (patches/<fix>/fix.diff), not ports"
        )
    view = matrix_mod.load(targets_file, version, releases_dir)  # an unknown release: MatrixError, one line
    defaulted = sorted(f for f, d in own.defaults.items() if d.vllm == version)
    if defaulted:
        raise BadInput(
            f"vLLM {version} is the default of {', '.join(defaulted)}: promote another release first "
            f"(`python build.py promote {defaulted[0]} --vllm V --source WHY`)"
        )
    profiles = sorted({t.fixes.profile for t in view.targets.values() if t.fixes})
    others = [
        matrix_mod.load(targets_file, v, releases_dir)
        for v in matrix_mod.releases(targets_file, releases_dir)
        if v != version
    ]
    for other in others:
        shared = {t.fixes.profile for t in other.targets.values() if t.fixes} & set(profiles)
        if shared:
            raise BadInput(
                f"vLLM {other.project.vllm_version} uses profile(s) {', '.join(sorted(shared))} too: not retired"
            )
    kept = {s.lock for other in others for s in other.standins.values()}  # a lock another release names stays
    files = Files(root)
    try:
        _remove(files, root, matrix_mod.release_file(version, releases_dir))
        for s in view.standins.values():
            if s.lock not in kept:
                _remove(files, root, root / s.lock)
        for profile in profiles:
            _remove(files, root, root / PROFILES / f"{profile}.json")
            for manifest in sorted((root / "patches").glob("*/fix.json")):
                _drop_port(files, root, manifest, profile)
        for recipe in sorted((root / "image" / "recipes").glob(f"*-v{version}.json")):
            _remove(files, root, recipe)
        _rendered(files, root)
    except BaseException:
        files.restore()
        raise
    return _changed(files, root)


def _remove(files: Files, root: Path, path: Path) -> None:
    files.keep(path.relative_to(root))
    path.unlink(missing_ok=True)
    files.prune(path)  # a release's own folder (requirements/vV/) goes with it


def _drop_port(files: Files, root: Path, manifest: Path, profile: str) -> None:
    fix = json.loads(manifest.read_text())
    if profile not in fix.get("ports", {}):
        return
    del fix["ports"][profile]
    if not fix["ports"]:
        del fix["ports"]
    files.write(manifest.relative_to(root), json.dumps(fix, indent=2) + "\n")
    _remove(files, root, manifest.parent / "ports" / f"{profile}.diff")


def _scalar(text: str) -> str:
    """One YAML plain scalar, quoted only when it must be."""
    import yaml

    return yaml.safe_dump(text.strip(), width=10**6).removesuffix("\n...\n").strip()


def _changed(files: Files, root: Path) -> list[str]:
    return sorted(
        str(path.relative_to(root))
        for path, data in files.before.items()
        if (data is None) != (not path.exists()) or (path.exists() and path.read_bytes() != data)
    )
