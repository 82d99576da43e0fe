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
  - "prefix", for templates without those blocks: for each assistant turn i
    the conversation is rendered up to turn i-1 with the generation prompt
    (where the reply starts) and up to turn i (where it ends); the characters
    in between are the reply, and every token that overlaps them is marked,
    the rule transformers applies to generation spans. On a template whose
    generation blocks enclose the reply from after the assistant header to
    the end of the turn, both give the same masks (tests check this). A
    template whose rendering of a prefix is not a prefix of the whole (one
    that rewrites earlier turns) is reported per record: give it
    {% generation %} blocks.

Records with nothing to train on (no assistant turn, only empty replies, no
text, a mask of zeros) are skipped and counted as empty_assistant; records
that cannot be read are reported with file:line (or row) and counted as
malformed (--strict stops at the first). With --workers N, N processes
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

from .._lib import add_version_flag
from .._outfile import output_conflict
from .hst import HstWriter

FORMATS = ("sharegpt", "messages", "text", "tokens")
MASK_METHODS = ("auto", "generation", "prefix")
CHUNK_RECORDS = 64
MAX_REPORTS = 20

SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant",
    "system": "system",
    "tool": "tool", "function": "tool", "observation": "tool",
}
MESSAGE_ROLES = {"system", "developer", "user", "assistant", "tool"}
_GENERATION_RE = re.compile(r"\{%-?\s*generation\s*-?%\}")
_TOKENIZER_FILE_RE = re.compile(
    r"^(tokenizer|vocab|merges|special_tokens_map|added_tokens|chat_template)|"
    r"\.(model|tiktoken)$")


class UsageError(Exception):
    """A problem with the command line or the tokenizer, not with one record."""


class Malformed(Exception):
    """One record cannot be used; the message says why."""


@dataclass
class PrepareOptions:
    tokenizer: str = None
    format: str = "auto"
    chat_template: str = None  # a file; default: the tokenizer's own template
    mask_method: str = "auto"
    system_prompt: str = None
    max_seq_len: int = 0  # 0: no limit
    overflow: str = "truncate"
    last_turn_only: bool = False
    workers: int = 1
    strict: bool = False
    split: str = None
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


def _jsonl_records(path):
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            if not raw.strip():
                continue
            loc = f"{path}:{lineno}"
            try:
                yield loc, json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
            except UnicodeDecodeError as e:
                yield loc, Malformed(f"not valid UTF-8 (byte {e.start})")
            except _DuplicateKey as e:
                yield loc, Malformed(str(e))
            except json.JSONDecodeError as e:
                yield loc, Malformed(f"not valid JSON ({e.msg} at column {e.colno})")


def _json_array_records(path):
    with open(path, "rb") as f:
        try:
            data = json.loads(f.read().decode("utf-8"), object_pairs_hook=_unique_keys)
        except (UnicodeDecodeError, json.JSONDecodeError, _DuplicateKey) as e:
            raise UsageError(f"{path}: not a valid JSON array ({e}); give a JSON array of "
                             "records or JSONL (one record per line)") from e
    if not isinstance(data, list):
        raise UsageError(f"{path}: the JSON document is not an array of records")
    for i, rec in enumerate(data):
        yield f"{path}[{i}]", rec


def _parquet_records(path):
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise UsageError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from e
    pf = pq.ParquetFile(path)
    row = 0
    for batch in pf.iter_batches(batch_size=1024):
        for rec in batch.to_pylist():
            yield f"{path} row {row}", rec
            row += 1


def _datasets_records(path, split):
    try:
        import datasets
    except ImportError as e:
        raise UsageError(f"{path}: reading a datasets folder needs the datasets package "
                         "(pip install datasets)") from e
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


def iter_records(path, split=None):
    """Yields (location, record) for every record of `path`; a record that
    cannot be decoded comes as a Malformed instance in its place."""
    if os.path.isdir(path):
        return _datasets_records(path, split)
    if path.endswith(".parquet"):
        return _parquet_records(path)
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"["):
        return _json_array_records(path)
    return _jsonl_records(path)


