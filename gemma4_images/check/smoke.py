"""Smoke tests: start a built image with testcontainers, wait for it, and check that it serves
the way the recipe promises. Used by `build.py smoke` and by the test suite."""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gemma4_images.build import probe
from gemma4_images.check import server
from gemma4_images.check.sampling_checks import SamplingChecks, Skipped
from gemma4_images.check.server import http
from gemma4_images.spec.facts import BUILD_FACTS, RECORDS
from gemma4_images.spec.image_code import gemma4_serve
from gemma4_images.spec.matrix import Matrix

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@dataclass
class Check:
    name: str
    status: str = "pass"  # pass | fail | skip
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    target: str
    image: str
    model: str
    image_id: str = ""  # what `build.py push` matches: a tag can move after the test
    checks: list[Check] = field(default_factory=list)
    seconds_to_healthy: float | None = None
    log_tail: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)  # the exceptions its whole log names
    answers: list = field(default_factory=list)  # (exchange, question, answer) of the scripted ones

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    def table(self) -> str:
        rows = [f"{'CHECK':<25} {'RESULT':<6} {'SECONDS':>7}  DETAIL"]
        rows += [f"{c.name:<25} {c.status.upper():<6} {c.seconds:>7.1f}  {c.detail}" for c in self.checks]
        return "\n".join(rows)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**asdict(self), "ok": self.ok}, indent=2) + "\n")


class CheckFailed(AssertionError):
    pass


# -- plumbing ------------------------------------------------------------------------------------


def expect(condition: bool, expected: str, got) -> None:
    if not condition:
        raise CheckFailed(f"expected {expected}; got {str(got)[:300]}")


# -- the checks ----------------------------------------------------------------------------------


