#!/usr/bin/python3
"""Independent reference of Kimi K3's XTML segment builder (spec §6.1, §6.2, §6.2.1, §6.5).

Written from the spec text only (not from plugins/kimi_k3/chat*.cc), so that the differential
test tools/xtml_ref/diff_test.py can check the C++ renderer against a second implementation:

    from xtml_ref import build_chat_segments, XtmlError
    segs = build_chat_segments({"messages": [{"role": "user", "content": "hi"}]})
    # [("<|open|>", True), ("message", False), (" role", False), ('="', False), ("user", False),
    #  ('"', False), ("<|sep|>", True), ("hi", False), ...]

Each segment is (text, allow_special): allow_special is True exactly for the four structural
tokens. Bad requests raise XtmlError. Standard library only (Debian /usr/bin/python3).

Where the spec leaves room, this follows the choices documented in plugins/kimi_k3/chat.h:
  * role `developer` is rendered as `system` (the vendor drops it); any other unknown role is an
    error;
  * chat_template_kwargs accepts only thinking, enable_thinking, thinking_effort and
    add_generation_prompt (anything else is an error); the caller's add_generation_prompt is
    ANDed with the kwargs one;
  * image / image_url content parts are an error (a text engine has no media blocks).
Choices of this file where neither the spec nor chat.h says more (the generator avoids the
ambiguous corners, see gen_cases.py):
  * each text part of a list content is its own text segment (§6.1: "every other piece is its own
    text segment");
  * reasoning is emitted as sent (not stripped) when it is non-blank after stripping;
  * `tool_choice` / `response_format` messages do not depend on `tools` being present;
  * a tool call with no `arguments` field renders an empty call;
  * a tool message with no tool/name field, not in a fully matched run and past the preceding
    assistant's calls is an error (§6.2 names no fallback; the C++ refuses it as well).
"""

import json

OPEN, CLOSE, SEP, EOM = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"

# §6.2.1 body constants, byte-exact.
TOOLS = ("# Tools\nHere are the available tools, described in JSONSchema.\n\n"
         "```json\n{tools_json}\n```")
DYNAMIC_TOOLS = (
    "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\nHere are the specs for the extended "
    "tools.\n\n```json\n{tools_json}\n```")
EFFORT = (
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the "
    "system is invoked with `thinking_effort={effort}`.")
CHOICE_REQUIRED = ("The system is invoked with `tool_choice=required`.\n"
                   "You MUST call tools in the next message.")
CHOICE_NONE = ("The system is invoked with `tool_choice=none`.\n"
               "You MUST NOT call any tools in the next message.")
RF_OBJECT = ("The system is invoked with `response_format=json_object`.\nYour response must be "
             "raw JSON data without markdown code blocks (```json) or any additional formatting.")
RF_SCHEMA = ("The system is invoked with `response_format=json_schema`.\nYour response must be "
             "raw JSON data without markdown code blocks (```json) or any additional formatting.\n"
             "The JSON data must match the following schema:\n```json\n{schema_json}\n```")

VALID_EFFORTS = ("low", "high", "max")
KWARGS_KEYS = ("thinking", "enable_thinking", "thinking_effort", "add_generation_prompt")


class XtmlError(ValueError):
    """A request the renderer refuses (the C++ side answers INVALID_ARGUMENT)."""


def _deep_sort(value):
    if isinstance(value, dict):
        return {k: _deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_deep_sort(v) for v in value]
    return value


def compact_sorted(value):
    """Tool declarations and response schemas: key-sorted, compact, non-ASCII kept (§6.2)."""
    return json.dumps(_deep_sort(value), ensure_ascii=False, separators=(",", ":"))


def spaced(value):
    """Typed argument values: Python's default json.dumps, order kept, float repr (§6.5.1)."""
    return json.dumps(value, ensure_ascii=False)


def escape_attr(value):
    return value.replace("&", "&amp;").replace('"', "&quot;")


def parse_arguments(text):
    """json.loads as the vendor does: NaN/Infinity accepted; a duplicated key keeps its first
    position and its last value (what a dict built from the pairs in order does)."""
    return json.loads(text, object_pairs_hook=dict)


def argument_type(value):
    if isinstance(value, bool):  # booleans before numbers (§6.2)
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    raise XtmlError("argument of unknown type %r" % type(value))