# ---- records to conversations ----------------------------------------------------------------


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
                raise Malformed(f"{where}: content part {p!r:.60} is not text")
        return "".join(parts)
    raise Malformed(f"{where}: content is {type(content).__name__}, not a string")


def _sharegpt_messages(turns):
    if not isinstance(turns, list):
        raise Malformed("\"conversations\" is not a list")
    msgs = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise Malformed(f"conversations[{i}] is not an object")
        who = t.get("from", t.get("role"))
        role = SHAREGPT_ROLES.get(str(who).lower()) if who is not None else None
        if role is None:
            raise Malformed(f"conversations[{i}] has role {who!r}; ShareGPT roles are human, gpt, "
                            "system and tool")
        text = t.get("value", t.get("content"))
        if not isinstance(text, str):
            raise Malformed(f"conversations[{i}] has no string \"value\"")
        msgs.append({"role": role, "content": text})
    return msgs


def _openai_messages(turns):
    if not isinstance(turns, list):
        raise Malformed("\"messages\" is not a list")
    msgs = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise Malformed(f"messages[{i}] is not an object")
        role = t.get("role")
        if role not in MESSAGE_ROLES:
            raise Malformed(f"messages[{i}] has role {role!r}; use one of "
                            f"{', '.join(sorted(MESSAGE_ROLES))}")
        m = {k: v for k, v in t.items() if v is not None}
        m["content"] = _text_of(t.get("content"), f"messages[{i}]")
        msgs.append(m)
    return msgs


def detect_format(rec):
    for key, fmt in (("conversations", "sharegpt"), ("messages", "messages"),
                     ("input_ids", "tokens"), ("text", "text")):
        if key in rec:
            return fmt
    raise Malformed("no \"conversations\", \"messages\", \"text\" or \"input_ids\" field "
                    f"(keys: {', '.join(sorted(map(str, rec)))[:80]}); give --format if the "
                    "field has another name")


def _token_list(v, name):
    if not isinstance(v, (list, tuple, np.ndarray)):
        raise Malformed(f"\"{name}\" is not a list")
    try:
        a = np.asarray(v)
    except (ValueError, TypeError) as e:
        raise Malformed(f"\"{name}\" is not a flat list of integers") from e
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iub"):
        raise Malformed(f"\"{name}\" is not a flat list of integers")
    return a.astype(np.int64)


def _tokens_record(rec):
    ids = _token_list(rec.get("input_ids"), "input_ids")
    if ids.size and (ids.min() < 0 or ids.max() > 0x7FFFFFFF):
        raise Malformed("input_ids must be integers in 0..2147483647")
    if rec.get("loss_mask") is not None:
        mask = _token_list(rec["loss_mask"], "loss_mask")
        if mask.size != ids.size:
            raise Malformed(f"loss_mask has {mask.size} entries, input_ids has {ids.size}")
        if mask.size and (mask.min() < 0 or mask.max() > 1):
            raise Malformed("loss_mask entries must be 0 or 1")
    elif rec.get("labels") is not None:
        labels = _token_list(rec["labels"], "labels")
        if labels.size != ids.size:
            raise Malformed(f"labels has {labels.size} entries, input_ids has {ids.size}")
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
    mask = np.zeros(len(offsets), dtype=np.int64)
    k = 0
    for t, (a, b) in enumerate(offsets):
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if b > spans[k][0]:
            mask[t] = 1
    return mask


def load_tokenizer(path):
    if not path:
        return None
    if not os.path.isdir(path):
        raise UsageError(f"--tokenizer {path}: not a folder; give the target model's folder "
                         "(tokenizer.json, tokenizer_config.json)")
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise UsageError("tokenising needs transformers (pip install transformers tokenizers)") \
            from e
    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:
        raise UsageError(f"--tokenizer {path}: cannot load a tokenizer from it ({e})") from e


