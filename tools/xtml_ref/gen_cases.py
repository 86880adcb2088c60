#!/usr/bin/python3
"""Random chat-completions requests covering every XTML rule of spec §6.2 / §6.5.

    gen_cases.py --seed 8 --count 200 > requests.json   # JSON array of request objects

generate(seed, count) returns [(name, request)]; error_cases() returns requests the renderer
must refuse. The same seed always gives the same requests (random.Random(seed), no other state).
The generator stays out of corners the spec leaves open (see xtml_ref.py's docstring): it never
combines two sources of the same option (e.g. reasoning_effort with
chat_template_kwargs.thinking_effort), never sends an empty `tools` list, and never sends an
unknown tool_choice / response_format type.
"""

import argparse
import json
import random

WORDS = ["hello", "Grüße", "日本語のテキスト", "emoji 🚀🙂", "tab\there", "line\nbreak",
         "  padded  ", "a & b", 'say "hi"', "<|open|>message<|sep|>", "<|end_of_msg|>",
         "x < y > z", "naïve café", "\u00a0nbsp", "back\\slash", "{\"json\": true}", "?", "0",
         "ctl\x01\x1f\x7f\u2028\u2029", "&amp; &quot;"]

# Literal argument strings whose spelling matters (parsed by json.loads first, §6.5.1).
RAW_NUMBERS = ["1e5", "1E-7", "-0.0", "0.1", "3.0", "1.5e300", "123456789012345678",
               "9223372036854775807", "-9223372036854775808", "18446744073709551615", "-0",
               "2.5E+3", "1e16", "1e-5", "0.0001", "12345.678e-2", "NaN", "-Infinity",
               "Infinity", "1e400", "0", "42", "-17"]
# (Blank strings are left to diff_test.py's hand cases: see KNOWN_DIFFERENCES there.)
INVALID_ARGS = ["{'a': 1}", "{\"a\": 1,}", "not json at all", "{\"a\": tru}", "{\"k\": \"v\"",
                "{\"a\": 1} trailing", "{\"city\": \"Par\"is\"}", "{\"a\": 01}", "{\"a\": .5}",
                "{\"a\": 1e}",
                "{\"a\": -NaN}", "{\"a\": nan}", "{\"a\": \"tab\there\"}", "x{\"a\": 1}"]


def rword(r):
    return r.choice(WORDS)


def rtext(r):
    return " ".join(rword(r) for _ in range(r.randint(1, 3)))


def rcontent(r, allow_none=False):
    x = r.random()
    if allow_none and x < 0.15:
        return None
    if x < 0.25:
        return [{"type": "text", "text": rtext(r)} for _ in range(r.randint(1, 3))]
    if x < 0.32:
        return ""
    return rtext(r)


def rjson_value(r, depth=0):
    kinds = ["int", "float", "str", "bool", "null"] + (["obj", "arr"] if depth < 3 else [])
    k = r.choice(kinds)
    if k == "int":
        return r.choice([0, 1, -1, 42, 2**53 + 1, 2**63 - 1, -2**63, 2**64 - 1, 10**15])
    if k == "float" and r.random() < 0.5:
        return r.choice([r.uniform(-1e6, 1e6), r.random() * 10.0 ** r.randint(-320, 300),
                         -r.random() * 10.0 ** r.randint(-20, 20), float(r.randint(-10**6, 10**6)),
                         r.randint(1, 99) * 10.0 ** r.randint(-8, 22)])
    if k == "float":
        return r.choice([1e5, 1e-7, -0.0, 0.1, 3.0, 1.5e300, 2.5, 1e16, 1e-5, 0.0001, 123.456,
                         5e-324, 1.7976931348623157e308])
    if k == "str":
        return rword(r)
    if k == "bool":
        return r.choice([True, False])
    if k == "null":
        return None
    if k == "obj":
        keys = ["z", "a", "m", "é", "key & \"q\"", "Ω", "b1", "_"]
        r.shuffle(keys)
        return {key: rjson_value(r, depth + 1) for key in keys[:r.randint(0, 4)]}
    return [rjson_value(r, depth + 1) for _ in range(r.randint(0, 4))]


