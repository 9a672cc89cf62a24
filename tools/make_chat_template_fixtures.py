#!/usr/bin/env python3
# Expected renderings of the test templates in fixtures/chat-templates/, by
# Jinja2 configured as transformers configures it for chat templates
# (transformers/utils/chat_template_utils.py: ImmutableSandboxedEnvironment
# with trim_blocks, lstrip_blocks and the loopcontrols extension; globals
# raise_exception and strftime_now; its own tojson over json.dumps). The
# clock is pinned to 2025-08-05 17:04:09 UTC, the time
# tests/chat_templates.rs injects. Cases with tools pass `tools` (the OpenAI
# list, as apply_chat_template(tools=...) does) and extra variables (what
# chat_template_kwargs carries); their messages are written as colibri's
# ChatMessage serializes them (fields only when present, reasoning under
# both `reasoning_content` and `thinking`). Needs only jinja2 (3.1.6 was used):
#   python3 tools/make_chat_template_fixtures.py
import json
import os
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime(2025, 8, 5, 17, 4, 9, tzinfo=timezone.utc)
DIR = os.path.join(os.path.dirname(__file__), "..", "fixtures", "chat-templates")
# The bundled model's own template, read from its tokenizer_config.json.
BUNDLED = "colibri-tiny"
BUNDLED_CONFIG = os.path.join(os.path.dirname(__file__), "..", "models", "colibri-tiny", "tokenizer_config.json")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return NOW.strftime(format)


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = strftime_now
    return e


def m(role, content):
    return {"role": role, "content": content}


def assistant(content, calls, reasoning=None):
    msg = {"role": "assistant", "content": content}
    if reasoning is not None:
        msg["reasoning_content"] = reasoning
        msg["thinking"] = reasoning
    msg["tool_calls"] = [
        {"id": id, "type": "function", "function": {"name": name, "arguments": args}} for id, name, args in calls
    ]
    return msg


def tool(call_id, content):
    return {"role": "tool", "content": content, "tool_call_id": call_id}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer", "default": 1},
                    "units": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "The time, <UTC> & \"quoted\"", "parameters": {"type": "object", "properties": {}}}},
]
WEATHER = {"city": "Paris", "days": 2}
MIXED = {"city": "Zürich", "days": 3, "units": "c", "extra": [1, 2.5, {"k": None}], "ok": True}