class Checks(SamplingChecks):
    """Each method is one check; it raises CheckFailed with what was expected and what came back.
    With script (the tiny trained model's exchanges) the answers must be the scripted ones exactly;
    without it (real weights) the checks hold for any model."""

    expect = staticmethod(expect)

    def __init__(
        self,
        url: str,
        model: str,
        launch: list[str] = (),
        script: list | None = None,
        timeout: float = server.REQUEST_TIMEOUT_S,
    ):
        self.url, self.model, self.timeout = url, model, timeout
        # Which modalities the launch accepts (vLLM's default when --limit-mm-per-prompt omits one).
        self.limits = gemma4_serve.mm_limits(list(launch))
        self.script = {ex.name: ex for ex in script or []}
        self.exact = bool(script)
        self.answers: list[tuple[str, str, str]] = []  # (exchange, question, answer), as they came back

    def scripted(self, name: str) -> str:
        """Send exchange `name` of the script; it must come back exactly as scripted."""
        ex = self.script[name]
        status, body = self.post(ex.path, ex.body(self.model))
        expect(status == 200, f"200 for the scripted {name} request", f"{status} {body}")
        problem = ex.mismatch(body)
        if problem:
            raise CheckFailed(f"the scripted answer; got {problem}")
        self.answers.append((name, question(ex.request), answer_text(ex.answer(body))))
        return body

    def post(self, path, body=None, raw=None):
        return http("POST", self.url + path, body, raw, timeout=self.timeout)

    def chat_body(self, **extra):
        return {
            "model": self.model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "ignore_eos": True,
            **extra,
        }

    def good_request_still_works(self):
        status, body = self.post("/v1/chat/completions", self.chat_body())
        expect(status == 200, "the next good request to succeed (200)", f"{status} {body}")

    def ready(self):
        status, body = http("GET", self.url + "/v1/models", timeout=self.timeout)
        ids = [m.get("id") for m in body.get("data", [])] if isinstance(body, dict) else body
        expect(status == 200 and self.model in ids, f"/v1/models to list {self.model}", f"{status} {ids}")

    def chat(self):
        if self.exact:
            body = self.scripted("chat")
            return (
                f"{self.script['chat'].request['messages'][0]['content']!r} -> "
                f"{body['choices'][0]['message']['content']!r}"
            )
        status, body = self.post("/v1/chat/completions", self.chat_body())
        expect(status == 200, "200", f"{status} {body}")
        message = body["choices"][0]["message"]
        text = (message.get("content") or "") + (message.get("reasoning") or message.get("reasoning_content") or "")
        expect(text != "", "content in the answer", message)
        expect(body.get("usage", {}).get("completion_tokens") == 8, "usage.completion_tokens == 8", body.get("usage"))
        return f"answer: {text[:48]!r}"

    def chat_stream(self):
        """Streamed deltas join to exactly the non-streamed answer (greedy)."""
        body = (
            self.script["chat"].body(self.model)
            if self.exact
            else {**self.chat_body(), "ignore_eos": False, "temperature": 0}
        )
        status, whole = self.post("/v1/chat/completions", body)
        expect(status == 200, "200", f"{status} {whole}")
        req = urllib.request.Request(
            self.url + "/v1/chat/completions",
            method="POST",
            data=json.dumps({**body, "stream": True}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
        expect(len(events) >= 3 and events[-1] == "[DONE]", "several SSE chunks ending in [DONE]", events[-3:])
        joined = "".join(
            json.loads(e)["choices"][0]["delta"].get("content") or ""
            for e in events[:-1]
            if json.loads(e).get("choices")
        )
        content = whole["choices"][0]["message"]["content"] or ""
        expect(
            joined == content, "the streamed deltas to join to the non-streamed answer", f"{joined!r} vs {content!r}"
        )
        return f"{len(events) - 1} chunks join to {content[:30]!r}"

    def completion(self):
        if self.exact:
            body = self.scripted("completion")
            return f"{self.script['completion'].request['prompt']!r} -> {body['choices'][0]['text']!r}"
        status, body = self.post(
            "/v1/completions",
            {"model": self.model, "prompt": "The capital of France is", "max_tokens": 4, "ignore_eos": True},
        )
        expect(status == 200 and body["choices"][0]["text"] != "", "200 with text", f"{status} {body}")

    def bos_counts(self, **request):
        status, body = self.post("/tokenize", {"model": self.model, "return_token_strs": True, **request})
        expect(status == 200, "/tokenize 200", f"{status} {body}")
        strs = body.get("token_strs") or []
        return strs.count("<bos>"), strs[:3]

    def chat_single_bos(self):
        count, head = self.bos_counts(messages=[{"role": "user", "content": "hi"}])
        expect(count == 1 and head[0] == "<bos>", "a chat prompt to start with exactly one <bos>", head)

    def raw_prompt_bos(self):
        count, head = self.bos_counts(prompt="Hello world")
        expect(
            count == 1 and head[0] == "<bos>",
            "a raw prompt to start with exactly one <bos> (the baked BOS tokenizer)",
            head,
        )

    def tools_forced(self):
        # A question no tool answers, so only the forcing (gemma4-required-tool-grammar) makes a call.
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            status, body = self.post(
                "/v1/chat/completions",
                {
                    "model": self.model,
                    "messages": [{"role": "user", "content": "What is the capital of France?"}],
                    "tools": [TOOL],
                    "tool_choice": choice,
                    "max_tokens": 64,
                    "temperature": 0,
                },
            )
            expect(status == 200, "200", f"{status} {body}")
            calls = body["choices"][0]["message"].get("tool_calls") or []
            expect(
                calls and calls[0]["function"]["name"] == "get_weather",
                f"tool_calls to get_weather for tool_choice={json.dumps(choice)}",
                body["choices"][0]["message"],
            )
            try:
                json.loads(calls[0]["function"]["arguments"])
            except ValueError:
                raise CheckFailed(f"arguments that parse as JSON; got {calls[0]['function']['arguments']!r}")

    def tools_auto(self):
        """tool_choice auto: the scripted calls, with a quote in a string argument as the model meant
        it (gemma4-buffered-tool-args), and the answer after the tool's result."""
        for name in ("tool_call", "tool_call_quote", "tool_result"):
            self.scripted(name)
        return "get_weather, send_message (quoted text), answer after the result: as scripted"

    def answer_image(self):
        for name in ("image_red", "image_blue"):
            self.scripted(name)
        return "red -> 'Red.', blue -> 'Blue.'"

    def answer_audio(self):
        for name in ("audio_low", "audio_high"):
            self.scripted(name)
        return "220 Hz -> 'Low.', 2000 Hz -> 'High.'"

    def prompt_logprobs_rejected(self):
        status, body = self.post(
            "/v1/completions", {"model": self.model, "prompt": "Hello", "max_tokens": 2, "prompt_logprobs": 1}
        )
        expect(
            400 <= status < 500 and re.search(r"prompt[ _]logprobs", json.dumps(body)) is not None,
            "a 4xx validation error naming prompt_logprobs",
            f"{status} {body}",
        )
        self.good_request_still_works()

    def reasoning(self):
        if self.exact:
            message = self.scripted("thinking")["choices"][0]["message"]
            return f"reasoning {message.get('reasoning')!r}, content {message['content']!r}"
        status, body = self.post(
            "/v1/chat/completions",
            {
                "model": self.model,
                "messages": [{"role": "user", "content": "What is 17 * 23? Think first."}],
                "max_tokens": 512,
                "chat_template_kwargs": {"enable_thinking": True},
            },
        )
        message = body["choices"][0]["message"] if status == 200 else body
        expect(
            status == 200 and (message.get("reasoning") or message.get("reasoning_content")) and message.get("content"),
            "reasoning and content separated",
            message,
        )

    def image_input(self):
        url = "data:image/png;base64," + base64.b64encode(gemma4_serve.test_png(32)).decode()
        return self._media("image", [{"type": "image_url", "image_url": {"url": url}}])

    def audio_input(self):
        # 44.1 kHz, so the server must also resample to Gemma 4's 16 kHz; both ways clients send it.
        wav = base64.b64encode(gemma4_serve.test_wav()).decode()
        for part in (
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
            {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + wav}},
        ):
            detail = self._media("audio", [part])
        return detail

    def video_input(self):
        # vLLM's own video path (a data URL, its OpenCV loader, transformers' Gemma 4 processor):
        # the one a transformers newer than vLLM's broke (targets.yaml transformers_version).
        url = "data:video/x-msvideo;base64," + base64.b64encode(gemma4_serve.test_avi()).decode()
        return self._media("video", [{"type": "video_url", "video_url": {"url": url}}])

    def _media(self, modality: str, parts: list[dict]) -> str:
        """200 where the launch accepts the modality, a 4xx where it does not (never a 500)."""
        status, body = self.post(
            "/v1/chat/completions",
            {
                "model": self.model,
                "max_tokens": 4,
                "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}],
            },
        )
        article = "an" if modality[0] in "aeiou" else "a"
        if self.limits.get(modality, 1) != 0:
            expect(
                status == 200,
                f"200 for {article} {modality} request (the launch accepts {modality})",
                f"{status} {body}",
            )
        else:
            expect(
                400 <= status < 500,
                f"a 4xx for {article} {modality} request (the launch refuses {modality})",
                f"{status} {body}",
            )
        self.good_request_still_works()
        return f"{status} ({'accepted' if status == 200 else 'refused'} as the launch says)"

    def bad_requests(self):
        cases = [
            ("malformed JSON body", None, b"{not json"),
            ("unknown model", {**self.chat_body(), "model": "no-such-model"}, None),
            ("oversize max_tokens", self.chat_body(max_tokens=10**9), None),
        ]
        for what, body, raw in cases:
            status, answer = self.post("/v1/chat/completions", body, raw)
            expect(400 <= status < 500, f"a 4xx for a {what}", f"{status} {answer}")
            self.good_request_still_works()


def image_facts(client, matrix: Matrix, target: str, image: str) -> None:
    """Labels and /etc/gemma4-e2b/build.json agree with each other and with targets.yaml."""
    labels = client.images.get(image).labels
    fixes = matrix.fixes(target)
    want = {
        "io.gemma4-images.target": target,
        "io.gemma4-images.model": matrix.project.model,
        "io.gemma4-images.vllm-version": matrix.project.vllm_version,
        "io.gemma4-images.fixes": ",".join(fixes),
    }
    got = {k: labels.get(k) for k in want}
    expect(got == want, json.dumps(want), got)

    build_path, fixes_path = f"{RECORDS}/build.json", f"{RECORDS}/fixes.json"
    records = probe.files(client, image, [build_path, fixes_path])
    expect(build_path in records, f"{build_path} in the image", sorted(records))
    build = json.loads(records[build_path])
    expect(build == {k: labels.get(k, "") for k in BUILD_FACTS}, "build.json == the image's labels", build)
    if fixes:
        expect(fixes_path in records, f"{fixes_path} in the image", sorted(records))
        recorded = [f["name"] for f in json.loads(records[fixes_path])["fixes"]]
        expect(sorted(recorded) == sorted(fixes), f"fixes.json to record {fixes}", recorded)
    return f"{len(fixes)} fixes recorded" if fixes else "no fixes pack for this target"


def question(request: dict) -> str:
    """A request as one line for people: the prompt, or the last user turn (media as [image])."""
    if "prompt" in request:
        return f"(raw completion) {request['prompt']}"
    content = [m for m in request["messages"] if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        text = content
    else:
        media = {"image_url": "[image]", "input_audio": "[audio]", "audio_url": "[audio]"}
        text = " ".join(p.get("text") or media.get(p["type"], f"[{p['type']}]") for p in content)
    if request["messages"][-1]["role"] == "tool":
        text += f" (tool result: {request['messages'][-1]['content']})"
    return text + (" (thinking)" if (request.get("chat_template_kwargs") or {}).get("enable_thinking") else "")


def answer_text(answer: dict) -> str:
    if "text" in answer:
        return answer["text"]
    calls = ", ".join(f"{c['name']}({c['arguments']})" for c in answer.get("tool_calls") or [])
    thought = f"[thought: {answer['reasoning']}] " if answer.get("reasoning") else ""
    return thought + (answer.get("content") or "") + (f"[tool call: {calls}]" if calls else "")


# vLLM logs a failed multi-modal warm-up (vllm/renderers/base.py, 0.30.0: its dummy inputs did
# not process) as a WARNING and serves on; the requests of that modality then fail the same way.
LOG_PROBLEM = re.compile(r"\bERROR\b|Traceback \(most recent call last\)|[Mm]ulti-modal warmup failed")

# What vLLM 0.30.0 logs of its compile cache under VLLM_CACHE_ROOT (vllm/compilation/decorators.py):
# the compiled model saved, taken back at a later start, or compiled again because the load failed.
COMPILE_SAVED = re.compile(r"saved AOT compiled function to (\S+)")
COMPILE_LOADED = re.compile(r"Directly load AOT compilation from path (\S+)")
COMPILE_LOAD_FAILED = "Compiling model again due to a load failure"


# The line a Python traceback ends on ("ValueError: ...", "torch.OutOfMemoryError: ..."), wherever
# vLLM's process prefix and log header put it: a failed check's cause on the server's side, which a
# 500 "EngineCore encountered an issue" leaves to the log ("See stack trace (above)").
EXCEPTION_LINE = re.compile(r"\b(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)\b: \S.*")
# A record vLLM's logger writes below ERROR: advice that may quote an exception it only fears (every
# start here warns of the fd limit with "`OSError: [Errno 24] Too many open files`").
QUIET_RECORD = re.compile(r"\b(?:DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d ")


def server_errors(lines: list[str], most: int = 5) -> list[str]:
    """The distinct exceptions a server's log names, in order, the last `most` of them."""
    found: list[str] = []
    for line in lines:
        match = None if QUIET_RECORD.search(line) else EXCEPTION_LINE.search(line)
        if match and match.group(0).strip() not in found:
            found.append(match.group(0).strip())
    return found[-most:]


def startup_log(lines: list[str]) -> str:
    """The server's start-up log (to its first healthy answer) has no ERROR line, no traceback and
    no failed multi-modal warm-up: each is a defect even when /health answers."""
    bad = [line.strip() for line in lines if LOG_PROBLEM.search(line)]
    expect(
        not bad,
        "no ERROR, traceback or failed warm-up in the start-up log",
        f"{len(bad)} line(s): " + " | ".join(bad[:3]),
    )
    return f"{len(lines)} lines, none an ERROR, a traceback or a failed warm-up"


def planned_checks(matrix: Matrix, target: str, launch: list[str], scripted: bool) -> list[tuple[str, str | None]]:
    """(check, reason to skip or None) for this target's launch; scripted: the tiny trained model
    serves, so answers can be checked exactly."""
    t = matrix.targets[target]
    parser = "--tool-call-parser" in launch
    grammar_fix = "gemma4-required-tool-grammar" in t.opt_in_fixes
    limits = gemma4_serve.mm_limits(launch)
    only_tiny = None if scripted else "exact answers need the tiny trained model (smoke --tiny)"
    return [
        ("ready", None),
        ("startup_log", None),
        ("image_facts", None),
        ("chat", None),
        ("chat_stream", None),
        ("completion", None),
        ("chat_single_bos", None),
        ("raw_prompt_bos", None if t.bos_tokenizer else "this target does not bake the BOS tokenizer"),
        ("tools_auto", only_tiny or (None if parser else "no tool parser in the launch")),
        (
            "tools_forced",
            None
            if parser and grammar_fix
            else "no tool parser in the launch"
            if not parser
            else "gemma4-required-tool-grammar is not applied here",
        ),
        (
            "prompt_logprobs_rejected",
            None if "--kv-sharing-fast-prefill" in launch else "no --kv-sharing-fast-prefill in the launch",
        ),
        ("reasoning", None if "--reasoning-parser" in launch else "no reasoning parser in the launch"),
        ("image_input", None),
        ("audio_input", None),
        ("video_input", None),
        ("answer_image", only_tiny or (None if limits.get("image", 1) else "the launch refuses images")),
        ("answer_audio", only_tiny or (None if limits.get("audio", 1) else "the launch refuses audio")),
        # The request parameters the Gaudi pack repairs, on any model.
        ("logit_bias", None),
        ("bad_words", None),
        ("min_tokens", None),
        ("min_p", None),
        ("top_logprobs", None),
        ("seed", None),
        ("mixed_batch", None),
        ("bad_requests", None),
    ]


# -- the run -------------------------------------------------------------------------------------


# The checks run CONCURRENT_CHECKS at a time (measured on 2 cores, warm: 13.5 s one by one, 10.1 s
# four at a time, 11.0 s eight: the API server's own work is the limit), except those in ALONE,
# run one by one afterwards: each compares the answers of separate requests, which on real
# hardware may differ in the last bits when batched with others.
CONCURRENT_CHECKS = 4
ALONE = {"chat_stream", "min_p", "seed", "mixed_batch"}


def run_smoke(
    client,
    matrix: Matrix,
    target: str,
    image: str | None = None,
    model: str | None = None,
    script: list | None = None,
    log=print,
) -> Report:
    """Start image, run every check that applies to target, always remove the container."""
    image = image or matrix.tag(target)
    image_id = client.images.get(image).id
    report = Report(target=target, image=image, model=model or matrix.project.model, image_id=image_id)
    log(f"starting {image} on 127.0.0.1")
    try:
        with server.serve(matrix, target, image, model, image_id=image_id) as srv:
            report.seconds_to_healthy = round(srv.seconds_to_healthy, 1)
            log(f"healthy after {report.seconds_to_healthy}s at {srv.url}")
            run_checks(client, matrix, target, image, srv, report, script, log=log)
        logs = srv.final_log
    except server.NotHealthy as e:
        report.checks.append(Check("ready", "fail", str(e)))
        logs = e.log
    report.log_tail = logs[-200:]
    report.server_errors = server_errors(logs)
    return report


def run_checks(client, matrix, target, image, srv, report, script=None, url=None, log=print) -> None:
    """Every check that applies to target's launch on the running server srv, into report (its
    checks and answers). url: where the server answers when not at srv.url (a server with no
    network, reached through `docker exec`)."""
    started = srv.log()
    # What the container runs: the recipe's launch as the entrypoint composes it, plus ours.
    printed = srv.launch()
    for line in printed.strip().splitlines():  # the launch, after any `export` the entrypoint adds
        log(f"serving: {line}")
    launch = shlex.split(printed)
    checks = Checks(url or srv.url, srv.served, launch, script, timeout=server.request_timeout(image))
    special = {
        "image_facts": lambda: image_facts(client, matrix, target, image),
        "startup_log": lambda: startup_log(started),
    }

    def run(name: str) -> Check:
        start = time.monotonic()
        try:
            detail = special[name]() if name in special else getattr(checks, name)()
            check = Check(name, "pass", detail or "")
        except Skipped as e:
            check = Check(name, "skip", str(e))
        except (CheckFailed, OSError, KeyError, ValueError) as e:
            check = Check(name, "fail", f"{type(e).__name__}: {e}" if not isinstance(e, CheckFailed) else str(e))
        check.seconds = round(time.monotonic() - start, 1)
        return check

    plan = planned_checks(matrix, target, launch, bool(script))
    done = {name: Check(name, "skip", skip) for name, skip in plan if skip}
    together = [name for name, skip in plan if not skip and name not in ALONE]
    pool = ThreadPoolExecutor(CONCURRENT_CHECKS)
    try:
        done.update(zip(together, pool.map(run, together)))
    finally:
        # Stopped by a signal: do not wait here for the checks in flight (up to a request
        # timeout each); the container goes next, as serve() ends, and they end with
        # it (the interpreter still joins their threads at exit, after that).
        pool.shutdown(wait=False, cancel_futures=True)
    done.update((name, run(name)) for name, skip in plan if not skip and name in ALONE)
    for name, _ in plan:
        report.checks.append(done[name])
        log(f"  {name}: {done[name].status}")
    report.answers = checks.answers