def rraw_value(r, depth=0):
    """JSON text of a value, with the literal number spellings of RAW_NUMBERS."""
    x = r.random()
    if x < 0.25:
        return r.choice(RAW_NUMBERS)
    if x < 0.35:  # a random spelling of a random number
        return r.choice(["%d.%de%+d" % (r.randint(0, 99), r.randint(0, 999), r.randint(-330, 310)),
                         "%dE%d" % (r.randint(1, 9), r.randint(-25, 25)),
                         "-%d.%0*d" % (r.randint(0, 10**6), r.randint(1, 20), r.randint(0, 10**6)),
                         str(r.randint(-2**63, 2**64 - 1))])
    if x < 0.5 and depth < 2:
        return "[" + ", ".join(rraw_value(r, depth + 1) for _ in range(r.randint(0, 3))) + "]"
    if x < 0.6 and depth < 2:
        keys = r.sample(["q", "b", "a"], r.randint(0, 3))
        if keys and r.random() < 0.3:  # nested duplicate key
            keys.append(keys[0])
        return "{" + ",".join('"%s":%s' % (k, rraw_value(r, depth + 1)) for k in keys) + "}"
    return json.dumps(rjson_value(r, depth + 1), ensure_ascii=r.random() < 0.5)


def rarguments(r):
    """A tool call's `arguments`: usually a JSON string (as OpenAI sends it), sometimes an object,
    sometimes invalid JSON (raw json block)."""
    x = r.random()
    keys = ["location", "unit", "count", "options", "z", "a", "ключ", "q&\"", "flag", "data"]
    r.shuffle(keys)
    chosen = keys[:r.randint(0, 5)]
    if x < 0.12:
        return r.choice(INVALID_ARGS)
    if x < 0.35:
        return {k: rjson_value(r) for k in chosen}
    if x < 0.45 and chosen:  # a duplicated key: first position, last value
        pairs = ['"%s": %s' % (k, rraw_value(r)) for k in chosen]
        pairs.append('"%s": %s' % (chosen[0], rraw_value(r)))
        return "{" + ", ".join(pairs) + "}"
    sep = r.choice([", ", ",", " ,\n "])
    body = sep.join("%s: %s" % (json.dumps(k, ensure_ascii=r.random() < 0.5), rraw_value(r))
                    for k in chosen)
    return r.choice(["", " ", "\n"]) + "{" + body + "}" + r.choice(["", " ", "\n"])


