#!/usr/bin/env python3
"""Chat-template goldens for gemma4.h's Jinja interpreter.

Renders every case below with transformers' apply_chat_template (jinja2 with
transformers' own settings: the sandboxed environment, trim_blocks,
lstrip_blocks, loopcontrols, its tojson, raise_exception), then tokenizes the
text with the `tokenizers` library and the tiny Gemma 4 tokenizer in
data/tokenizer/tokenizer.json. Writes data/templates/goldens.jsonl, one JSON
object per line:

    {"name", "template": file under data/templates, "chat_json": the
     conversation as given to `build/gemma4 template --messages`, "think",
     "gen" (add_generation_prompt), then either
     "text" and "ids" (tokenize=True; checked equal to tokenizers' encode of
     the text without special tokens) or "error" (what jinja2 raised)}
    {"name", "bad_template": source, "chat_json", "error": jinja2's message,
     "needle": what our message must say, "line": the line it must name}

The templates: e2b/chat_template.jinja is the released Gemma 4 E2B template
(see docs/templates.md); chatml_tools.jinja and gemma3_style.jinja are written in the
style of common Hub templates; constructs_*.jinja cover every supported
construct (constructs_edges.jinja: whitespace, precedence and printing edge cases
found by comparing with jinja2 snippet by snippet). Usage, from the repository root:

    venv/bin/python tools/make_template_goldens.py
"""

import datetime
import json
import os
import platform
import sys

import jinja2
import tokenizers
import transformers
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

assert jinja2.__version__ == "3.1.6", jinja2.__version__
assert transformers.__version__ == "5.23.0", transformers.__version__
assert tokenizers.__version__ == "0.23.3", tokenizers.__version__

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TDIR = os.path.join(ROOT, "data", "templates")
TOKFILE = os.path.join(ROOT, "data", "tokenizer", "tokenizer.json")

hf = PreTrainedTokenizerFast(tokenizer_file=TOKFILE, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                             unk_token="<unk>")
raw = Tokenizer.from_file(TOKFILE)

E2B = "e2b/chat_template.jinja"


def U(c):
    return {"role": "user", "content": c}


def A(c, **kw):
    return dict({"role": "assistant", "content": c}, **kw)


def S(c):
    return {"role": "system", "content": c}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature unit"}},
        "required": ["city"]}}}
NESTED = {"type": "function", "function": {
    "name": "book_trip", "description": "Book a trip with travellers and legs.",
    "parameters": {"type": "object", "properties": {
        "travellers": {"type": "array", "description": "Who travels",
                       "items": {"type": "object", "properties": {
                           "name": {"type": "string", "description": "Full name"},
                           "age": {"type": "integer"},
                           "tags": {"type": "array", "items": {"type": "string"}}},
                           "required": ["name"]}},
        "budget": {"type": "number", "description": "In EUR", "nullable": True},
        "options": {"type": "object", "description": "Extras",
                    "properties": {"insurance": {"type": "boolean"},
                                   "seat": {"type": "string", "enum": ["aisle", "window"]}},
                    "required": ["insurance"]},
        "Zeta": {"type": "string"},
        "alpha": {"type": "string"}},
        "required": ["travellers", "options"]},
    "response": {"type": "object", "description": "The booking"}}}
NOARGS = {"type": "function", "function": {"name": "now", "description": "The time now."}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "k": {"type": "integer"}},
                   "required": ["q"]}}}


