# SPDX-License-Identifier: Apache-2.0
"""hsflow.data prepare: conversations, text or token records -> .hst (or JSONL).

Inputs: JSONL, a JSON array, Parquet, or a Hugging Face `datasets` folder
written by save_to_disk. Each record is one of (detected by its keys, or
forced with --format):

    sharegpt  {"conversations": [{"from": "human"|"gpt"|"system"|"tool", "value": "..."}]}
    messages  {"messages": [{"role": "user"|"assistant"|"system"|"tool", "content": "..."}]}
    text      {"text": "..."}
    tokens    {"input_ids": [...], "loss_mask": [0|1, ...]} or "labels" (-100 = no loss)

Conversations are rendered with the target tokenizer's chat template and
tokenised as transformers does it (the rendered text, no extra special
tokens). The loss mask covers the assistant tokens:

  - "generation": a template with {% generation %} blocks; the mask is
    exactly transformers' apply_chat_template(..., return_assistant_tokens_mask=True).
  - "render", for templates without those blocks: the conversation is
    rendered once and each reply gets loss as that render shows it, from the
    end of its assistant header through its end-of-turn marker, both found
    by probing the template (chat.py). Templates that rewrite earlier turns
    (reasoning shown only after the last user turn) are covered: the mask is
    that of the template with {% generation %} after the header and
    {% endgeneration %} after the end marker (tests check it per family).
  - "prefix": for each assistant turn i the conversation is rendered up to
    turn i-1 with the generation prompt (where the reply starts) and up to
    turn i (where it ends); for prefix-stable templates without an
    assistant header (Mistral's [INST]).
  - "auto" (default): generation when the template has the blocks, else
    render when probing finds it exact, else prefix when the template is
    prefix-stable; otherwise the template is refused at start.
  Every token that overlaps a reply's characters is marked, the rule
  transformers applies to generation spans.

Reasoning (reasoning_content, reasoning or thinking on assistant messages,
or <think>...</think> inline) goes to the template under the key it reads,
or inline when it reads none; tool calls, tool results and a record's tools
(OpenAI, and ShareGPT's function_call / observation as LLaMA-Factory writes
them) become the messages Hugging Face templates expect (chat.py).

Records with nothing to train on (no assistant turn, only empty replies, no
text, a mask of zeros) are skipped and counted as empty_assistant; records
that cannot be read are counted as malformed by reason, the first few of
each named with file:line (or row); --strict stops at the first, and more
skipped records than --max-skip (default 1%) fail the command. With --workers N, N processes
tokenise chunks of records; the results are written in input order, so the
output does not depend on N.
"""
import argparse
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .._deps import MissingPackage, need
from .._lib import add_version_flag
from .._outfile import output_conflict
from . import chat
from .chat import Malformed
from .hst import HstWriter

FORMATS = ("sharegpt", "messages", "text", "tokens")
MASK_METHODS = ("auto", "generation", "render", "prefix")
CHUNK_RECORDS = 64
MAX_REPORTS = 5  # records named per skip reason
# A record past one of these bounds is skipped before it is parsed or
# rendered (malformed: too_large, too_deep, too_many_turns): what json and
# the template would make of it is unbounded (memory, recursion, time).
MAX_RECORD_BYTES = 16 << 20  # one JSONL line, without its newline
MAX_DEPTH = 64  # nesting of objects and arrays in a record
MAX_TURNS = 1024  # messages of one conversation

_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")
_TOKENIZER_FILE_RE = re.compile(
    r"^(tokenizer|vocab|merges|special_tokens_map|added_tokens|chat_template)|"
    r"\.(model|tiktoken)$")


class UsageError(Exception):
    """A problem with the command line or the tokenizer, not with one record."""


class TooManySkipped(Exception):
    """More records were skipped than --max-skip allows; nothing was written."""


@dataclass
class PrepareOptions:
    tokenizer: str = None
    format: str = "auto"
    chat_template: str = None  # a file; default: the tokenizer's own template
    mask_method: str = "auto"
    mask_end: str = "marker"  # where a reply's loss ends without {% generation %}: chat.MASK_ENDS
    template_args: dict = None  # extra template variables, e.g. {"enable_thinking": False}
    system_prompt: str = None
    max_seq_len: int = 0  # 0: no limit
    overflow: str = "truncate"
    last_turn_only: bool = False
    workers: int = 1
    strict: bool = False
    max_skip: str = "1%"  # records skipped before the command fails: "P%" or a count
    split: str = None
    max_record_bytes: int = MAX_RECORD_BYTES
    max_depth: int = MAX_DEPTH
    max_turns: int = MAX_TURNS
    progress: bool = None  # None: when stderr is a terminal


@dataclass
class Counts:
    read: int = 0
    written: int = 0
    truncated: int = 0
    dropped: int = 0
    empty_assistant: int = 0
    malformed: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    tokens_lost: int = 0  # cut by truncation or in dropped records
    cut_empty: int = 0  # records truncated to no loss token, skipped
    loss_tokens_lost: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> records
    by_format: dict = field(default_factory=dict)


# ---- reading inputs ------------------------------------------------------------------------


class _DuplicateKey(ValueError):
    def __init__(self, key):
        super().__init__(f"key {key!r} given twice in one object (readers disagree on which one "
                         "counts: json keeps the last, hs-data refuses it); keep one")


def _unique_keys(pairs):
    """object_pairs_hook: an object that gives a key twice is refused, not read as its last."""
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise _DuplicateKey(k)
        obj[k] = v
    return obj


