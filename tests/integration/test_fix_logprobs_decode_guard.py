"""Fix logprobs-decode-guard, on the real vLLM of the CPU image (the CPU default's release).

The probe feeds vLLM's OutputProcessor (what AsyncLLM's output handler calls for every
engine step) logprob token ids the tokenizer cannot decode. Unpatched, the error leaves
process_outputs, which ends the output handler and fails every request of the server.
How the observations are made: tests/fixes_helpers.py.
"""

import pytest

from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration

INVALID = fx.INVALID_TOKEN_TEXT


@pytest.fixture(scope="module")
def obs(fix_observations):
    return {
        "unpatched": fx.phase(fix_observations, "unpatched")["logprobs"],
        "patched": fx.phase(fix_observations, "patched")["logprobs"],
    }


def no_probe_error(data):
    assert "probe_error" not in data, data.get("probe_error")
    return data


def test_unpatched_a_bad_logprob_id_raises_out_of_the_output_processor(obs):
    lp = no_probe_error(obs["unpatched"])
    assert lp["bad_ids"]["steps"][0]["error"] == "OverflowError"  # id -5
    assert lp["bad_ids"]["steps"][1]["error"] == "OverflowError"  # id 2**33
    assert lp["bad_prompt_ids"]["steps"][0]["error"] == "OverflowError"  # prompt logprobs
    assert lp["bad_sampled_then_byte"]["steps"][0]["error"] == "OverflowError"
    assert lp["index_error"]["error"] == "IndexError"  # list-backed vocabulary


def test_patched_bad_ids_get_the_placeholder_and_valid_ids_their_text(obs):
    steps = no_probe_error(obs["patched"])["bad_ids"]["steps"]
    assert steps[0] == {"logprobs": [{"483": "Hello", "-5": INVALID, str(2**40): INVALID}]}
    assert steps[1] == {"logprobs": [{"454": "w", str(2**33): INVALID, "479": "call"}]}


def test_patched_warns_once_per_request(obs):
    lp = no_probe_error(obs["patched"])
    (first,) = lp["bad_ids"]["warnings"]  # two steps with bad ids, one warning
    assert "req-bad" in first and "[-5, 1099511627776]" in first and "OverflowError" in first
    (second,) = lp["bad_ids_second_request"]["warnings"]
    assert "req-bad-2" in second and "[-1]" in second


def test_patched_prompt_logprobs_with_a_bad_id(obs):
    (step,) = no_probe_error(obs["patched"])["bad_prompt_ids"]["steps"]
    assert step["prompt_logprobs"][1] == {"476": " the", "-7": INVALID}
    assert step["prompt_logprobs"][2] == {"449": "r", "454": "w"}


def test_patched_a_corrupted_sampled_id_does_not_break_a_later_byte_correction(obs):
    steps = no_probe_error(obs["patched"])["bad_sampled_then_byte"]["steps"]
    assert steps[0] == {"logprobs": [{"-5": INVALID, "454": "w", "479": "call"}]}
    assert "error" not in steps[1]  # its U+FFFD correction decodes the context, which holds -5


def test_patched_index_error_of_other_tokenizers_is_caught_too(obs):
    result = no_probe_error(obs["patched"])["index_error"]
    assert result["logprobs"] == [{"483": "Hello", "600": INVALID, "454": "w"}]
    (warning,) = result["warnings"]
    assert "IndexError" in warning


def test_valid_ids_decode_exactly_as_before(obs):
    assert no_probe_error(obs["patched"])["valid"] == no_probe_error(obs["unpatched"])["valid"]
    assert obs["patched"]["valid"]["warnings"] == []
