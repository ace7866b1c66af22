"""A STAND-IN for vllm-gaudi: the real upstream files its fixes were written against (main
091bbadd, taken from the snapshots in ../shared/upstream by the pack's pre_sha256) and
distribution metadata, nothing else. It proves the Gaudi image's pipeline (version guard,
sha256 check, apply, manifest, labels), not the patches: their proof is in
tests/unit/test_gaudi_fix_*.py against a real vllm-gaudi checkout."""

from pathlib import Path

from gemma4_images.spec.modules import load_file

REPO = Path(__file__).resolve().parents[2]


def upstream_files() -> dict[str, bytes]:
    """{site-packages path: bytes}: the upstream file of each path the vllm_gaudi fixes touch."""
    return load_file("port_fixes", REPO / "scripts" / "port-fixes.py").upstream_files()


DOCKERFILE = """\
ARG BASE
FROM ${BASE}
# STAND-IN for vllm-gaudi {version} and Gaudi SW {gaudi_sw}: distribution metadata plus the upstream
# files the fixes pack was written against (tests/integration/gaudi_standin.py); nothing here runs on HPU.
COPY site-packages/ /opt/venv/lib/python3.11/site-packages/
LABEL io.gemma4-images.stand-in="vllm-gaudi {version}: main 091bbadd files the fixes touch"
"""


def write_context(ctx: Path, vllm_gaudi_version: str, gaudi_sw: str = "1.24.1.0") -> None:
    site = ctx / "site-packages"
    for path, data in upstream_files().items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(data)
    (site / "vllm_gaudi" / "__init__.py").write_text("")
    for dist, version in (
        (f"vllm_gaudi-{vllm_gaudi_version}", vllm_gaudi_version),
        (f"habana_torch_plugin-{gaudi_sw}", gaudi_sw),
    ):
        meta = site / f"{dist}.dist-info" / "METADATA"
        meta.parent.mkdir(parents=True)
        meta.write_text(f"Metadata-Version: 2.1\nName: {dist.split('-')[0]}\nVersion: {version}\n")
    (ctx / "Dockerfile").write_text(DOCKERFILE.replace("{version}", vllm_gaudi_version).replace("{gaudi_sw}", gaudi_sw))