# A JSON string (escapes included), and every byte but the four brackets.
_JSON_STRING_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw):
    """How deep objects and arrays nest in the JSON text `raw` (bytes),
    without parsing it: strings dropped, then the brackets counted (C-speed
    passes, memory of the order of the brackets)."""
    brackets = _JSON_STRING_RE.sub(b"", raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    a = np.frombuffer(brackets, np.uint8)
    return int(np.cumsum(np.where((a == 0x5B) | (a == 0x7B), 1, -1), dtype=np.int64).max())


def _parse_record(raw, max_depth):
    """One record's JSON text (bytes) -> the record, or a Malformed: its
    depth is bounded before json sees it."""
    depth = json_depth(raw)
    if depth > max_depth:
        return Malformed(f"nested {depth} deep, more than --max-depth {max_depth} "
                         "(not parsed)", "too_deep")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except UnicodeDecodeError as e:
        return Malformed(f"not valid UTF-8 (byte {e.start})", "bad_json")
    except _DuplicateKey as e:
        return Malformed(str(e), "duplicate_key")
    except json.JSONDecodeError as e:
        return Malformed(f"not valid JSON ({e.msg} at column {e.colno})", "bad_json")
    except RecursionError:
        return Malformed(f"nested too deep for the JSON reader (--max-depth {max_depth})",
                         "too_deep")


def _jsonl_records(path, opts):
    limit = opts.max_record_bytes
    with open(path, "rb") as f:
        lineno = 0
        while True:
            raw = f.readline(limit + 2)  # the line, its newline, and one byte to tell
            if not raw:
                return
            lineno += 1
            loc = f"{path}:{lineno}"
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if len(raw.rstrip(b"\r\n")) > limit:
                n = len(raw)
                while not raw.endswith(b"\n"):  # the rest of the line, never held whole
                    raw = f.readline(1 << 20)
                    if not raw:
                        break
                    n += len(raw)
                yield loc, Malformed(f"a record of more than --max-record-bytes {limit} bytes "
                                     f"({n} with its newline; not read whole)",
                                     "too_large")
                continue
            if not raw.strip():
                continue
            yield loc, _parse_record(raw, opts.max_depth)


def _json_array_records(path, opts):
    with open(path, "rb") as f:
        text = f.read()
    depth = json_depth(text)
    if depth > opts.max_depth + 1:  # the array itself is one level
        raise UsageError(f"{path}: a record nested {depth - 1} deep, more than --max-depth "
                         f"{opts.max_depth}; a JSON array is read whole, so give the records as "
                         "JSONL (one per line) to have such records skipped, or raise "
                         "--max-depth")
    try:
        data = json.loads(text.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError, _DuplicateKey) as e:
        raise UsageError(f"{path}: not a valid JSON array ({e}); give a JSON array of "
                         "records or JSONL (one record per line)") from e
    if not isinstance(data, list):
        raise UsageError(f"{path}: the JSON document is not an array of records")
    for i, rec in enumerate(data):
        yield f"{path}[{i}]", rec


def _parquet_records(path):
    pq = need("pyarrow.parquet", "hsflow-data prepare", "data", package="pyarrow",
              purpose=f"reading Parquet ({path})")
    pf = pq.ParquetFile(path)
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            yield f"{path} row {row}", rec
            row += 1


def _datasets_records(path, split):
    datasets = need("datasets", "hsflow-data prepare", "data",
                    purpose=f"reading a datasets folder ({path})")
    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
        names = list(ds.keys())
        if split is None:
            split = "train" if "train" in ds else (names[0] if len(names) == 1 else None)
        if split not in ds:
            raise UsageError(f"{path}: a DatasetDict with splits {names}; pick one with --split")
        ds = ds[split]
        where = f"{path}[{split}]"
    else:
        where = path
    for i, rec in enumerate(ds):
        yield f"{where} row {i}", rec


def _count_records(path):
    """The number of records an input holds, for the progress bar (None: unknown)."""
    if os.path.isdir(path):
        return None
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:
            return None
    if os.path.getsize(path) > (64 << 30):
        return None
    n = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(16 << 20)
            if not b:
                return n
            n += b.count(b"\n")


def iter_records(path, split=None, opts=None):
    """Yields (location, record) for every record of `path`; a record that
    cannot be decoded, or is past a bound of `opts` (--max-record-bytes,
    --max-depth; the defaults without opts), comes as a Malformed instance
    in its place."""
    opts = opts or PrepareOptions()
    if os.path.isdir(path):
        return _datasets_records(path, split)
    if path.endswith(".parquet"):
        return _parquet_records(path)
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        return _json_array_records(path, opts)
    return _jsonl_records(path, opts)


# ---- records to conversations ----------------------------------------------------------------


def detect_format(rec):
    for key, fmt in (("conversations", "sharegpt"), ("messages", "messages"),
                     ("input_ids", "tokens"), ("text", "text")):
        if key in rec:
            return fmt
    raise Malformed("no \"conversations\", \"messages\", \"text\" or \"input_ids\" field "
                    f"(keys: {', '.join(sorted(map(str, rec)))[:80]}); give --format if the "
                    "field has another name", "no_format")


def _token_list(v, name):
    if not isinstance(v, (list, tuple, np.ndarray)):
        raise Malformed(f"\"{name}\" is not a list", "bad_tokens")
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise Malformed(f"\"{name}\" is not a flat list of integers", "bad_tokens") from e
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iub"):
        raise Malformed(f"\"{name}\" is not a flat list of integers", "bad_tokens")
    return a.astype(np.int64)


def _token_list_per_id(rec, name, ids):
    """rec[name] as a token list with one entry per input id."""
    a = _token_list(rec[name], name)
    if a.size != ids.size:
        raise Malformed(f"{name} has {a.size} entries, input_ids has {ids.size}", "bad_tokens")
    return a


def _tokens_record(rec):
    ids = _token_list(rec.get("input_ids"), "input_ids")
    if ids.size and (ids.min() < 0 or ids.max() > 0x7FFFFFFF):
        raise Malformed("input_ids must be integers in 0..2147483647", "bad_tokens")
    if rec.get("loss_mask") is not None:
        mask = _token_list_per_id(rec, "loss_mask", ids)
        if mask.size and (mask.min() < 0 or mask.max() > 1):
            raise Malformed("loss_mask entries must be 0 or 1", "bad_tokens")
    elif rec.get("labels") is not None:
        labels = _token_list_per_id(rec, "labels", ids)
        mask = (labels != -100).astype(np.int64)
    else:
        mask = np.ones_like(ids)
    return ids, mask


# ---- tokenising --------------------------------------------------------------------------------


def _last_run(mask):
    """The mask with only its last run of ones kept."""
    out = np.zeros_like(mask)
    nz = np.flatnonzero(mask)
    if nz.size:
        end = nz[-1]
        start = end
        while start > 0 and mask[start - 1]:
            start -= 1
        out[start:end + 1] = 1
    return out


def spans_to_mask(offsets, spans):
    """Marks every token whose character range overlaps one of `spans` (both in
    order), the rule transformers applies to {% generation %} spans."""
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(off), dtype=np.int64)
    if not len(off) or not spans:
        return mask
    starts, ends = off[:, 0], off[:, 1]
    if np.all(starts[1:] >= starts[:-1]) and np.all(ends[1:] >= ends[:-1]):
        for s, e in spans:  # offsets in order: the overlapping tokens are one run
            mask[np.searchsorted(ends, s, side="right"):np.searchsorted(starts, e)] = 1
        return mask
    k = 0  # offsets out of order: transformers' walk, token by token
    for t, (a, b) in enumerate(off.tolist()):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if b > spans[k][0]:
            mask[t] = 1
    return mask


