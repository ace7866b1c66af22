"""A STAND-IN for vllm-gaudi, synthesised from the fixes pack's own diffs: for every file the
vllm_gaudi fixes touch, a file made only of the lines those diffs expect to find (each hunk's
"before" side, separated by filler), so the pack applies to it in order. It proves the Gaudi
image's pipeline (version guard, apply, manifest, labels), not the patches: their proof is in
tests/unit/test_gaudi_fix_*.py against a real vllm-gaudi checkout."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import gaudi_fixes_helpers as helpers  # noqa: E402


def synthesise() -> dict[str, str]:
    """{site-packages path: text} such that every vllm_gaudi fix of profile v0.30.0 applies in order."""
    applier = helpers.load_applier()
    fixes = [applier.parse_diff(helpers.fix_diff(name), name) for name in helpers.gaudi_fixes()]
    files: dict[str, list[str]] = {}
    for index, fix in enumerate(fixes):
        for path, hunks in fix.items():
            original = files.setdefault(path, [])
            current = original
            for earlier in fixes[:index]:
                if path in earlier:
                    current, _ = applier.apply_hunks(current, earlier[path])
            for hunk in hunks:
                before = hunk.side(False)
                if not any(current[i:i + len(before)] == before for i in range(len(current) - len(before) + 1)):
                    filler = [f"# gemma4-images stand-in filler {len(original)}\n"]
                    original += filler + before
                    current = current + filler + before
    return {path: "".join(lines) for path, lines in files.items()}


DOCKERFILE = """\
ARG BASE
FROM ${BASE}
# STAND-IN for vllm-gaudi {version} and Gaudi SW {gaudi_sw}: distribution metadata plus the files
# synthesised from the fixes pack (see tests/integration/gaudi_standin.py); nothing here runs on HPU.
COPY site-packages/ /opt/venv/lib/python3.11/site-packages/
LABEL io.gemma4-images.stand-in="vllm-gaudi {version} synthesised from the fixes pack"
"""


def write_context(ctx: Path, vllm_gaudi_version: str, gaudi_sw: str = "1.24.1.0") -> None:
    site = ctx / "site-packages"
    for path, text in synthesise().items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    (site / "vllm_gaudi" / "__init__.py").write_text("")
    for dist, version in ((f"vllm_gaudi-{vllm_gaudi_version}", vllm_gaudi_version),
                          (f"habana_torch_plugin-{gaudi_sw}", gaudi_sw)):
        meta = site / f"{dist}.dist-info" / "METADATA"
        meta.parent.mkdir(parents=True)
        meta.write_text(f"Metadata-Version: 2.1\nName: {dist.split('-')[0]}\nVersion: {version}\n")
    (ctx / "Dockerfile").write_text(DOCKERFILE.replace("{version}", vllm_gaudi_version)
                                    .replace("{gaudi_sw}", gaudi_sw))