def rtool(r, i):
    props = {}
    for name in r.sample(["zeta", "alpha", "mid", "ünïcode", "城市", "nested"], r.randint(0, 4)):
        if name == "nested":
            props[name] = {"type": "object", "properties": {"y": {"type": "integer"},
                                                            "b": {"type": "array",
                                                                  "items": {"type": "string"}}},
                           "required": ["y"]}
        else:
            props[name] = {"type": r.choice(["string", "number", "boolean"]),
                           "description": rword(r)}
    fn = {"name": "tool_%d%s" % (i, r.choice(["", "_é", "&x", '"q'])),
          "description": rtext(r),
          "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]}}
    if r.random() < 0.2:
        fn["strict"] = True
    return {"type": "function", "function": fn}


def ids_for(r, n):
    ids = ["call_%d_%d" % (r.randint(0, 999), k) for k in range(n)]
    if n >= 2 and r.random() < 0.15:  # duplicate ids: the first call wins
        ids[r.randrange(1, n)] = ids[0]
    return ids


def rassistant(r, thinking_history=True):
    m = {"role": "assistant"}
    x = r.random()
    if thinking_history:
        if x < 0.3:
            m["reasoning_content"] = rtext(r)
        elif x < 0.4:
            m["reasoning"] = rtext(r)
        elif x < 0.5:
            m["reasoning_content"] = r.choice(["", None])
            m["reasoning"] = rtext(r)
        elif x < 0.58:
            m["reasoning_content"] = r.choice(["   ", "\n\t"])
            m["reasoning"] = rtext(r)
        elif x < 0.62:
            m["reasoning_content"] = "  " + rword(r) + " \n"
    if r.random() < 0.15:
        m["name"] = r.choice(["bot", "a&b", 'q"t', "", "&amp;"])
    calls = []
    if r.random() < 0.45:
        n = r.randint(1, 3)
        for k, cid in enumerate(ids_for(r, n)):
            calls.append({"id": cid, "type": "function",
                          "function": {"name": r.choice(["get_weather", "search", "calc&co",
                                                         'say"it', "outil_é"]),
                                       "arguments": rarguments(r)}})
        m["tool_calls"] = calls
        m["content"] = rcontent(r, allow_none=True)
    else:
        m["content"] = rcontent(r)
    return m, calls


def rtool_results(r, calls):
    out = []
    n = len(calls) if calls and r.random() < 0.8 else r.randint(1, 2)
    for k in range(n):
        msg = {"role": "tool", "content": rcontent(r)}
        if calls and k < len(calls):
            msg["tool_call_id"] = calls[k]["id"]
        x = r.random()
        if x < 0.15:
            msg["tool_call_id"] = "call_unmatched_%d" % k
        elif x < 0.25:
            msg.pop("tool_call_id", None)
        if r.random() < 0.2:
            msg["name"] = r.choice(["named_tool", "n&m"])
        elif r.random() < 0.1:
            msg["tool"] = "tool_field"
        elif k >= len(calls):  # past the calls a name is needed (see error_cases)
            msg["name"] = "by_name_%d" % k
        out.append(msg)
    if len(out) >= 2 and r.random() < 0.1:  # a user turn inside the results: two runs
        out.insert(r.randint(1, len(out) - 1), {"role": "user", "content": rtext(r)})
    if r.random() < 0.6:
        r.shuffle(out)  # results out of order
    return out


def generate(seed, count):
    r = random.Random(seed)
    cases = []
    for i in range(count):
        req = {}
        if r.random() < 0.45:
            req["tools"] = [rtool(r, t) for t in range(r.randint(1, 3))]
        elif r.random() < 0.05:
            req["tools"] = r.choice([[], None])
        msgs = []
        if r.random() < 0.4:
            sysmsg = {"role": r.choice(["system", "system", "developer"]), "content": rcontent(r)}
            if r.random() < 0.2:
                sysmsg["name"] = "ops"
            msgs.append(sysmsg)
        for _ in range(r.randint(1, 3)):
            u = {"role": "user", "content": rcontent(r)}
            if r.random() < 0.15:
                u["name"] = r.choice(["alice", "a&b", 'q"t', "", "Zoë"])
            msgs.append(u)
            if r.random() < 0.1:
                msgs.append({"role": "system", "content": rtext(r),
                             "tools": [rtool(r, 9)]})  # lazy tool loading
            if r.random() < 0.7:
                a, calls = rassistant(r)
                msgs.append(a)
                if calls or r.random() < 0.1:
                    msgs.extend(rtool_results(r, calls))
        if msgs[-1]["role"] == "assistant" and r.random() < 0.7:
            msgs.append({"role": "user", "content": rtext(r)})
        req["messages"] = msgs
        # Options: at most one source per option.
        x = r.random()
        if x < 0.1:
            req["enable_thinking"] = False
        elif x < 0.15:
            req["enable_thinking"] = True
        elif x < 0.3:
            req["reasoning_effort"] = r.choice(["none", "low", "high", "max"])
        elif x < 0.45:
            kw = {}
            y = r.random()
            if y < 0.4:
                kw["thinking"] = r.choice([True, False])
            elif y < 0.55:
                kw["enable_thinking"] = r.choice([True, False])
            if r.random() < 0.5:
                kw["thinking_effort"] = r.choice(["low", "high", "max"])
            if r.random() < 0.3:
                kw["add_generation_prompt"] = r.choice([True, False])
            req["chat_template_kwargs"] = kw
        elif x < 0.5:
            req["enable_thinking"] = False
            req["reasoning_effort"] = r.choice(["low", "high", "max"])
        if "chat_template_kwargs" not in req and r.random() < 0.08:
            req["chat_template_kwargs"] = {"add_generation_prompt": False}
        y = r.random()
        if y < 0.12:
            req["tool_choice"] = "required"
        elif y < 0.22:
            req["tool_choice"] = "none"
        elif y < 0.3:
            req["tool_choice"] = "auto"
        elif y < 0.36:
            req["tool_choice"] = {"type": "function", "function": {"name": "tool_0"}}
        z = r.random()
        if z < 0.08:
            req["response_format"] = {"type": "json_object"}
        elif z < 0.12:
            req["response_format"] = "json_object"
        elif z < 0.16:
            req["response_format"] = {"type": "text"}
        elif z < 0.22:
            req["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "answer", "strict": True,
                "schema": {"type": "object", "required": ["z", "a"],
                           "properties": {"z": {"type": "string"}, "a": {"type": "number",
                                                                         "minimum": 0.5},
                                          "ü": {"enum": ["é", "日本"]}}}}}
        elif z < 0.25:
            req["response_format"] = {"type": "json_schema",
                                      "json_schema": {"json_schema": {"type": "array",
                                                                      "items": {"b": 1, "a": 2}}}}
        elif z < 0.28:
            req["response_format"] = {"type": "json_schema"}
        elif z < 0.31:
            req["response_format"] = {"type": "json_schema",
                                      "json_schema": {"type": "object", "title": "bare"}}
        cases.append(("gen_%d" % i, req))
    return cases


