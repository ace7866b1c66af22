"""What each vLLM-level fix's bug looks like in its probe's observations (tests/fixes_helpers.py).

symptoms(fix, observed) -> the bug's symptoms found in one phase (unpatched or patched) of one
package: an empty list when the package behaves as the fix intends. A probe whose fix's code path
this package cannot take on this machine raises NotHere with the reason (a fact the probe
recorded, not an assumption). The detailed per-fix tests (tests/integration/test_fix_*.py) hold
the CPU packages to more than this; these are the bugs themselves, the same on every package.
"""

from __future__ import annotations

import json

from tests import fixes_helpers as fx

TOLERANCE = 0.05  # bf16 against float32 for the oneDNN linear; float32 is exact to ~1e-6


class NotHere(Exception):
    """The fix's code path is not taken by this package on this machine; the message says why."""


def logprobs(o: dict) -> list[str]:
    """logprobs-decode-guard: a logprob id the tokenizer cannot decode must not raise out of the
    output processor; it gets the placeholder text."""
    found = []
    for case in ("bad_ids", "bad_prompt_ids", "bad_sampled_then_byte", "bad_ids_second_request"):
        for i, step in enumerate(o[case]["steps"]):
            if "error" in step:
                found.append(f"{case} step {i}: {step['error']} raised out of the output processor")
    if "error" in o["index_error"]:
        found.append(f"a list-backed vocabulary: {o['index_error']['error']} raised")
    elif fx.INVALID_TOKEN_TEXT not in json.dumps(o["index_error"]["logprobs"]):
        found.append("a list-backed vocabulary's bad id has no placeholder")
    steps = o["bad_ids"]["steps"]
    if steps and "error" not in steps[0] and steps[0]["logprobs"][0].get("-5") != fx.INVALID_TOKEN_TEXT:
        found.append(f"id -5 decoded as {steps[0]['logprobs'][0].get('-5')!r}")
    return found


def tool_args(o: dict) -> list[str]:
    """gemma4-buffered-tool-args: each call's arguments are what the model meant, streamed in one
    delta equal to the non-streamed arguments."""
    found = []
    for name, (_, expected) in fx.TOOL_ARG_CASES.items():
        case = o[name]
        got = [(c["name"], json.loads(c["arguments"])) for c in case["parse"]["calls"]]
        if got != expected:
            found.append(f"{name}: arguments {got} (meant {expected})")
        deltas: dict[int, list[str]] = {}
        for delta in case["stream"]:
            for call in delta.get("tool_calls", []):
                args = call.get("function", {}).get("arguments")
                if args is not None:
                    deltas.setdefault(call["index"], []).append(args)
        streamed = [deltas[i] for i in sorted(deltas)]
        whole = [[c["arguments"]] for c in case["parse"]["calls"]]
        if streamed != whole:
            found.append(f"{name}: streamed {streamed}, not each call's arguments in one delta")
    return found


# Which candidates a forced choice's grammar must accept (the rest it must refuse).
ANY_CALL = {"say_call", "say_call_quotes", "run_call", "two_calls"}
SAY_ONLY = {"say_call", "say_call_quotes"}
THOUGHT = {"thought_then_call"}
SCHEMA_BREAKS = set(fx.SCHEMA_BREAKS)


def schema_held(o: dict, entry: str) -> bool:
    """Whether vLLM's rules hold say's arguments to its schema in this grammar entry. With
    --tool-strict-level (vLLM 0.32.0 on): the tool's strict: true, or level parameter. Before it
    (vLLM 0.30.0, get_function_parameters): unless the tool says strict: false."""
    if entry.endswith("+strict"):
        return True
    if entry.endswith("+strict_false"):
        return False
    if entry.endswith("+level_parameter"):
        return True
    return not o["strict_levels"]


def expected_accepts(o: dict, entry: str) -> set[str]:
    choice = entry.split("+")[0]
    accepted = set(ANY_CALL if choice == "required" else SAY_ONLY)
    if entry.endswith(("+reasoning", "+effort_high")):
        accepted |= THOUGHT  # thinking is on: a thought block may come first
    if entry.endswith("+single"):
        accepted -= {"two_calls"}
    if not schema_held(o, entry):
        accepted |= SCHEMA_BREAKS
    return accepted


def forced_entries(o: dict) -> list[str]:
    """The chat grammar entries of a forced choice the probe recorded (not Responses, not the
    opt-out, not the builtin hidden)."""
    return [
        k
        for k in o
        if k.split("+")[0] in ("required", "named_say")
        and not k.endswith(("+responses", "+strict_off", "+no_builtin"))
        and isinstance(o[k], dict)
    ]


