"""Fix gemma4-required-tool-grammar, on the real vLLM 0.30.0 of the CPU image.

The probe builds the unified parser of ``--tool-call-parser gemma4`` (with and without
``--reasoning-parser gemma4``), calls ``adjust_request`` as the online renderer does, then
puts the request's structured output through vLLM's own xgrammar validation and backend
(``XgrammarBackend.compile_grammar``, Gemma's stop tokens) and feeds the compiled
grammar the token ids of candidate outputs. "accepts" = every token is accepted and the
request may end there. Three xgrammar setups: the package's 0.2.9 (it has the ``gemma_4``
builtin and its "gemma" JSON style), the same with the builtin hidden, and real xgrammar 0.2.1
(vLLM 0.30.0's floor, without the builtin); without the style the fix holds the arguments to the
schema with its own Gemma-syntax grammar, so on every setup a call that breaks the tool's schema
is refused unless the tool says ``strict: false``.
How the observations are made: tests/fixes_helpers.py.
"""

import pytest

from tests import fixes_helpers as fx

pytestmark = pytest.mark.integration

ANY_TOOL = {"say_call", "say_call_quotes", "run_call", "two_calls"}
SAY_ONLY = {"say_call", "say_call_quotes"}
THOUGHT = {"thought_then_call"}  # a thought block, then a call of "say"
FORCED = {"required": ANY_TOOL, "named_say": SAY_ONLY}


def forced(choice, reasoning=""):
    """What the grammar must accept. "+reasoning": the request enables thinking, so (the
    grammar applying from the first token) a thought block may come before the calls."""
    return FORCED[choice] | (THOUGHT if reasoning else set())


@pytest.fixture(scope="module")
def result(fix_package_observations, own):
    """The CPU package of targets.yaml's own release: vLLM 0.30.0 with its xgrammar 0.2.9 (the
    gemma_4 builtin) and the floor 0.2.1. Every other package's grammar is held to the same
    verdict by tests/integration/test_fixes_on_every_package.py (tests/fix_verdicts.py grammar)."""
    observed = fix_package_observations(f"cpu-{own.project.vllm_version}")
    assert observed["check_rc"] == 0 and observed["apply_rc"] == 0, (
        observed["logs"]["check"] + observed["logs"]["apply"]
    )
    return observed


def grammar(result, phase):
    data = fx.phase(result, phase)["grammar"]
    assert "probe_error" not in data, data["probe_error"]
    return data


@pytest.mark.parametrize("choice", ["required", "named_say", "required+reasoning", "named_say+reasoning"])
def test_unpatched_forced_tool_choice_sets_no_grammar(result, choice):
    entry = grammar(result, "unpatched")[choice]
    assert entry["structured_outputs"] is None
    assert entry["grammar_from_parser"] is False
    # So nothing stops the model from answering in prose, which the parser returns as no call.
    assert entry["parsed"]["prose"] == []


def check_forced(entry, accepted, fallback, chat=True):
    assert "probe_error" not in entry, entry["probe_error"]
    assert entry["structural_tag"] is not None, entry
    assert entry["valid"] is True  # vLLM's validate_xgrammar_grammar
    assert entry["fallback_grammar"] is fallback
    assert {name for name, ok in entry["accepts"].items() if ok} == accepted
    if not chat:  # Responses: vLLM's reasoning gate stays
        assert entry["grammar_from_parser"] is None
        return
    for name in accepted:  # what the grammar allows, the parser reads, streaming too
        names = [n for n in ("say", "run") if n in fx.GRAMMAR_CANDIDATES[name]]
        assert entry["parsed"][name] == names and entry["streamed"][name] == names, name
    assert entry["skip_special_tokens"] is False
    assert entry["grammar_from_parser"] is True  # so the serving layer sets reasoning_ended


@pytest.mark.parametrize("choice", ["required", "named_say"])
@pytest.mark.parametrize("reasoning", ["", "+reasoning"])
def test_patched_schema_arguments_on_xgrammar_0_2_9(result, choice, reasoning):
    data = grammar(result, "patched")
    assert data["builtin_gemma_4"] is True  # the image's xgrammar 0.2.9
    check_forced(data[choice + reasoning], forced(choice, reasoning), fallback=False)


