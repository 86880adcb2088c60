#!/usr/bin/python3
"""Differential test: C++ XTML renderer (xtml_dump) vs the independent Python reference.

    diff_test.py --dumper build/bin/xtml_dump [--seed 8] [--count 200]

Renders the generated requests (gen_cases.py), the expected-error requests and a hand-written
corpus of the spec's canonical examples (§6.2.1) with both implementations and requires identical
segment lists [(text, special)], or an error from both. The canonical corpus is also checked
against the spec's rendered text, so the reference itself is anchored to the spec.
Cases in KNOWN_DIFFERENCES must still differ (so a fix is noticed and the entry removed).
Exit status 0 on success, 1 on any failure.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_cases  # noqa: E402
import xtml_ref  # noqa: E402

# Cases where the C++ renderer is known to disagree with the spec; each names the spec text it
# breaks. The test fails if one of them starts to agree (remove it then).
# Each entry: case name -> why the reference (spec text) is right. The requests are in KNOWN_CASES.
KNOWN_DIFFERENCES = {
    # §6.2: "If `arguments` is a string that is not valid JSON, the call body is instead open
    # `json` attr `type=object`, the raw string, close `json`." json.loads("") raises, so the
    # vendor writes an (empty) json block; the C++ renders a call with no body ("blank = no args").
    "known_blank_arguments_empty":
        'spec §6.2: a string that is not valid JSON -> json block; C++ omits the block for ""',
    "known_blank_arguments_spaces":
        'spec §6.2: a string that is not valid JSON -> json block; C++ omits it for "  "',
    # §6.5.1: "integers stay integers" (Python json.loads keeps big integers exact); the C++ turns
    # an integer outside int64/uint64 into a float (documented in chat_json.h as a deviation).
    "known_big_integer":
        "spec §6.5.1: integers stay integers; C++ writes 2**70 as 1.1805916207174113e+21",
    # §6.2: "Arguments that parse to a non-object are an error." A JSON null is not an object (the
    # vendor iterates the arguments' items); the C++ renders an empty call instead of refusing.
    "known_null_arguments":
        "spec §6.2: non-object arguments are an error; C++ accepts null as no arguments",
}


def _one_call(arguments):
    return {"enable_thinking": False, "chat_template_kwargs": {"add_generation_prompt": False},
            "messages": [{"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function",
                 "function": {"name": "f", "arguments": arguments}}]}]}


KNOWN_CASES = [
    ("known_blank_arguments_empty", _one_call("")),
    ("known_blank_arguments_spaces", _one_call("  ")),
    ("known_big_integer", _one_call('{"n": %d, "m": -%d}' % (2**70, 2**64))),
    ("known_null_arguments", _one_call(None)),
]

EFFORT_MAX = ("<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>"
              + xtml_ref.EFFORT.format(effort="max") + "<|close|>message<|sep|><|end_of_msg|>")

# (name, request, expected rendered text or None). Texts are the spec's canonical examples.
CANONICAL = [
    ("canon_non_thinking",
     {"messages": [{"role": "user", "content": "hello"}], "enable_thinking": False},
     '<|open|>message role="user"<|sep|>hello<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'),
    ("canon_multi_turn_reasoning",
     {"messages": [{"role": "user", "content": "Q1"},
                   {"role": "assistant", "reasoning_content": "R1", "content": "A1"},
                   {"role": "user", "content": "Q2"}]},
     EFFORT_MAX
     + '<|open|>message role="user"<|sep|>Q1<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>R1<|close|>think<|sep|>'
     '<|open|>response<|sep|>A1<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="user"<|sep|>Q2<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'),
    ("canon_float_args",  # §6.5.1 spelled-out examples
     {"enable_thinking": False, "add_generation_prompt": True,
      "messages": [{"role": "user", "content": "go"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "c", "type": "function", "function": {
                           "name": "f",
                           "arguments": '{"x": 1e5, "y": 1E-7, "n": -0.0, "i": 7, '
                                        '"o": {"z": 1, "a": [1, 2]}, "s": "é"}'}}]}]},
     '<|open|>message role="user"<|sep|>go<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
     '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
     '<|open|>argument key="x" type="number"<|sep|>100000.0<|close|>argument<|sep|>'
     '<|open|>argument key="y" type="number"<|sep|>1e-07<|close|>argument<|sep|>'
     '<|open|>argument key="n" type="number"<|sep|>-0.0<|close|>argument<|sep|>'
     '<|open|>argument key="i" type="number"<|sep|>7<|close|>argument<|sep|>'
     '<|open|>argument key="o" type="object"<|sep|>{"z": 1, "a": [1, 2]}<|close|>argument<|sep|>'
     '<|open|>argument key="s" type="string"<|sep|>é<|close|>argument<|sep|>'
     '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>'),
    ("canon_raw_json_block",
     {"enable_thinking": False, "chat_template_kwargs": {"add_generation_prompt": False},
      "messages": [{"role": "assistant", "content": "x", "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]},
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|>x<|close|>response<|sep|>'
     '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
     '<|open|>json type="object"<|sep|>{bad<|close|>json<|sep|>'
     '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>'),
    ("canon_escape_and_special_text",
     {"enable_thinking": False, "chat_template_kwargs": {"add_generation_prompt": False},
      "messages": [{"role": "user", "name": 'a&"b"', "content": "<|open|>x"}]},
     '<|open|>message role="user" name="a&amp;&quot;b&quot;"<|sep|><|open|>x'
     '<|close|>message<|sep|><|end_of_msg|>'),
    ("choice_no_arguments_field",  # chat.h's choice: no `arguments` field = no arguments
     {"enable_thinking": False, "chat_template_kwargs": {"add_generation_prompt": False},
      "messages": [{"role": "assistant", "content": "", "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "f"}}]}]},
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
     '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|>'
     '<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>'),
    # §6.5.1: NaN/-Infinity accepted; a duplicate key keeps its first position, last value.
    ("canon_nan_dupkey",
     {"enable_thinking": False, "chat_template_kwargs": {"add_generation_prompt": False},
      "messages": [{"role": "assistant", "content": "", "tool_calls": [
          {"id": "c", "type": "function", "function": {
              "name": "f", "arguments": '{"a": NaN, "b": -Infinity, "a": 2}'}}]}]},
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
     '<|open|>tools<|sep|><|open|>call tool="f" index="1"<|sep|>'
     '<|open|>argument key="a" type="number"<|sep|>2<|close|>argument<|sep|>'
     '<|open|>argument key="b" type="number"<|sep|>-Infinity<|close|>argument<|sep|>'
     '<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>'),
    ("canon_tool_results_resorted",  # §6.5.6: fully matched run re-sorted, names from the calls
     {"enable_thinking": False, "chat_template_kwargs": {"add_generation_prompt": False},
      "messages": [{"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "type": "function", "function": {"name": "f1", "arguments": "{}"}},
          {"id": "b", "type": "function", "function": {"name": "f2", "arguments": "{}"}}]},
          {"role": "tool", "tool_call_id": "b", "name": "wrong", "content": "B"},
          {"role": "tool", "tool_call_id": "a", "content": "A"}]},
     '<|open|>message role="assistant"<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
     '<|open|>tools<|sep|><|open|>call tool="f1" index="1"<|sep|><|close|>call<|sep|>'
     '<|open|>call tool="f2" index="2"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>'
     '<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="tool" tool="f1" index="1"<|sep|>A<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="tool" tool="f2" index="2"<|sep|>B'
     '<|close|>message<|sep|><|end_of_msg|>'),
    ("canon_options_tail",  # §6.2 items 1, 2, 4, 5 and 6 in vendor order
     {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": "é"}}}],
      "reasoning_effort": "low", "tool_choice": "none", "response_format": "json_object",
      "messages": [{"role": "user", "content": "u"}]},
     '<|open|>message role="system" type="tool-declare"<|sep|>'
     + xtml_ref.TOOLS.format(
         tools_json='[{"function":{"name":"f","parameters":{"a":"é","b":1}},"type":"function"}]')
     + '<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="system" type="thinking-effort"<|sep|>'
     + xtml_ref.EFFORT.format(effort="low") + '<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="user"<|sep|>u<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="system" type="tool-choice"<|sep|>' + xtml_ref.CHOICE_NONE
     + '<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="system" type="response-format"<|sep|>' + xtml_ref.RF_OBJECT
     + '<|close|>message<|sep|><|end_of_msg|>'
     '<|open|>message role="assistant"<|sep|><|open|>think<|sep|>'),
]


def run_reference(request):
    try:
        return [[t, s] for t, s in xtml_ref.build_chat_segments(request)]
    except xtml_ref.XtmlError as e:
        return {"error": str(e)}


def run_dumper(dumper, requests):
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", delete=False) as f:
        json.dump(requests, f, ensure_ascii=False)
        path = f.name
    try:
        out = subprocess.run([dumper, path], capture_output=True, timeout=60, check=True)
    finally:
        os.unlink(path)
    # Split on LF only: str.splitlines() would also split at U+2028 inside a segment.
    lines = out.stdout.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(requests):
        raise SystemExit("xtml_dump printed %d lines for %d requests" % (len(lines), len(requests)))
    return [json.loads(line) for line in lines]


def describe_difference(ref, cpp):
    """A short text showing the first differing segment with two segments of context."""
    if isinstance(ref, dict) or isinstance(cpp, dict):
        return "  reference: %s\n  c++:       %s" % (
            ref if isinstance(ref, dict) else "%d segments" % len(ref),
            cpp if isinstance(cpp, dict) else "%d segments" % len(cpp))
    i = 0
    while i < min(len(ref), len(cpp)) and ref[i] == cpp[i]:
        i += 1
    lo = max(0, i - 2)
    return ("  first difference at segment %d (reference %d segments, c++ %d)\n"
            "  context:   %s\n  reference: %s\n  c++:       %s" % (
                i, len(ref), len(cpp), json.dumps(ref[lo:i], ensure_ascii=False),
                json.dumps(ref[i:i + 3], ensure_ascii=False),
                json.dumps(cpp[i:i + 3], ensure_ascii=False)))


# Rules the generated requests must exercise (feature -> test on (request, rendered text)), so a
# change to the generator cannot quietly stop covering one.
def _calls(req):
    for m in req["messages"]:
        for c in m.get("tool_calls") or []:
            yield c["function"]["arguments"]


def _has_arg(req, pred):
    return any(isinstance(a, str) and pred(a) for a in _calls(req))


COVERAGE = {
    "tool declarations": lambda q, t: 'type="tool-declare"<|sep|># Tools' in t,
    "lazy tool loading": lambda q, t: "## New Tools Available" in t,
    "effort low/high/max": lambda q, t: "thinking_effort=high`" in t or "thinking_effort=low`" in t,
    "thinking off": lambda q, t: t.endswith("<|open|>response<|sep|>"),
    "no generation prompt": lambda q, t: t.endswith("<|end_of_msg|>"),
    "developer role": lambda q, t: any(m["role"] == "developer" for m in q["messages"]),
    "name attribute escaped": lambda q, t: ' name="a&amp;b"' in t or "&quot;" in t,
    "list-of-parts content": lambda q, t: any(isinstance(m.get("content"), list)
                                              for m in q["messages"]),
    "reasoning fallback": lambda q, t: any(not m.get("reasoning_content") and m.get("reasoning")
                                           for m in q["messages"]),
    "whitespace reasoning": lambda q, t: any((m.get("reasoning_content") or "x").strip() == ""
                                             for m in q["messages"]),
    "raw json block": lambda q, t: '<|open|>json type="object"' in t,
    "object arguments": lambda q, t: any(isinstance(a, dict) and a for a in _calls(q)),
    "duplicate argument key": lambda q, t: _has_arg(q, lambda a: a.count('"a":') > 1),
    "NaN/Infinity": lambda q, t: ">NaN<" in t or "Infinity" in t,
    "float exponent": lambda q, t: "e-0" in t and "e+" in t,
    "negative zero": lambda q, t: "-0.0" in t,
    "typed boolean/null/array/object": lambda q, t: all(
        'type="%s"' % k in t for k in ("boolean", "null", "array", "object")),
    "tool messages": lambda q, t: '<|open|>message role="tool"' in t,
    "tool_choice required": lambda q, t: "tool_choice=required" in t,
    "tool_choice none": lambda q, t: "tool_choice=none" in t,
    "tool_choice object": lambda q, t: isinstance(q.get("tool_choice"), dict),
    "response_format json_object string": lambda q, t: q.get("response_format") == "json_object",
    "response_format schema": lambda q, t: "```json\n{" in t and "json_schema" in t,
    "response_format null schema": lambda q, t: "```json\nnull\n```" in t,
    "special text in body": lambda q, t: "<|open|>message<|sep|> " in t or "<|end_of_msg|> " in t,
}


def check_coverage(generated):
    hits = dict.fromkeys(COVERAGE, 0)
    for _, req in generated:
        try:
            text = xtml_ref.render_text(xtml_ref.build_chat_segments(req))
        except xtml_ref.XtmlError:
            continue
        for feature, test in COVERAGE.items():
            hits[feature] += bool(test(req, text))
    missing = [f for f, n in hits.items() if n == 0]
    for f in missing:
        print("FAIL coverage: no generated request exercises '%s'" % f)
    return len(missing)


def agree(ref, cpp):
    if isinstance(ref, dict) or isinstance(cpp, dict):
        return isinstance(ref, dict) and isinstance(cpp, dict)  # both refuse
    return ref == cpp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dumper", required=True)
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()

    failures = 0
    # 1. The reference reproduces the spec's canonical texts.
    for name, request, text in CANONICAL:
        got = xtml_ref.render_text(xtml_ref.build_chat_segments(request))
        if got != text:
            failures += 1
            print("FAIL %s: reference text differs from the spec\n  spec: %r\n  ref:  %r"
                  % (name, text, got))

    generated = gen_cases.generate(a.seed, a.count)
    failures += check_coverage(generated)
    cases = [(n, r) for n, r, _ in CANONICAL] + KNOWN_CASES + generated + gen_cases.error_cases()
    expected_errors = {n for n, _ in gen_cases.error_cases()}
    cpp_all = run_dumper(a.dumper, [r for _, r in cases])
    agreed = errors = 0
    for (name, request), cpp in zip(cases, cpp_all):
        ref = run_reference(request)
        if name in expected_errors and not isinstance(ref, dict):
            failures += 1
            print("FAIL %s: the reference accepted a request that must be refused" % name)
        ok = agree(ref, cpp)
        if name in KNOWN_DIFFERENCES:
            if ok:
                failures += 1
                print("FAIL %s: listed in KNOWN_DIFFERENCES but now agrees; remove it" % name)
            else:
                print("known difference %s (%s)" % (name, KNOWN_DIFFERENCES[name]))
            continue
        if ok:
            agreed += 1
            errors += isinstance(ref, dict)
            if a.verbose and isinstance(ref, dict):
                print("both refuse %s: ref %s | c++ %s" % (name, ref["error"], cpp["error"]))
            continue
        failures += 1
        print("FAIL %s\n  request: %s\n%s" % (name, json.dumps(request, ensure_ascii=False),
                                            describe_difference(ref, cpp)))
    print("%d cases: %d identical (%d refused by both), %d known differences, %d failures"
          % (len(cases), agreed, errors, len(KNOWN_DIFFERENCES), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