class _Builder:

    def __init__(self):
        self.segs = []

    def text(self, s):
        if s:  # §6.1: empty strings produce no segment
            self.segs.append((s, False))

    def special(self, s):
        self.segs.append((s, True))

    def open(self, tag, attrs=()):
        self.special(OPEN)
        self.text(tag)
        for key, value in attrs:
            self.text(" " + key)
            self.text('="')
            self.text(escape_attr(value))
            self.text('"')
        self.special(SEP)

    def close(self, tag):
        self.special(CLOSE)
        self.text(tag)
        self.special(SEP)

    def system_message(self, type_, body):
        self.open("message", [("role", "system"), ("type", type_)])
        self.text(body)
        self.close("message")
        self.special(EOM)

    def content(self, content, where):
        if content is None:
            return
        if isinstance(content, str):
            self.text(content)
            return
        if not isinstance(content, list):
            raise XtmlError("%s.content: must be a string or a list of parts" % where)
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise XtmlError("%s.content[%d]: must be an object" % (where, i))
            kind = part.get("type")
            if kind == "text":
                t = part.get("text")
                if not isinstance(t, str):
                    raise XtmlError("%s.content[%d].text: must be a string" % (where, i))
                self.text(t)
            else:
                raise XtmlError("%s.content[%d].type: unsupported part %r" % (where, i, kind))


def _str_field(msg, key):
    v = msg.get(key)
    return v if isinstance(v, str) else ""


def _resolve_options(request, add_generation_prompt):
    thinking = True
    effort = "max"  # §6.5.2: the builder defaults to thinking on with thinking_effort = max
    agp = add_generation_prompt
    if "enable_thinking" in request and request["enable_thinking"] is not None:
        if not isinstance(request["enable_thinking"], bool):
            raise XtmlError("enable_thinking: must be a boolean")
        thinking = request["enable_thinking"]
    re_ = request.get("reasoning_effort")
    if re_ is not None:
        if not isinstance(re_, str):
            raise XtmlError("reasoning_effort: must be a string")
        if re_ == "none":  # §6.5.3
            thinking = False
        elif re_ in VALID_EFFORTS:
            effort = re_
        else:  # §6.5.4: validated even when thinking is off; 'medium' is an error
            raise XtmlError("reasoning_effort: unsupported value %r" % re_)
    kw = request.get("chat_template_kwargs")
    if kw is not None:
        if not isinstance(kw, dict):
            raise XtmlError("chat_template_kwargs: must be an object")
        for key in kw:
            if key not in KWARGS_KEYS:
                raise XtmlError("chat_template_kwargs.%s: unknown key" % key)
        for key in ("thinking", "enable_thinking"):
            if key in kw and kw[key] is not None:
                if not isinstance(kw[key], bool):
                    raise XtmlError("chat_template_kwargs.%s: must be a boolean" % key)
                thinking = kw[key]
        if kw.get("thinking_effort") is not None:
            te = kw["thinking_effort"]
            if te not in VALID_EFFORTS:
                raise XtmlError("chat_template_kwargs.thinking_effort: unsupported %r" % (te,))
            effort = te
        if kw.get("add_generation_prompt") is not None:
            if not isinstance(kw["add_generation_prompt"], bool):
                raise XtmlError("chat_template_kwargs.add_generation_prompt: must be a boolean")
            agp = agp and kw["add_generation_prompt"]
    return thinking, effort, agp


def _resort_tool_runs(messages):
    """§6.2 / §6.5.6: re-sort each run of consecutive tool messages by tool_call_id.

    Returns a list of (message, forced_name or None) in render order."""
    out = []
    last_calls = []  # the preceding assistant's (id, name) list
    i = 0
    while i < len(messages):
        msg = messages[i]
        role = msg.get("role") if isinstance(msg, dict) else None
        if role != "tool":
            if role == "assistant":
                last_calls = []
                for call in msg.get("tool_calls") or []:
                    fn = call.get("function") or {} if isinstance(call, dict) else {}
                    last_calls.append((call.get("id") if isinstance(call, dict) else None,
                                       _str_field(fn, "name") if isinstance(fn, dict) else ""))
            out.append((msg, None))
            i += 1
            continue
        j = i
        while j < len(messages) and isinstance(messages[j], dict) and \
                messages[j].get("role") == "tool":
            j += 1
        run = messages[i:j]
        positions = []
        for m in run:
            tcid = m.get("tool_call_id")
            pos = None
            if tcid is not None:
                for k, (cid, _) in enumerate(last_calls):
                    if cid == tcid:  # duplicate call ids: the first call wins
                        pos = k
                        break
            positions.append(pos)
        if run and all(p is not None for p in positions):
            order = sorted(range(len(run)), key=lambda k: positions[k])  # stable
            for k in order:
                out.append((run[k], last_calls[positions[k]][1]))
        else:
            for m in run:
                out.append((m, None))
        i = j
    return out