def error_cases():
    """Requests the renderer must refuse (§6.2, §6.5.4, chat.h)."""
    u = [{"role": "user", "content": "hi"}]

    def call(args):
        return u + [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]}]

    return [
        ("err_unknown_role", {"messages": [{"role": "robot", "content": "x"}]}),
        ("err_missing_role", {"messages": [{"content": "x"}]}),
        ("err_args_array_string", {"messages": call("[1, 2]")}),
        ("err_args_number_string", {"messages": call("5")}),
        ("err_args_null_string", {"messages": call("null")}),
        ("err_args_string_string", {"messages": call("\"text\"")}),
        ("err_args_array", {"messages": call([1, 2])}),
        ("err_args_number", {"messages": call(7)}),
        ("err_effort_medium", {"messages": u, "reasoning_effort": "medium"}),
        ("err_effort_medium_thinking_off", {"messages": u, "reasoning_effort": "medium",
                                            "enable_thinking": False}),
        ("err_effort_bogus", {"messages": u, "reasoning_effort": "extreme"}),
        ("err_kwargs_effort_medium", {"messages": u,
                                      "chat_template_kwargs": {"thinking_effort": "medium"}}),
        ("err_kwargs_unknown_key", {"messages": u, "chat_template_kwargs": {"foo": 1}}),
        ("err_messages_missing", {"tools": []}),
        ("err_tool_name_unresolvable", {"messages": u + [{"role": "tool", "content": "r"}]}),
        ("err_tool_name_past_calls", {"messages": call("{}") + [
            {"role": "tool", "content": "r1"}, {"role": "tool", "content": "r2"}]}),
        ("err_messages_not_array", {"messages": {"role": "user"}}),
        ("err_image_part", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:x"}}]}]}),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=8)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--errors", action="store_true", help="append the expected-error requests")
    a = ap.parse_args()
    cases = generate(a.seed, a.count) + (error_cases() if a.errors else [])
    print(json.dumps([req for _, req in cases], ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