_HF_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_tokenizer(path):
    """--tokenizer: a folder, or a Hugging Face model id found in the local
    cache (never downloaded) -> the folder."""
    if os.path.isdir(path):
        return path
    tried = ["not a folder"]
    if _HF_ID_RE.match(path) and not os.path.exists(path):
        try:
            from huggingface_hub import constants, snapshot_download
        except ImportError:
            tried.append("not looked up as a Hugging Face model id (huggingface_hub is not "
                         "installed)")
        else:
            try:
                return snapshot_download(path, local_files_only=True)
            except Exception as e:  # noqa: BLE001 (not cached, or a broken cache entry)
                tried.append(f"as a Hugging Face model id: not in the local cache "
                             f"{constants.HF_HUB_CACHE} ({type(e).__name__}; nothing is "
                             "downloaded)")
    raise UsageError(f"--tokenizer {path}: {'; '.join(tried)}; give the target model's folder "
                     "(tokenizer.json, tokenizer_config.json) or a model id downloaded "
                     "beforehand (huggingface-cli download ID)")


def load_tokenizer(path):
    if not path:
        return None
    need("tokenizers", "hsflow-data", "data", purpose="tokenising")
    AutoTokenizer = need("transformers", "hsflow-data", "data",
                         purpose="tokenising").AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise UsageError(f"--tokenizer {path}: cannot load a tokenizer from it ({e})") from e


_RESERVED_ARGS = {"messages", "tools", "documents", "add_generation_prompt", "chat_template",
                  "tokenize", "return_dict", "return_assistant_tokens_mask",
                  "continue_final_message"}


def parse_template_arg(s):
    """'KEY=VALUE' -> (KEY, value): VALUE read as JSON (true, 3, "x", {...}), or
    kept as a string when it is not JSON."""
    key, sep, value = s.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise UsageError(f"--template-arg {s!r}: give KEY=VALUE, e.g. enable_thinking=false")
    if key in _RESERVED_ARGS:
        raise UsageError(f"--template-arg {key}: set by hsflow.data itself; not a template "
                         "variable to give")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