def build_chat_segments(request, add_generation_prompt=True):
    """Renders a chat-completions request (a dict) into [(text, allow_special)]."""
    if not isinstance(request, dict):
        raise XtmlError("request: must be an object")
    thinking, effort, agp = _resolve_options(request, add_generation_prompt)
    messages = request.get("messages")
    if not isinstance(messages, list):
        raise XtmlError("messages: must be an array")
    b = _Builder()

    tools = request.get("tools")
    if tools:  # 1. tool declarations
        b.system_message("tool-declare", TOOLS.format(tools_json=compact_sorted(tools)))
    if thinking and effort in VALID_EFFORTS:  # 2. effort
        b.system_message("thinking-effort", EFFORT.format(effort=effort))

    # Validate roles first so the error names the original index.
    for idx, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise XtmlError("messages[%d]: must be an object" % idx)
        role = msg.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise XtmlError("messages[%d].role: unknown role %r" % (idx, role))

    tool_index = 0
    last_call_names = []
    for idx, (msg, forced_name) in enumerate(_resort_tool_runs(messages)):
        where = "messages"
        role = msg["role"]
        if role in ("user", "system", "developer"):
            if role == "system" and msg.get("tools") is not None:  # lazy tool loading
                b.system_message("tool-declare",
                                 DYNAMIC_TOOLS.format(tools_json=compact_sorted(msg["tools"])))
                continue
            r = "user" if role == "user" else "system"
            attrs = [("role", r)]
            name = _str_field(msg, "name")
            if name:
                attrs.append(("name", name))
            b.open("message", attrs)
            b.content(msg.get("content"), where)
            b.close("message")
            b.special(EOM)
        elif role == "assistant":
            tool_index = 0
            attrs = [("role", "assistant")]
            name = _str_field(msg, "name")
            if name:
                attrs.append(("name", name))
            b.open("message", attrs)
            if thinking:
                b.open("think")
                rc = msg.get("reasoning_content")
                if rc is None or rc == "":  # §6.5.5: only empty/null falls back
                    rc = msg.get("reasoning")
                if isinstance(rc, str) and rc.strip():
                    b.text(rc)
                b.close("think")
            b.open("response")
            b.content(msg.get("content"), where)
            b.close("response")
            calls = msg.get("tool_calls") or []
            last_call_names = []
            if calls:
                b.open("tools")
                for n, call in enumerate(calls, 1):
                    fn = call.get("function") or {}
                    fname = _str_field(fn, "name")
                    last_call_names.append(fname)
                    # A call without an `arguments` field has no arguments (chat.h's choice; the
                    # spec does not say). An explicit null is a non-object: an error (§6.2).
                    args = fn.get("arguments", {})
                    b.open("call", [("tool", fname), ("index", str(n))])
                    parsed = None
                    if isinstance(args, str):
                        try:
                            parsed = parse_arguments(args)
                        except ValueError:
                            b.open("json", [("type", "object")])
                            b.text(args)
                            b.close("json")
                            b.close("call")
                            continue
                    else:
                        parsed = args
                    if not isinstance(parsed, dict):
                        raise XtmlError("tool_calls[%d].function.arguments: not an object"
                                        % (n - 1))
                    for key, value in parsed.items():
                        b.open("argument", [("key", key), ("type", argument_type(value))])
                        b.text(value if isinstance(value, str) else spaced(value))
                        b.close("argument")
                    b.close("call")
                b.close("tools")
            b.close("message")
            b.special(EOM)
        elif role == "tool":
            tool_index += 1
            if forced_name is not None:
                name = forced_name
            else:
                name = _str_field(msg, "tool") or _str_field(msg, "name")
                if not name:
                    if tool_index > len(last_call_names):
                        # The spec names no fallback past the calls; the vendor's lookup of
                        # the n-th call fails there, and the C++ refuses too.
                        raise XtmlError("messages: tool message %d has no resolvable tool name"
                                        % tool_index)
                    name = last_call_names[tool_index - 1]
            b.open("message", [("role", "tool"), ("tool", name), ("index", str(tool_index))])
            b.content(msg.get("content"), where)
            b.close("message")
            b.special(EOM)

    tc = request.get("tool_choice")  # 4. (an object naming a function is ignored, §6.5.7)
    if tc == "required":
        b.system_message("tool-choice", CHOICE_REQUIRED)
    elif tc == "none":
        b.system_message("tool-choice", CHOICE_NONE)

    rf = request.get("response_format")  # 5.
    rf_type = rf if isinstance(rf, str) else (rf.get("type") if isinstance(rf, dict) else None)
    if rf_type == "json_object":
        b.system_message("response-format", RF_OBJECT)
    elif rf_type == "json_schema" and isinstance(rf, dict):
        js = rf.get("json_schema")
        if isinstance(js, dict) and js.get("schema") is not None:
            schema = js["schema"]
        elif isinstance(js, dict) and js.get("json_schema") is not None:
            schema = js["json_schema"]
        else:
            schema = js
        b.system_message("response-format", RF_SCHEMA.format(schema_json=compact_sorted(schema)))

    if agp:  # 6. generation prompt
        b.open("message", [("role", "assistant")])
        b.open("think" if thinking else "response")
    return b.segs


def render_text(segs):
    return "".join(t for t, _ in segs)


if __name__ == "__main__":
    import sys
    req = json.load(sys.stdin)
    print(render_text(build_chat_segments(req)))