@pytest.mark.parametrize("choice", ["required", "named_say"])
def test_patched_fallback_grammar_without_the_builtin(result, choice):
    check_forced(grammar(result, "patched")[choice + "+no_builtin"], forced(choice), fallback=True)


@pytest.mark.parametrize("phase, fallback", [("patched", False), ("patched_xgrammar_floor", True)])
@pytest.mark.parametrize("choice", ["required", "named_say"])
def test_patched_responses_api_request(result, phase, fallback, choice):
    if result.get(phase) is None:
        pytest.skip("xgrammar 0.2.1 could not be downloaded from PyPI")
    unpatched = grammar(result, "unpatched")[choice + "+responses"]
    assert "probe_error" not in unpatched and unpatched["structured_outputs"] is None
    check_forced(grammar(result, phase)[choice + "+responses"], forced(choice), fallback, chat=False)


@pytest.mark.parametrize("choice", ["required", "named_say"])
@pytest.mark.parametrize("reasoning", ["", "+reasoning"])
def test_patched_on_real_xgrammar_0_2_1(result, choice, reasoning):
    if result.get("patched_xgrammar_floor") is None:
        pytest.skip("xgrammar 0.2.1 could not be downloaded from PyPI")
    data = grammar(result, "patched_xgrammar_floor")
    assert data["builtin_gemma_4"] is False
    check_forced(data[choice + reasoning], forced(choice, reasoning), fallback=True)


def test_patched_prose_and_json_are_rejected(result):
    for key in ("required", "named_say", "required+no_builtin", "named_say+no_builtin"):
        accepts = grammar(result, "patched")[key]["accepts"]
        for name in (
            "prose",
            "prose_then_call",
            "json_call",
            "unknown_tool",
            "call_end_inside_string",
            "say_call_subword",
        ):
            assert accepts[name] is False, (key, name)


@pytest.mark.parametrize("phase", ["unpatched", "patched"])
def test_auto_stays_unconstrained(result, phase):
    for key in ("auto", "auto+reasoning"):
        assert grammar(result, phase)[key]["structured_outputs"] is None


def test_strict_tool_calling_off_keeps_the_old_behaviour(result):
    assert grammar(result, "patched")["required+strict_off"]["structured_outputs"] is None


def test_markers_are_bound_to_their_special_tokens(result):
    """The same call text with its markers spelled in ordinary tokens is read by the
    non-streaming parser but not by the streaming one (it matches markers by token id),
    so the grammar must not allow it (xgrammar's gemma_4 builtin alone would)."""
    entry = grammar(result, "patched")["required"]
    assert entry["parsed"]["say_call_subword"] == ["say"]
    assert entry["streamed"]["say_call_subword"] == []
    for phase in ("patched", "patched_xgrammar_floor"):
        if result.get(phase) is not None:
            for key in ("required", "named_say", "required+reasoning"):
                assert grammar(result, phase)[key]["accepts"]["say_call_subword"] is False, (phase, key)


def test_parallel_tool_calls_false_allows_one_call(result):
    check_forced(grammar(result, "patched")["required+single"], ANY_TOOL - {"two_calls"}, fallback=False)


def test_patched_schema_is_held_unless_the_tool_says_strict_false(result):
    """vLLM 0.30.0's rule (get_function_parameters): arguments follow the schema unless strict is
    false; an unknown key, a missing required key and a string for an integer are refused, on every
    xgrammar setup."""
    data = grammar(result, "patched")
    for key in ("required", "required+strict", "required+no_builtin"):
        assert not any(data[key]["accepts"][n] for n in fx.SCHEMA_BREAKS), key
    assert all(data["required+strict_false"]["accepts"][n] for n in fx.SCHEMA_BREAKS)
    floor = result.get("patched_xgrammar_floor")
    if floor is not None:
        assert not any(floor["grammar"]["required"]["accepts"][n] for n in fx.SCHEMA_BREAKS)


def test_patched_reasoning_effort_turns_thinking_on_as_vllm_does(result):
    """vLLM's build_chat_params asks the template to think for any reasoning_effort but "none":
    the grammar then allows the thought before the call, and not for "none"."""
    data = grammar(result, "patched")
    assert data["required+effort_high"]["accepts"]["thought_then_call"] is True
    assert data["required+effort_none"]["accepts"]["thought_then_call"] is False
    assert data["required+effort_none"]["accepts"]["say_call"] is True
