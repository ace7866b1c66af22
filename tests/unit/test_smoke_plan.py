"""The smoke's plan: the checks kept out of the concurrent run name checks that exist."""

from gemma4_images.check import smoke
from gemma4_images.spec import matrix

M = matrix.load()


def test_every_check_run_alone_is_a_planned_check():
    # A renamed check would otherwise drop out of ALONE silently and run batched with others.
    for target in M.targets:
        names = {name for name, _ in smoke.planned_checks(M, target, [], scripted=True)}
        assert smoke.ALONE <= names, (target, smoke.ALONE - names)


def test_server_errors_names_the_engines_exception_and_nothing_else():
    # As vLLM 0.30.0 logs an engine core that died in a step, then the API server's 500.
    log = [
        "(APIServer pid=1) INFO 12-04 14:55:02 [api_server.py:1012] Starting vLLM API server 0 on http://127.0.0.1:8000",
        # every start here: a warning that quotes an exception nobody raised
        "(APIServer pid=1) WARNING 12-04 15:32:29 [system_utils.py:299] Found ulimit of 20000 and failed to "
        "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors "
        "like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n",
        "(EngineCore_DP0 pid=80) ERROR 12-04 14:56:10 [core.py:1088] EngineCore encountered a fatal error.",
        "(EngineCore_DP0 pid=80) ERROR 12-04 14:56:10 [core.py:1088] Traceback (most recent call last):",
        '(EngineCore_DP0 pid=80) ERROR 12-04 14:56:10 [core.py:1088]   File "/opt/venv/lib/x.py", line 3, in f',
        "(EngineCore_DP0 pid=80) ERROR 12-04 14:56:10 [core.py:1088] RuntimeError: shape '[1, 64]' is invalid",
        "(APIServer pid=1) ERROR 12-04 14:56:10 [async_llm.py:555] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        '(APIServer pid=1) INFO:     127.0.0.1:40000 - "POST /v1/chat/completions HTTP/1.1" 500 Internal Server Error',
    ]
    assert smoke.server_errors(log) == [
        "RuntimeError: shape '[1, 64]' is invalid",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
        "root cause.",
    ]
    assert smoke.server_errors(log[:3] + log[-1:]) == []  # a log whose only exception is a warning's
