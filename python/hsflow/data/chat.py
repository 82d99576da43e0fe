# SPDX-License-Identifier: Apache-2.0
"""Conversations as chat templates take them, and where a template puts each reply.

Records (ShareGPT as LLaMA-Factory writes it, OpenAI messages) become the
messages a Hugging Face chat template expects: reasoning under the key the
template reads (or inline <think>...</think> when it reads none), tool calls
with their arguments as objects, tool definitions in the {"type": "function",
"function": {...}} form.

A template without {% generation %} blocks is probed once (probe_template)
for the text that opens an assistant reply (the header) and the text that
closes it (the end-of-turn marker), by rendering conversations whose
contents are known words. The "render" mask method then renders each
conversation once and gives loss to every reply as that render shows it,
from the end of each header through the end marker that follows (without
the white space after it, by default: MASK_ENDS): the mask of the same
template with {% generation %} put after the header and {% endgeneration %}
after the end marker, whether or not the template rewrites earlier turns
(reasoning stripped from history).
"""
import json
import re

# accepted roles and what they become; the error for an unknown role lists them all
SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant",
    "function_call": "assistant",  # a tool call (LLaMA-Factory); the value is its JSON
    "system": "system",
    "tool": "tool", "function": "tool", "observation": "tool",
}
MESSAGE_ROLES = ("system", "developer", "user", "assistant", "tool", "ipython")
REASONING_KEYS = ("reasoning_content", "reasoning", "thinking")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


class Malformed(Exception):
    """One record cannot be used; the message says why, `reason` names the kind."""

    def __init__(self, msg, reason="malformed"):
        super().__init__(msg)
        self.reason = reason


def reasoning_key(template):
    """The message key the template reads reasoning from, or None (it takes
    reasoning inline in the content, or not at all)."""
    for key in REASONING_KEYS:
        if re.search(r"(\.|\[\s*['\"])%s\b" % key, template):
            return key
    return None


def _text_of(content, where):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, dict) and p.get("type", "text") == "text" and \
                    isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise Malformed(f"{where}: content part {p!r:.60} is not text", "bad_field")
        return "".join(parts)
    raise Malformed(f"{where}: content is {type(content).__name__}, not a string", "bad_field")


def _json_value(v, where):
    if not isinstance(v, str):
        return v
    try:
        return json.loads(v)
    except json.JSONDecodeError as e:
        raise Malformed(f"{where} is not valid JSON ({e.msg} at column {e.colno})",
                        "bad_field") from e


def normalize_tools(tools):
    """A record's tool definitions (a list, or its JSON as LLaMA-Factory writes
    it) -> [{"type": "function", "function": {...}}] or None when there are none."""
    if tools is None:
        return None
    if isinstance(tools, str):
        if not tools.strip():
            return None
        tools = _json_value(tools, "\"tools\"")
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list):
        raise Malformed("\"tools\" is not a list of tool definitions", "bad_field")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise Malformed(f"tools[{i}] is not an object", "bad_field")
        if "function" in t and isinstance(t["function"], dict):
            out.append(t)
        elif isinstance(t.get("name"), str):
            out.append({"type": "function", "function": t})
        else:
            raise Malformed(f"tools[{i}] has neither \"function\" nor \"name\"", "bad_field")
    return out or None


def _tool_calls(calls, where):
    """Tool calls in any of the usual forms -> [{"type": "function", "function":
    {"name", "arguments": object}}, ...], ids kept."""
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not calls:
        raise Malformed(f"{where}: tool calls are not a list of calls", "bad_field")
    out = []
    for i, c in enumerate(calls):
        if not isinstance(c, dict):
            raise Malformed(f"{where}: tool call {i} is not an object", "bad_field")
        fn = c.get("function", c)
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise Malformed(f"{where}: tool call {i} has no function name", "bad_field")
        fn = dict(fn)
        args = fn.get("arguments", fn.pop("parameters", {}))
        fn["arguments"] = _json_value(args, f"{where}: the arguments of tool call {i}")
        call = {k: v for k, v in c.items() if k != "function" and k not in fn}
        call["type"] = "function"
        call["function"] = fn
        out.append(call)
    return out