def call(name, args, id=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if id:
        c["id"] = id
    return c


def tool(content, id=None, name=None):
    m = {"role": "tool", "content": content}
    if id:
        m["tool_call_id"] = id
    if name:
        m["name"] = name
    return m


CASES = []


def case(name, messages, tools=None, template=E2B, think=False, gen=True, **extra):
    chat = {"messages": messages}
    if tools is not None:
        chat["tools"] = tools
    chat.update(extra)
    CASES.append((name, template, chat, think, gen))


# ---- the released Gemma 4 template
case("user only", [U("Hello!")])
case("system and user", [S("You are terse."), U("Hi")])
case("developer role is a system turn", [{"role": "developer", "content": "Answer in French."}, U("Hello")])
case("multi-turn", [U("Hi"), A("Hello! How can I help?"), U("Tell me a joke."), A("Why did the chicken cross the road?"), U("Why?")])
case("thought in an earlier answer is stripped", [U("2+2?"), A("<|channel>thought\nsimple sum<channel|>4"), U("and 3+3?")])
case("two thought blocks in one answer", [U("Q"), A("<|channel>thought\na<channel|>First. <|channel>thought\nb<channel|>Second."), U("more")])
case("reasoning_content after the last user turn", [U("Why is the sky blue?"), A("Rayleigh scattering.", reasoning_content="Think about light.")], gen=False)
case("reasoning_content before the last user turn is dropped", [U("Q1"), A("A1", reasoning_content="r1"), U("Q2")])
case("thinking field is aliased", [U("Q"), A("A", thinking="deep thoughts")], gen=False)
case("reasoning field is aliased", [U("Q"), A("A", reasoning="other name")], gen=False)
case("user content as parts", [{"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "image"}, {"type": "text", "text": "this.\n"}]}])
case("system content as parts", [{"role": "system", "content": [{"type": "text", "text": "Part one."}, {"type": "text", "text": " Part two. "}]}, U("go")])
case("assistant parts with a thought", [U("q"), {"role": "assistant", "content": [{"type": "text", "text": "<|channel>thought\nx<channel|> visible "}, {"type": "audio"}]}, U("next")])
case("media parts", [{"role": "user", "content": [{"type": "image_url"}, {"type": "input_audio"}, {"type": "video"}, {"type": "text", "text": "what?"}]}])
case("unicode text", [S("Réponds en français — s'il te plaît."), U("日本語で答えて 😀 مرحبا e\u0301")])
case("unicode whitespace is trimmed", [U("\u3000\u00a0 padded \u2003\n"), A(" \u2028answer\u2029 "), U("ok")])
case("empty user content", [U("")])
case("empty assistant content", [U("hi"), A(""), U("still there?")])
case("content null is dropped", [U("hi"), {"role": "assistant", "content": None}, U("again")])
case("consecutive assistant turns continue one model turn", [U("Story?"), A("Once upon a time"), A("there was a dragon."), U("Then?")])
case("consecutive user turns", [U("first"), U("second")])
case("only a system message", [S("Just a system prompt.")])
case("system with surrounding whitespace", [S("\n\n  spaced system  \n"), U("  spaced user  ")])
case("special tokens inside user text", [U("literal <|turn> and <eos> in text")])
case("long conversation", [m for i in range(6) for m in (U("question %d" % i), A("answer %d" % i))] + [U("last")])
case("extra message fields are ignored", [{"role": "user", "content": "hi", "name": "bob", "meta": {"x": 1}}])
case("thinking on, no system", [U("Solve x+1=2")], think=True)
case("thinking on, with system", [S("Be careful."), U("Solve x+1=2")], think=True)
case("thinking on, no generation prompt", [S("sys"), U("q"), A("a")], think=True, gen=False)
case("no generation prompt", [U("Hi"), A("Hello")], gen=False)
case("tool declaration", [U("Weather in Paris?")], tools=[WEATHER])
case("tool declarations with nested schemas", [S("You book trips."), U("Book for Ann (34) and Bo.")], tools=[NESTED, WEATHER, NOARGS])
case("tools with thinking", [U("Search for cats")], tools=[SEARCH], think=True)
case("tool call and response", [U("Weather in Paris?"),
                                A("", tool_calls=[call("get_weather", {"city": "Paris", "unit": "celsius"}, "c1")]),
                                tool("{\"temp\": 21}", "c1"), A("It is 21 degrees."), U("Thanks")], tools=[WEATHER])
case("tool call, response pending generation", [U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Oslo"}, "c1")]),
                                                tool("sunny", "c1")], tools=[WEATHER])
case("tool response then thinking generation prompt", [U("Weather?"), A("", tool_calls=[call("get_weather", {"city": "Oslo"}, "c1")]),
                                                       tool("sunny", "c1")], tools=[WEATHER], think=True)
case("two tool calls, two responses", [U("Paris and Rome?"),
                                       A("Checking both.", tool_calls=[call("get_weather", {"city": "Paris"}, "a"), call("get_weather", {"city": "Rome"}, "b")]),
                                       tool("18C", "a"), tool("25C", "b"), A("Paris 18C, Rome 25C.")], tools=[WEATHER], gen=False)
case("tool call arguments of every type", [U("go"), A("", tool_calls=[call("book_trip", {
    "travellers": [{"name": "Ann", "age": 34, "tags": ["vip", "veg"]}, {"name": "Bo", "age": None}],
    "budget": 1234.5, "tiny": 1e-07, "huge": 1e+20, "neg": -0.0, "big": 9007199254740993, "flag": True, "off": False,
    "options": {"insurance": True, "seat": "window", "note": "a \"quoted\" é"}})]), tool("ok")], tools=[NESTED])
case("tool response as parts", [U("q"), A("", tool_calls=[call("search", {"q": "cats"}, "s1")]),
                                tool([{"type": "text", "text": "result one; "}, {"type": "text", "text": "result two"}, {"type": "image"}], "s1")],
     tools=[SEARCH])
case("tool response as an object", [U("q"), A("", tool_calls=[call("search", {"q": "x"}, "s1")]),
                                    tool({"hits": 3, "top": ["a", "b"], "ok": True}, "s1")], tools=[SEARCH])
case("tool response names by tool_call_id", [U("q"), A("", tool_calls=[call("search", {"q": "x"}, "id9")]),
                                             tool("r", "nomatch", name="fallback_name")], tools=[SEARCH])
case("legacy tool_responses on the assistant message", [U("q"), A("", tool_calls=[call("search", {"q": "x"})],
                                                                  tool_responses=[{"name": "search", "response": {"hits": 1}}]), A("Done.")],
     tools=[SEARCH], gen=False)
case("tool call with a thought and preserve_thinking", [U("q"), A("", reasoning_content="plan the call", tool_calls=[call("search", {"q": "x"}, "p")]),
                                                        tool("r", "p"), U("and?")], tools=[SEARCH], preserve_thinking=True)
case("tool call with no arguments", [U("time?"), A("", tool_calls=[call("now", None, "t")]), tool("12:00", "t")], tools=[NOARGS])
case("tool call arguments as a string raises", [U("q"), A("", tool_calls=[call("search", "{\"q\": \"x\"}")])], tools=[SEARCH])
case("thought-only answer", [U("q"), A("<|channel>thought\nonly thinking<channel|>"), U("hm")])

# ---- other templates
case("chatml: default system", [U("Hi there")], template="chatml_tools.jinja")
case("chatml: tools and calls", [S("You can search."), U("cats?"), A("", tool_calls=[call("search", {"q": "cats", "k": 3})]),
                                 tool("[\"a\", \"b\"]"), tool("more"), A("Found two."), U("Thanks")],
     template="chatml_tools.jinja", tools=[SEARCH, WEATHER])
case("chatml: unicode in tool json", [U("météo à Zürich?")], template="chatml_tools.jinja",
     tools=[{"type": "function", "function": {"name": "météo", "description": "Température « actuelle » 😀",
                                              "parameters": {"type": "object", "properties": {}}}}])
case("gemma3 style: system folded into first user", [S("Be nice."), U("Hi"), A("Hello"), U("Bye")], template="gemma3_style.jinja")
case("gemma3 style: parts", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " What is this? "}]}],
     template="gemma3_style.jinja", gen=False)
