"""Fix gemma4-buffered-tool-args, on the real vLLM of the CPU image (the CPU default's release).

The probe runs Gemma 4 tool-call outputs through the unified parser of
``--tool-call-parser gemma4`` as the chat serving layer does: ``Parser.parse``
(non-streaming) and ``Parser.parse_delta`` fed token by token (streaming).

The un-escaping rule under test: inside ``<|"|>`` delimiters a backslash is literal,
unless the value holds ``\\"`` and no bare ``"``; only then ``\\"`` -> ``"`` and
``\\\\`` -> ``\\`` (left to right), every other backslash kept.
How the observations are made: tests/fixes_helpers.py.
"""

import json

import pytest

from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration

ESCAPED = ["escaped_quotes", "escaped_code", "array", "two_calls"]


@pytest.fixture(scope="module")
def obs(fix_observations):
    data = {
        "unpatched": fx.phase(fix_observations, "unpatched")["tool_args"],
        "patched": fx.phase(fix_observations, "patched")["tool_args"],
    }
    for name, value in data.items():
        assert "probe_error" not in value, f"{name}: {value.get('probe_error')}"
    return data


def calls(case):
    return [(c["name"], json.loads(c["arguments"])) for c in case["parse"]["calls"]]


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings(item)


def streamed(case):
    """Per tool index: its name and the list of argument deltas, in order."""
    out = {}
    for delta in case["stream"]:
        for tc in delta.get("tool_calls", []):
            entry = out.setdefault(tc["index"], {"name": None, "arguments": []})
            fn = tc.get("function", {})
            if fn.get("name"):
                entry["name"] = fn["name"]
            if fn.get("arguments") is not None:
                entry["arguments"].append(fn["arguments"])
    return [out[i] for i in sorted(out)]


@pytest.mark.parametrize("name", ESCAPED)
def test_unpatched_arguments_keep_the_models_backslashes(obs, name):
    _, expected = fx.TOOL_ARG_CASES[name]
    got = calls(obs["unpatched"][name])
    assert [n for n, _ in got] == [n for n, _ in expected]
    assert got != expected
    assert any('\\"' in text for text in strings(got))  # a backslash before a quote


def test_unpatched_streaming_sends_arguments_in_several_deltas(obs):
    for name in ESCAPED:
        assert any(len(call["arguments"]) > 1 for call in streamed(obs["unpatched"][name])), name


@pytest.mark.parametrize("name", list(fx.TOOL_ARG_CASES))
def test_patched_arguments_are_what_the_model_meant(obs, name):
    _, expected = fx.TOOL_ARG_CASES[name]
    assert calls(obs["patched"][name]) == expected
    assert obs["patched"][name]["parse"]["content"] is None


@pytest.mark.parametrize("name", list(fx.TOOL_ARG_CASES))
def test_patched_streaming_sends_each_calls_arguments_in_one_delta(obs, name):
    case = obs["patched"][name]
    stream = streamed(case)
    assert [(s["name"], len(s["arguments"])) for s in stream] == [(n, 1) for n, _ in calls(case)]
    # The one delta is the whole arguments JSON, the same as non-streaming.
    assert [s["arguments"][0] for s in stream] == [c["arguments"] for c in case["parse"]["calls"]]
    # The name goes out first, in its own delta, with the call id.
    first = case["stream"][0]["tool_calls"][0]
    assert first["function"] == {"name": stream[0]["name"]} and first["id"]


def test_legitimate_backslashes_are_left_alone(obs):
    """A value with a bare quote, or without any escaped quote, is verbatim: the
    fix must not change it (both sides give the same arguments)."""
    assert calls(obs["patched"]["verbatim_backslashes"]) == calls(obs["unpatched"]["verbatim_backslashes"])
    ((_, args),) = calls(obs["patched"]["escaped_code"])
    assert args["path"] == "C:\\Users"  # \U is no escape pair
    assert args["code"].endswith(")\\n")  # \n stays backslash + n
