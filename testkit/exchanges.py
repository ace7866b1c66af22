"""The script the tiny trained Gemma 4 learns: each exchange is a request exactly as an OpenAI client
sends it to vLLM, the text the model is trained to generate for it, and what the server must
answer (greedy, temperature 0).

`output` is the model's own text (Gemma 4's markup, before vLLM's parsers); `expected` is what the
OpenAI API returns once the recipe's `--reasoning-parser gemma4` and `--tool-call-parser gemma4`
have read it. The model stops on `stop` (an id of generation_config's eos_token_id list).

    for ex in EXCHANGES:
        status, answer = post(ex.path, ex.body(served_model_name))
        problem = ex.mismatch(answer)      # None, or one line saying what differs
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from . import media

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
GREEDY = {"temperature": 0, "max_tokens": 64}  # every output fits with room to spare

GET_WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
SEND_MESSAGE = {
    "type": "function",
    "function": {
        "name": "send_message",
        "description": "Send a text message",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
            "required": ["to", "text"],
        },
    },
}
TOOLS = [GET_WEATHER, SEND_MESSAGE]

# vLLM's gemma4 converter writes arguments with json.dumps(ensure_ascii=False) in the order the model
# wrote the keys (vllm/parser/gemma4.py, _gemma4_arg_converter): these are those exact strings.
WEATHER_ARGS = json.dumps({"city": "Paris"}, ensure_ascii=False)
QUOTE_ARGS = json.dumps({"to": "Bob", "text": 'She said "hi".'}, ensure_ascii=False)


@dataclass(frozen=True)
class Exchange:
    name: str
    path: str
    request: dict  # the body without "model"
    output: str  # what the model generates, up to (not including) its stop token
    expected: dict  # the answer's fields: text | content, reasoning, tool_calls; finish_reason
    stop: str = "<turn|>"
    # Completions only: what the model continues when the prompt has no <bos> (a server without
    # the BOS tokenizer copy). A stand-in for the real model's degraded output without <bos>,
    # trained so that the raw-completion check fails there by design, not by luck.
    output_without_bos: str | None = None

    def body(self, model: str) -> dict:
        return {"model": model, **copy.deepcopy(self.request)}

    def answer(self, response: dict) -> dict:
        """The fields of a response that `expected` names, in the same shape."""
        choice = response["choices"][0]
        if self.path == COMPLETIONS:
            return {"text": choice["text"], "finish_reason": choice["finish_reason"]}
        message = choice["message"]
        return {
            "content": message.get("content"),
            "reasoning": message.get("reasoning", message.get("reasoning_content")),
            "tool_calls": [
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in message.get("tool_calls") or []
            ],
            "finish_reason": choice["finish_reason"],
        }

    def mismatch(self, response: dict) -> str | None:
        """None when the response is exactly the scripted answer, else what differs."""
        try:
            got = self.answer(response)
        except (KeyError, IndexError, TypeError) as e:
            return f"{self.name}: not an OpenAI {self.path} response ({type(e).__name__}: {e}): {str(response)[:200]}"
        diffs = [f"{k} {got[k]!r} (expected {self.expected[k]!r})" for k in self.expected if got[k] != self.expected[k]]
        return f"{self.name}: " + "; ".join(diffs) if diffs else None


def _chat(name, messages, output, content=None, reasoning=None, tool_calls=(), **request) -> Exchange:
    finish = "tool_calls" if tool_calls else "stop"
    return Exchange(
        name,
        CHAT,
        {"messages": messages, **request, **GREEDY},
        output,
        {"content": content, "reasoning": reasoning, "tool_calls": list(tool_calls), "finish_reason": finish},
    )


def _user(*parts):
    return [{"role": "user", "content": parts[0] if len(parts) == 1 and isinstance(parts[0], str) else list(parts)}]


def _image(rgb):
    return {"type": "image_url", "image_url": {"url": media.data_url("image/png", media.png(rgb))}}


def _audio(hz):
    return {"type": "input_audio", "input_audio": {"data": media.b64(media.wav(hz)), "format": "wav"}}


WEATHER_QUESTION = "What is the weather in Paris?"

EXCHANGES: list[Exchange] = [
    _chat("chat", _user("What is the capital of France?"), "Paris.", content="Paris."),
    Exchange(
        "completion",
        COMPLETIONS,
        {"prompt": "The capital of France is", **GREEDY},
        " Paris.",
        {"text": " Paris.", "finish_reason": "stop"},
        stop="<eos>",
        output_without_bos=" unknown (no BOS).",
    ),
    _chat(
        "thinking",
        _user("Is the sky blue?"),
        "<|channel>thought\nAir scatters blue light most.<channel|>Yes.",
        content="Yes.",
        reasoning="Air scatters blue light most.",
        chat_template_kwargs={"enable_thinking": True},
    ),
    _chat(
        "tool_call",
        _user(WEATHER_QUESTION),
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>',
        tool_calls=[{"name": "get_weather", "arguments": WEATHER_ARGS}],
        tools=TOOLS,
        tool_choice="auto",
    ),
    # Gemma 4 escapes a quote inside its own <|"|> string delimiters as \" (JSON habit); the
    # gemma4-buffered-tool-args fix turns it back into a plain quote. Without the fix the
    # arguments keep the backslashes.
    _chat(
        "tool_call_quote",
        _user('Send Bob: She said "hi".'),
        '<|tool_call>call:send_message{to:<|"|>Bob<|"|>,text:<|"|>She said \\"hi\\".<|"|>}<tool_call|>',
        tool_calls=[{"name": "send_message", "arguments": QUOTE_ARGS}],
        tools=TOOLS,
        tool_choice="auto",
    ),
    _chat(
        "tool_result",
        [
            *_user(WEATHER_QUESTION),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": WEATHER_ARGS}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
        ],
        "Sunny and 21 C in Paris.",
        content="Sunny and 21 C in Paris.",
        tools=TOOLS,
        tool_choice="auto",
    ),
    # Two images and two sounds with the same question: only the vision or audio tower's output
    # tells the answers apart.
    _chat(
        "image_red",
        _user(_image((255, 0, 0)), {"type": "text", "text": "What colour is this?"}),
        "Red.",
        content="Red.",
    ),
    _chat(
        "image_blue",
        _user(_image((0, 0, 255)), {"type": "text", "text": "What colour is this?"}),
        "Blue.",
        content="Blue.",
    ),
    _chat(
        "audio_low", _user(_audio(220), {"type": "text", "text": "Is this tone high or low?"}), "Low.", content="Low."
    ),
    _chat(
        "audio_high",
        _user(_audio(2000), {"type": "text", "text": "Is this tone high or low?"}),
        "High.",
        content="High.",
    ),
]

BY_NAME = {ex.name: ex for ex in EXCHANGES}