def grammar(o: dict) -> list[str]:
    """gemma4-required-tool-grammar: a forced tool choice gets a grammar vLLM accepts, which takes
    exactly the calls the choice allows (a thought first when thinking is on, whether by
    enable_thinking or reasoning_effort), holds the arguments to the schema where vLLM's strict
    rules say so and refuses prose, JSON, other tools and markers spelled in sub-word tokens."""
    found = []
    for entry in forced_entries(o):
        data = o[entry]
        if "probe_error" in data:
            found.append(f"{entry}: {data.get('error', '')} {data.get('message', '')}".strip())
            continue
        if data["structural_tag"] is None:
            found.append(f"{entry}: no grammar, the model may answer in prose")
            continue
        if data["valid"] is not True:
            found.append(f"{entry}: vLLM refuses the grammar: {data['valid']}")
            continue
        got = {name for name, ok in data["accepts"].items() if ok}
        want = expected_accepts(o, entry)
        if got != want:
            found.append(f"{entry}: accepts {sorted(got - want)} and refuses {sorted(want - got)} wrongly")
    return found


def linear_off(name: str, got: dict) -> str | None:
    """What is wrong with one probed matrix product against torch's (its error, or a difference past
    TOLERANCE), None when it is right."""
    if "error" in got:
        return f"{name}: {got['error']}: {got['message']}"
    if got["max_abs_diff"] > TOLERANCE * max(1.0, got["max_abs"]):
        return f"{name}: off by {got['max_abs_diff']}"
    return None


def onednn(o: dict) -> list[str]:
    """cpu-onednn-strided-input: vLLM's oneDNN linear on a transposed activation (Gemma 4's audio
    conformer) gives torch's linear."""
    if not o.get("supports_onednn"):
        raise NotHere("this build has no oneDNN kernels (vllm._custom_ops._supports_onednn is False)")
    return [off for key, got in o.items() if isinstance(got, dict) and (off := linear_off(key, got))]


def compile_cache(o: dict) -> list[str]:
    """cpu-compile-cache-load: vLLM loads an artifact the CPU platform compiled, and it computes
    what the module does."""
    if o.get("platform") != "cpu":
        raise NotHere(f"vLLM's platform here is {o.get('platform')!r}, not the CPU platform whose artifact it loads")
    found = [f"warned: {w}" for w in o["warnings"]]
    if not o["loaded"]:
        found.append("the saved artifact was not loaded (the model compiles again)")
    elif o["max_abs_diff"] > 1e-5:
        found.append(f"the loaded artifact is off by {o['max_abs_diff']}")
    return found


def embedding(o: dict) -> list[str]:
    """cpu-embedding-gemm-on-use: a lookup-only embedding holds no packed copy of its table; the LM
    head still multiplies as torch's linear does."""
    if o.get("platform") != "cpu":
        raise NotHere(f"vLLM's platform here is {o.get('platform')!r}: the packing is the CPU platform's")
    found = []
    if o["packed_at_load"]["table"] or o["packed_after_use"]["table"]:
        found.append("a lookup-only table was packed for a matrix product: a second copy of it")
    if not o["lookup_equal"]:
        found.append("a lookup gives other rows than torch's embedding")
    off = linear_off("the LM head's logits", o["logits"])
    return found + ([off] if off else [])


def shutdown(o: dict) -> list[str]:
    """shutdown-ends-requests: SIGTERM with a request waiting for an engine whose aborts never
    arrive ends that request with a 503, and the server ends."""
    found = []
    if not o["waiting"]:
        return ["the request never reached the engine client"]
    if o["ended_after_s"] is None:
        found.append(f"the server did not end within {fx.SHUTDOWN_WAIT_S} s of SIGTERM")
    if o["answer"].get("status") != 503:
        found.append(f"the waiting request got {o['answer']}, not a 503")
    return found


# fix -> (its probe, its symptoms)
VERDICTS = {
    "logprobs-decode-guard": ("logprobs", logprobs),
    "shutdown-ends-requests": ("shutdown", shutdown),
    "cpu-onednn-strided-input": ("onednn", onednn),
    "cpu-compile-cache-load": ("compile_cache", compile_cache),
    "cpu-embedding-gemm-on-use": ("embedding", embedding),
    "gemma4-required-tool-grammar": ("grammar", grammar),
    "gemma4-buffered-tool-args": ("tool_args", tool_args),
}


def symptoms(fix: str, observed: dict) -> list[str]:
    """The fix's bug as one phase of one package shows it ([] when it is not there)."""
    probe, read = VERDICTS[fix]
    data = observed.get(probe) or {"probe_error": f"probe {probe} wrote nothing"}
    if "probe_error" in data:
        return [f"the probe failed: {data['probe_error'].strip().splitlines()[-1]}"]
    return read(data)
