"""The full-size tier (`make test-fullsize`, alone on the machine): random weights of E2B's exact shape
(testkit.e2b_shape, 10.2 GB) served by the CPU image with the recipe's launch as a pod runs it (vLLM
compiling, the pod's KV cache). Random weights answer nonsense; what is proven is that E2B's size
loads, starts clean, and that every endpoint, the tool parser and the towers take real-size
requests. Figures go to reports/fullsize-tier-figures.json (tests/fullsize_tier.py records them).
Tensor parallelism across two nodes: test_fullsize_tp.py, once this module's server is gone."""

from __future__ import annotations

import base64
import json

import pytest

from gemma4_images.bench import fullsize
from gemma4_images.check import server, smoke
from gemma4_images.spec.image_code import gemma4_serve
from tests.fullsize_tier import FIGURES

pytestmark = [pytest.mark.integration, pytest.mark.fullsize]
TARGET = "xeon6"
# Always run: what a random model answers to any request, and what its launch refuses.
CHECKS = ["ready", "chat", "chat_stream", "completion", "chat_single_bos", "raw_prompt_bos", "bad_requests"]
CHECKS += ["image_input", "audio_input", "video_input"]
TOOL = smoke.TOOL


@pytest.fixture(scope="module")
def shape_server(m, e2b_shape):
    """The CPU image with the shape's tokenizer baked, serving the recipe's launch (nothing of the
    smoke's own), compiled, with the pod's KV cache and an empty compile-cache volume."""
    image, folder = e2b_shape
    kv_gib = m.families["cpu"].kubernetes.resources.kv_cache_gib
    with fullsize.cache_volume() as volume:
        try:
            with server.serve(
                m, TARGET, image, str(folder), eager=False, launch_only=True, keep_compiles=False,
                customize=fullsize.pod_like(volume, kv_gib), budget=fullsize.BUDGET_S,
            ) as srv:  # fmt: skip
                yield srv, srv.log(), kv_gib
        except server.NotHealthy as e:  # why it did not start is in its log, not in the exception
            pytest.fail(f"{e}\n" + "\n".join(e.log[-60:]), pytrace=False)


def test_the_recipe_launch_serves_e2b_shape_cleanly(shape_server, m):
    """The launch is the recipe's as `build.py run xeon6` composes it (no argument of the smoke's),
    the start-up log holds no ERROR or traceback, and vLLM's KV capacity is on record."""
    srv, started, kv_gib = shape_server
    launch = srv.launch()
    for flag in m.targets[TARGET].smoke.args:
        assert flag not in launch, f"the smoke's {flag} in what should be the recipe's launch: {launch}"
    smoke.startup_log(started)
    kv = fullsize.kv_capacity(started)
    assert kv and kv["tokens"] > 0, "vLLM's KV cache line is missing from the start-up log"
    fullsize.write_figures(FIGURES, {"healthy_s": round(srv.seconds_to_healthy), "kv_cache_gib": kv_gib, "kv": kv})


@pytest.mark.parametrize("name", CHECKS)
def test_every_endpoint_answers_at_full_size(shape_server, name):
    srv, _, _ = shape_server
    checks = smoke.Checks(srv.url, srv.served, srv.launch().split(), timeout=fullsize.REQUEST_TIMEOUT_S)
    getattr(checks, name)()


def test_tool_calls_parse_whatever_the_model_emits(shape_server):
    """tool_choice auto: whatever a random model emits, the gemma4 parser answers 200 with either text
    or well-formed calls (JSON arguments) - never a 500 or a half-parsed call."""
    srv, _, _ = shape_server
    checks = smoke.Checks(srv.url, srv.served, timeout=fullsize.REQUEST_TIMEOUT_S)
    for stream in (False, True):
        body = {
            "model": srv.served,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [TOOL],
            "tool_choice": "auto",
            "max_tokens": 24,
            "temperature": 1.0,
            "seed": 7,
        }
        if not stream:
            status, answer = checks.post("/v1/chat/completions", body)
            assert status == 200, answer
            for call in answer["choices"][0]["message"].get("tool_calls") or []:
                json.loads(call["function"]["arguments"])
        else:
            events = fullsize.stream(srv.url, {**body, "stream": True}, fullsize.REQUEST_TIMEOUT_S)
            assert events[-1] == "[DONE]", events[-3:]


@pytest.mark.parametrize("modality", ["image", "audio"])
def test_the_towers_take_recipe_sized_inputs(shape_server, modality):
    """The largest inputs the recipe's launch takes reach the towers: four 896-pixel images in one
    prompt (--limit-mm-per-prompt image 4, each at the 280-soft-token default budget) and one
    30-second clip (750 tokens, the processor's limit; e2b.json processor). The prompt's token count
    shows the towers' output was placed."""
    srv, _, _ = shape_server
    checks = smoke.Checks(srv.url, srv.served, timeout=fullsize.REQUEST_TIMEOUT_S)
    if modality == "image":
        png = base64.b64encode(gemma4_serve.test_png(896)).decode()
        parts = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}] * 4
    else:
        wav = base64.b64encode(gemma4_serve.test_wav(rate=16000, seconds=30)).decode()
        parts = [{"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}]
    body = {"model": srv.served, "max_tokens": 1, "messages": [{"role": "user", "content": [*parts]}]}
    status, answer = checks.post("/v1/chat/completions", body)
    assert status == 200, answer
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert prompt_tokens >= fullsize.MEDIA_TOKENS[modality], f"{prompt_tokens} prompt tokens for {modality}"
    fullsize.write_figures(FIGURES, {f"{modality}_prompt_tokens": prompt_tokens})
