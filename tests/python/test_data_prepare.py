# SPDX-License-Identifier: Apache-2.0
"""hsflow.data prepare: conversations, text and token records to .hst / JSONL.

The tokenizers are built here, offline: a small byte-level BPE trained with
the `tokenizers` package, saved as a transformers tokenizer folder, with chat
templates that have {% generation %} blocks and the same templates without
them. Masks are compared token by token with transformers'
apply_chat_template(..., return_assistant_tokens_mask=True)."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers package is not installed "
                                 "(scripts/install-deps installs python/requirements-dev.txt)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed "
                                   "(scripts/install-deps installs python/requirements-dev.txt)")
pytest.importorskip("xxhash", reason="xxhash is not installed (python/requirements-dev.txt)")

from hsflow.data import read_hst  # noqa: E402
from hsflow.data.prepare import PrepareOptions, UsageError, prepare, sidecar_path  # noqa: E402

from tiny_tokenizer import CHATML, save_tokenizer, train_bpe  # noqa: E402

# a BOS, headers with their own separator token, contents trimmed, no newlines
HEADERS = (
    "{{ bos_token }}{% for m in messages %}<|start|>{{ m['role'] }}<|sep|>"
    "{% if m['role'] == 'assistant' %}{%- generation -%}{{ m['content'] | trim }}<|eot|>"
    "{%- endgeneration -%}{% else %}{{ m['content'] | trim }}<|eot|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant<|sep|>{% endif %}")
# renders earlier assistant turns differently from the last one (like
# templates that strip reasoning from history): not prefix-stable; with its
# {% generation %} blocks, for the twin transformers computes
REWRITES = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{% if not loop.last %}(earlier){% endif %}"
    "{{ m['content'] }}<|im_end|>{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def strip_generation(template):
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


@pytest.fixture(scope="session")
def tokenizer_dirs(tmp_path_factory):
    """{name: folder}: the BPE with each template, with and without generation blocks."""
    tok = train_bpe()
    root = tmp_path_factory.mktemp("tokenizers")
    dirs = {}
    for name, template in (("chatml", CHATML), ("chatml_plain", strip_generation(CHATML)),
                           ("headers", HEADERS), ("headers_plain", strip_generation(HEADERS)),
                           ("rewrites", strip_generation(REWRITES)),
                           ("rewrites_twin", REWRITES)):
        dirs[name] = save_tokenizer(tok, root / name, template)
    return dirs


def load(d):
    return transformers.AutoTokenizer.from_pretrained(d, local_files_only=True)


CONVERSATIONS = [
    # system, two turns
    [{"from": "system", "value": "you are a helpful assistant"},
     {"from": "human", "value": "hello world"}, {"from": "gpt", "value": "I am fine"},
     {"from": "human", "value": "how are you today"},
     {"from": "gpt", "value": "the weather is nice"}],
    # a tool turn between two assistant turns
    [{"from": "human", "value": "call the tool get_weather for Paris"},
     {"from": "gpt", "value": "get_weather(Paris)"},
     {"from": "tool", "value": "result: sunny, 21 degrees"},
     {"from": "gpt", "value": "sunny and 21 degrees in Paris"}],
    # leading/trailing whitespace, unicode, an empty reply in the middle
    [{"from": "human", "value": "  héllo ✓\n"}, {"from": "gpt", "value": ""},
     {"from": "human", "value": "naïve café?"}, {"from": "gpt", "value": " multi turn chat works \n"}],
]

ROLE = {"human": "user", "gpt": "assistant", "system": "system", "tool": "tool"}


def as_messages(conv):
    return [{"role": ROLE[t["from"]], "content": t["value"]} for t in conv]


def expected(tok, msgs):
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def rows(path):
    """[(ids, mask)] of an .hst or JSONL output."""
    if str(path).endswith(".jsonl"):
        out = []
        for line in open(path):
            r = json.loads(line)
            out.append((r["input_ids"], r["loss_mask"]))
        return out
    offsets, ids, mask = read_hst(path)
    return [(ids[a:b].tolist(), mask[a:b].tolist()) for a, b in zip(offsets[:-1], offsets[1:])]


def run(tmp_path, records, tokenizer, out="out.hst", **kw):
    src = write_jsonl(tmp_path / "in.jsonl", records)
    dst = str(tmp_path / out)
    counts, meta = prepare(src, dst, PrepareOptions(tokenizer=tokenizer, progress=False, **kw),
                           log=lambda m: None)
    return rows(dst), meta


@pytest.mark.parametrize("name", ["chatml", "headers"])
def test_sharegpt_masks_match_transformers_token_by_token(tmp_path, tokenizer_dirs, name):
    got, meta = run(tmp_path, [{"conversations": c} for c in CONVERSATIONS], tokenizer_dirs[name])
    assert meta["chat_template"]["mask_method"] == "generation"
    tok = load(tokenizer_dirs[name])
    assert len(got) == len(CONVERSATIONS)
    for conv, (ids, mask) in zip(CONVERSATIONS, got):
        want_ids, want_mask = expected(tok, as_messages(conv))
        assert ids == want_ids
        assert mask == want_mask, [(t, tok.decode([t]), m) for t, m in zip(ids, mask)]
        assert any(mask)


@pytest.mark.parametrize("name", ["chatml", "headers"])
def test_render_and_prefix_methods_without_generation_blocks_give_the_same_masks(
        tmp_path, tokenizer_dirs, name):
    records = [{"conversations": c} for c in CONVERSATIONS]
    with_blocks, _ = run(tmp_path, records, tokenizer_dirs[name], out="gen.hst")
    # the same template without the blocks: auto probes it and picks the render method
    plain, meta = run(tmp_path, records, tokenizer_dirs[name + "_plain"], out="plain.hst")
    assert meta["chat_template"]["mask_method"] == "render"
    assert plain == with_blocks
    # and forcing each method on the template that has the blocks
    for method in ("prefix", "render"):
        forced, meta = run(tmp_path, records, tokenizer_dirs[name], out=method + ".hst",
                           mask_method=method)
        assert meta["chat_template"]["mask_method"] == method
        assert forced == with_blocks, method


def test_a_template_that_rewrites_earlier_turns_gets_the_mask_of_its_twin(tmp_path,
                                                                         tokenizer_dirs):
    records = [{"conversations": CONVERSATIONS[0]},  # two assistant turns: rewritten
               {"messages": [{"role": "user", "content": "hello"},
                             {"role": "assistant", "content": "world"}]}]
    got, meta = run(tmp_path, records, tokenizer_dirs["rewrites"])
    assert meta["chat_template"]["mask_method"] == "render"
    assert meta["counts"]["written"] == 2
    twin = load(tokenizer_dirs["rewrites_twin"])
    assert got == [expected(twin, as_messages(CONVERSATIONS[0])),
                   expected(twin, records[1]["messages"])]
    assert "(earlier)I am fine" in twin.decode(got[0][0])
    # the prefix method, forced, refuses what it cannot mark exactly, naming the turn
    with pytest.raises(Exception, match="turn 2 .*not prefix-stable"):
        run(tmp_path, records, tokenizer_dirs["rewrites"], strict=True, out="strict.hst",
            mask_method="prefix")


def test_openai_messages_and_sharegpt_give_the_same_sequences(tmp_path, tokenizer_dirs):
    sharegpt, _ = run(tmp_path, [{"conversations": c} for c in CONVERSATIONS],
                      tokenizer_dirs["chatml"], out="a.hst")
    messages, meta = run(tmp_path, [{"messages": as_messages(c)} for c in CONVERSATIONS],
                         tokenizer_dirs["chatml"], out="b.hst")
    assert messages == sharegpt
    assert meta["by_format"] == {"messages": 3}
    # content given as OpenAI content parts
    parts = [{"messages": [{"role": m["role"], "content": [{"type": "text", "text": m["content"]}]}
                           for m in as_messages(c)]} for c in CONVERSATIONS]
    as_parts, _ = run(tmp_path, parts, tokenizer_dirs["chatml"], out="c.hst")
    assert as_parts == sharegpt


def test_text_and_pretokenised_records(tmp_path, tokenizer_dirs):
    tok = load(tokenizer_dirs["chatml"])
    records = [{"text": "hello world how are you"},
               {"input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]},
               {"input_ids": [9, 10, 11], "labels": [-100, 10, 11]},
               {"input_ids": [12, 13]}]
    got, meta = run(tmp_path, records, tokenizer_dirs["chatml"])
    ids = tok("hello world how are you", add_special_tokens=True)["input_ids"]
    assert got == [(ids, [1] * len(ids)), ([5, 6, 7, 8], [0, 0, 1, 1]), ([9, 10, 11], [0, 1, 1]),
                   ([12, 13], [1, 1])]
    assert meta["by_format"] == {"text": 1, "tokens": 3}
    # pre-tokenised input needs no tokenizer
    got2, _ = run(tmp_path, records[1:], None, out="notok.hst")
    assert got2 == got[1:]


def test_system_prompt_is_added_only_where_there_is_none(tmp_path, tokenizer_dirs):
    tok = load(tokenizer_dirs["chatml"])
    convs = [CONVERSATIONS[0], CONVERSATIONS[1]]  # the first has its own system turn
    got, _ = run(tmp_path, [{"conversations": c} for c in convs], tokenizer_dirs["chatml"],
                 system_prompt="be brief")
    assert got[0] == tuple(expected(tok, as_messages(convs[0])))
    want = expected(tok, [{"role": "system", "content": "be brief"}] + as_messages(convs[1]))
    assert got[1] == tuple(want)


def test_empty_conversation_no_assistant_and_malformed_records_are_counted(tmp_path,
                                                                           tokenizer_dirs):
    records = [{"conversations": []},
               {"conversations": [{"from": "human", "value": "hello"}]},
               {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": ""}]},
               "this line is not json",
               {"conversations": [{"from": "alien", "value": "hello"}]},
               {"something": "else"},
               {"input_ids": [1, -2]},
               {"conversations": CONVERSATIONS[0]}]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    logs = []
    counts, meta = prepare(src, str(tmp_path / "o.hst"),
                           PrepareOptions(tokenizer=tokenizer_dirs["chatml"], progress=False,
                                          max_skip="7"),
                           log=logs.append)
    assert meta["counts"] == {"read": 8, "written": 1, "truncated": 0, "dropped": 0,
                              "empty_assistant": 3, "malformed": 4}
    assert meta["skipped"] == {"empty_assistant": 3, "bad_json": 1, "unknown_role": 1,
                               "no_format": 1, "bad_tokens": 1}
    text = "\n".join(logs)
    for line, what in ((4, "not valid JSON"), (5, "role 'alien'"), (6, "no \"conversations\""),
                       (7, "0..2147483647")):
        assert f"{src}:{line}: " in text and what in text, text


def test_a_record_giving_a_key_twice_is_malformed_naming_the_key(tmp_path, tokenizer_dirs):
    src = tmp_path / "dup.jsonl"
    src.write_text('{"input_ids": [1, 2], "input_ids": [3, 4]}\n'
                   + json.dumps({"conversations": CONVERSATIONS[0]}) + "\n")
    logs = []
    counts, meta = prepare(str(src), str(tmp_path / "o.hst"),
                           PrepareOptions(tokenizer=tokenizer_dirs["chatml"], progress=False,
                                          max_skip="50%"),
                           log=logs.append)
    assert meta["counts"]["malformed"] == 1 and meta["counts"]["written"] == 1
    text = "\n".join(logs)
    assert f"{src}:1: " in text and "key 'input_ids' given twice" in text, text
    arr = tmp_path / "dup.json"
    arr.write_text('[{"text": "a", "text": "b"}]')
    with pytest.raises(UsageError, match="given twice"):
        prepare(str(arr), str(tmp_path / "a.hst"),
                PrepareOptions(tokenizer=tokenizer_dirs["chatml"], progress=False), log=logs.append)


def test_truncate_and_drop_at_max_seq_len(tmp_path, tokenizer_dirs):
    tok = load(tokenizer_dirs["chatml"])
    records = [{"conversations": c} for c in CONVERSATIONS]
    full = [expected(tok, as_messages(c)) for c in CONVERSATIONS]
    limit = sorted(len(i) for i, _ in full)[1]  # the shortest fits, the others do not
    got, meta = run(tmp_path, records, tokenizer_dirs["chatml"], max_seq_len=limit)
    n_long = sum(len(i) > limit for i, _ in full)
    assert meta["counts"]["truncated"] == n_long - sum(
        not any(m[:limit]) for i, m in full if len(i) > limit)
    for (ids, mask), (wi, wm) in zip(got, [f for f in full if any(f[1][:limit])]):
        assert ids == wi[:limit] and mask == wm[:limit]
    got, meta = run(tmp_path, records, tokenizer_dirs["chatml"], max_seq_len=limit,
                    overflow="drop", out="drop.hst")
    assert meta["counts"]["dropped"] == n_long
    assert got == [tuple(f) for f in full if len(f[0]) <= limit]


def test_last_turn_only_keeps_the_loss_of_the_last_reply(tmp_path, tokenizer_dirs):
    got, _ = run(tmp_path, [{"conversations": CONVERSATIONS[0]}], tokenizer_dirs["chatml"],
                 last_turn_only=True)
    tok = load(tokenizer_dirs["chatml"])
    ids, mask = expected(tok, as_messages(CONVERSATIONS[0]))
    last = max(i for i, m in enumerate(mask) if m)
    start = last
    while mask[start - 1]:
        start -= 1
    assert got[0][0] == ids
    assert got[0][1] == [int(start <= i <= last) for i in range(len(ids))]
    assert sum(got[0][1]) < sum(mask)
    assert tok.decode([t for t, m in zip(ids, got[0][1]) if m]).startswith("the weather is nice")


def many_records(n):
    out = []
    for i in range(n):
        c = CONVERSATIONS[i % len(CONVERSATIONS)]
        out.append({"conversations": [dict(t, value=t["value"] + (" x" * (i % 5))) for t in c]})
        if i % 17 == 3:
            out.append("{broken")
    return out


def cli(*args, env_extra=(), **kw):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), **dict(env_extra))
    return subprocess.run([sys.executable, "-m", "hsflow.data", *args], capture_output=True,
                          text=True, env=env, timeout=300, **kw)


def test_workers_1_and_3_write_identical_files(tmp_path, tokenizer_dirs):
    src = write_jsonl(tmp_path / "in.jsonl", many_records(300))
    outs = []
    for w in (1, 3):
        dst = str(tmp_path / f"w{w}.hst")
        prepare(src, dst, PrepareOptions(tokenizer=tokenizer_dirs["chatml"], workers=w,
                                         progress=False, max_skip="10%"), log=lambda m: None)
        outs.append(dst)
    a, b = (open(p, "rb").read() for p in outs)
    assert a == b
    ma, mb = (json.load(open(sidecar_path(p))) for p in outs)
    assert ma["counts"] == mb["counts"] and ma["counts"]["malformed"] == 18


def test_cli_writes_hst_and_sidecar_and_hs_data_reads_it(tmp_path, tokenizer_dirs):
    src = write_jsonl(tmp_path / "chat.jsonl", many_records(40))
    r = cli("prepare", src, str(tmp_path / "train.hst"), "--tokenizer", tokenizer_dirs["chatml"],
            "--max-skip", "3")
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "malformed 3" in r.stdout
    assert f"{src}:5: not valid JSON" in r.stderr
    meta = json.load(open(tmp_path / "train.hst.meta.json"))
    assert meta["tokenizer"]["name"] == "chatml" and len(meta["tokenizer"]["sha256"]) == 64
    assert meta["chat_template"]["sha256"] == __import__("hashlib").sha256(
        CHATML.encode()).hexdigest()
    assert meta["counts"]["read"] == 43 and meta["counts"]["written"] == 40
    # the JSONL form of the same data has the same fingerprint in hs-data
    r = cli("prepare", src, str(tmp_path / "train.jsonl"), "--tokenizer",
            tokenizer_dirs["chatml"], "--max-skip", "10%")
    assert r.returncode == 0, r.stderr
    assert rows(tmp_path / "train.jsonl") == rows(tmp_path / "train.hst")
    hs_data = shutil.which("hs-data", path=os.environ.get("HSFLOW_BIN_DIR", ""))
    if hs_data:
        fps = set()
        for f in ("train.hst", "train.jsonl"):
            info = subprocess.run([hs_data, "info", str(tmp_path / f)], capture_output=True,
                                  text=True, timeout=60)
            assert info.returncode == 0, info.stderr
            fps.add(re.search(r"fingerprint\s+([0-9a-f]{16})", info.stdout).group(1))
        assert fps == {meta["fingerprint"]}


def test_cli_strict_stops_at_the_first_malformed_record(tmp_path, tokenizer_dirs):
    src = write_jsonl(tmp_path / "chat.jsonl", many_records(10))
    r = cli("prepare", src, str(tmp_path / "o.hst"), "--tokenizer", tokenizer_dirs["chatml"],
            "--strict")
    assert r.returncode == 1
    assert f"{src}:5: not valid JSON" in r.stderr and "--strict" in r.stderr
    assert not os.path.exists(tmp_path / "o.hst")
    assert [p for p in os.listdir(tmp_path) if p != "chat.jsonl"] == []  # no temporary left


def test_cli_refuses_to_write_onto_its_input(tmp_path, tokenizer_dirs):
    src = write_jsonl(tmp_path / "data.jsonl", [{"input_ids": [1, 2]}])
    before = open(src).read()
    os.link(src, tmp_path / "alias.jsonl")
    for out in (src, str(tmp_path / "alias.jsonl")):
        r = cli("prepare", src, out)
        assert r.returncode == 2 and "the output is the input" in r.stderr
    assert open(src).read() == before


def test_cli_refuses_outputs_onto_the_tokenizer_or_the_chat_template(tmp_path, tokenizer_dirs):
    src = write_jsonl(tmp_path / "c.jsonl", [{"conversations": CONVERSATIONS[0]}])
    tok = tmp_path / "tok"
    shutil.copytree(tokenizer_dirs["chatml"], tok)
    template = tmp_path / "t.hst.meta.json"  # also the sidecar of an output named t.hst
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    os.symlink(template.name, tmp_path / "t-link.jinja")
    watched = sorted(tok.iterdir()) + [template]
    before = {p: p.read_bytes() for p in watched}
    cases = [(tok / "tokenizer.json", "inside the input folder"),
             (tok / "train.hst", "inside the input folder"),
             (template, "the output is the input"),
             (tmp_path / "t-link.jinja", "by another name or link"),
             (tmp_path / "t.hst", "the output is the input")]  # its sidecar is the template
    for out, why in cases:
        r = cli("prepare", src, str(out), "--tokenizer", str(tok), "--chat-template",
                str(template))
        assert r.returncode == 2 and why in r.stderr, (out, r.stderr)
    assert {p: p.read_bytes() for p in watched} == before
    assert sorted(tok.iterdir()) + [template] == watched


def test_cli_help_and_usage_errors(tmp_path, tokenizer_dirs):
    r = cli("prepare", "--help")
    assert r.returncode == 0 and "--last-turn-only" in r.stdout and "examples:" in r.stdout
    src = write_jsonl(tmp_path / "c.jsonl", [{"conversations": CONVERSATIONS[0]}])
    r = cli("prepare", src, str(tmp_path / "o.hst"))
    assert r.returncode == 2 and "give --tokenizer DIR" in r.stderr
    r = cli("prepare", src, str(tmp_path / "o.hst"), "--tokenizer", str(tmp_path / "nope"))
    assert r.returncode == 2 and "not a folder" in r.stderr
    r = cli("prepare", src, str(tmp_path / "o.hst"), "--tokenizer",
            tokenizer_dirs["chatml_plain"], "--mask-method", "generation")
    assert r.returncode == 2 and "no {% generation %} blocks" in r.stderr


def test_json_array_parquet_and_datasets_folder_inputs(tmp_path, tokenizer_dirs):
    records = [{"conversations": c} for c in CONVERSATIONS] + [{"text": "hello world"}]
    base, _ = run(tmp_path, records, tokenizer_dirs["chatml"], out="base.hst")
    opts = PrepareOptions(tokenizer=tokenizer_dirs["chatml"], progress=False)
    arr = tmp_path / "in.json"
    arr.write_text(json.dumps(records))
    prepare(str(arr), str(tmp_path / "arr.hst"), opts, log=lambda m: None)
    assert rows(tmp_path / "arr.hst") == base
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    table = pa.Table.from_pylist([{"messages": as_messages(c)} for c in CONVERSATIONS])
    pq.write_table(table, tmp_path / "in.parquet")
    prepare(str(tmp_path / "in.parquet"), str(tmp_path / "pq.hst"), opts, log=lambda m: None)
    assert rows(tmp_path / "pq.hst") == base[:3]
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list([{"messages": as_messages(c)} for c in CONVERSATIONS])
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dsdir"))
    prepare(str(tmp_path / "dsdir"), str(tmp_path / "ds.hst"), opts, log=lambda m: None)
    assert rows(tmp_path / "ds.hst") == base[:3]


def test_nothing_usable_is_an_error_and_writes_nothing(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ["nope", {"input_ids": []}])
    with pytest.raises(UsageError, match="no usable records"):
        prepare(src, str(tmp_path / "o.hst"), PrepareOptions(progress=False), log=lambda m: None)
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_cli_more_skipped_than_max_skip_fails_writing_nothing_and_names_the_reasons(
        tmp_path, tokenizer_dirs):
    # 40 conversations and 3 broken lines: 7% skipped
    src = write_jsonl(tmp_path / "chat.jsonl", many_records(40))
    r = cli("prepare", src, str(tmp_path / "o.hst"), "--tokenizer", tokenizer_dirs["chatml"])
    assert r.returncode == 1
    assert "3 of 43 records skipped (6.98%), more than --max-skip 1% allows (0): bad_json 3" \
        in r.stderr
    assert f"{src}:5: not valid JSON" in r.stderr and "record skipped (bad_json)" in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["chat.jsonl"]
    # 7% is within --max-skip 10%, and within a count of 3
    for limit in ("10%", "3"):
        r = cli("prepare", src, str(tmp_path / "o.hst"), "--tokenizer",
                tokenizer_dirs["chatml"], "--max-skip", limit)
        assert r.returncode == 0, r.stderr
        assert "skipped 3 of 43 records (6.98%): bad_json 3" in r.stderr
    r = cli("prepare", src, str(tmp_path / "o.hst"), "--tokenizer", tokenizer_dirs["chatml"],
            "--max-skip", "lots")
    assert r.returncode == 2 and "--max-skip 'lots'" in r.stderr


def test_truncation_is_a_warning_with_the_share_of_tokens_lost(tmp_path, tokenizer_dirs):
    tok = load(tokenizer_dirs["chatml"])
    full = [expected(tok, as_messages(c)) for c in CONVERSATIONS]
    limit = min(len(i) for i, _ in full) - 1  # every sequence is cut
    src = write_jsonl(tmp_path / "in.jsonl", [{"conversations": c} for c in CONVERSATIONS])
    logs = []
    _, meta = prepare(src, str(tmp_path / "o.hst"),
                      PrepareOptions(tokenizer=tokenizer_dirs["chatml"], progress=False,
                                     max_seq_len=limit, max_skip="100%"), log=logs.append)
    total = sum(len(i) for i, _ in full)
    lost = total - limit * len(full)
    lost_loss = sum(sum(m[limit:]) for _, m in full)
    assert meta["tokens"]["lost"] == lost and meta["tokens"]["loss_lost"] == lost_loss
    want = (f"WARNING: {lost} of {total} tokens ({100.0 * lost / total:.2f}%) lost at "
            f"--max-seq-len {limit}")
    assert any(want in line for line in logs), logs


def test_cli_hostile_records_are_skipped_by_their_bound_and_counted_against_max_skip(
        tmp_path, tokenizer_dirs):
    """A line nested 200,000 deep (once an uncaught RecursionError), a line
    larger than the default --max-record-bytes (never read whole), and a
    20,000-turn conversation under --mask-method prefix (once minutes of
    rendering): each is skipped before it is parsed or rendered, counted
    with its reason, and --max-skip decides."""
    import time
    deep = '{"text": ' + "[" * 200000 + "]" * 200000 + "}"
    big = '{"input_ids": [' + ",".join(["7"] * (9 << 20)) + '], "loss_mask": []}'
    assert len(big) > 16 << 20
    turns = [{"from": "human" if i % 2 == 0 else "gpt", "value": "turn %d" % i}
             for i in range(20000)]
    good = [{"conversations": CONVERSATIONS[i % len(CONVERSATIONS)]} for i in range(40)]
    src = write_jsonl(tmp_path / "in.jsonl",
                      good[:10] + [deep] + good[10:20] + [big] + good[20:30]
                      + [{"conversations": turns}] + good[30:])
    out = str(tmp_path / "o.hst")
    flags = ("--tokenizer", tokenizer_dirs["chatml_plain"], "--mask-method", "prefix")
    t0 = time.monotonic()
    r = cli("prepare", src, out, *flags)
    assert time.monotonic() - t0 < 120
    assert r.returncode == 1, r.stderr
    assert "3 of 43 records skipped" in r.stderr and "more than --max-skip 1%" in r.stderr
    for line, reason, says in (
            (11, "too_deep", "nested 200001 deep, more than --max-depth 64"),
            (22, "too_large", "a record of more than --max-record-bytes 16777216 bytes"),
            (33, "too_many_turns", "20000 turns, more than --max-turns 1024")):
        assert f"{src}:{line}: {says}" in r.stderr, (says, r.stderr)
        assert f"record skipped ({reason})" in r.stderr
    assert not os.path.exists(out)

    t0 = time.monotonic()
    r = cli("prepare", src, out, *flags, "--max-skip", "3")
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 120
    meta = json.load(open(sidecar_path(out)))
    assert meta["counts"]["written"] == 40 and meta["counts"]["malformed"] == 3
    assert meta["skipped"] == {"too_deep": 1, "too_large": 1, "too_many_turns": 1}
    assert meta["options"]["max_record_bytes"] == 16 << 20
    assert meta["options"]["max_depth"] == 64 and meta["options"]["max_turns"] == 1024
    assert len(rows(out)) == 40


def test_record_bounds_are_flags_with_their_defaults_in_help(tmp_path, tokenizer_dirs):
    r = cli("prepare", "--help")
    assert r.returncode == 0
    for flag in ("--max-record-bytes", "--max-depth", "--max-turns"):
        assert flag in r.stdout, flag
    records = [{"conversations": CONVERSATIONS[0]},
               {"text": "x" * 3000},
               {"text": [[[[["five deep"]]]]]},
               {"conversations": CONVERSATIONS[0] * 3}]
    src = write_jsonl(tmp_path / "in.jsonl", records)
    out = str(tmp_path / "o.hst")
    r = cli("prepare", src, out, "--tokenizer", tokenizer_dirs["chatml"], "--max-skip", "3",
            "--max-record-bytes", "2K", "--max-depth", "4", "--max-turns", "10")
    assert r.returncode == 0, r.stderr
    assert f"{src}:2: a record of more than --max-record-bytes 2048 bytes" in r.stderr
    assert f"{src}:3: nested 6 deep, more than --max-depth 4" in r.stderr
    assert f"{src}:4: 15 turns, more than --max-turns 10" in r.stderr
    meta = json.load(open(sidecar_path(out)))
    assert meta["skipped"] == {"too_large": 1, "too_deep": 1, "too_many_turns": 1}
    r = cli("prepare", src, out, "--tokenizer", tokenizer_dirs["chatml"], "--max-record-bytes",
            "lots")
    assert r.returncode == 2 and "--max-record-bytes" in r.stderr
    # the same bounds in the environment
    r = cli("prepare", src, out, "--tokenizer", tokenizer_dirs["chatml"], "--max-skip", "3",
            env_extra={"HS_MAX_TURNS": "10"})
    assert r.returncode == 0 and f"{src}:4: 15 turns, more than --max-turns 10" in r.stderr
    # a JSON array is read whole: a record nested too deep there refuses the input, saying so
    arr = tmp_path / "in.json"
    arr.write_text('[{"text": "fine"}, {"text": ' + "[" * 100000 + "]" * 100000 + "}]")
    r = cli("prepare", str(arr), out, "--tokenizer", tokenizer_dirs["chatml"])
    assert r.returncode == 2 and "a record nested 100001 deep, more than --max-depth 64" in r.stderr
    assert "give the records as JSONL" in r.stderr