class Encoder:
    """Records -> (input_ids, loss_mask) with one tokenizer and chat template."""

    def __init__(self, opts):
        self.opts = opts
        self.tok_dir = resolve_tokenizer(opts.tokenizer) if opts.tokenizer else None
        self.tok = load_tokenizer(self.tok_dir)
        self.template_args = dict(opts.template_args or {})
        self.template = None
        self.method = None
        self.shape = None
        self.reasoning_key = None
        if opts.chat_template:
            with open(opts.chat_template, encoding="utf-8") as f:
                self.template = f.read()
        elif self.tok is not None:
            t = self.tok.chat_template
            self.template = t.get("default", next(iter(t.values()))) if isinstance(t, dict) else t
        if self.template is None:
            return
        self.reasoning_key = chat.reasoning_key(self.template)
        if opts.mask_end not in chat.MASK_ENDS:
            raise UsageError(f"--mask-end {opts.mask_end}: one of {', '.join(chat.MASK_ENDS)}")
        has_gen = bool(_GENERATION_RE.search(self.template))
        method = opts.mask_method
        if method == "generation" and not has_gen:
            raise UsageError("--mask-method generation: the chat template has no "
                             "{% generation %} blocks; use --mask-method auto")
        if method == "auto" and has_gen:
            method = "generation"
        if self.tok is None or method == "generation":
            self.method = method
            return
        if not self.tok.is_fast:
            raise UsageError(f"--tokenizer {opts.tokenizer}: the {method} mask method needs a "
                             "fast tokenizer (tokenizer.json) for character offsets")
        self.shape = chat.probe_template(lambda msgs, gp: self._render(msgs, None, gp))
        if method == "auto":
            method = "render" if self.shape.header else \
                "prefix" if self.shape.prefix_stable else None
            if method is None:
                raise UsageError("no exact loss mask for this chat template: the render method "
                                 f"does not apply ({self.shape.why}) and the prefix method "
                                 f"neither ({self.shape.prefix_why}); give the template "
                                 "{% generation %} blocks around each reply (--chat-template "
                                 "FILE)")
        elif method == "render" and not self.shape.header:
            raise UsageError(f"--mask-method render: not exact for this chat template "
                             f"({self.shape.why}); use --mask-method auto")
        self.method = method

    def _need_tokenizer(self, what):
        if self.tok is None:
            raise UsageError(f"{what} records need a tokenizer: give --tokenizer DIR")

    def _render(self, msgs, tools, add_generation_prompt):
        return self.tok.apply_chat_template(msgs, tools=tools, chat_template=self.template,
                                            tokenize=False,
                                            add_generation_prompt=add_generation_prompt,
                                            **self.template_args)

    def _prefix_spans(self, msgs, tools, full):
        spans = []
        for i, m in enumerate(msgs):
            if m["role"] != "assistant":
                continue
            head = self._render(msgs[:i], tools, True)
            body = self._render(msgs[:i + 1], tools, False)
            if not (full.startswith(head) and full.startswith(body) and len(head) <= len(body)):
                raise Malformed(f"the chat template renders turn {i} differently inside the "
                                "whole conversation than on its own (not prefix-stable); use "
                                "--mask-method auto", "not_prefix_stable")
            stop = len(body.rstrip()) if self.opts.mask_end == "marker" else len(body)
            if stop > len(head):
                spans.append((len(head), stop))
        return spans

    def encode_chat(self, msgs, tools=None):
        """Messages -> (ids, mask, rendered text or None)."""
        self._need_tokenizer("conversation")
        if self.template is None:
            raise UsageError(f"--tokenizer {self.opts.tokenizer} has no chat template; give one "
                             "with --chat-template FILE")
        try:
            if self.method == "generation":
                out = self.tok.apply_chat_template(msgs, tools=tools, chat_template=self.template,
                                                   tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True,
                                                   **self.template_args)
                ids = np.asarray(out["input_ids"], dtype=np.int64)
                mask = np.asarray(out["assistant_masks"], dtype=np.int64)
                chat.check_rendered(self._render(msgs, tools, False), msgs)
                return ids, mask
            full = self._render(msgs, tools, False)
            chat.check_rendered(full, msgs)
            if self.method == "render":
                spans = chat.reply_spans(full, self.shape.header, self.shape.end,
                                         chat.end_keep(self.shape.end, self.opts.mask_end))
                chat.check_spans(full, spans, msgs)
            else:
                spans = self._prefix_spans(msgs, tools, full)
            enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
            ids = np.asarray(enc["input_ids"], dtype=np.int64)
            return ids, spans_to_mask(enc["offset_mapping"], spans)
        except (Malformed, UsageError):
            raise
        except Exception as e:  # the template's own checks (raise_exception) and jinja errors
            raise Malformed(f"the chat template failed on this conversation: {e}",
                            "template_error") from e

    def encode_text(self, text):
        self._need_tokenizer("text")
        ids = np.asarray(self.tok(text, add_special_tokens=True)["input_ids"], dtype=np.int64)
        return ids, np.ones_like(ids)

    def tokens(self, rec):
        """One record -> (format, ids, mask) before --last-turn-only and
        --max-seq-len; raises Malformed or Skip."""
        if not isinstance(rec, dict):
            raise Malformed(f"the record is a {type(rec).__name__}, not an object", "bad_field")
        fmt = self.opts.format if self.opts.format != "auto" else detect_format(rec)
        if fmt in ("sharegpt", "messages"):
            key = "conversations" if fmt == "sharegpt" else "messages"
            if key not in rec:
                raise Malformed(f"--format {fmt}: the record has no \"{key}\" field", "no_format")
            turns = rec[key]
            if isinstance(turns, list) and len(turns) > self.opts.max_turns:
                raise Malformed(f"{len(turns)} turns, more than --max-turns "
                                f"{self.opts.max_turns} (not rendered)",
                                "too_many_turns")
            read = chat.sharegpt_messages if fmt == "sharegpt" else chat.openai_messages
            msgs, tools = read(rec, self.reasoning_key)
            if self.opts.system_prompt is not None and \
                    not any(m["role"] == "system" for m in msgs):
                msgs.insert(0, {"role": "system", "content": self.opts.system_prompt})
            if not chat.has_reply(msgs):
                raise Skip("empty_assistant", "no assistant turn with content")
            ids, mask = self.encode_chat(msgs, tools)
        elif fmt == "text":
            text = rec.get("text")
            if not isinstance(text, str):
                raise Malformed("\"text\" is missing or not a string", "bad_field")
            if not text:
                raise Skip("empty_assistant", "empty text")
            ids, mask = self.encode_text(text)
        else:
            if "input_ids" not in rec:
                raise Malformed("--format tokens: the record has no \"input_ids\" field",
                                "no_format")
            ids, mask = _tokens_record(rec)
        return fmt, ids, mask

    def encode(self, rec):
        """One record -> (format, ids, mask, tokens lost to truncation, loss
        tokens lost) or raises Malformed/Skip."""
        fmt, ids, mask = self.tokens(rec)
        if self.opts.last_turn_only:
            mask = _last_run(mask)
        lost = lost_loss = 0
        limit = self.opts.max_seq_len
        if limit and ids.size > limit:
            if self.opts.overflow == "drop":
                raise Skip("dropped", f"{ids.size} tokens, above --max-seq-len {limit}",
                           int(ids.size), int(mask.sum()))
            lost, lost_loss = int(ids.size - limit), int(mask[limit:].sum())
            ids, mask = ids[:limit], mask[:limit]
        if ids.size == 0 or not mask.any():
            raise Skip("empty_assistant", "no token has loss (nothing to train on)" +
                       (" after truncation" if lost else ""), int(ids.size) + lost, lost_loss)
        return fmt, ids.astype(np.int32), mask.astype(np.uint8), lost, lost_loss


class Skip(Exception):
    """A record with nothing to train on, or dropped; `tokens`, `loss`: what it held."""

    def __init__(self, kind, why, tokens=0, loss=0):
        super().__init__(why)
        self.kind = kind
        self.reason = kind
        self.tokens = tokens
        self.loss = loss

