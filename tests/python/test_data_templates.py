# SPDX-License-Identifier: Apache-2.0
"""hsflow.data prepare on the chat templates of the families it claims.

Each template (chat_templates.py) is used as a model ships it, without
{% generation %} blocks, and compared token by token with transformers'
apply_chat_template(..., return_assistant_tokens_mask=True) on its twin, the
same template with the blocks around every reply: multi-turn conversations
with system prompts, reasoning given as a field and inline, tool calls and
results, non-ASCII text, truncation. Tokenizers are built offline
(tiny_tokenizer.py)."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from ports import reserve_port

pytest.importorskip("tokenizers", reason="the tokenizers package is not installed "
                    "(scripts/install-deps installs python/requirements-dev.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(scripts/install-deps installs python/requirements-dev.txt)")
pytest.importorskip("xxhash", reason="xxhash is not installed (python/requirements-dev.txt)")

from hsflow.data import read_hst  # noqa: E402
from hsflow.data import chat  # noqa: E402
from hsflow.data.prepare import PrepareOptions, UsageError, prepare  # noqa: E402

from chat_templates import FAMILIES, SPECIALS, strip_generation  # noqa: E402
from tiny_tokenizer import save_tokenizer, train_bpe  # noqa: E402

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def user(c):
    return {"role": "user", "content": c}


def assistant(c, **kw):
    return dict({"role": "assistant", "content": c}, **kw)


CONVERSATIONS = {
    "system_two_turns_non_ascii": [
        {"role": "system", "content": "you are a helpful assistant"},
        user("hello world, naïve café ✓"), assistant("I am fine, 日本語もOK"),
        user("how are you today"), assistant("the weather is nice")],
    "three_turns_reasoning_field": [
        user("hello world"), assistant("I am fine", reasoning_content="they greet me"),
        user("how are you today"), assistant("very well", reasoning_content="be brief\nand kind"),
        user("call the tool"), assistant("done", reasoning_content="the last thought")],
    "three_turns_reasoning_inline": [
        user("hello world"), assistant("<think>\nthey greet me\n</think>\n\nI am fine"),
        user("how are you today"), assistant("<think>\nbe brief\nand kind\n</think>\n\nvery well"),
        user("call the tool"), assistant("<think>the last thought</think>done")],
    "reasoning_under_other_keys": [
        user("hello"), assistant("one", reasoning="first thought"),
        user("again"), assistant("two", thinking="second thought")],
    "tools": [
        {"role": "system", "content": "you may call tools"},
        user("what is the weather in Paris?"),
        assistant("", tool_calls=[{"id": "c1", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]),
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 degrees"},
        assistant("sunny and 21 degrees in Paris"),
        user("and in Zürich?"),
        assistant("", tool_calls=[{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Zürich"}}}]),
        {"role": "tool", "content": "rain"},
        assistant("it rains in Zürich")],
}
TOOLS = {"tools": [WEATHER_TOOL]}


@pytest.fixture(scope="session")
def dirs(tmp_path_factory):
    """{family: (folder with the template as shipped, folder with its twin)}."""
    tok = train_bpe(vocab_size=500, extra_specials=SPECIALS)
    root = tmp_path_factory.mktemp("families")
    return {name: (save_tokenizer(tok, root / name, strip_generation(t)),
                   save_tokenizer(tok, root / (name + "_twin"), t))
            for name, t in FAMILIES.items()}


def load(d):
    return transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)


def twin_expected(twin, template, rec, max_len=0):
    """(ids, mask) from transformers on the twin, or None if the template refuses it."""
    msgs, tools = chat.openai_messages(rec, chat.reasoning_key(template))
    try:
        out = twin.apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=True,
                                       return_assistant_tokens_mask=True)
    except Exception:  # noqa: BLE001 (raise_exception: e.g. Mistral and the tool role)
        return None
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    if max_len:
        ids, mask = ids[:max_len], mask[:max_len]
    return ids, mask


def rows(path):
    offsets, ids, mask = read_hst(path)
    return [(ids[a:b].tolist(), mask[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]


def run(tmp_path, records, tokenizer, out="out.hst", **kw):
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    logs = []
    counts, meta = prepare(str(src), str(tmp_path / out),
                           PrepareOptions(tokenizer=tokenizer, progress=False, **kw),
                           log=logs.append)
    return rows(str(tmp_path / out)), meta, logs


def records():
    out = []
    for name, msgs in CONVERSATIONS.items():
        rec = {"messages": msgs}
        if name == "tools":
            rec.update(TOOLS)
        out.append((name, rec))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("cut", [False, True])
def test_masks_equal_transformers_on_the_generation_block_twin(tmp_path, dirs, family, cut):
    plain, twin_dir = dirs[family]
    twin = load(twin_dir)
    template = FAMILIES[family]
    recs = records()
    max_len = 0
    if cut:  # the median length: the longer half is cut
        lengths = sorted(len(w[0]) for w in (twin_expected(twin, template, r) for _, r in recs)
                         if w is not None)
        max_len = lengths[len(lengths) // 2] - 1
    want = [twin_expected(twin, template, r, max_len) for _, r in recs]
    ok = [(n, r) for (n, r), w in zip(recs, want) if w is not None]
    # ChatML and R1 render no tool calls: the tool-calling turns would be empty replies
    # with loss (the twin marks them so); prepare refuses the record and counts it
    unrendered = [n == "tools" and family in ("chatml", "r1") for n, _ in recs]
    # cut at max_len, a record whose first max_len tokens have no loss is skipped
    trained = [w is not None and any(w[1]) and not u for w, u in zip(want, unrendered)]
    got, meta, logs = run(tmp_path, [r for _, r in ok], plain, max_seq_len=max_len,
                          max_skip="100%")
    assert meta["chat_template"]["mask_method"] == ("prefix" if family == "mistral" else "render")
    assert meta["counts"]["read"] == len(ok), logs
    assert meta["counts"]["written"] == sum(trained), logs
    assert meta["skipped"].get("not_rendered", 0) == sum(unrendered), meta["skipped"]
    if any(unrendered):
        assert any("does not render its tool call 'get_weather'" in line for line in logs), logs
    if max_len:
        assert meta["counts"]["truncated"] >= 1 and meta["tokens"]["lost"] > 0
        assert any("WARNING" in line and f"lost at --max-seq-len {max_len}" in line
                   for line in logs), logs
    ok = [x for x, t in zip(ok, [t for t, w in zip(trained, want) if w is not None]) if t]
    want = [w for w, t in zip(want, trained) if t]
    assert len(got) == len(want)
    for (name, _), (ids, mask), w in zip(ok, got, want):
        tok = load(plain)
        assert ids == w[0], name
        assert mask == w[1], (name, [(tok.decode([t]), m, e) for t, m, e in zip(ids, mask, w[1])])
        assert any(mask)
    # the template as shipped renders the same text as its twin
    t = load(plain)
    for _, r in ok:
        msgs, tools = chat.openai_messages(r, chat.reasoning_key(template))
        assert t.apply_chat_template(msgs, tools=tools, tokenize=False) == \
            twin.apply_chat_template(msgs, tools=tools, tokenize=False)
    # every family but Mistral renders the tool conversation; Mistral refuses the tool role
    assert sum(w is not None for w in [twin_expected(twin, template, r) for _, r in recs]) == \
        len(recs) - (family == "mistral")


def loss_text(tok, ids, mask):
    return tok.decode([t for t, m in zip(ids, mask) if m])


def test_qwen3_reasoning_field_and_inline_give_one_sequence_reasoning_on_the_last_reply(
        tmp_path, dirs):
    plain = dirs["qwen3"][0]
    recs = [{"messages": CONVERSATIONS["three_turns_reasoning_field"]},
            {"messages": CONVERSATIONS["three_turns_reasoning_inline"]}]
    got, meta, _ = run(tmp_path, recs, plain)
    assert meta["chat_template"]["reasoning_key"] == "reasoning_content"
    assert got[0] == got[1]
    tok = load(plain)
    ids, mask = got[0]
    text = tok.decode(ids)
    # history rewritten: earlier reasoning gone, the last kept and trained on
    assert "they greet me" not in text and "be brief" not in text
    assert loss_text(tok, ids, mask).endswith(
        "<think>\nthe last thought\n</think>\n\ndone<|im_end|>")
    assert "I am fine<|im_end|>" in loss_text(tok, ids, mask)


@pytest.mark.parametrize("method", ["render", "prefix"])
def test_mask_end_marks_the_end_marker_and_not_the_newline_unless_turn(tmp_path, dirs, method):
    """--mask-end marker (default): ChatML's <|im_end|> gets loss, the newline
    after it does not, as the generation-block twins mark; --mask-end turn:
    the newline too (one token more per reply)."""
    plain, _ = dirs["chatml"]
    tok = load(plain)
    rec = {"messages": [user("hi"), assistant("hello there"), user("and?"), assistant("bye")]}
    (ids, mask), = run(tmp_path, [rec], plain, mask_method=method)[0]
    (ids2, mask2), = run(tmp_path, [rec], plain, out="turn.hst", mask_method=method,
                         mask_end="turn")[0]
    assert ids == ids2
    nl = tok.convert_tokens_to_ids(tok.tokenize("\n"))
    ends = [i for i, t in enumerate(ids) if t == tok.convert_tokens_to_ids("<|im_end|>")]
    replies = [i for i in ends if mask[i]]
    assert len(replies) == 2 and all(not mask[i + 1] for i in replies if i + 1 < len(ids))
    assert sum(mask2) - sum(mask) == sum(1 for i in replies if i + 1 < len(ids)) == 2, nl
    assert all(mask2[i + 1] for i in replies if i + 1 < len(ids))
    with pytest.raises(Exception, match="--mask-end last: one of marker, turn"):
        run(tmp_path, [rec], plain, out="bad.hst", mask_end="last")


def test_r1_and_chatml_take_reasoning_inline(tmp_path, dirs):
    rec = {"messages": CONVERSATIONS["three_turns_reasoning_field"]}
    for family, kept in (("r1", False), ("chatml", True)):
        got, meta, _ = run(tmp_path, [rec, {"messages": CONVERSATIONS[
            "three_turns_reasoning_inline"]}], dirs[family][0], out=family + ".hst")
        assert meta["chat_template"]["reasoning_key"] is None
        tok = load(dirs[family][0])
        text = loss_text(tok, *got[0])
        assert ("the last thought" in text) == kept, text
        assert "done" in text
        if family == "r1":  # the template strips reasoning from every reply
            assert "the last thought" not in tok.decode(got[0][0])


def test_sharegpt_llama_factory_tools_equal_openai_messages(tmp_path, dirs):
    msgs = CONVERSATIONS["tools"]
    sharegpt = {"system": "you may call tools", "tools": json.dumps([WEATHER_TOOL["function"]]),
                "conversations": [
                    {"from": "human", "value": "what is the weather in Paris?"},
                    {"from": "function_call",
                     "value": json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})},
                    {"from": "observation", "value": "sunny, 21 degrees"},
                    {"from": "gpt", "value": "sunny and 21 degrees in Paris"},
                    {"from": "human", "value": "and in Zürich?"},
                    {"from": "function_call",
                     "value": json.dumps([{"name": "get_weather",
                                           "arguments": {"city": "Zürich"}}])},
                    {"from": "observation", "value": "rain"},
                    {"from": "gpt", "value": "it rains in Zürich"}]}
    for family in ("qwen3", "llama3"):
        a, _, _ = run(tmp_path, [sharegpt], dirs[family][0], out=family + "-s.hst")
        b, _, _ = run(tmp_path, [{"messages": msgs, **TOOLS}], dirs[family][0],
                      out=family + "-m.hst")
        assert a == b
        tok = load(dirs[family][0])
        text = tok.decode(a[0][0])
        assert "get_weather" in text and "Zürich" in text and "rain" in text
        assert '"city": "Paris"' in loss_text(tok, *a[0])  # the call is trained on


def test_a_reply_the_template_does_not_render_is_counted_and_refused(tmp_path, dirs):
    """A template that renders a tool call in place of the reply's content
    drops that content; one that ignores tool calls (ChatML) renders the
    calling turn empty. Either record is skipped as not_rendered, naming the
    message, never trained as an empty or partial turn; the others pass."""
    tpl = tmp_path / "calls_only.jinja"
    tpl.write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m.tool_calls %}<tool>"
        "{{ m.tool_calls[0].function.name }}</tool>{% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% endif %}")
    call = [{"type": "function", "function": {"name": "get_weather", "arguments": {}}}]
    recs = [{"messages": [user("weather?"), assistant("let me look", tool_calls=call)]},
            {"messages": [user("hello"), assistant("world")]},
            {"messages": [user("weather?"), assistant("", tool_calls=call)]}]
    got, meta, logs = run(tmp_path, recs, dirs["chatml"][0], chat_template=str(tpl),
                          max_skip="100%")
    assert meta["skipped"] == {"not_rendered": 1} and meta["counts"]["written"] == 2, logs
    assert any("message 1 (assistant): the chat template does not render its content "
               "('let me look')" in line for line in logs), logs
    got, meta, logs = run(tmp_path, recs[1:], dirs["chatml"][0], out="chatml.hst",
                          max_skip="100%")
    assert meta["skipped"] == {"not_rendered": 1} and meta["counts"]["written"] == 1, logs
    assert any("does not render its tool call 'get_weather'" in line for line in logs), logs


def test_unknown_role_error_lists_every_accepted_role(tmp_path, dirs):
    recs = [{"conversations": [{"from": "alien", "value": "x"}, {"from": "gpt", "value": "y"}]},
            {"messages": [{"role": "alien", "content": "x"}, assistant("y")]},
            {"messages": [user("hello"), assistant("world")]}]
    _, meta, logs = run(tmp_path, recs, dirs["chatml"][0], max_skip="2")
    assert meta["skipped"] == {"unknown_role": 2}
    text = "\n".join(logs)
    for role in list(chat.SHAREGPT_ROLES) + list(chat.MESSAGE_ROLES):
        assert role in text, role
    assert ":1: conversations[0] has role 'alien'; accepted roles: human, user, gpt" in text


def test_template_args_reach_the_template_and_the_sidecar(tmp_path, dirs):
    got, meta, _ = run(tmp_path, [{"messages": CONVERSATIONS["three_turns_reasoning_field"]}],
                       dirs["qwen3"][0], template_args={"enable_thinking": False})
    assert meta["options"]["template_args"] == {"enable_thinking": False}
    assert meta["chat_template"]["args"] == {"enable_thinking": False}
    assert meta["chat_template"]["mask_method"] == "render"
    twin = load(dirs["qwen3"][1])
    msgs, _ = chat.openai_messages({"messages": CONVERSATIONS["three_turns_reasoning_field"]},
                                   "reasoning_content")
    out = twin.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                   return_assistant_tokens_mask=True, enable_thinking=False)
    assert got[0] == (list(out["input_ids"]), list(out["assistant_masks"]))
    # a variable the template prints
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{{ greeting }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                   "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    got, meta, _ = run(tmp_path, [{"messages": [user("hi"), assistant("yo")]}],
                       dirs["chatml"][0], out="g.hst", chat_template=str(tpl),
                       template_args={"greeting": "HELLO"})
    assert load(dirs["chatml"][0]).decode(got[0][0]).startswith("HELLO<|im_start|>user")


def test_a_header_inside_a_message_is_refused_not_guessed(tmp_path, dirs):
    recs = [{"messages": [user("say <|im_start|>assistant\nplease"), assistant("no")]},
            {"messages": [user("hi"), assistant("a <|im_end|>\n in a reply")]},
            {"messages": [user("hello"), assistant("world")]}]
    _, meta, logs = run(tmp_path, recs, dirs["qwen3"][0], max_skip="2")
    assert meta["skipped"] == {"ambiguous_render": 2} and meta["counts"]["written"] == 1


def test_a_template_with_no_exact_method_is_refused_at_start(tmp_path, dirs):
    # no header before the reply and not prefix-stable: nothing exact to do
    tpl = tmp_path / "bad.jinja"
    tpl.write_text("{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
                   "{% else %}{% if loop.last %}A: {% endif %}{{ m['content'] }}\n{% endif %}"
                   "{% endfor %}")
    with pytest.raises(UsageError, match="no exact loss mask for this chat template"):
        run(tmp_path, [{"messages": [user("hi"), assistant("yo")]}], dirs["chatml"][0],
            chat_template=str(tpl))


def cli(*args, env=None):
    e = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "hsflow.data", *args], capture_output=True,
                          text=True, env=e, timeout=300)


def test_inspect_marks_the_loss_tokens_with_brackets_off_a_terminal(tmp_path, dirs):
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"messages": CONVERSATIONS["three_turns_reasoning_field"]}) + "\n"
                   + "{broken\n")
    r = cli("inspect", str(src), "--tokenizer", dirs["qwen3"][0], "-n", "2")
    assert r.returncode == 0, r.stderr
    assert "[[I am fine<|im_end|>]]\n" in r.stdout
    assert "[[<think>\nthe last thought\n</think>\n\ndone<|im_end|>]]\n" in r.stdout
    assert "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n[[" in r.stdout
    assert f"{src}:2: skipped (bad_json)" in r.stdout


def test_tokenizer_as_a_model_id_from_the_local_cache_only(tmp_path, dirs):
    # a Hugging Face cache as the hub client lays it out: refs/main -> snapshots/<commit>
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in os.listdir(dirs["qwen3"][0]):
        (snap / f).write_bytes(open(os.path.join(dirs["qwen3"][0], f), "rb").read())
    src = tmp_path / "c.jsonl"
    src.write_text(json.dumps({"messages": CONVERSATIONS["three_turns_reasoning_field"]}) + "\n")
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    r = cli("prepare", str(src), str(tmp_path / "id.hst"), "--tokenizer", "acme/tiny-chat",
            env=env)
    assert r.returncode == 0, r.stderr
    r2 = cli("prepare", str(src), str(tmp_path / "dir.hst"), "--tokenizer", dirs["qwen3"][0])
    assert r2.returncode == 0, r2.stderr
    assert rows(str(tmp_path / "id.hst")) == rows(str(tmp_path / "dir.hst"))
    meta = json.load(open(tmp_path / "id.hst.meta.json"))
    assert meta["tokenizer"]["given"] == "acme/tiny-chat"
    assert meta["tokenizer"]["path"] == str(snap)
    # an id not in the cache: an error saying what was tried, nothing fetched
    r = cli("prepare", str(src), str(tmp_path / "no.hst"), "--tokenizer", "acme/absent",
            env=dict(env, HF_HUB_OFFLINE="0"))
    assert r.returncode == 2
    assert "--tokenizer acme/absent: not a folder; as a Hugging Face model id: not in the " \
           f"local cache {tmp_path / 'hub'}" in r.stderr, r.stderr


def _bin(name):
    d = os.environ.get("HSFLOW_BIN_DIR") or os.path.join(ROOT, "build", "bin")
    path = os.path.join(d, name)
    if not os.path.exists(path):
        pytest.fail(f"{name} not found in {d}: build the project and set HSFLOW_BIN_DIR")
    return path


def reasoning_dataset(n):
    """n multi-turn reasoning conversations: reasoning as a field and inline,
    tool calls in OpenAI and LLaMA-Factory form, system prompts, non-ASCII."""
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            rec = {"messages": CONVERSATIONS["three_turns_reasoning_field"]}
        elif kind == 1:
            rec = {"messages": CONVERSATIONS["three_turns_reasoning_inline"]}
        elif kind == 2:
            rec = {"messages": CONVERSATIONS["tools"], **TOOLS}
        else:
            rec = {"system": "think step by step", "conversations": [
                {"from": "human", "value": f"question {i}: café ✓"},
                {"from": "gpt", "value": f"<think>\nthinking about {i}\n</think>\n\nanswer {i}"},
                {"from": "human", "value": "and the weather?"},
                {"from": "function_call", "value": json.dumps(
                    {"name": "get_weather", "arguments": {"city": "Paris"}})},
                {"from": "observation", "value": "sunny"},
                {"from": "gpt", "value": "<think>it is sunny</think>sunny"}],
                "tools": json.dumps([WEATHER_TOOL["function"]])}
        out.append(rec)
    return out


def test_a_reasoning_dataset_through_prepare_plan_and_a_producer_run(tmp_path, dirs):
    n = 64
    src = tmp_path / "reasoning.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n"
                           for r in reasoning_dataset(n)))
    r = cli("prepare", str(src), str(tmp_path / "train.hst"), "--tokenizer", dirs["qwen3"][0])
    assert r.returncode == 0, r.stderr
    meta = json.load(open(tmp_path / "train.hst.meta.json"))
    assert meta["counts"]["written"] == n and meta["skipped"] == {}, meta["counts"]
    assert meta["chat_template"]["mask_method"] == "render"
    longest = max(len(ids) for ids, _ in rows(str(tmp_path / "train.hst")))
    hs_data, env = _bin("hs-data"), dict(os.environ, HS_LOG_LEVEL="info")
    # the plan keeps every record; cut below the longest, it warns with the share lost
    p = subprocess.run([hs_data, "plan", str(tmp_path / "train.hst"), "--token-budget", "8192"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    assert re.search(rf"kept\s+{n} sequences", p.stdout) and "WARNING" not in p.stderr
    cut = longest // 2
    p = subprocess.run([hs_data, "plan", str(tmp_path / "train.hst"), "--token-budget", "8192",
                        "--max-seq-len", str(cut)], capture_output=True, text=True, timeout=60,
                       env=env)
    assert p.returncode == 0, p.stderr
    assert re.search(r"tokens \(\d+\.\d\d%\) are lost to max seq len " + str(cut), p.stderr), \
        p.stderr
    # a run: every batch of the plan delivered once, every record in it
    port = reserve_port()
    summary = tmp_path / "run.json"
    cons = subprocess.Popen([_bin("hs-consumer"), "--listen", f"127.0.0.1:{port}",
                             "--cache-gb", "1", "--epochs", "1", "--verify-synthetic",
                             "--summary-json", str(summary)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        prod = subprocess.run([_bin("hs-producer"), "--to", f"127.0.0.1:{port}", "--data",
                               str(tmp_path / "train.hst"), "--token-budget", "4096",
                               "--hidden-size", "64", "--layers", "1,2", "--source",
                               "synthetic", "--gpus", "cpu:1"],
                              capture_output=True, text=True, timeout=120)
        assert prod.returncode == 0, prod.stderr[-3000:]
        assert "lost to max seq len" not in prod.stderr
        cons.wait(timeout=60)
    finally:
        if cons.poll() is None:
            cons.kill()
        cons.communicate()
    assert cons.returncode == 0
    s = json.load(open(summary))
    assert s["complete"] is True and s["batches_delivered"] == s["batches_planned"] > 0, s
    assert s["duplicates"] == 0 and s["checksum_failures"] == 0
    total = sum(len(ids) for ids, _ in rows(str(tmp_path / "train.hst")))
    assert s["tokens"] == total, s  # every token of every record, once


def test_a_producer_that_truncates_warns_at_start_with_the_share_lost(tmp_path, dirs):
    src = tmp_path / "r.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in reasoning_dataset(8)))
    r = cli("prepare", str(src), str(tmp_path / "t.hst"), "--tokenizer", dirs["qwen3"][0])
    assert r.returncode == 0, r.stderr
    # no consumer listening: the plan is made and logged before the first connect fails
    prod = subprocess.run([_bin("hs-producer"), "--to", f"127.0.0.1:{reserve_port()}", "--data",
                           str(tmp_path / "t.hst"), "--token-budget", "100", "--hidden-size",
                           "64", "--layers", "1", "--source", "synthetic", "--gpus", "cpu:1",
                           "--connect-timeout", "1"],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, HS_LOG_LEVEL="warn"))
    assert re.search(r"WARN.*tokens \(\d+\.\d\d%\) are lost to max seq len 100", prod.stderr), \
        prod.stderr[-2000:]