CASES = [
    ("harmony-style.jinja", [m("system", "  Be brief.  "), m("user", "Hi"), m("assistant", "<think>hmm</think>\n\nHello!"), m("user", "Ça va? <ok>")], True),
    ("harmony-style.jinja", [m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d"), m("user", "e")], True),
    ("harmony-style.jinja", [m("user", "a"), m("assistant", "done")], False),
    ("harmony-style.jinja", [m("user", "a"), m("assistant", "x <|channel|>final")], True),
    ("harmony-style.jinja", [m("tool", "42")], True),
    ("chatml-thinking.jinja", [m("system", "Think."), m("user", "2+2?"), m("assistant", "<think>\nadd\n</think>\n\n4"), m("user", "and 3+3?"), m("assistant", "<think>\ncall\n</think>\n\ncalling"), m("user", "<tool_response>6</tool_response>")], True),
    ("chatml-thinking.jinja", [m("user", "naïve \"quote\"\ttab 😀")], False),
    # Tools, calls and results, shaped like the published templates.
    ("qwen3-tools.jinja", [m("system", "Be brief."), m("user", "Weather?"), assistant("", [("call_1", "get_weather", WEATHER)], "I should check."), tool("call_1", "sunny")], True, TOOLS, {}),
    ("qwen3-tools.jinja", [m("user", "Both?"), assistant("Let me look.", [("c1", "get_weather", MIXED), ("c2", "now", "{}")]), tool("c1", "rain"), tool("c2", "noon"), m("assistant", "Rain at noon.")], False, TOOLS, {}),
    ("qwen3-tools.jinja", [m("user", "Hi")], True, None, {"enable_thinking": False}),
    ("glm-tools.jinja", [m("user", "Weather?"), assistant("", [("a", "get_weather", MIXED)], "Look it up."), tool("a", "sunny"), tool("a", "warm")], True, TOOLS, {}),
    ("glm-tools.jinja", [m("system", "Sys"), m("user", "Time?"), assistant("Checking.", [("b", "now", {})])], False, TOOLS, {"enable_thinking": False}),
    ("gpt-oss-tools.jinja", [m("system", "Be brief."), m("user", "Weather?"), assistant("", [("x", "get_weather", WEATHER)], "Need data."), tool("x", "{\"sky\": \"clear\"}")], True, TOOLS, {"reasoning_effort": "high"}),
    ("gpt-oss-tools.jinja", [m("user", "Weather?"), assistant("Hmm", [("x", "get_weather", WEATHER)], "Need data.")], True, TOOLS, {}),
    ("gpt-oss-tools.jinja", [m("user", "Weather?"), assistant("", [("x", "get_weather", WEATHER)], "Need data."), tool("x", "ok"), m("assistant", "Clear.")], False, TOOLS, {}),
    ("deepseek-tools.jinja", [m("system", "Be brief."), m("user", "Weather?"), assistant("", [("d1", "get_weather", '{"city": "Paris"}'), ("d2", "now", "{}")]), tool("d1", "sunny"), tool("d2", "noon")], True, TOOLS, {}),
    ("mistral-tools.jinja", [m("user", "Weather?"), assistant("", [("abcDEF123", "get_weather", WEATHER)]), tool("abcDEF123", "sunny"), m("assistant", "Sunny."), m("user", "Thanks")], True, TOOLS, {}),
    ("mistral-tools.jinja", [m("user", "Weather?"), assistant("", [("call_1", "get_weather", WEATHER)])], False, TOOLS, {}),
    ("minimax-m2-tools.jinja", [m("system", "Be brief."), m("user", "Weather?"), assistant("Checking both.", [("m1", "get_weather", MIXED), ("m2", "now", {})], "I should check."), tool("m1", "rain"), tool("m2", "noon")], True, TOOLS, {}),
    ("minimax-m2-tools.jinja", [m("user", "Weather?"), assistant("", [("m1", "get_weather", WEATHER)], "Old thought."), tool("m1", "sunny"), m("assistant", "Sunny."), m("user", "Thanks")], True, None, {"enable_thinking": False}),
    # The bundled model: hermes-style calls, tool results as user turns.
    (BUNDLED, [m("system", "Be brief."), m("user", "what does river mean?")], True),
    (BUNDLED, [m("user", "river?"), assistant("", [("c1", "get_weather", MIXED), ("c2", "now", "{}")]), tool("c1", "rain"), tool("c2", "noon")], True, TOOLS, {}),
    (BUNDLED, [m("user", "Weather?"), assistant("Checking.", [("c1", "get_weather", WEATHER)]), tool("c1", "sunny"), m("assistant", "Sunny.")], False, TOOLS, {}),
]


def source(name):
    if name == BUNDLED:
        with open(BUNDLED_CONFIG) as f:
            return json.load(f)["chat_template"]
    with open(os.path.join(DIR, name)) as f:
        return f.read()


def main():
    e = env()
    out = []
    for name, messages, gen, *rest in CASES:
        tools, kwargs = rest if rest else (None, {})
        t = e.from_string(source(name))
        case = {"template": name, "messages": messages, "add_generation_prompt": gen}
        context = dict(kwargs)
        if tools is not None:
            case["tools"] = tools
            context["tools"] = tools
        if kwargs:
            case["kwargs"] = kwargs
        try:
            case["rendered"] = t.render(
                messages=messages,
                add_generation_prompt=gen,
                bos_token="<|startoftext|>",
                eos_token="<|return|>",
                **context,
            )
        except jinja2.exceptions.TemplateError as err:
            case["error"] = str(err)
        out.append(case)
    with open(os.path.join(DIR, "expected.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
