#!/usr/bin/env python3
"""jinja_cases.py — the jinja unit test's cases (tests/unit/test_jinja.c).

Each case is a template and a JSON context; the expected output is what
Python's jinja2, set up as Hugging Face does (tests/e2e/jinja_oracle.py),
renders. `python3 tests/unit/jinja_cases.py > tests/unit/jinja_cases.inc`
regenerates the table test_jinja.c includes; a case jinja2 disagrees with
is reported on stderr."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import jinja_oracle as jo  # noqa: E402

CASES = [
 # output, literals, printing
 ("Hello {{ name }}!", '{"name": "W\\u00fcrld"}'),
 ("{{ 1 }} {{ 1.5 }} {{ 2.0 }} {{ 1e20 }} {{ 1e-5 }} {{ 0.1 + 0.2 }} {{ -0.0 }}", "{}"),
 ("{{ true }} {{ false }} {{ none }} {{ [1, 'a', none, true] }} {{ {'k': 'v', 'n': 1} }} {{ (1,) }} {{ (1, 2) }}", "{}"),
 ("{{ \"it's\" }} {{ ['it\\'s', \"q\\\"\", 'a\\nb'] }}", "{}"),
 ("{{ 'a' 'b' }}{{ '\\u00e9\\x41\\t|' }}", "{}"),
 # arithmetic and operators
 ("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 1 / 4 }} {{ 3 - 5 }} {{ 2 * 3.5 }} {{ 7.5 // 2 }}", "{}"),
 ("{{ 'ab' * 3 }}{{ [1] * 2 }}{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 'x' ~ 1 ~ none ~ undefined_thing }}", "{}"),
 ("{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 2 >= 2.0 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1,2] == [1,2] }} {{ true == 1 }}", "{}"),
 ("{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }} {{ 3 not in [1] }} {{ not true }} {{ true and 'x' }} {{ 0 or 'y' }}", "{}"),
 ("{{ 'yes' if x else 'no' }} {{ 'only' if x }}|{{ -x }} {{ +x }}", '{"x": 3}'),
 # subscripts and slices
 ("{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[:-1] }}{{ s[4:] }}{{ l[1:] }}{{ l[::2] }}{{ l[-2:] }}", '{"s": "h\\u00e9llo", "l": [1,2,3,4]}'),
 # slice bounds clamped both ways (CPython's slice.indices), lists and strings alike
 ("{{ l[-9:2] }}{{ l[2:99] }}{{ l[99:] }}{{ l[-9:] }}{{ l[9::-1] }}{{ l[:-9:-1] }}{{ l[-2:-9:-1] }}{{ l[3:0:-2] }}{{ l[1:3:-1] }}|{{ s[9::-2] }}{{ s[-9:9] }}{{ s[:-9:-1] }}{{ s[-1:-3:-1] }}{{ l[true:] }}", '{"s": "h\\u00e9llo", "l": [1,2,3,4]}'),
 ("{{ d.a }}{{ d['b'] }}{{ d.missing }}|{{ d['missing'] is defined }}{{ l[5] is defined }}{{ l.0 }}", '{"d": {"a": 1, "b": 2}, "l": [9]}'),
 # if / elif / else
 ("{% if x > 2 %}big{% elif x > 1 %}mid{% else %}small{% endif %}", '{"x": 2}'),
 ("{% if u %}u{% elif not u %}not-u{% endif %}", "{}"),
 # for
 ("{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", '{"l": ["a","b","c"]}'),
 ("{% for x in l %}{{ loop.previtem | default('-') }}{{ x }}{{ loop.nextitem | default('-') }} {% endfor %}", '{"l": [1,2,3]}'),
 ("{% for x in l if x is odd %}{{ x }}{{ loop.index }}{% else %}empty{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}", '{"l": [1,2,3,4,5]}'),
 ("{% for x in l %}{% if x == 3 %}{% break %}{% endif %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}", '{"l": [0,1,2,3,4]}'),
 ("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for c in 'ab' %}[{{ c }}]{% endfor %}", '{"d": {"z": 1, "a": 2}}'),
 ("{% for a in [1,2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}{% for x in u %}never{% endfor %}", "{}"),
 ("{% for x in [1,2] %}{{ loop.cycle('odd', 'even') }}{% endfor %}", "{}"),
 # set, scoping, namespace
 ("{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", "{}"),
 ("{% set ns = namespace(total=0, found=false) %}{% for i in [1,2,3] %}{% set ns.total = ns.total + i %}{% if i == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.total }}{{ ns.found }}", "{}"),
 ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}  block {{ a }} {% endset %}[{{ t }}]{% set u2 | trim | upper %}  up {% endset %}[{{ u2 }}]", "{}"),
 # macros and call
 ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} {{ greet(punct='.', name='C') }}", "{}"),
 ("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}", "{}"),
 ("{% macro row(x) %}{{ caller(x * 2) }}{% endmacro %}{% call(v) row(21) %}v={{ v }}{% endcall %}", "{}"),
 ("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", "{}"),
 ("{% set g = 'global' %}{% macro m() %}{{ g }}{% endmacro %}{{ m() }}", "{}"),
 # filter block
 ("{% filter upper %}abc {{ 'd' }}{% endfilter %}|{%- filter trim -%}   x   {%- endfilter %}", "{}"),
 # filters
 ("{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'AbC' | lower }}{{ 'abc' | upper }}{{ 'hello wORLD-x' | title }}{{ 'hELLO' | capitalize }}", "{}"),
 ("{{ [1,2,3] | length }}{{ 'h\\u00e9' | length }}{{ {'a':1} | count }}{{ u | length }}", "{}"),
 ("{{ [1,'a',none] | join(', ') }}|{{ ['x','y'] | join }}|{{ [{'n':'a'},{'n':'b'}] | join('-', attribute='n') }}", "{}"),
 ("{{ 'a-b-a' | replace('a', 'X') }}{{ 'aaa' | replace('a', 'b', 2) }}", "{}"),
 ("{{ u | default('dflt') }}{{ '' | default('e') }}{{ '' | default('e', true) }}{{ none | d('n', true) }}{{ 0 | default(5) }}", "{}"),
 ("{{ [3,1,2] | first }}{{ [3,1,2] | last }}{{ 'abc' | first }}{{ [] | first is defined }}", "{}"),
 ("{{ msgs | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }}{{ msgs | rejectattr('role', 'eq', 'user') | list | length }}{{ msgs | selectattr('x') | list }}", '{"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "x": 1}]}'),
 ("{{ [1,2,3,4] | select('even') | list }}{{ [1,2,3,4] | reject('odd') | list }}{{ ['A','b'] | map('lower') | list }}{{ [{'a':{'b':3}}] | map(attribute='a.b') | list }}", "{}"),
 ("{{ d | items | list }}{{ d | dictsort }}{{ d | dictsort(by='value') }}{{ d | dictsort(reverse=true) }}", '{"d": {"b": 1, "a": 3, "C": 2}}'),
 ("{{ ['b','A','a','c'] | unique | list }}{{ [3,1,2] | sort }}{{ ['b','A','c'] | sort }}{{ ['b','A'] | sort(case_sensitive=true) }}{{ [1,2] | reverse | list }}{{ 'abc' | reverse }}", "{}"),
 ("{{ [3,1,2] | min }}{{ [3,1,2] | max }}{{ [1,2,3] | sum }}{{ -3 | abs }}{{ 2.5 | round }}{{ 3.14159 | round(2) }}{{ 2.1 | round(0, 'ceil') }}", "{}"),
 ("{{ '42' | int }}{{ 'x' | int }}{{ 'x' | int(7) }}{{ 3.9 | int }}{{ '3.5' | int }}{{ '2.5' | float }}{{ 3 | float }}{{ true | int }}", "{}"),
 ("{{ 5 | string }}{{ [1] | string }}{{ none | string }}{{ 'a<b' | safe }}{{ '<&\\'\">' | e }}", "{}"),
 ("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}|{{ 'x' | indent }}", "{}"),
 ("{{ [1,2,3,4,5] | batch(2) | list }}{{ [1,2,3] | batch(2, 0) | list }}{{ 'one two  three' | wordcount }}{{ 'ab' | center(6) }}|", "{}"),
 # tojson (HF's: ensure_ascii off, insertion order, indent)
 ("{{ v | tojson }}", '{"v": {"b": [1, 2.5, null, true, false], "a": "\\u00e9\\n\\"q\\" <x> \\u0001", "e": {}, "l": []}}'),
 ("{{ v | tojson(indent=2) }}", '{"v": {"b": [1, {"c": []}], "a": {}}}'),
 ("{{ v | tojson(indent=4) }}|{{ [] | tojson(indent=2) }}|{{ 'x' | tojson }}|{{ 1.0 | tojson }}|{{ (1,2) | tojson }}", '{"v": [1, [2, [3]]]}'),
 ("{{ v | tojson(separators=(',', ':')) }}{{ v | tojson(sort_keys=true) }}{{ v | tojson(ensure_ascii=true) }}", '{"v": {"z": "\\u00fc\\ud83d\\ude00", "a": 1}}'),
 # every escape json.dumps writes, the non-finite floats, and keys that are not strings
 ("{{ s | tojson }}|{{ s | tojson(ensure_ascii=true) }}|{{ [1e400, -1e400, 1e400 - 1e400] | tojson }}|{{ {1: none, 2.5: true, false: 0, none: 1} | tojson }}", '{"s": "\\b\\f\\n\\r\\t\\"\\\\ \\u0001\\u007f\\u00e9"}'),
 # tests
 ("{{ x is defined }}{{ u is defined }}{{ u is undefined }}{{ n is none }}{{ x is none }}{{ n is not none }}", '{"x": 1, "n": null}'),
 ("{{ 's' is string }}{{ 1 is string }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 's' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ {} is sequence }}", "{}"),
 ("{{ 1 is number }}{{ 1.5 is number }}{{ 's' is number }}{{ 1 is integer }}{{ 1.5 is float }}{{ true is boolean }}{{ 1 is boolean }}{{ true is true }}{{ 1 is true }}{{ false is false }}", "{}"),
 ("{{ 3 is odd }}{{ 3 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 2 is in [1,2] }}{{ 'a' is in 'abc' }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 'A' is upper }}{{ 'a' is lower }}", "{}"),
 ("{{ none is sameas none }}{{ f is callable }}{{ 1 is callable }}", "{}"),
 # methods
 ("{{ '  x  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ '  x'.lstrip() }}|{{ 'x  '.rstrip() }}|{{ 'a\\n'.rstrip('\\n') }}|", "{}"),
 ("{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ 'a b c'.rsplit(none, 1) }}", "{}"),
 ("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.replace('b', 'X') }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab cd'.title() }}{{ 'aB'.capitalize() }}", "{}"),
 ("{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}{{ 'hello'.count('l') }}{{ '-'.join(['a','b']) }}{{ '12'.isdigit() }}{{ 'a1'.isalpha() }}{{ 'a\\nb'.splitlines() }}", "{}"),
 ("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 'dflt') }}{{ d.keys() | list }}{{ d.values() | list }}{{ d.items() | list }}{{ [1,2,1].count(1) }}{{ [1,2].index(2) }}", '{"d": {"a": 1, "b": 2}}'),
 ("{{ range(3) | list }}{{ range(1, 4) | list }}{{ range(5, 0, -2) | list }}{{ dict(a=1, b=2) }}", "{}"),
 ("{{ strftime_now('%Y-%m-%d %H:%M') }} {{ strftime_now('%d %b %Y') }}", "{}"),
 # whitespace control: trim_blocks, lstrip_blocks, - and +
 ("a\n  {% if true %}\n  b\n  {% endif %}\nc\n", "{}"),
 ("a  {% if true %}b{% endif %}  c", "{}"),
 ("  {# comment #}\nx\n{#- c2 -#}  y", "{}"),
 ("x  {%- if true -%}  \n  y  \n  {%- endif -%}  z", "{}"),
 ("{{- ' a ' -}}   \n   {{ 'b' }}  {{- 'c' }}", "{}"),
 ("  {%+ if true %}x{% endif +%}\ny\n", "{}"),
 ("{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", "{}"),
 ("line1\n    {% set x = 1 %}\nline2 {% if true %}\nin\n{% endif %} tail\n", "{}"),
 ("{% generation %}gen {{ 1 }}{% endgeneration %}", "{}"),
 # generators (map, select, ...) and Markup (|safe, |e), as jinja2 has them
 ("{{ none | map('string') | list }}{{ none | selectattr('a') | list }}{% if [] | select('odd') %}gen-is-true{% endif %}{{ [3,1] | reverse | list }}{{ {'a':1} | items | list }}", "{}"),
 ("{{ 'a' | safe + '<b>' }}|{{ '<' + 'x' | safe }}|{{ ('x' | safe + '\"') ~ '<' }}|{{ '<' | e | e }}|{{ 'q' | safe + 'r' | safe }}", "{}"),
 ("{{ ([1,2] | map('string'))[0] is defined }}{{ (none)[1:] is defined }}", "{}"),
 ("{% set ns = namespace(n=1) %}{% set ns.n = ns %}{{ ns }}|{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ [a, a] }}", "{}"),
]

# (template, context, error substring kvseal must report) -- jinja2 raises for each
ERRORS = [
 ("{{ raise_exception('Only user and assistant roles are supported!') }}", "{}", "raise_exception: Only user and assistant roles are supported!"),
 ("{{ u.attr }}", "{}", "'u' is undefined"),
 ("{{ d.missing.attr }}", '{"d": {}}', "undefined"),
 ("{{ u + 1 }}", "{}", "'u' is undefined"),
 ("{{ none + 1 }}", "{}", "unsupported operand"),
 ("{{ 'a' + 1 }}", "{}", "unsupported operand"),
 ("{{ 1 / 0 }}", "{}", "division by zero"),
 ("{{ [1].append(2) }}", "{}", "undefined"),
 ("{{ d.pop('a') }}", '{"d": {"a": 1}}', "undefined"),
 ("{{ x | no_such_filter }}", '{"x": 1}', "no filter named 'no_such_filter'"),
 ("{{ x is no_such_test }}", '{"x": 1}', "no test named 'no_such_test'"),
 ("{{ u | tojson }}", "{}", "not JSON serializable"),
 ("{{ 1 | length }}", "{}", "has no len()"),
 ("{% for x in 1 %}{% endfor %}", "{}", "not iterable"),
 ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "{}", "takes not more than"),
 ("{{ 1 < 'a' }}", "{}", "not supported between"),
 ("{{ [1] | map('string') | length }}", "{}", "has no len()"),
 ("{{ [1] | map('string') | tojson }}", "{}", "not JSON serializable"),
 ("{{ [1] | select | last }}", "{}", "not reversible"),
 ("{{ [1] + [2] | select }}", "{}", "unsupported operand"),
 # a comparing test without its argument (fuzz_jinja: a NULL reached the comparison)
 ("{{ 1 is lessthan }}", "{}", "test 'lessthan' needs an argument"),
 ("{{ 1 is greaterthan }}", "{}", "test 'greaterthan' needs an argument"),
 ("{{ 1 is eq }}", "{}", "test 'eq' needs an argument"),
]

# (template, error substring) -- compile errors (jinja2: TemplateSyntaxError)
SYNTAX = [
 ("{% if x %}no end", "expected 'endif'"),
 ("{{ x ", "unexpected end of template"),
 ("{% endfor %}", "unexpected 'endfor'"),
 ("{% frobnicate %}", "unknown tag 'frobnicate'"),
 ("{{ 'unterminated }}", "unterminated string"),
 ("{{ (1 + }}", "unexpected"),
 ("{# never closed", "unclosed comment"),
 ("{% for x in %}{% endfor %}", "unexpected"),
 ("{{ x.}}", "expected an attribute name"),
 ("{% set %}", "expected a name"),
 ("{{ namespace(a=1, 2) }}", "positional argument after keyword"),
]


def main():
    env = jo.make_env()
    def cstr(s):
        b = s.encode('utf-8')
        out = '"'
        for c in b:
            ch = chr(c)
            if ch == '"': out += '\\"'
            elif ch == '\\': out += '\\\\'
            elif ch == '\n': out += '\\n'
            elif ch == '\t': out += '\\t'
            elif c < 0x20 or c >= 0x7f: out += '\\%03o' % c
            else: out += ch
        return out + '"'
    lines = []
    for t, ctx in CASES:
        c = json.loads(ctx)
        try:
            want = env.from_string(t).render(**c)
        except Exception as e:
            print("CASE RAISES", t, e, file=sys.stderr); continue
        lines.append('    {%s, %s, %s},' % (cstr(t), cstr(ctx), cstr(want)))
    print("static const struct jcase k_cases[] = {\n" + "\n".join(lines) + "\n};")
    lines = []
    for t, ctx, sub in ERRORS:
        try:
            env.from_string(t).render(**json.loads(ctx))
            print("ERROR CASE DOES NOT RAISE", t, file=sys.stderr)
        except Exception:
            pass
        lines.append('    {%s, %s, %s},' % (cstr(t), cstr(ctx), cstr(sub)))
    print("static const struct jcase k_errors[] = {\n" + "\n".join(lines) + "\n};")
    lines = []
    for t, sub in SYNTAX:
        try:
            env.from_string(t)
            print("SYNTAX CASE COMPILES", t, file=sys.stderr)
        except Exception:
            pass
        lines.append('    {%s, NULL, %s},' % (cstr(t), cstr(sub)))
    print("static const struct jcase k_syntax[] = {\n" + "\n".join(lines) + "\n};")


if __name__ == "__main__":
    main()