def _split_inline(content):
    """'<think>R</think>A' -> (R, A) as reasoning templates split it, or (None, content)."""
    if _THINK_CLOSE not in content:
        return None, content
    reasoning = content.split(_THINK_CLOSE)[0].rstrip("\n").split(_THINK_OPEN)[-1].lstrip("\n")
    return reasoning, content.split(_THINK_CLOSE)[-1].lstrip("\n")


def _place_reasoning(m, where, key):
    """Moves the reasoning of assistant message `m` where the template reads it:
    under `key`, or inline in the content when `key` is None."""
    given = [(k, m.pop(k)) for k in REASONING_KEYS if m.get(k) is not None]
    for k, v in given:
        if not isinstance(v, str):
            raise Malformed(f"{where}: \"{k}\" is {type(v).__name__}, not a string", "bad_field")
    if len({v for _, v in given}) > 1:
        raise Malformed(f"{where}: different reasoning under {' and '.join(k for k, _ in given)}; "
                        "give one", "bad_field")
    reasoning = given[0][1] if given else None
    if key is None:
        if reasoning and _THINK_CLOSE not in m["content"]:
            m["content"] = (f"{_THINK_OPEN}\n{reasoning.strip(chr(10))}\n{_THINK_CLOSE}\n\n"
                            + m["content"].lstrip("\n"))
        return
    if reasoning is None:
        reasoning, content = _split_inline(m["content"])
        if reasoning is None:
            return
        m["content"] = content
    m[key] = reasoning


def _has_reply(m):
    return bool(m["content"] or m.get("tool_calls") or any(m.get(k) for k in REASONING_KEYS))


def _unknown_role(where, who, accepted):
    return Malformed(f"{where} has role {who!r}; accepted roles: {', '.join(accepted)}",
                     "unknown_role")


def sharegpt_messages(rec, reasoning_at):
    """A ShareGPT record -> (messages, tools)."""
    turns = rec.get("conversations")
    if not isinstance(turns, list):
        raise Malformed("\"conversations\" is not a list", "bad_field")
    msgs = []
    system = rec.get("system")
    if system is not None:
        if not isinstance(system, str):
            raise Malformed("\"system\" is not a string", "bad_field")
        if system:
            msgs.append({"role": "system", "content": system})
    for i, t in enumerate(turns):
        where = f"conversations[{i}]"
        if not isinstance(t, dict):
            raise Malformed(f"{where} is not an object", "bad_field")
        who = t.get("from", t.get("role"))
        role = SHAREGPT_ROLES.get(str(who).lower()) if who is not None else None
        if role is None:
            raise _unknown_role(where, who, list(SHAREGPT_ROLES))
        text = t.get("value", t.get("content"))
        if not isinstance(text, str):
            raise Malformed(f"{where} has no string \"value\"", "bad_field")
        if str(who).lower() == "function_call":
            m = {"role": "assistant", "content": "",
                 "tool_calls": _tool_calls(_json_value(text, f"{where} (function_call)"), where)}
        else:
            m = {"role": role, "content": text}
            for k in REASONING_KEYS:
                if t.get(k) is not None:
                    m[k] = t[k]
        if role == "assistant":
            _place_reasoning(m, where, reasoning_at)
        msgs.append(m)
    return msgs, normalize_tools(rec.get("tools"))


