#!/usr/bin/env python3
"""jinja_oracle.py — renders chat templates with Python's jinja2, set up as
Hugging Face transformers renders chat templates, and with `kvseal template`,
and requires byte-identical output (or an error from both).

usage: jinja_oracle.py KVSEAL TEMPLATE_DIR [NAME_FILTER]
Exit 0 when every template x conversation matches, 1 otherwise, 77 when
jinja2 is missing. Used by tests/e2e/test_template_oracle.sh.

The jinja2 environment follows the templates README and transformers:
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks), the loopcontrols
extension, a {% generation %} tag that renders its body (transformers'
assistant-mask tracker), tojson = json.dumps(ensure_ascii=False, indent=...,
separators=..., sort_keys=False), raise_exception and strftime_now (at a
fixed instant, the same one given to kvseal with --now)."""
import glob
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: python3 has no jinja2 (Debian: python3-jinja2)")
    sys.exit(77)

NOW = 1764633600  # 2025-12-02 00:00:00 UTC


class Generation(Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "description": "forecast days"},
            },
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                       "required": ["query"]},
    },
}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
CALL2 = {"id": "call_2", "type": "function",
         "function": {"name": "search", "arguments": {"query": "Louvre hours"}}}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello! What's up?"}
A1 = {"role": "assistant", "content": "Hi there. How can I help?"}
U2 = {"role": "user", "content": "Tell me a \"joke\" about ünïcödé & <tags>.\nTwo lines."}

CONVS = {
    "sys_user": dict(messages=[SYS, U1], add_generation_prompt=True),
    "user_nogen": dict(messages=[U1], add_generation_prompt=False),
    "multi_turn": dict(messages=[SYS, U1, A1, U2], add_generation_prompt=True),
    "multi_turn_nogen": dict(messages=[U1, A1, U2, {"role": "assistant", "content": "Why..."}],
                             add_generation_prompt=False),
    "tools": dict(messages=[SYS, {"role": "user", "content": "Weather in Paris?"}],
                  tools=[WEATHER, SEARCH], add_generation_prompt=True),
    "tool_call": dict(messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
    ], tools=[WEATHER], add_generation_prompt=True),
    "tool_calls_2": dict(messages=[
        SYS,
        {"role": "user", "content": "Weather in Paris, and Louvre hours?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "21C"},
        {"role": "tool", "tool_call_id": "call_2", "name": "search", "content": "9 to 18"},
        {"role": "assistant", "content": "It is 21C; the Louvre opens 9 to 18."},
        {"role": "user", "content": "Thanks"},
    ], tools=[WEATHER, SEARCH], add_generation_prompt=True),
    "thinking_off": dict(messages=[SYS, U1, A1, U2], add_generation_prompt=True,
                         enable_thinking=False),
    "thinking_on": dict(messages=[U1, {"role": "assistant", "content": "Hi!",
                                       "reasoning_content": "The user greets me."}, U2],
                        add_generation_prompt=True, enable_thinking=True),
    "odd_text": dict(messages=[
        {"role": "system", "content": "  Spaces around.\n\n"},
        {"role": "user", "content": "{{ not_a_variable }} {% if %} <|im_end|> \t 😀 \u2028 end  "},
        {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nShown answer."},
        {"role": "user", "content": ""},
    ], add_generation_prompt=True),
    "developer": dict(messages=[{"role": "developer", "content": "Answer in French."}, U1],
                      add_generation_prompt=True),
}


def context(conv):
    ctx = {"bos_token": "<s>", "eos_token": "</s>", "tools": None}
    ctx.update(conv)
    return ctx


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    kvseal, tdir = sys.argv[1], sys.argv[2]
    filt = sys.argv[3] if len(sys.argv) > 3 else ""
    env = make_env()
    files = sorted(glob.glob(os.path.join(tdir, "*.jinja")))
    if not files:
        print(f"SKIP: no templates in {tdir}")
        return 77
    n_ok = n_err = 0
    bad = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path in files:
            name = os.path.basename(path)
            if filt and filt not in name:
                continue
            src = open(path, encoding="utf-8").read()
            try:
                tmpl = env.from_string(src)
                compile_err = None
            except Exception as e:  # a template jinja2 cannot compile
                compile_err = f"{type(e).__name__}: {e}"
            for cname, conv in CONVS.items():
                ctx = context(conv)
                want_err = compile_err
                want = None
                if not want_err:
                    try:
                        want = tmpl.render(**json.loads(json.dumps(ctx)))
                    except Exception as e:
                        want_err = f"{type(e).__name__}: {e}"
                cpath = os.path.join(tmp, "ctx.json")
                with open(cpath, "w", encoding="utf-8") as f:
                    json.dump(ctx, f, ensure_ascii=False)
                p = subprocess.run([kvseal, "template", "--file", path, "--context-file", cpath,
                                    "--now", str(NOW)], capture_output=True)
                got = p.stdout.decode("utf-8", "replace")
                if want_err is not None:
                    if p.returncode != 0:
                        n_err += 1
                        continue
                    bad.setdefault(name, []).append(
                        f"{cname}: jinja2 raised ({want_err}) but kvseal rendered {len(got)} bytes")
                    continue
                if p.returncode != 0:
                    bad.setdefault(name, []).append(
                        f"{cname}: kvseal failed: {p.stderr.decode(errors='replace').strip()}")
                    continue
                if got != want:
                    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
                             min(len(got), len(want)))
                    bad.setdefault(name, []).append(
                        f"{cname}: differs at char {i}: jinja2 {want[max(0, i-30):i+40]!r} "
                        f"kvseal {got[max(0, i-30):i+40]!r}")
                    continue
                n_ok += 1
    for name, msgs in sorted(bad.items()):
        print(f"MISMATCH {name}")
        for m in msgs:
            print(f"  {m}")
    print(f"{n_ok} renders identical, {n_err} errors on both sides, "
          f"{sum(len(v) for v in bad.values())} mismatches in {len(bad)} templates")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
