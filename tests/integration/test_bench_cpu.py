"""gemma4-bench for real: the CPU image, the tiny model, tiny sizes, both modes. Structure only:
no timing is asserted (the machines are noisy; BENCHMARKS.md holds the figures)."""

import pytest

from gemma4_images.bench import harness
from gemma4_images.build import owned
from gemma4_images.spec.matrix import ROOT

pytestmark = pytest.mark.integration

OFFLINE = [
    "offline",
    "--model",
    "/models/tiny",
    "--cases",
    "prefill-bs16,decode-bs64",
    "--scale",
    "0.05",
    "--enforce-eager",
    "--max-model-len",
    "512",
    "--warmups",
    "2",
    "--reps",
    "3",
    "--check-prompts",
    "4",
    "--json",
    "-",
]
SERVED = [
    "served",
    "--concurrency",
    "4",
    "--prompt-tokens",
    "24",
    "--max-tokens",
    "8",
    "--token-low",
    "120",
    "--token-high",
    "250",
    "--startup-budget",
    "300",
    "--json",
    "-",
    "--",
    "--enforce-eager",
    "--max-model-len",
    "512",
]


def test_the_harness_is_shipped_in_the_image(client, cpu_image):
    shipped = client.containers.run(
        cpu_image,
        ["/usr/local/bin/gemma4-bench"],
        entrypoint=["cat"],
        remove=True,
        network_mode="none",
        labels=owned.labels(),
    )
    assert shipped == (ROOT / "image" / "gemma4_bench.py").read_bytes()


def test_offline_runs_both_modes_and_the_correctness_check(client, cpu_image):
    result, _, _ = harness.run_harness(client, cpu_image, OFFLINE, print)
    assert result["errors"] == {}
    assert set(result["modes"]) == {"stock", "fast"}
    assert [c["case"] for c in result["cases"]] == ["prefill-bs16", "decode-bs64"]
    for mode in ("stock", "fast"):
        for c in result["cases"]:
            got = result["modes"][mode][c["case"]]
            assert len(got["latency_s"]) == 3 and len(got["tok_s_reps"]) == 3 and got["tok_s"] > 0
            # ignore_eos: every prompt produced exactly the case's output length, in every rep
            assert got["output_tokens_per_rep"] == [got["expected_output_tokens"]] * 3
    assert set(result["ratios"]) == {"prefill-bs16", "decode-bs64"} and all(result["ratios"].values())
    check = result["correctness"]
    assert check["n"] == 4 and check["tokens"] == 32
    assert 0 <= check["continuation_identical"] <= check["first_token_identical"] <= 4
    assert result["settings"]["max_model_len"] == 512 and result["settings"]["prompt_bs_cap"] == 1


def test_served_starts_each_mode_and_records_two_rounds(client, cpu_image):
    result, _, _ = harness.run_harness(client, cpu_image, SERVED, print)
    assert result["errors"] == {}
    assert set(result["modes"]) == {"stock", "fast"}
    for mode, flag in (("stock", "--no-kv-sharing-fast-prefill"), ("fast", "--kv-sharing-fast-prefill")):
        got = result["modes"][mode]
        assert got["launch"][-1] == flag
        assert len(got["ttft_median_s"]) == 2 and len(got["wall_s"]) == 2
        assert all(t > 0 for t in got["ttft_median_s"] + got["wall_s"])
    assert result["outputs"]["n"] == 4