class Encoder:
    """Records -> (input_ids, loss_mask) with one tokenizer and chat template."""

    def __init__(self, opts):
        self.opts = opts
        self.tok = load_tokenizer(opts.tokenizer)
        self.template = None
        self.method = None
        if opts.chat_template:
            with open(opts.chat_template, encoding="utf-8") as f:
                self.template = f.read()
        elif self.tok is not None:
            t = self.tok.chat_template
            self.template = t.get("default", next(iter(t.values()))) if isinstance(t, dict) else t
        if self.template is not None:
            has_gen = bool(_GENERATION_RE.search(self.template))
            self.method = opts.mask_method
            if self.method == "auto":
                self.method = "generation" if has_gen else "prefix"
            if self.method == "generation" and not has_gen:
                raise UsageError("--mask-method generation: the chat template has no "
                                 "{% generation %} blocks; use --mask-method prefix (or auto)")
            if self.method == "prefix" and self.tok is not None and not self.tok.is_fast:
                raise UsageError(f"--tokenizer {opts.tokenizer}: the prefix mask method needs a "
                                 "fast tokenizer (tokenizer.json) for character offsets")

    def _need_tokenizer(self, what):
        if self.tok is None:
            raise UsageError(f"{what} records need a tokenizer: give --tokenizer DIR")

    def _render(self, msgs, tools, add_generation_prompt):
        return self.tok.apply_chat_template(msgs, tools=tools, chat_template=self.template,
                                            tokenize=False,
                                            add_generation_prompt=add_generation_prompt)

    def encode_chat(self, msgs, tools=None):
        self._need_tokenizer("conversation")
        if self.template is None:
            raise UsageError(f"--tokenizer {self.opts.tokenizer} has no chat template; give one "
                             "with --chat-template FILE")
        try:
            if self.method == "generation":
                out = self.tok.apply_chat_template(msgs, tools=tools, chat_template=self.template,
                                                   tokenize=True, return_dict=True,
                                                   return_assistant_tokens_mask=True)
                ids = np.asarray(out["input_ids"], dtype=np.int64)
                mask = np.asarray(out["assistant_masks"], dtype=np.int64)
            else:
                full = self._render(msgs, tools, False)
                spans = []
                for i, m in enumerate(msgs):
                    if m["role"] != "assistant":
                        continue
                    head = self._render(msgs[:i], tools, True)
                    body = self._render(msgs[:i + 1], tools, False)
                    if not (full.startswith(head) and full.startswith(body)
                            and len(head) <= len(body)):
                        raise Malformed(f"the chat template renders turn {i} differently inside "
                                        "the whole conversation than on its own (not prefix-"
                                        "stable); give the template {% generation %} blocks")
                    if len(body) > len(head):
                        spans.append((len(head), len(body)))
                enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
                ids = np.asarray(enc["input_ids"], dtype=np.int64)
                mask = spans_to_mask(enc["offset_mapping"], spans)
        except (Malformed, UsageError):
            raise
        except Exception as e:  # the template's own checks (raise_exception) and jinja errors
            raise Malformed(f"the chat template failed on this conversation: {e}") from e
        return ids, mask

    def encode_text(self, text):
        self._need_tokenizer("text")
        ids = np.asarray(self.tok(text, add_special_tokens=True)["input_ids"], dtype=np.int64)
        return ids, np.ones_like(ids)

    def encode(self, rec):
        """One record -> (format, ids, mask, truncated) or raises Malformed/Skip."""
        if not isinstance(rec, dict):
            raise Malformed(f"the record is a {type(rec).__name__}, not an object")
        fmt = self.opts.format if self.opts.format != "auto" else detect_format(rec)
        if fmt in ("sharegpt", "messages"):
            key = "conversations" if fmt == "sharegpt" else "messages"
            if key not in rec:
                raise Malformed(f"--format {fmt}: the record has no \"{key}\" field")
            msgs = _sharegpt_messages(rec[key]) if fmt == "sharegpt" else \
                _openai_messages(rec[key])
            if self.opts.system_prompt is not None and \
                    not any(m["role"] == "system" for m in msgs):
                msgs.insert(0, {"role": "system", "content": self.opts.system_prompt})
            if not any(m["role"] == "assistant" and (m["content"] or m.get("tool_calls"))
                       for m in msgs):
                raise Skip("empty_assistant", "no assistant turn with content")
            ids, mask = self.encode_chat(msgs, rec.get("tools"))
        elif fmt == "text":
            text = rec.get("text")
            if not isinstance(text, str):
                raise Malformed("\"text\" is missing or not a string")
            if not text:
                raise Skip("empty_assistant", "empty text")
            ids, mask = self.encode_text(text)
        else:
            if "input_ids" not in rec:
                raise Malformed("--format tokens: the record has no \"input_ids\" field")
            ids, mask = _tokens_record(rec)
        if self.opts.last_turn_only:
            mask = _last_run(mask)
        truncated = False
        limit = self.opts.max_seq_len
        if limit and ids.size > limit:
            if self.opts.overflow == "drop":
                raise Skip("dropped", f"{ids.size} tokens, above --max-seq-len {limit}")
            ids, mask, truncated = ids[:limit], mask[:limit], True
        if ids.size == 0 or not mask.any():
            raise Skip("empty_assistant", "no token has loss (nothing to train on)" +
                       (" after truncation" if truncated else ""))
        return fmt, ids.astype(np.int32), mask.astype(np.uint8), truncated