# ---- workers -------------------------------------------------------------------------------------

_ENCODER = None


def _worker_init(opts, enc=None):
    global _ENCODER
    _ENCODER = enc if enc is not None else Encoder(opts)


def _encode_chunk(chunk):
    """[(loc, rec)] -> [(loc, outcome)]; an outcome is ("ok", fmt, ids, mask,
    lost, lost_loss), (kind, reason, why, tokens, loss) for a skipped record,
    or ("usage", why)."""
    out = []
    for loc, rec in chunk:
        if isinstance(rec, Malformed):
            out.append((loc, ("malformed", rec.reason, str(rec), 0, 0)))
            continue
        try:
            out.append((loc, ("ok",) + _ENCODER.encode(rec)))
        except Malformed as e:
            out.append((loc, ("malformed", e.reason, str(e), 0, 0)))
        except Skip as e:
            out.append((loc, (e.kind, e.reason, str(e), e.tokens, e.loss)))
        except UsageError as e:
            out.append((loc, ("usage", str(e))))
            break
        except RecursionError:  # a structure too deep for the template or the reader
            out.append((loc, ("malformed", "too_deep", "nested too deep to render "
                              f"(--max-depth {_ENCODER.opts.max_depth})", 0, 0)))
    return out


def _chunks(records):
    it = iter(records)
    while True:
        c = list(itertools.islice(it, CHUNK_RECORDS))
        if not c:
            return
        yield c


# ---- outputs -------------------------------------------------------------------------------------


class JsonlWriter:
    """Pre-tokenised JSONL through a temporary file renamed at the end."""

    def __init__(self, path):
        self.path = os.path.abspath(path)
        fd, self._tmp = tempfile.mkstemp(dir=os.path.dirname(self.path),
                                         prefix=os.path.basename(self.path) + ".tmp.")
        os.fchmod(fd, 0o644)
        self._f = os.fdopen(fd, "w", encoding="utf-8")
        self.fingerprint = None

    def add(self, ids, mask):
        self._f.write('{"input_ids":[%s],"loss_mask":[%s]}\n' % (
            ",".join(map(str, ids.tolist())), ",".join(map(str, mask.tolist()))))

    def close(self):
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        os.replace(self._tmp, self.path)

    def abort(self):
        self._f.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)


def _files_sha256(folder):
    h = hashlib.sha256()
    names = []
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        if os.path.isfile(p) and _TOKENIZER_FILE_RE.search(name):
            names.append(name)
            h.update(name.encode() + b"\0")
            with open(p, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest(), names


def _sidecar(in_path, out_path, opts, enc, counts, fingerprint, seconds):
    tok = None
    if opts.tokenizer:
        digest, files = _files_sha256(enc.tok_dir)
        tok = {"name": os.path.basename(os.path.normpath(opts.tokenizer)),
               "given": opts.tokenizer,
               "path": os.path.abspath(enc.tok_dir),
               "class": type(enc.tok).__name__, "files": files, "sha256": digest}
    template = None
    if enc.template is not None:
        template = {"source": opts.chat_template or "tokenizer",
                    "sha256": hashlib.sha256(enc.template.encode("utf-8")).hexdigest(),
                    "mask_method": enc.method,
                    "mask_end": None if enc.method == "generation" else opts.mask_end,
                    "args": dict(enc.template_args),
                    "reasoning_key": enc.reasoning_key}
        if enc.method == "render":
            template["reply_header"] = enc.shape.header
            template["reply_end"] = enc.shape.end
    c = asdict(counts)
    return {
        "input": os.path.abspath(in_path),
        "output": os.path.abspath(out_path),
        "output_format": "jsonl" if out_path.endswith(".jsonl") else "hst",
        "fingerprint": None if fingerprint is None else f"{fingerprint:016x}",
        "tokenizer": tok,
        "chat_template": template,
        "options": {k: getattr(opts, k) for k in
                    ("format", "system_prompt", "max_seq_len", "overflow", "last_turn_only",
                     "strict", "max_skip", "split", "template_args", "max_record_bytes",
                     "max_depth", "max_turns")},
        "counts": {k: c[k] for k in ("read", "written", "truncated", "dropped",
                                     "empty_assistant", "malformed")},
        "skipped": dict(counts.skipped),
        "tokens": {"total": counts.tokens, "loss": counts.loss_tokens,
                   "lost": counts.tokens_lost, "loss_lost": counts.loss_tokens_lost},
        "by_format": counts.by_format,
        "seconds": round(seconds, 3),
    }


def _skip_limit(max_skip, n_read):
    """--max-skip ("P%" of the records read, or a count) -> records allowed."""
    v = str(max_skip).strip()
    try:
        if v.endswith("%"):
            p = float(v[:-1])
            if not 0 <= p <= 100:
                raise ValueError
            return int(n_read * p / 100.0)
        n = int(v)
        if n < 0:
            raise ValueError
        return n
    except ValueError:
        raise UsageError(f"--max-skip {max_skip!r}: give a share like 1% or 0.5%, or a count of "
                         "records like 10") from None


def _reasons(counts):
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.skipped.items(), key=lambda x: -x[1]))


def _loss_report(counts, opts):
    """The lines that say what was lost: skipped records by reason, tokens cut."""
    out = []
    n_skipped = counts.read - counts.written
    if n_skipped:
        out.append(f"hsflow-data: skipped {n_skipped} of {counts.read} records "
                   f"({100.0 * n_skipped / max(counts.read, 1):.2f}%): {_reasons(counts)}"
                   + (f" (the first {MAX_REPORTS} of each named above)"
                      if any(v > MAX_REPORTS for v in counts.skipped.values()) else ""))
    if counts.tokens_lost:
        whole = counts.tokens + counts.tokens_lost
        out.append(f"hsflow-data: WARNING: {counts.tokens_lost} of {whole} tokens "
                   f"({100.0 * counts.tokens_lost / whole:.2f}%) lost at --max-seq-len "
                   f"{opts.max_seq_len} ({counts.truncated} sequences truncated, "
                   f"{counts.dropped} dropped, {counts.cut_empty} skipped with no loss left "
                   f"after the cut), {counts.loss_tokens_lost} of them with loss; "
                   "raise --max-seq-len to keep them")
    return out