def openai_messages(rec, reasoning_at):
    """An OpenAI messages record -> (messages, tools)."""
    turns = rec.get("messages")
    if not isinstance(turns, list):
        raise Malformed("\"messages\" is not a list", "bad_field")
    msgs = []
    for i, t in enumerate(turns):
        where = f"messages[{i}]"
        if not isinstance(t, dict):
            raise Malformed(f"{where} is not an object", "bad_field")
        role = t.get("role")
        if role not in MESSAGE_ROLES:
            raise _unknown_role(where, role, MESSAGE_ROLES)
        m = {k: v for k, v in t.items() if v is not None}
        m["content"] = _text_of(t.get("content"), where)
        if m.get("tool_calls") is not None:
            m["tool_calls"] = _tool_calls(m["tool_calls"], where)
        elif "tool_calls" in t:
            m.pop("tool_calls", None)
        if role == "assistant":
            _place_reasoning(m, where, reasoning_at)
        msgs.append(m)
    return msgs, normalize_tools(rec.get("tools"))


def has_reply(msgs):
    return any(m["role"] == "assistant" and _has_reply(m) for m in msgs)


# ---- where a template puts each reply ---------------------------------------------------------

_PROBE_USER = ("hsprobe alpha question", "hsprobe gamma question")
_PROBE_REPLY = ("hsprobe beta answer", "hsprobe delta answer")
_PROBE_SYSTEM = "hsprobe system words"


class TemplateShape:
    """What probing a template found: `header` (text that opens each assistant
    reply; the reply starts after it) and `end` (the end-of-turn marker; the
    reply ends after it), or `why` the render method is not exact for it, and
    whether it is prefix-stable (each shorter conversation renders as a
    prefix of the longer one)."""

    def __init__(self, header=None, end=None, why=None, prefix_stable=False, prefix_why=None):
        self.header, self.end, self.why = header, end, why
        self.prefix_stable, self.prefix_why = prefix_stable, prefix_why


# where a reply's loss ends in a template without {% generation %} blocks (--mask-end):
#   marker  through the end-of-turn marker, not the white space the template puts after it
#           (ChatML's <|im_end|> included, its newline not), as the common twins mark
#   turn    through everything up to the next turn (the marker and that white space)
MASK_ENDS = ("marker", "turn")


def end_keep(end, mask_end):
    """How many characters of the end-of-turn text `end` get loss."""
    if mask_end not in MASK_ENDS:
        raise ValueError(f"mask end {mask_end!r}: one of {', '.join(MASK_ENDS)}")
    return len(end.rstrip()) if mask_end == "marker" else len(end)


def reply_spans(text, header, end, keep=None):
    """[(start, stop)] character spans of the replies in a rendered conversation:
    each from the end of a header through the first `keep` characters (default
    all) of the end marker that follows it."""
    spans = []
    pos = 0
    hl, el = len(header), len(end)
    kl = el if keep is None else keep
    while True:
        i = text.find(header, pos)
        if i < 0:
            return spans
        s = i + hl
        j = text.find(end, s)
        if j < 0:
            raise Malformed(f"a reply opened by {header!r} has no end marker {end!r} after it",
                            "ambiguous_render")
        spans.append((s, j + kl))
        pos = j + el


def check_spans(text, spans, msgs):
    """Refuses a render whose spans cannot be told apart from its contents: a
    header inside a message, an end marker inside a reply."""
    replies = [m for m in msgs if m["role"] == "assistant"]
    if len(spans) != len(replies):
        raise Malformed(f"the render holds {len(spans)} assistant headers for {len(replies)} "
                        "assistant messages (a message contains the template's header text, or "
                        "the template leaves a reply out); the mask would be a guess",
                        "ambiguous_render")
    for k, (m, (a, b)) in enumerate(zip(replies, spans)):
        c = m["content"].strip()
        if c and c in text and text.find(c, a) not in range(a, b - len(c) + 1):
            raise Malformed(f"assistant reply {k} is not inside the span its header opens (it "
                            "contains the template's end-of-turn marker?); the mask would be a "
                            "guess", "ambiguous_render")


