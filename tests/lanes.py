"""The two lanes `make test` runs at once (pytest-xdist, two workers), decided by test module.

"serve" holds the integration modules that only run the images every lane shares (the CPU image
at each vLLM release and its unfixed twin, the tiny models, built first by conftest's
shared_images); "engine" holds every other integration module, every build among them, so a build's
intermediate containers and <none> images are that lane's own (no_build_leftovers). Unit tests and
the integration modules that need no engine are each their own unit of work, run by whichever
worker is free.

The scheduler is xdist's LoadScopeScheduling with these scopes (tests/conftest.py). Not the
xdist_group mark: with pytest 9.2 and xdist 3.8, a marked test's nodeid does not keep the group
suffix xdist writes, and the marked tests spread over both workers (seen here, a two-file
sample included)."""

from __future__ import annotations

SERVE = {
    "test_smoke_cpu.py",
    "test_trained_serving.py",
    "test_runtime_cpu.py",
    "test_stop_signals.py",
    "test_bench_cpu.py",
    "test_cpu_image.py",
    "test_fix_gemma4_buffered_tool_args.py",
    "test_fix_gemma4_required_tool_grammar.py",
    "test_fix_logprobs_decode_guard.py",
    "test_fix_cpu_onednn_strided_input.py",
    "test_fix_cpu_compile_cache_load.py",
    "test_compile_cache_cpu.py",
    "test_multi_node_cpu.py",
    "test_autoscale_signal.py",
}
NO_ENGINE = {"test_apply_all_real_vllm.py", "test_fix_pack_applies.py", "test_bump.py"}
# The supply chain apart from the image core (docs/publish.md): push, cosign, oras, SBOM,
# provenance, the contract, pin, the pipelines; `make test-publish` runs these alone.
PUBLISH = {
    "test_cosign.py",
    "test_multiplatform_push.py",
    "test_push.py",
    "test_release.py",
    "test_sbom_provenance.py",
    "test_contract.py",
    "test_contract_form.py",
    "test_pin_registry.py",
    "test_model_image_no_network.py",
    "test_publish.py",
    "test_verify_cli.py",
    "test_sigstore_policy.py",
    "test_pipelines.py",
    "test_sbom.py",
    "test_no_keys_in_repo.py",
    "test_pin.py",
    "test_registry.py",
    "test_provenance.py",
    "test_reports.py",
}
INTEGRATION = "tests/integration/"


def publishing(nodeid: str) -> bool:
    """Whether a test (its nodeid) is in the publishing lane."""
    return nodeid.split("::", 1)[0].rpartition("/")[2] in PUBLISH


def lane(nodeid: str) -> str | None:
    """The lane of a test (its nodeid, relative to the rootdir), or None: run wherever."""
    path = nodeid.split("::", 1)[0]
    if not path.startswith(INTEGRATION) or "/" in path.removeprefix(INTEGRATION):
        return None
    name = path.removeprefix(INTEGRATION)
    if name in NO_ENGINE:
        return None
    return "serve" if name in SERVE else "engine"
