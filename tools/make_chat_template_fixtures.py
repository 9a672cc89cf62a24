#!/usr/bin/env python3
# Expected renderings of the test templates in fixtures/chat-templates/, by
# Jinja2 configured as transformers configures it for chat templates
# (transformers/utils/chat_template_utils.py: ImmutableSandboxedEnvironment
# with trim_blocks, lstrip_blocks and the loopcontrols extension; globals
# raise_exception and strftime_now; its own tojson over json.dumps). The
# clock is pinned to 2025-08-05 17:04:09 UTC, the time
# tests/chat_templates.rs injects. Needs only jinja2 (3.1.6 was used):
#   python3 tools/make_chat_template_fixtures.py
import json
import os
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime(2025, 8, 5, 17, 4, 9, tzinfo=timezone.utc)
DIR = os.path.join(os.path.dirname(__file__), "..", "fixtures", "chat-templates")


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


CASES = [
    ("harmony-style.jinja", [m("system", "  Be brief.  "), m("user", "Hi"), m("assistant", "<think>hmm</think>\n\nHello!"), m("user", "Ça va? <ok>")], True),
    ("harmony-style.jinja", [m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d"), m("user", "e")], True),
    ("harmony-style.jinja", [m("user", "a"), m("assistant", "done")], False),
    ("harmony-style.jinja", [m("user", "a"), m("assistant", "x <|channel|>final")], True),
    ("harmony-style.jinja", [m("tool", "42")], True),
    ("chatml-thinking.jinja", [m("system", "Think."), m("user", "2+2?"), m("assistant", "<think>\nadd\n</think>\n\n4"), m("user", "and 3+3?"), m("assistant", "<think>\ncall\n</think>\n\ncalling"), m("user", "<tool_response>6</tool_response>")], True),
    ("chatml-thinking.jinja", [m("user", "naïve \"quote\"\ttab 😀")], False),
]


def main():
    e = env()
    out = []
    for name, messages, gen in CASES:
        with open(os.path.join(DIR, name)) as f:
            t = e.from_string(f.read())
        case = {"template": name, "messages": messages, "add_generation_prompt": gen}
        try:
            case["rendered"] = t.render(
                messages=messages, add_generation_prompt=gen, bos_token="<|startoftext|>", eos_token="<|return|>"
            )
        except jinja2.exceptions.TemplateError as err:
            case["error"] = str(err)
        out.append(case)
    with open(os.path.join(DIR, "expected.json"), "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