def check_rendered(text, msgs):
    """Refuses a render that leaves out what an assistant message holds: its
    answer (the content after any reasoning, which templates may drop from
    history) or the name of one of its tool calls. Such a turn would be
    trained as an empty or partial reply; the record is skipped as
    `not_rendered` instead, naming the message."""
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        answer = _split_inline(m["content"])[1].strip()
        if answer and answer not in text:
            raise Malformed(f"message {i} (assistant): the chat template does not render its "
                            f"content ({answer!r:.60}); it would be trained as an empty turn",
                            "not_rendered")
        for c in m.get("tool_calls") or ():
            name = c["function"]["name"]
            if name not in text:
                raise Malformed(f"message {i} (assistant): the chat template does not render its "
                                f"tool call {name!r} (a template that ignores tool_calls?); it "
                                "would be trained as an empty turn", "not_rendered")


def _find_all(text, words):
    pos, out = 0, []
    for w in words:
        i = text.find(w, pos)
        if i < 0 or text.find(w, i + 1) >= 0:
            return None
        out.append((i, i + len(w)))
        pos = i + len(w)
    return out


def probe_template(render):
    """Probes a chat template through `render(messages, add_generation_prompt)`;
    returns a TemplateShape."""
    u, a = _PROBE_USER, _PROBE_REPLY
    convo = [{"role": "user", "content": u[0]}, {"role": "assistant", "content": a[0]},
             {"role": "user", "content": u[1]}, {"role": "assistant", "content": a[1]}]
    try:
        short = render(convo[:1], False)
        prompt = render(convo[:1], True)
        full = render(convo, False)
    except Exception as e:  # noqa: BLE001 (the template's own errors)
        return TemplateShape(why=f"the template failed on a probe conversation ({e})",
                             prefix_why="the template failed on a probe conversation")
    # prefix stability: every shorter render (with the prompt before each reply) a prefix
    stable, prefix_why = True, None
    try:
        for i in range(len(convo)):
            head = render(convo[:i], True) if convo[i]["role"] == "assistant" else None
            body = render(convo[:i + 1], False)
            if not full.startswith(body) or (head is not None and not full.startswith(head)):
                stable, prefix_why = False, (f"the template renders message {i} differently once "
                                             "more follow (not prefix-stable)")
                break
    except Exception as e:  # noqa: BLE001
        stable, prefix_why = False, f"the template failed on a shorter probe ({e})"
    shape = TemplateShape(prefix_stable=stable, prefix_why=prefix_why)
    if not prompt.startswith(short) or len(prompt) == len(short):
        shape.why = "the generation prompt adds no assistant header to find"
        return shape
    gen = prompt[len(short):]
    where = _find_all(full, [u[0], a[0], u[1], a[1]])
    if where is None:
        shape.why = "the probe contents do not appear once each in the render"
        return shape
    # the header: the longest start of the generation prompt found before every reply
    header = None
    for k in (1, 3):
        pre = full[where[k - 1][1]:where[k][0]]
        n = len(gen)
        while n and gen[:n] not in pre:
            n -= 1
        header = gen[:n] if header is None or n < len(header) else header
    end = full[where[3][1]:]
    if not header:
        shape.why = "no part of the generation prompt comes before each reply"
        return shape
    if not end or not full[where[1][1]:where[2][0]].startswith(end):
        shape.why = "no end-of-turn marker follows each reply the same way"
        return shape
    # the method on the probes themselves: each reply inside its span, no other content
    probes = [(convo, full)]
    try:
        withsys = [{"role": "system", "content": _PROBE_SYSTEM}] + convo
        probes.append((withsys, render(withsys, False)))
    except Exception:  # noqa: BLE001 (a template without system messages)
        pass
    for msgs, text in probes:
        try:
            spans = reply_spans(text, header, end)
            check_spans(text, spans, msgs)
        except Malformed as e:
            shape.why = f"on a probe conversation: {e}"
            return shape
        for m in msgs:
            i = text.find(m["content"])
            inside = any(s <= i < e for s, e in spans)
            if inside != (m["role"] == "assistant"):
                where = "inside" if inside else "outside"
                shape.why = f"the {m['role']} probe content falls {where} the reply spans"
                return shape
    shape.header, shape.end = header, end
    return shape