def sidecar_path(out_path):
    return out_path + ".meta.json"


# ---- the command ---------------------------------------------------------------------------------


def prepare(in_path, out_path, opts, log=None):
    """Runs the whole preparation; returns (Counts, sidecar dict). Raises
    UsageError for a bad setup, Malformed under --strict."""
    log = log or (lambda msg: print(msg, file=sys.stderr))
    t0 = time.monotonic()
    if not os.path.exists(in_path):
        raise UsageError(f"{in_path}: no such file or folder")
    # every output (OUT and its sidecar) against every input: IN, the
    # tokenizer's folder and the chat template
    inputs = (in_path, opts.tokenizer, opts.chat_template)
    for out in (out_path, sidecar_path(out_path)):
        why = output_conflict(out, inputs)
        if why:
            raise UsageError(why)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise UsageError(f"{out_path}: the folder {out_dir} does not exist")
    if opts.workers < 1:
        raise UsageError("--workers must be at least 1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    enc = Encoder(opts)
    for name in ("max_record_bytes", "max_depth", "max_turns"):
        if getattr(opts, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    records = iter_records(in_path, opts.split, opts)
    writer = JsonlWriter(out_path) if out_path.endswith(".jsonl") else HstWriter(out_path)
    counts = Counts()
    pool = None
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    show = opts.progress if opts.progress is not None else sys.stderr.isatty()
    bar = None
    if tqdm is not None and show:
        bar = tqdm(total=_count_records(in_path), unit=" rec", file=sys.stderr,
                   dynamic_ncols=True, smoothing=0.1, desc="prepare")
        log = bar.write
    try:
        if opts.workers == 1:
            _worker_init(opts, enc)
            results = map(_encode_chunk, _chunks(records))
        else:
            import multiprocessing as mp
            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            pool = ctx.Pool(opts.workers, initializer=_worker_init, initargs=(opts,))
            results = pool.imap(_encode_chunk, _chunks(records), chunksize=1)
        for chunk in results:
            for loc, res in chunk:
                kind = res[0]
                if kind == "usage":
                    raise UsageError(res[1])
                counts.read += 1
                if kind == "ok":
                    _, fmt, ids, mask, lost, lost_loss = res
                    writer.add(ids, mask)
                    counts.written += 1
                    counts.truncated += lost > 0
                    counts.tokens += int(ids.size)
                    counts.loss_tokens += int(mask.sum())
                    counts.tokens_lost += lost
                    counts.loss_tokens_lost += lost_loss
                    counts.by_format[fmt] = counts.by_format.get(fmt, 0) + 1
                    continue
                _, reason, why, lost, lost_loss = res
                setattr(counts, kind, getattr(counts, kind) + 1)
                counts.cut_empty += kind == "empty_assistant" and lost > 0
                counts.tokens_lost += lost
                counts.loss_tokens_lost += lost_loss
                if kind == "malformed" and opts.strict:
                    raise Malformed(f"{loc}: {why} (--strict stops at the first malformed "
                                    "record)", reason)
                key = reason if kind == "malformed" else kind
                n = counts.skipped[key] = counts.skipped.get(key, 0) + 1
                if n <= MAX_REPORTS:
                    log(f"hsflow-data: {loc}: {why}; record skipped ({key})")
            if bar is not None:
                bar.update(len(chunk))
        if counts.written == 0:
            raise UsageError(f"{in_path}: no usable records ({counts.read} read, "
                             f"{counts.malformed} malformed, {counts.empty_assistant} with no "
                             f"assistant tokens, {counts.dropped} too long); nothing written")
        for line in _loss_report(counts, opts):
            log(line)
        limit = _skip_limit(opts.max_skip, counts.read)
        n_skipped = counts.read - counts.written
        if n_skipped > limit:
            raise TooManySkipped(
                f"{n_skipped} of {counts.read} records skipped "
                f"({100.0 * n_skipped / counts.read:.2f}%), more than --max-skip {opts.max_skip} "
                f"allows ({limit}): {_reasons(counts)}; fix the records named above, or raise "
                "--max-skip to accept the loss; nothing written")
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.terminate()
            pool.join()
    meta = _sidecar(in_path, out_path, opts, enc, counts, writer.fingerprint,
                    time.monotonic() - t0)
    side = sidecar_path(out_path)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=os.path.basename(side) + ".tmp.")
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o644)
        json.dump(meta, f, indent=2)
        f.write("\n")
    os.replace(tmp, side)
    return counts, meta


def _env_default(name, default):
    return os.environ.get("HS_" + name.upper().replace("-", "_"), default)