case("gemma3 style: roles must alternate", [U("a"), U("b")], template="gemma3_style.jinja")
for i, msgs in enumerate([
        [S("  Setup text.  "), U("Hello world!"), A("Hi. How are you?")],
        [U("Ünïcödé wörds here?"), {"role": "assistant", "content": [{"type": "text", "text": "part A"}, {"type": "image"}, {"type": "text", "text": "part B."}]}],
        [U(""), A("   "), {"role": "tool", "content": "x", "tool_call_id": "1"}],
        [U("one two three four five six"), U("The quick brown fox."), A("Jumps over the lazy dog!"), S("late system")]]):
    case("constructs flow %d" % (i + 1), msgs, template="constructs_flow.jinja", gen=i % 2 == 0)
    case("constructs expr %d" % (i + 1), msgs, template="constructs_expr.jinja")
    if i < 2:
        case("constructs edges %d" % (i + 1), msgs, template="constructs_edges.jinja", gen=i == 0)

# ---- bad templates: jinja2 must reject each; needle and line are what our message must name
BAD = [
    ("unclosed if", "a\n{% if x %}\nb", "'if' block from line 2 is not closed", 3),
    ("unclosed for", "{% for m in messages %}{{ m.role }}", "'for' block from line 1 is not closed", 1),
    ("unclosed macro", "{% macro f() %}x", "'macro' block from line 1 is not closed", 1),
    ("unclosed print", "{{ messages", "'{{' not closed", 1),
    ("unclosed comment", "x {# never closed", "missing end of comment tag", 1),
    ("unclosed string", "{{ 'abc }}", "unterminated string literal", 1),
    ("unknown filter", "line one\n{{ messages | nofilter }}", "unknown filter 'nofilter'", 2),
    ("unknown test", "{{ messages is shiny }}", "unknown test 'shiny'", 1),
    ("unknown tag", "{% frobnicate %}", "unknown tag 'frobnicate'", 1),
    ("unsupported include", "{% include 'x.jinja' %}", "unsupported tag 'include'", 1),
    ("endfor without for", "{% endfor %}", "unknown tag 'endfor'", 1),
    ("break outside a loop", "{% break %}", "'break' outside a for loop", 1),
    ("mismatched bracket", "{{ (1, 2] }}", "unexpected ']'", 1),
    ("raise_exception", "ok\n{{ raise_exception('custom failure: ' ~ messages | length) }}", "raise_exception: custom failure: 1", 2),
    ("deep recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested deeper than max_depth", 1),
    ("huge loop", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "max_steps", 1),
    ("huge range", "{{ range(10000000) | length }}", "range too big", 1),
    ("undefined attribute chain", "{{ nothing.attr }}", "'nothing' is undefined", 1),
    ("string plus int", "\n\n{{ 'a' + 1 }}", "unsupported operand type(s) for +: 'str' and 'int'", 3),
    ("call of a string", "{{ 'x'() }}", "'str' object is not callable", 1),
    ("too many macro arguments", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", "takes not more than 1 argument", 1),
    ("unknown macro keyword", "{% macro f(a) %}{% endmacro %}{{ f(b=1) }}", "no keyword argument 'b'", 1),
    ("tojson of undefined", "{{ nothing | tojson }}", "not JSON serializable", 1),
    ("division by zero", "{{ 1 // 0 }}", "division or modulo by zero", 1),
    ("list append", "{% set l = [] %}{{ l.append(1) }}", "unsafe", 1),
    ("assign to a non-namespace", "{% set x = 1 %}{% set x.y = 2 %}", "non-namespace", 1),
]


def render(template_src, chat, think, gen):
    extra = {k: v for k, v in chat.items() if k not in ("messages", "tools")}
    kw = dict(tools=chat.get("tools"), chat_template=template_src, add_generation_prompt=gen, enable_thinking=think, **extra)
    text = hf.apply_chat_template(chat["messages"], tokenize=False, **kw)
    ids = hf.apply_chat_template(chat["messages"], tokenize=True, **kw)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    return text, list(ids)


def main():
    out = []
    n_text = n_err = 0
    for name, tfile, chat, think, gen in CASES:
        src = open(os.path.join(TDIR, tfile), encoding="utf-8").read()
        row = {"name": name, "template": tfile, "chat_json": json.dumps(chat, ensure_ascii=False), "think": think, "gen": gen}
        try:
            text, ids = render(src, chat, think, gen)
        except jinja2.TemplateError as e:
            row["error"] = str(e)
            n_err += 1
        else:
            enc = raw.encode(text, add_special_tokens=False).ids
            assert enc == ids, (name, enc, ids)
            row["text"], row["ids"] = text, ids
            n_text += 1
        out.append(row)
    n_bad = 0
    for name, src, needle, line in BAD:
        chat = {"messages": [U("hi")]}
        try:
            if name == "huge loop":  # jinja2 has no step limit: it would run 10^10 iterations
                raise KeyboardInterrupt
            render(src, chat, False, True)
        except KeyboardInterrupt:
            err = "(not run with jinja2: it has no step limit)"
        except Exception as e:  # TemplateError, TypeError, SyntaxError (break outside a loop), ...  # noqa: BLE001
            err = "%s: %s" % (type(e).__name__, e)
        else:
            raise SystemExit("jinja2 accepted bad template %r" % name)
        out.append({"name": name, "bad_template": src, "chat_json": json.dumps(chat), "error": err, "needle": needle, "line": line})
        n_bad += 1
    with open(os.path.join(TDIR, "goldens.jsonl"), "w", encoding="utf-8") as f:
        for row in out:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(TDIR, "VERSIONS.txt"), "w") as f:
        f.write("jinja2 %s\ntransformers %s\ntokenizers %s\npython %s\n" % (jinja2.__version__, transformers.__version__,
                                                                          tokenizers.__version__, platform.python_version()))
        f.write("date %s UTC\n" % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"))
        f.write("command venv/bin/python tools/make_template_goldens.py\n")
        f.write("cases %d rendered (text + ids), %d raising in the template, %d bad templates\n" % (n_text, n_err, n_bad))
    print("%d rendered, %d raising, %d bad templates" % (n_text, n_err, n_bad))


if __name__ == "__main__":
    main()
