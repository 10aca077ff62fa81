#!/usr/bin/env python3
"""Golden outputs for tests/data/test_chat_template.c, from jinja2 itself.

Renders every tests/data/chat_template/*.jinja over every conversation of
tests/data/chat_template/conversations.json with jinja2 set up as
transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment,
trim_blocks, lstrip_blocks, loopcontrols, its generation tag, tojson,
raise_exception and strftime_now), and writes NAME.CONV.out (the text) or
NAME.CONV.err (the error: "raise_exception: MESSAGE" for the template's own
raise, "TYPE: MESSAGE" for any other). It also renders the small cases of
CASES below into chat_template/cases.json: {"vars": the variables of a case
without its own, "cases": [{"template", "out"} or {"template", "error",
"message"}, with "vars" where a case has its own]}.

Reference only, never a build or test dependency: run it with a Python that
has jinja2 (3.1.x), e.g.

    PEER_PYTHON=/path/to/python; $PEER_PYTHON tests/data/gen_chat_template_golden.py
"""
import copy
import glob
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_template")


class Generation(jinja2.ext.Extension):
    """transformers' AssistantTracker, not tracking: {% generation %} renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, text, variables):
    """("out", text) or ("err", "KIND: message")."""
    try:
        return "out", env.from_string(text).render(**variables)
    except jinja2.exceptions.TemplateError as e:
        kind = type(e).__name__
        if kind == "TemplateError":  # raise_exception's
            return "err", "raise_exception: " + str(e.message)
        return "err", kind + ": " + str(e)
    except Exception as e:  # TypeError, ZeroDivisionError, ...
        return "err", type(e).__name__ + ": " + str(e)


V = {"xs": [1, 2, 3], "d": {"b": 2, "a": 1, "c": [1, "x"]}, "s": "héllo wörld 🎉", "n": None, "e": "",
     "f": 2.5, "neg": -7, "t": True, "msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                               {"role": "user", "content": "c", "extra": 1}]}

# Small cases: (template, variables); V when variables is None.
CASES = [
    # whitespace: trim_blocks, lstrip_blocks, '-', '+', comments, raw
    ("a\n  {% if true %}\n  b\n  {% endif %}\nc", None),
    ("a  {% if true %}b{% endif %}  c", None),
    ("  {%+ if true %}x{% endif %}\n", None),
    ("x\n\t {%- if true -%}  \n y \n {%- endif %}\nz", None),
    ("{{ 'a' }}  {% if true %}\nb{% endif %}", None),
    ("{{ 'a' -}}\n\n  {{- 'b' }}  {{ 'c' }}", None),
    ("line\n    {# comment #}\nnext\n  {#- c -#}  \n after", None),
    ("{% if true +%}\nkept newline{% endif +%}\n!", None),
    ("  {% raw %}  {{ x }} {% if %}\n  {% endraw %}\nafter", None),
    ("text\r\nwith\rcr\n{% if true %}\r\nx{% endif %}\r\n", None),
    ("{% for i in xs %}\n  {{ i }}\n{% endfor %}\n", None),
    ("{%- for i in xs -%}\n  {{ i }}\n{%- endfor -%}\n", None),
    ("a\n{# c #}\n\n{% set x = 1 %}  \nb", None),
    ("  {{ 1 }}\n  {% if true %}2{% endif %}", None),
    ("\u3000 {%- if true %}x{% endif %}", None),
    # literals and printing: Python's str()/repr()
    ("{{ none }} {{ None }} {{ true }} {{ False }} {{ n }} {{ [none, true, 1.0, 'a'] }}", None),
    ("{{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 1e-5 }} {{ 0.0001 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ -0.0 }} {{ 2.5e-10 }}",
     None),
    ("{{ 3 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2**3**2 }}",
     None),
    ("{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1_000 }} {{ 0x1F }} {{ 0b101 }} {{ 0o17 }} {{ 1.5e3 }}", None),
    ("{{ ['a\\n', \"it's\", 'q\"', {'k': ('t',)}, (1, 2), ()] }}", None),
    ("{{ d }} {{ {'a': none, 1: 2.5} }} {{ s }} {{ [s] }}", None),
    ("{{ ['\\x01\\x7f\\u00a0\\u2028é'] }}", None),
    ("{{ 'a' 'b' }} {{ \"\\t|\\\\|\\x41|\\u00e9|\\101|\\q\" }}", None),
    ("{{ 1, 2 }} {{ (1,) }}", None),
    # operators and precedence
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ not 1 == 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}",
     None),
    ("{{ 'a' ~ 1 ~ none ~ u }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }} {{ 'x' + 'y' }}", None),
    ("{{ 'b' in 'abc' }} {{ 2 in xs }} {{ 'a' in d }} {{ 5 not in xs }} {{ 'z' in u }}", None),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == (1,) }} {{ d == {'a': 1, 'c': [1, 'x'], 'b': 2} }} {{ u == u }}",
     None),
    ("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ '' or [] }} {{ none and 1 }}", None),
    ("{{ 'y' if t }}|{{ 'y' if n }}|{{ 'a' if n else 'b' if t else 'c' }}", None),
    ("{{ -f }} {{ +neg }} {{ -neg|abs }} {{ (-neg)|abs }}", None),
    # undefined
    ("[{{ u }}] {{ u is defined }} {{ u is undefined }} {{ u|default('dflt') }} {{ u|length }} {{ u|list }}", None),
    ("{{ d.zz }}|{{ d['zz'] }}|{{ xs[10] }}|{{ n.a }}|{{ n[0] }}|{{ (d.zz is defined) }}|{{ s.nope is defined }}",
     None),
    ("{% for x in u %}{{ x }}{% else %}empty{% endfor %} {{ u|join(',') }} {{ u|string }}{{ u ~ 'z' }}", None),
    ("{{ u.a }}", None),
    ("{{ u[0] }}", None),
    ("{{ d.zz.a }}", None),
    ("{{ u + 1 }}", None),
    ("{{ u() }}", None),
    # loops
    ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}", None),
    ("{% for x in xs %}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }}{{ loop.cycle('a','b') }}"
     "{% endfor %}", None),
    ("{% for x in xs if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}", None),
    ("{% for x in xs %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% if x == 3 %}{% break %}{% endif %}"
     "{% endfor %}", None),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {% for k in d %}{{ k }}{% endfor %}", None),
    ("{% for a, b in [(1, 2), [3, 4], 'xy'] %}{{ a }}{{ b }}{% endfor %}", None),
    ("{% for c in s %}{{ c }}|{% endfor %}", None),
    ("{% for x in [] %}{{ x }}{% else %}none{% endfor %}", None),
    ("{% set y = 0 %}{% for x in xs %}{{ y }}{% set y = x %}{{ y }}|{% endfor %}{{ y }}", None),
    ("{% for x in xs %}{% for y in xs %}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}", None),
    ("{% for m in msgs[::-1] %}{{ m.content }}{% endfor %} {% for i in range(3) %}{{ i }}{% endfor %}"
     " {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }}", None),
    ("{% for x in xs %}{{ x }}{% break %}{% else %}else-after-break{% endfor %}", None),
    ("{% for x in xs %}{% if x < 3 %}{% continue %}{% endif %}{{ x }}{% else %}no-else{% endfor %}", None),
    ("{% for x in xs %}{% continue %}{% else %}else-after-continue{% endfor %}", None),
    ("{{ range(3) }} {{ range(1, 9, 2) }} {{ [range(2)] }} {{ range(2)|list }} {{ range(3)[1:] }}", None),
    ("{% for a, b in xs %}{% endfor %}", None),
    ("{% for x in 3 %}{% endfor %}", None),
    # set, namespace, scoping, with, macros, call, filter blocks
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set c = 1, 2 %}{{ c }}", None),
    ("{% set ns = namespace(n=0, l=[]) %}{% for x in xs %}{% set ns.n = ns.n + x %}{% set ns.l = ns.l + [x] %}"
     "{% endfor %}{{ ns.n }} {{ ns.l }} {{ ns.missing is defined }}", None),
    ("{% if true %}{% set z = 5 %}{% endif %}{{ z }}", None),
    ("{% set x %}block {{ xs|length }}{% endset %}[{{ x }}] {% set y | upper %}up{% endset %}{{ y }}", None),
    ("{% with a = 1, b = 'x' %}{{ a }}{{ b }}{% endwith %}[{{ a }}]", None),
    ("{% macro m(a, b=2, c='c') %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }} {{ m(1, 3) }} {{ m(1, c='z') }}"
     " {{ m() }}", None),
    ("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k='v') }}", None),
    ("{% macro m(x) %}{{ q }}{{ x }}{% endmacro %}{% set q = 'Q' %}{{ m('x') }}", None),
    ("{% macro w(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call w('b') %}in{{ 1 + 1 }}{% endcall %}",
     None),
    ("{% macro w() %}{% for i in [1, 2] %}{{ caller(i) }}{% endfor %}{% endmacro %}"
     "{% call(n) w() %}[{{ n }}]{% endcall %}", None),
    ("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}", None),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %} {% filter trim|replace('a', 'b') %}  aaa  {% endfilter %}",
     None),
    ("{% generation %}gen {{ 1 }}{% set inner = 1 %}{% endgeneration %}[{{ inner }}]", None),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", None),
    ("{% set n.x = 1 %}", None),
    # slicing and indexing
    ("{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ xs[5:] }} {{ xs[-10:1] }}"
     " {{ xs[2:0:-1] }} {{ xs[-1] }} {{ xs[0] }}", None),
    ("{{ s[0] }} {{ s[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ s[::3] }} {{ s|length }} {{ s[100:] }}|", None),
    ("{{ xs[::0] }}", None),
    ("{{ d['c'][1] }} {{ d.c.1 }} {{ msgs[2]['extra'] }} {{ msgs.0.role }}", None),
    # tests
    ("{{ n is none }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }} "
     "{{ true is boolean }} {{ 't' is string }} {{ d is mapping }} {{ xs is iterable }} {{ s is sequence }} "
     "{{ d is sequence }} {{ 1 is iterable }}", None),
    ("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(2) }} {{ 'a' is eq 'a' }} "
     "{{ 2 is gt 1 }} {{ 2 is le 1 }} {{ 'x' is in 'xyz' }} {{ 'abc' is lower }} {{ 'ABC' is upper }} "
     "{{ n is sameas none }} {{ t is true }} {{ 1 is true }} {{ f is not false }} {{ range is callable }}", None),
    ("{{ xs|select('odd')|list }} {{ xs|reject('equalto', 2)|list }} {{ msgs|selectattr('extra')|list }} "
     "{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }} {{ [0, 1, '', 'a']|select|list }}",
     None),
    # filters
    ("{{ '  a b  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|upper }}|{{ 'ÀB'|lower }}|{{ 'hello-world foo(bar'|title }}"
     "|{{ 'they\\'re 1st'|capitalize }}|{{ 'aXa'|replace('a', 'b') }}|{{ 'aaa'|replace('a', 'b', 2) }}", None),
    ("{{ xs|join(', ') }} {{ msgs|join('|', attribute='role') }} {{ [1, 'a', none]|join }} {{ xs|first }} "
     "{{ xs|last }} {{ 'abc'|first }} {{ []|first is defined }} {{ xs|length }} {{ d|count }} {{ 'é'|length }}",
     None),
    ("{{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ xs|sort(reverse=true) }} "
     "{{ msgs|sort(attribute='content', reverse=true)|map(attribute='content')|join }} "
     "{{ ['a', 'A', 'b']|unique|list }}",
     None),
    ("{{ d|dictsort }} {{ d|dictsort(reverse=true) }} {{ d|items|list }} {{ xs|reverse|list }} {{ s|reverse }} "
     "{{ xs|list }} {{ 'ab'|list }}", None),
    ("{{ xs|map('string')|join('-') }} {{ [-1, 2]|map('abs')|list }} "
     "{{ msgs|map(attribute='extra', default=0)|list }} {{ xs|sum }} {{ msgs|sum(attribute='extra', start=10) }} "
     "{{ xs|min }} {{ ['b', 'A']|max }} {{ []|max is defined }}",
     None),
    ("{{ 1|string + '2' }} {{ '3'|int + 1 }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '3.7'|int }} {{ 3.7|int }} "
     "{{ '0x1A'|int(0, 16) }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ '2.5'|float }} {{ 'x'|float }} "
     "{{ 3|float }}",
     None),
    ("{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ 2.1|round(method='ceil') }} "
     "{{ 2.9|round(0, 'floor') }} {{ -2.5|round }} {{ -3|abs }} {{ -2.5|abs }}", None),
    ("{{ ''|default('a') }}|{{ ''|default('a', true) }}|{{ none|default('a') }}|{{ none|d('a', true) }}|"
     "{{ u|d }}|", None),
    ("{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }}", None),
    ("[{{ 'a\\nb\\n\\nc'|indent }}] [{{ 'a\\nb'|indent(2, true) }}] [{{ 'a\\n\\nb'|indent(1, blank=true) }}] "
     "[{{ 'x\\ny'|indent('> ') }}]", None),
    ("{% if false %}{{ x|nosuch }}{{ x is nosuch }}{% endif %}ok {{ x|nosuch2 if false else 'y' }}", None),
    ("{% if true %}{{ x|nosuch }}{% endif %}", None),
    ("{% if true %}{% for i in xs %}{{ i|nosuch }}{% endfor %}{% endif %}", None),
    ("{% if false %}{{ x|groupby('a') }}{% endif %}ok", None),
    ("{{ xs|indent }}", None),
    ("{{ xs|length.x }}", None),
    ("{{ 'one two  three'|wordcount }} {{ 'héllo, wörld_2!'|wordcount }}", None),
    # tojson (transformers': json.dumps, ensure_ascii=False)
    ("{{ d|tojson }} {{ xs|tojson }} {{ s|tojson }} {{ none|tojson }} {{ t|tojson }} {{ f|tojson }} "
     "{{ 1.0|tojson }} {{ (1, 'a')|tojson }}", None),
    ("{{ '\"quoted\" back\\\\slash\\nnl\\ttab\\x01\\x1f\\x7f é \\u2028 😀 </script>'|tojson }}", None),
    ("{{ d|tojson(indent=2) }}|{{ {'a': [], 'b': {}, 'c': [1, [2, {'x': none}]]}|tojson(indent=4) }}", None),
    ("{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ s|tojson(ensure_ascii=true) }} "
     "{{ {1: 'i', 2.5: 'f', none: 'n', true: 'b'}|tojson }} {{ d|tojson(indent='\\t') }}", None),
    ("{{ u|tojson }}", None),
    ("{{ msgs|tojson(indent=0) }}", None),
    # methods
    ("{{ ' a b '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ '\\n a\\n'.rstrip() }}|"
     "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a b c'.rsplit(' ', 1) }}|"
     "{{ 'a\\nb\\r\\nc'.splitlines() }}", None),
    ("{{ s.startswith('hé') }} {{ s.endswith(('x', '🎉')) }} {{ s.find('l') }} {{ s.find('zz') }} {{ s.rfind('l') }} "
     "{{ 'aXbX'.count('X') }} {{ '-'.join(['a', 'b']) }} {{ s.upper() }} {{ 'hello wORLD'.title() }} "
     "{{ 'hELLO'.capitalize() }} {{ 'aBc'.swapcase() }} {{ 'a-b'.replace('-', '+') }}", None),
    ("{{ '12'.isdigit() }} {{ '1a'.isdigit() }} {{ 'ab'.isalpha() }} {{ ' \\t'.isspace() }} {{ ''.isspace() }} "
     "{{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('c') }}", None),
    ("{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} "
     "{{ d.items()|list }} {{ xs.index(2) }} {{ [1, 1, 2].count(1) }}", None),
    ("{{ xs.append(4) }}", None),
    ("{{ d.update({'x': 1}) }}", None),
    ("{{ d.pop('a') }}", None),
    ("{{ '-'.join([1, 2]) }}", None),
    ("{{ 'a'.split('') }}", None),
    # errors
    ("{{ raise_exception('custom failure: ' ~ xs|length) }}", None),
    ("{{ 1 / 0 }}", None),
    ("{{ 'a' + 1 }}", None),
    ("{{ 'a' < 1 }}", None),
    ("{{ -'a' }}", None),
    ("{{ {}[[]] }}", None),
    ("{% if %}", None),
    ("{% if true %}open", None),
    ("{% for x in xs %}{% endif %}", None),
    ("{{ x | nosuchfilter }}", None),
    ("{{ x is nosuchtest }}", None),
    ("{% nosuchtag %}", None),
    ("{% break %}", None),
    ("{{ 'unterminated }}", None),
    ("{{ (1 }}", None),
    ("{{ 1 ]}}", None),
    ("{# unclosed", None),
    ("{{ 1 2 }}", None),
    ("{% endfor %}", None),
    ("a\nb\n{{ 1 +* 2 }}", None),
    # printf-style formatting: the % operator and the format filter
    ("{{ '%s-%05.2f' % ('a', 3.14159) }}|{{ '%s' % [1, 2] }}|{{ '%r|%a' % ('\u00e9', '\u00e9') }}", None),
    ("{{ '%d|%i|%u' % (3.9, -2, True) }}|{{ '%x|%X|%#x|%#o|%o' % (255, 255, 0, 8, -8) }}", None),
    ("{{ '%5s|%-5s|%.2s|%5.1s' % ('ab', 'ab', '\u00e9\u00e9\u00e9', 'xyz') }}|{{ '%+d|% d|%05d|%-5d|' % (3, 3, -3, 3) }}",
     None),
    ("{{ '%e|%E|%g|%G|%.3g|%f|%F' % (12345.678, 0.00012, 1e20, 1e-5, 3.14159, 2.5, 1.5) }}", None),
    ("{{ '%c%c' % (65, '\u00e9') }}|{{ '100%%' % () }}|{{ '%(a)s and %(b)d' % {'a': 'x', 'b': 4} }}", None),
    ("{{ '%*d|%-*.*f' % (5, 3, 8, 2, 3.14159) }}|{{ '%s %s' | format('a', 'b') }}|{{ '%(k)s' | format(k='v') }}", None),
    ("{{ '%(role)s: %(content)s' % messages[0] }}|{{ '%-08.3f|%+08d|%#08x|%08s' % (3.14159, 42, 255, 'ab') }}",
     {"messages": [{"role": "user", "content": "x"}]}),
    ("{{ 'abc' % {'a': 1} }}|{{ '%s' % none }}|{{ '%5.3d|%.0f|%.0f' % (7, 0.5, 1.5) }}", None),
    ("{{ '%d' % '3' }}", None),
    ("{{ '%s %s' % ('a',) }}", None),
    ("{{ '%s' % ('a', 'b') }}", None),
    ("{{ '%q' % 1 }}", None),
    ("{{ '%x' % 3.0 }}", None),
    ("{{ '%(a)s' % ('x',) }}", None),
    ("{{ '%5%' % (1,) }}", None),
    ("{{ '%s %s' | format('a', b='c') }}", None),
    # an undefined argument: str() of it is '', repr() 'Undefined'; a number or a mapping of it fails
    ("{{ '%s|' % nope }}{{ '%r|%a|%5s|' % (nope, nope, nope) }}{{ '%s %s|' % (nope, 1) }}{{ '%s' | format(nope) }}",
     None),
    ("{{ '%d' % nope }}", None),
    ("{{ '%(a)s' % nope }}", None),
]


def main():
    env = make_env()
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        convs = json.load(f)
    for old in glob.glob(os.path.join(HERE, "*.out")) + glob.glob(os.path.join(HERE, "*.err")):
        os.remove(old)
    n = 0
    for path in sorted(glob.glob(os.path.join(HERE, "*.jinja"))):
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        name = os.path.basename(path)[:-len(".jinja")]
        for conv in convs:
            kind, result = render(env, text, copy.deepcopy(conv["vars"]))
            with open(os.path.join(HERE, f"{name}.{conv['name']}.{kind}"), "w", encoding="utf-8", newline="") as f:
                f.write(result)
            n += 1
    cases = []
    for text, variables in CASES:
        # a copy each: jinja2's indent filter appends to a list it is given
        kind, result = render(env, text, copy.deepcopy(V if variables is None else variables))
        case = {"template": text}
        if variables is not None:
            case["vars"] = variables
        if kind == "out":
            case["out"] = result
        else:
            case["error"], _, case["message"] = result.partition(": ")
        cases.append(case)
    with open(os.path.join(HERE, "cases.json"), "w", encoding="utf-8", newline="") as f:
        json.dump({"vars": V, "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{n} golden renders, {len(cases)} cases")


if __name__ == "__main__":
    main()