def _positive(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a whole number")
    if v < 0:
        raise argparse.ArgumentTypeError(f"'{s}' is negative")
    return v


def _size(s):
    """A size in bytes: 65536, 64K, 16M, 1G (K = 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", str(s), re.I)
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"'{s}' is not a size like 16M, 512K or 65536")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2).upper()]


def _bound_args(p):
    """--max-record-bytes, --max-depth, --max-turns: what one record may hold."""
    p.add_argument("--max-record-bytes", metavar="SIZE", type=_size,
                   default=_env_default("max-record-bytes", str(MAX_RECORD_BYTES)),
                   help="skip (malformed, too_large) a JSONL line longer than this, without "
                        "reading it whole (default 16M; K, M, G suffixes)")
    p.add_argument("--max-depth", metavar="N", type=_positive,
                   default=_env_default("max-depth", MAX_DEPTH),
                   help="skip (too_deep) a record whose objects and arrays nest deeper, found "
                        f"by a scan before it is parsed (default {MAX_DEPTH})")
    p.add_argument("--max-turns", metavar="N", type=_positive,
                   default=_env_default("max-turns", MAX_TURNS),
                   help="skip (too_many_turns) a conversation of more messages, before it is "
                        f"rendered (default {MAX_TURNS})")


def _tokenizer_arg(p, extra):
    p.add_argument("--tokenizer", metavar="DIR|ID", default=_env_default("tokenizer", None),
                   help="the target model's folder, or its Hugging Face model id found in the "
                        f"local cache (nothing is downloaded); {extra}")


def _template_args(p):
    p.add_argument("--chat-template", metavar="FILE",
                   default=_env_default("chat-template", None),
                   help="a Jinja chat template to use instead of the tokenizer's")
    p.add_argument("--template-arg", metavar="KEY=VALUE", action="append", default=[],
                   help="a variable for the chat template, VALUE as JSON (true, 3, \"x\"; "
                        "other text is a string), e.g. enable_thinking=false; repeatable; "
                        "recorded in the sidecar")
    p.add_argument("--mask-method", choices=MASK_METHODS,
                   default=_env_default("mask-method", "auto"),
                   help="generation: the template's {%% generation %%} blocks (as "
                        "transformers); render: render each conversation once and mark every "
                        "reply from its header to its end-of-turn marker, both found by "
                        "probing the template; prefix: render turn by turn (prefix-stable "
                        "templates); default auto: generation when the template has the "
                        "blocks, else render where probing finds it exact, else prefix")
    p.add_argument("--mask-end", choices=chat.MASK_ENDS,
                   default=_env_default("mask-end", "marker"),
                   help="where a reply's loss ends when the template has no {%% generation %%} "
                        "blocks (theirs decide otherwise): marker (default) through the "
                        "end-of-turn marker, not the white space after it (ChatML's <|im_end|> "
                        "included, its newline not), as generation-block twins commonly mark; "
                        "turn: through that white space too")
    p.add_argument("--system-prompt", metavar="TEXT",
                   default=_env_default("system-prompt", None),
                   help="a system message for conversations that have none")


def build_parser():
    ap = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="hsflow-data",
        description="Prepare training data for hsflow: conversations, text or token records "
                    "to the .hst files (or pre-tokenised JSONL) that hs-producer reads.")
    add_version_flag(ap)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    def command(name, **kw):  # no abbreviated flags: '--tok' is not --tokenizer
        return sub.add_parser(name, allow_abbrev=False,
                              formatter_class=argparse.RawDescriptionHelpFormatter, **kw)
    p = command(
        "prepare",
        help="tokenise with the target's chat template; loss on assistant tokens only",
        description="Tokenise IN with the target's tokenizer and chat template and write OUT: "
                    ".hst, or pre-tokenised JSONL when OUT ends in .jsonl. The loss mask covers "
                    "the assistant tokens. A sidecar OUT.meta.json records the tokenizer, the "
                    "template and the counts.",
        epilog="""inputs: JSONL, a JSON array, Parquet (.parquet), a datasets folder (save_to_disk).
record formats (detected from the keys, or --format):
  sharegpt  {"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}
  messages  {"messages": [{"role": "user", "content": "..."}, ...]}
  text      {"text": "..."}                      (every token has loss)
  tokens    {"input_ids": [...], "loss_mask": [...]} or "labels" (-100: no loss)

Every option can also come from the environment: --max-seq-len as HS_MAX_SEQ_LEN
and so on; the command line wins.

examples:
  python -m hsflow.data prepare chat.jsonl train.hst --tokenizer /models/Qwen2.5-7B-Instruct
  hsflow-data prepare chat.parquet train.hst --tokenizer /models/llama --max-seq-len 4096 \\
      --overflow drop --workers 4
  hsflow-data prepare sft.jsonl train.jsonl --tokenizer /models/llama --last-turn-only \\
      --system-prompt "You are a helpful assistant."
""")
    p.add_argument("input", metavar="IN", help="JSONL, JSON array, Parquet or datasets folder")
    p.add_argument("output", metavar="OUT", help="OUT.hst (default) or OUT.jsonl")
    _tokenizer_arg(p, "not needed for pre-tokenised records")
    p.add_argument("--format", choices=("auto",) + FORMATS,
                   default=_env_default("format", "auto"),
                   help="record format (default auto: per record, from its keys)")
    _template_args(p)
    p.add_argument("--max-seq-len", metavar="N", type=_positive,
                   default=_env_default("max-seq-len", 0),
                   help="longest sequence written (default: no limit)")
    p.add_argument("--overflow", choices=("truncate", "drop"),
                   default=_env_default("overflow", "truncate"),
                   help="longer sequences are truncated (default) or dropped")
    p.add_argument("--last-turn-only", action="store_true",
                   default=bool(_env_default("last-turn-only", "")),
                   help="loss on the last assistant turn only")
    p.add_argument("--workers", metavar="N", type=_positive,
                   default=_env_default("workers", 1),
                   help="tokenising processes (default 1); the output does not depend on N")
    p.add_argument("--strict", action="store_true", default=bool(_env_default("strict", "")),
                   help="fail on the first malformed record instead of skipping it")
    p.add_argument("--max-skip", metavar="P%|N", default=_env_default("max-skip", "1%"),
                   help="fail, writing nothing, when more records than this are skipped "
                        "(malformed, nothing to train on, dropped): a share of the records "
                        "read or a count (default 1%%)")
    p.add_argument("--split", default=_env_default("split", None),
                   help="the split of a DatasetDict folder (default train)")
    _bound_args(p)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: shown when stderr is a terminal)")
    q = command(
        "inspect", help="print records as prepare renders them, the loss tokens marked",
        description="Render the first N records of IN as prepare would and print them with "
                    "the tokens that get loss marked: green on a terminal, between [[ and ]] "
                    "otherwise (or with NO_COLOR set). The check to make before trusting a "
                    "mask on a new template or dataset.",
        epilog="""examples:
  hsflow-data inspect chat.jsonl --tokenizer Qwen/Qwen3-8B -n 3
  hsflow-data inspect chat.jsonl --tokenizer /models/r1 --template-arg enable_thinking=false
""")
    q.add_argument("input", metavar="IN", help="JSONL, JSON array, Parquet or datasets folder")
    _tokenizer_arg(q, "not needed for pre-tokenised records")
    q.add_argument("-n", type=_positive, default=3, help="records to print (default 3)")
    q.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                   help="record format (default auto: per record, from its keys)")
    _template_args(q)
    q.add_argument("--max-seq-len", metavar="N", type=_positive, default=0,
                   help="cut as prepare would (default: no limit)")
    q.add_argument("--last-turn-only", action="store_true",
                   help="loss on the last assistant turn only")
    q.add_argument("--split", default=None, help="the split of a DatasetDict folder")
    _bound_args(q)
    return ap


def _inspect(args, opts, out=sys.stdout):
    """Prints the first N records as rendered, loss tokens marked."""
    enc = Encoder(opts)
    colour = out.isatty() and not os.environ.get("NO_COLOR")
    mark = ("\x1b[1;32m", "\x1b[0m") if colour else ("[[", "]]")
    print(f"# tokenizer {opts.tokenizer}, mask method {enc.method}; loss tokens "
          + ("in green" if colour else "between [[ and ]]"), file=out)
    shown = 0
    for loc, rec in iter_records(args.input, opts.split, opts):
        if shown >= args.n:
            break
        shown += 1
        if isinstance(rec, Malformed):
            print(f"--- {loc}: skipped ({rec.reason}): {rec}", file=out)
            continue
        try:
            fmt, ids, mask, lost, _ = enc.encode(rec)
        except (Malformed, Skip) as e:
            print(f"--- {loc}: skipped ({e.reason}): {e}", file=out)
            continue
        print(f"--- {loc}: {fmt}, {ids.size} tokens, {int(mask.sum())} with loss"
              + (f", {lost} cut at --max-seq-len" if lost else ""), file=out)
        parts, start = [], 0
        for i in range(1, ids.size + 1):
            if i == ids.size or mask[i] != mask[start]:
                text = enc.tok.decode(ids[start:i].tolist(), skip_special_tokens=False) \
                    if enc.tok is not None else " ".join(map(str, ids[start:i].tolist()))
                parts.append(mark[0] + text + mark[1] if mask[start] else text)
                start = i
        print("".join(parts), file=out)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["store"]:  # hsflow-data store info|verify|export DIR
        from .store import main as store_main
        return store_main(argv[1:])
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command not in ("prepare", "inspect"):
        ap.print_help(sys.stderr if args.command is None else sys.stdout)
        return 2
    try:
        max_seq_len = _positive(str(args.max_seq_len))
        workers = _positive(str(getattr(args, "workers", 1)))
        template_args = dict(parse_template_arg(a) for a in args.template_arg)
        bounds = {}
        for name, conv in (("max_record_bytes", _size), ("max_depth", _positive),
                           ("max_turns", _positive)):
            flag = "--" + name.replace("_", "-")
            try:
                bounds[name] = conv(str(getattr(args, name)))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{flag} (HS_{name.upper()}): {e}") from None
            if bounds[name] < 1:
                raise argparse.ArgumentTypeError(f"{flag} (HS_{name.upper()}): must be at "
                                                 "least 1")
    except argparse.ArgumentTypeError as e:
        print(f"hsflow-data: HS_MAX_SEQ_LEN / HS_WORKERS / bounds: {e}", file=sys.stderr)
        return 2
    except UsageError as e:
        print(f"hsflow-data: {e}", file=sys.stderr)
        return 2
    opts = PrepareOptions(
        tokenizer=args.tokenizer, format=args.format, chat_template=args.chat_template,
        mask_method=args.mask_method, mask_end=args.mask_end, template_args=template_args,
        system_prompt=args.system_prompt, max_seq_len=max_seq_len,
        overflow=getattr(args, "overflow", "truncate"), last_turn_only=args.last_turn_only,
        workers=workers, strict=getattr(args, "strict", False),
        max_skip=getattr(args, "max_skip", "1%"), split=args.split,
        progress=False if getattr(args, "no_progress", True) else None, **bounds)
    t0 = time.monotonic()
    try:
        if args.command == "inspect":
            if not os.path.exists(args.input):
                raise UsageError(f"{args.input}: no such file or folder")
            return _inspect(args, opts)
        counts, meta = prepare(args.input, args.output, opts)
    except UsageError as e:
        print(f"hsflow-data: {e}", file=sys.stderr)
        return 2
    except MissingPackage as e:
        print(f"hsflow-data: {e}", file=sys.stderr)
        return 2
    except (Malformed, TooManySkipped) as e:
        print(f"hsflow-data: {e}" + ("" if isinstance(e, TooManySkipped) else "; nothing written"),
              file=sys.stderr)
        return 1
    except OSError as e:
        print(f"hsflow-data: {e}", file=sys.stderr)
        return 1
    took = time.monotonic() - t0
    c = meta["counts"]
    fp = f", fingerprint {meta['fingerprint']}" if meta["fingerprint"] else ""
    print(f"wrote {args.output}: {c['written']} sequences, {counts.tokens} tokens "
          f"({counts.loss_tokens} with loss){fp} in {took:.2f} s; read {c['read']}, truncated "
          f"{c['truncated']}, dropped {c['dropped']}, empty_assistant {c['empty_assistant']}, "
          f"malformed {c['malformed']}; see {sidecar_path(args.output)}")
    return 0
