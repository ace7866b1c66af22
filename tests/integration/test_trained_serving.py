"""vLLM in the CPU image (the CPU default's release), serving the tiny trained Gemma 4 exactly as the smoke tier runs
the image (targets.yaml xeon6: --user 2000, --shm-size 1g, VLLM_CPU_KVCACHE_SPACE=1,
--enforce-eager, --kv-sharing-fast-prefill, the recipe's parsers and chat template), gives every
scripted answer exactly under greedy decoding: chat, raw completion from <bos>, reasoning split,
auto tool calls, an answer after a tool result, image and audio turns. The same with
--no-kv-sharing-fast-prefill, token for token.

Each request also asks for `return_token_ids`, so the prompt vLLM built is compared with the
sequence the model was trained on, and the generated ids with the trained output and stop token.
"""

import json

import pytest
from docker.errors import NotFound

from gemma4_images.check import server, smoke
from testkit import exchanges, prompts, trained

pytestmark = pytest.mark.integration

TARGET = prompts.TARGET  # the launch the model was trained for
VARIANTS = {"recipe": [], "no_fast_prefill": ["--no-kv-sharing-fast-prefill"]}


def serve_and_ask(client, m, image, extra_args) -> dict:
    """Every exchange's response from one server; the container is always removed."""
    try:
        with server.serve(m, TARGET, image, str(trained.ensure()), extra_args=extra_args) as srv:
            answers = {
                ex.name: smoke.http("POST", srv.url + ex.path, {**ex.body(srv.served), "return_token_ids": True})
                for ex in exchanges.EXCHANGES
            }
            log = "\n".join(srv.log())
    except server.NotHealthy as e:
        pytest.fail(f"{e}\n" + "\n".join(e.log[-40:]))
    with pytest.raises(NotFound):
        client.containers.get(srv.container.id)
    return {"answers": answers, "log": log}


@pytest.fixture(scope="module")
def runs(client, m, cpu_image):
    return {name: serve_and_ask(client, m, cpu_image, args) for name, args in VARIANTS.items()}


@pytest.fixture(scope="module")
def trained_prompts():
    """What the model was trained on, for the prompts the image's launch renders."""
    renderer = prompts.Renderer(trained.ensure())
    return {
        ex.name: next(p for p in renderer.prompts(ex) if p.template in ("served", "completion"))
        for ex in exchanges.EXCHANGES
    }


def ids(response: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, generated ids) of a response that asked for return_token_ids."""
    choice = response["choices"][0]
    return response.get("prompt_token_ids") or choice.get("prompt_token_ids"), choice["token_ids"]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("ex", exchanges.EXCHANGES, ids=lambda ex: ex.name)
def test_greedy_answer_is_exactly_the_script(runs, trained_prompts, variant, ex):
    status, response = runs[variant]["answers"][ex.name]
    assert status == 200, response
    assert ex.mismatch(response) is None
    prompt_ids, output_ids = ids(response)
    assert prompt_ids == trained_prompts[ex.name].prompt_ids, "vLLM built another prompt than the one trained"
    assert output_ids == trained_prompts[ex.name].target_ids  # the text and then the stop token


def test_fast_prefill_changes_no_greedy_token(runs):
    with_fp, without = (runs[v]["answers"] for v in VARIANTS)
    for ex in exchanges.EXCHANGES:
        assert ids(with_fp[ex.name][1])[1] == ids(without[ex.name][1])[1], ex.name


def test_the_cpu_tier_serves_the_models_own_dtype(runs):
    # --dtype auto on vLLM's CPU platform keeps a bfloat16 checkpoint in bfloat16 (and would cast a
    # float32 one down to it: vllm/config/model.py, _resolve_auto_dtype; vllm/platforms/cpu.py,
    # supported_dtypes), so the fixture's dtype is the one served.
    assert json.loads((trained.ensure() / "config.json").read_text())["dtype"] == "bfloat16"
    assert "dtype=torch.bfloat16" in runs["recipe"]["log"]