class Skip(Exception):
    def __init__(self, kind, why):
        super().__init__(why)
        self.kind = kind


# ---- workers -------------------------------------------------------------------------------------

_ENCODER = None


def _worker_init(opts):
    global _ENCODER
    _ENCODER = Encoder(opts)


def _encode_chunk(chunk):
    """[(loc, rec)] -> [(loc, outcome)]; an outcome is ("ok", fmt, ids, mask,
    truncated), (kind, why) for a skipped record, or ("usage", why)."""
    out = []
    for loc, rec in chunk:
        if isinstance(rec, Malformed):
            out.append((loc, ("malformed", str(rec))))
            continue
        try:
            out.append((loc, ("ok",) + _ENCODER.encode(rec)))
        except Malformed as e:
            out.append((loc, ("malformed", str(e))))
        except Skip as e:
            out.append((loc, (e.kind, str(e))))
        except UsageError as e:
            out.append((loc, ("usage", str(e))))
            break
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
        digest, files = _files_sha256(opts.tokenizer)
        tok = {"name": os.path.basename(os.path.normpath(opts.tokenizer)),
               "path": os.path.abspath(opts.tokenizer),
               "class": type(enc.tok).__name__, "files": files, "sha256": digest}
    template = None
    if enc.template is not None:
        template = {"source": opts.chat_template or "tokenizer",
                    "sha256": hashlib.sha256(enc.template.encode("utf-8")).hexdigest(),
                    "mask_method": enc.method}
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
                     "strict", "split")},
        "counts": {k: c[k] for k in ("read", "written", "truncated", "dropped",
                                     "empty_assistant", "malformed")},
        "tokens": {"total": counts.tokens, "loss": counts.loss_tokens},
        "by_format": counts.by_format,
        "seconds": round(seconds, 3),
    }


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
    records = iter_records(in_path, opts.split)
    writer = JsonlWriter(out_path) if out_path.endswith(".jsonl") else HstWriter(out_path)
    counts = Counts()
    reported = {}
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
            _worker_init(opts)
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
                    _, fmt, ids, mask, truncated = res
                    writer.add(ids, mask)
                    counts.written += 1
                    counts.truncated += truncated
                    counts.tokens += int(ids.size)
                    counts.loss_tokens += int(mask.sum())
                    counts.by_format[fmt] = counts.by_format.get(fmt, 0) + 1
                    continue
                setattr(counts, kind, getattr(counts, kind) + 1)
                if kind == "malformed" and opts.strict:
                    raise Malformed(f"{loc}: {res[1]} (--strict stops at the first malformed "
                                    "record)")
                n = reported[kind] = reported.get(kind, 0) + 1
                if kind == "malformed" and n <= MAX_REPORTS:
                    log(f"hsflow-data: {loc}: {res[1]}; record skipped")
            if bar is not None:
                bar.update(len(chunk))
        if counts.written == 0:
            raise UsageError(f"{in_path}: no usable records ({counts.read} read, "
                             f"{counts.malformed} malformed, {counts.empty_assistant} with no "
                             f"assistant tokens, {counts.dropped} too long); nothing written")
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
    if reported.get("malformed", 0) > MAX_REPORTS:
        log(f"hsflow-data: {reported['malformed'] - MAX_REPORTS} more malformed records "
            "not shown")
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


