"""The real CPU tier: the CPU image serves a tiny random-weight Gemma 4 (the real architecture
class, made here) through the same `build.py smoke` path users run."""
import json
import subprocess
import sys

import pytest

from gemma4_images import images, matrix, smoke, tiny_model

pytestmark = pytest.mark.integration


def build_py(*args):
    return subprocess.run([sys.executable, "build.py", *args], cwd=matrix.ROOT, capture_output=True, text=True)


def test_cpu_smoke_tier_passes(cpu_image, tmp_path, no_new_containers):
    report_path = tmp_path / "smoke.json"
    r = build_py("smoke", "cpu", "--tiny", "--report", str(report_path))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(report_path.read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    must_pass = ["ready", "image_facts", "chat", "chat_stream", "completion", "chat_single_bos",
                 "raw_prompt_bos", "prompt_logprobs_rejected", "bad_requests"]
    assert {name: status[name] for name in must_pass} == {name: "pass" for name in must_pass}
    assert status["reasoning"] == "skip"          # random weights cannot reason
    assert report["seconds_to_healthy"] > 0
    assert "CHECK" in r.stdout and "all checks passed" in r.stdout


def test_a_server_that_never_starts_fails_with_its_log_and_leaves_nothing(cpu_image, tmp_path,
                                                                           no_new_containers):
    r = build_py("smoke", "cpu", "--image", cpu_image, "--model", str(tmp_path / "no-such-model"),
                 "--report", str(tmp_path / "r.json"))
    assert r.returncode == 1
    assert "ready" in r.stdout and "FAIL" in r.stdout
    assert "container log (last lines)" in r.stderr and "  | " in r.stderr


@pytest.fixture(scope="module")
def plain_server(client, m, cpu_image):
    """The CPU image without its fixes pack, serving the tiny model with the model's own tokenizer
    (the user's --tokenizer wins over the baked copy): the checks of those fixes must fail here."""
    image = images.build_target(client, m, "cpu", tokenizer_source=str(tiny_model.ensure()),
                                tag="gemma4-e2b-test/xeon6:unfixed", log=print,
                                extra_args={"GEMMA4_FIXES_PROFILE": "", "GEMMA4_FIXES": ""})
    model = tiny_model.ensure()
    port = smoke.free_port()
    container, served, _ = smoke._container(m, "xeon6", image, str(model), port,
                                            extra_args=["--tokenizer", f"{smoke.MODEL_MOUNT}/{model.name}"])
    container.start()
    try:
        smoke._wait_healthy(container, f"http://127.0.0.1:{port}", 600)
        yield smoke.Checks(f"http://127.0.0.1:{port}", served)
    finally:
        container.stop()


def test_raw_prompt_bos_check_fails_without_the_bos_tokenizer(plain_server):
    # The tiny tokenizer mirrors the instruct tokenizer's flaw: no <bos> on raw prompts.
    with pytest.raises(smoke.CheckFailed, match="exactly one <bos>"):
        plain_server.raw_prompt_bos()
    plain_server.chat_single_bos()  # the chat template adds one, and only one


def test_forced_tool_call_check_fails_without_the_grammar_fix(plain_server):
    with pytest.raises(smoke.CheckFailed, match="tool_calls"):
        plain_server.tools_forced()


def test_a_missing_image_is_one_clear_line(tmp_path):
    r = build_py("smoke", "cpu", "--image", "gemma4-e2b-test/never-built:none", "--tiny")
    assert r.returncode == 1
    assert "no local image gemma4-e2b-test/never-built:none" in r.stderr and "Traceback" not in r.stderr