def build_parser():
    ap = argparse.ArgumentParser(
        prog="hsflow-data",
        description="Prepare training data for hsflow: conversations, text or token records "
                    "to the .hst files (or pre-tokenised JSONL) that hs-producer reads.")
    add_version_flag(ap)
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser(
        "prepare", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="tokenise with the target's chat template; loss on assistant tokens only",
        description="Tokenise IN with the target's tokenizer and chat template and write OUT: "
                    ".hst, or pre-tokenised JSONL when OUT ends in .jsonl. The loss mask covers "
                    "the assistant tokens. A sidecar OUT.meta.json records the tokenizer, the "
                    "template and the counts.",
        epilog="""inputs: JSONL, a JSON array, Parquet (.parquet), or a datasets folder (save_to_disk).
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
    p.add_argument("--tokenizer", metavar="DIR", default=_env_default("tokenizer", None),
                   help="the target model's folder (AutoTokenizer, local files only); not "
                        "needed for pre-tokenised records")
    p.add_argument("--format", choices=("auto",) + FORMATS,
                   default=_env_default("format", "auto"),
                   help="record format (default auto: per record, from its keys)")
    p.add_argument("--chat-template", metavar="FILE",
                   default=_env_default("chat-template", None),
                   help="a Jinja chat template to use instead of the tokenizer's")
    p.add_argument("--mask-method", choices=MASK_METHODS,
                   default=_env_default("mask-method", "auto"),
                   help="generation: the template's {%% generation %%} blocks (as "
                        "transformers); prefix: render turn by turn (templates without the "
                        "blocks); default auto: generation when the template has them")
    p.add_argument("--system-prompt", metavar="TEXT",
                   default=_env_default("system-prompt", None),
                   help="a system message for conversations that have none")
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
    p.add_argument("--split", default=_env_default("split", None),
                   help="the split of a DatasetDict folder (default train)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: shown when stderr is a terminal)")
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.command != "prepare":
        ap.print_help(sys.stderr if args.command is None else sys.stdout)
        return 2
    try:
        max_seq_len = _positive(str(args.max_seq_len))
        workers = _positive(str(args.workers))
    except argparse.ArgumentTypeError as e:
        print(f"hsflow-data: HS_MAX_SEQ_LEN / HS_WORKERS: {e}", file=sys.stderr)
        return 2
    opts = PrepareOptions(
        tokenizer=args.tokenizer, format=args.format, chat_template=args.chat_template,
        mask_method=args.mask_method, system_prompt=args.system_prompt,
        max_seq_len=max_seq_len, overflow=args.overflow, last_turn_only=args.last_turn_only,
        workers=workers, strict=args.strict, split=args.split,
        progress=False if args.no_progress else None)
    t0 = time.monotonic()
    try:
        counts, meta = prepare(args.input, args.output, opts)
    except UsageError as e:
        print(f"hsflow-data: {e}", file=sys.stderr)
        return 2
    except Malformed as e:
        print(f"hsflow-data: {e}; nothing written", file=sys.stderr)
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
