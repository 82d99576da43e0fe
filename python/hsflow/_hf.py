# SPDX-License-Identifier: Apache-2.0
"""The transformers side of hsflow-produce: checking a model folder, loading
only the decoder layers a run needs, and computing one ticket's hidden
states into their column slices of the wire layout.

Layer indices are Hugging Face output_hidden_states indices (docs/model.md):
0 is the input of decoder layer 0 (the embeddings), i (1 <= i < N) the
output of decoder layer i-1, N the last layer's output after the final norm.
A forward pre-hook on layer 0 catches index 0, a forward hook on layer i-1
catches index i, and a hook on the final norm catches index N. Each hook
copies the real tokens of its layer into columns [j*H, (j+1)*H) of the
batch's [T, k*H] output, so no full set of hidden states is ever kept.

Batches run packed (one row of T tokens, position ids restarting at each
sequence) with variable-length attention (flash_attention_*, kernels-hub,
flex), otherwise padded: the sequences longest first, right-padded in
[n, Lmax] calls of at most the token budget. Under the causal mask a real
token never sees the padding after it, so no attention mask is passed and
sdpa keeps its fastest (flash) kernel; the pads' states are dropped.

Packing is exact or not used. Attention (full and sliding-window) is kept
within each sequence by transformers from the restarting position ids: a
[T, T] block mask for sdpa, eager and flex, cu_seqlens for flash kernels
(passed here as cu_seq_lens_q/k, max_length_q/k). Layers that carry a state
along the sequence (linear attention such as Gated DeltaNet, Mamba-style
state-space mixers, short convolutions) are handed no boundary they honour
in every transformers path (its torch fallbacks ignore cu_seqlens), so such
a mixer runs on the packed row's sequences apart: its input is scattered
into a right-padded [n, Lmax] batch and its output gathered back
(per_sequence_mixers). Per-token layers (MLPs, mixture-of-experts) need
nothing. Whether a model's packed forward then equals each sequence alone
is not assumed: probe_packing runs a few short sequences both ways on every
decoder layer at load, and packing is refused naming the first layer (and
its layer types) that mixes sequences.
"""
import contextlib
import glob
import json
import os
import re

import numpy as np

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
          "half": "float16", "fp32": "float32", "float32": "float32", "float": "float32"}


class ModelError(ValueError):
    """A model folder that cannot serve the run; the text says what to do."""


def _transformers():
    from ._deps import MissingPackage, need
    try:
        need("torch", "hsflow-produce", "produce")
        return need("transformers", "hsflow-produce", "produce")
    except MissingPackage as e:
        raise ModelError(str(e)) from e


def inspect_model(model_dir):
    """Reads a model folder's config.json without transformers or weights (a
    quick check before any process starts). Returns a dict: n_layers,
    hidden_size, model_type, architecture, vlm (bool). Raises ModelError
    naming what is wrong. Whether transformers can build the model is found
    by the workers, before any of them connects."""
    if not os.path.isdir(model_dir):
        raise ModelError("--model %s: not a directory; give a local Hugging Face model folder "
                         "(config.json and the weights)" % model_dir)
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise ModelError("--model %s: no config.json there; give the folder that holds the "
                         "checkpoint's config.json and weights" % model_dir)
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelError("--model %s: config.json cannot be read as JSON (%s)" % (model_dir, e))
    if not isinstance(raw, dict):
        raise ModelError("--model %s: config.json is not a JSON object" % model_dir)
    weights = (glob.glob(os.path.join(model_dir, "*.safetensors")) +
               glob.glob(os.path.join(model_dir, "*.bin")) +
               glob.glob(os.path.join(model_dir, "*.pt")))
    if not weights:
        raise ModelError("--model %s: no weights (*.safetensors or pytorch_model*.bin) next to "
                         "config.json" % model_dir)
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    n, h = text.get("num_hidden_layers"), text.get("hidden_size")
    if not isinstance(n, int) or not isinstance(h, int):  # other field names: ask transformers
        cfg = load_config(model_dir, raw)
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        n = getattr(text_cfg, "num_hidden_layers", None)
        h = getattr(text_cfg, "hidden_size", None)
    if not isinstance(n, int) or n <= 0 or not isinstance(h, int) or h <= 0:
        raise ModelError("--model %s: the config gives no decoder layer count and hidden size "
                         "(num_hidden_layers=%r, hidden_size=%r)" % (model_dir, n, h))
    archs = raw.get("architectures") or ["?"]
    return {"n_layers": n, "hidden_size": h, "model_type": raw.get("model_type", "?"),
            "architecture": archs[0], "vlm": text is not raw}


def load_config(model_dir, raw=None):
    """transformers' config of the folder; ModelError when it cannot load it."""
    transformers = _transformers()
    try:
        return transformers.AutoConfig.from_pretrained(model_dir, local_files_only=True)
    except Exception as e:  # transformers raises ValueError, KeyError, OSError...
        if raw is None:
            try:
                with open(os.path.join(model_dir, "config.json")) as f:
                    raw = json.load(f)
            except (OSError, ValueError):
                raw = {}
        raise ModelError("--model %s: transformers %s cannot load this config (model_type %r): "
                         "%s. A newer transformers may know it (pip install -U transformers)"
                         % (model_dir, transformers.__version__, raw.get("model_type"),
                            str(e).splitlines()[0] if str(e) else type(e).__name__))


def dflash_layers(n_target, n_draft):
    """DFlash's default target layers for an n_draft-layer drafter on an
    n_target-layer target, as hsflow indices (DFlash's id + 1). More than one
    draft layer needs n_target >= n_draft + 3 (else they repeat): a
    ModelError naming the depth (hs_model_dflash_layers in C)."""
    if n_draft > 1 and n_target < n_draft + 3:
        raise ModelError("--dflash-layers %d: the model has %d decoder layers, too few for "
                         "DFlash's default set of %d draft layers (spread over decoder layers "
                         "1..N-3, it needs at least %d); give fewer draft layers or --layers "
                         "explicitly" % (n_draft, n_target, n_draft, n_draft + 3))
    if n_draft == 1:
        ids = [n_target // 2]
    else:
        ids = [round(1 + i * (n_target - 4) / (n_draft - 1)) for i in range(n_draft)]
    return [i + 1 for i in ids]


def eagle3_layers(n_target):
    """EAGLE-3's default target layers as speculators and vLLM define them:
    layer ids 2, N//2, N-3 (vLLM captures id i as the state entering decoder
    layer i, which is output_hidden_states[i], so hsflow's index is the same
    number) plus the final normed state N, which speculators' extraction
    appends. Needs N >= 7: a ModelError naming the depth
    (hs_model_eagle3_layers in C)."""
    if n_target < 7:
        raise ModelError("--eagle3-layers: the model has %d decoder layers, too few for EAGLE-3's "
                         "default set 2, N/2, N-3, N (it needs at least 7 for four distinct "
                         "layers in order); give --layers explicitly" % n_target)
    return [2, n_target // 2, n_target - 3, n_target]


def check_layers(layers, n_layers, model_dir):
    """Raises ModelError when an index is outside 0..n_layers."""
    bad = [i for i in layers if i < 0 or i > n_layers]
    if bad:
        raise ModelError("--layers asks for hidden state %d but the model at %s has %d layers "
                         "(valid: 0..%d; 0 = embeddings, i = output of decoder layer i-1, %d = "
                         "final normed output)" % (bad[0], model_dir, n_layers, n_layers,
                                                   n_layers))


def layers_to_run(layers, n_layers):
    """Decoder layers the forward needs: up to the highest captured index
    (index N needs all N and the final norm; index 0 needs layer 0's input)."""
    return max(1, min(max(layers), n_layers))


def packing_is_varlen(attn_implementation):
    """True when the attention implementation runs packed sequences as
    variable-length attention (flash_attention_2/3, kernels-hub kernels,
    flex's block masks): padding-free costs nothing extra there."""
    impl = attn_implementation or "sdpa"
    return "flash" in impl or "/" in impl or impl == "flex_attention"


def packing_masks_supported():
    """True when this transformers keeps packed sequences apart by their
    position ids for sdpa and eager attention (a [T, T] block mask)."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    return hasattr(masking_utils, "find_packed_sequence_indices")


def _model_class(cfg):
    """The transformers class load_decoder will build for this config, or
    None when no auto class maps it."""
    transformers = _transformers()
    for name in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel"):
        auto = getattr(transformers, name, None)
        try:
            return auto._model_mapping[type(cfg)]
        except (AttributeError, KeyError, ValueError):
            continue
    return None


def _importable(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def attn_implementations(cfg, device):
    """The attention implementations this model supports here, fastest
    first: flash_attention_3 and _2 (CUDA, with their packages installed),
    sdpa, flex_attention, eager. On the CPU: sdpa, eager (flex compiles its
    kernels; it is listed last)."""
    import torch
    cls = _model_class(cfg)
    sup = lambda a: cls is None or bool(getattr(cls, a, False))  # noqa: E731
    cuda = device != "cpu" and torch.cuda.is_available()
    out = []
    if cuda and sup("_supports_flash_attn"):
        if _importable("flash_attn_interface") and torch.cuda.get_device_capability()[0] >= 9:
            out.append("flash_attention_3")
        if _importable("flash_attn"):
            out.append("flash_attention_2")
    if sup("_supports_sdpa"):
        out.append("sdpa")
    if cuda and sup("_supports_flex_attn"):
        out.append("flex_attention")
    out.append("eager")
    if not cuda and sup("_supports_flex_attn"):
        out.append("flex_attention")
    return out


def resolve_attn_implementation(cfg, choice, device, model_dir):
    """--attn-implementation: 'auto' takes the fastest this model supports
    here (attn_implementations); a named one the model does not support is
    a ModelError naming the ones that work. Kernels-hub names
    (org/repo) and others transformers knows are passed through."""
    works = attn_implementations(cfg, device)
    if choice in (None, "", "auto"):
        return works[0]
    known = ("flash_attention_3", "flash_attention_2", "sdpa", "flex_attention", "eager")
    if choice in known and choice not in works:
        cls = _model_class(cfg)
        raise ModelError("--attn-implementation %s: %s (--model %s) cannot run it here%s; the "
                         "implementations that work: %s (or auto, which takes %s)"
                         % (choice, cls.__name__ if cls else "this model", model_dir,
                            " (its package is not installed or there is no CUDA device)"
                            if choice.startswith("flash") or choice == "flex_attention" else "",
                            ", ".join(works), works[0]))
    return choice


def _find_decoder(model):
    """The module holding the decoder layers (.layers, .embed_tokens, .norm):
    model.model for causal LMs, the language model of a vision-language one."""
    import torch
    best = None
    for name, m in model.named_modules():
        layers = getattr(m, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and hasattr(m, "embed_tokens"):
            if best is None or len(layers) > len(best[1].layers):
                best = (name, m)
    if best is None:
        raise ModelError("the loaded %s has no decoder module with .layers and .embed_tokens; "
                         "hsflow-produce runs decoder-only transformers models"
                         % type(model).__name__)
    return best[1]


def load_decoder(model_dir, n_run, dtype, attn_implementation, device):
    """Loads the checkpoint with only its first n_run decoder layers (the
    others' weights are skipped) on `device` and returns the decoder module
    (no LM head, no vision tower), in eval mode without gradients."""
    import torch
    transformers = _transformers()
    transformers.logging.set_verbosity_error()  # skipped layers' weights are expected
    transformers.logging.disable_progress_bar()
    cfg = load_config(model_dir)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n_all = text.num_hidden_layers
    if n_run < n_all:
        text.num_hidden_layers = n_run
        if isinstance(getattr(text, "layer_types", None), list):
            text.layer_types = text.layer_types[:n_run]
    attn_implementation = resolve_attn_implementation(cfg, attn_implementation, device,
                                                      model_dir)
    kw = {"config": cfg, "local_files_only": True, "attn_implementation": attn_implementation}
    major = int(transformers.__version__.split(".")[0])
    kw["dtype" if major >= 5 else "torch_dtype"] = getattr(torch, DTYPES[dtype])
    if device != "cpu":
        kw["device_map"] = {"": device}
    errors = []
    model = None
    for cls_name in ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel"):
        cls = getattr(transformers, cls_name, None)
        if cls is None:
            continue
        try:
            model = cls.from_pretrained(model_dir, **kw)
            break
        except ValueError as e:  # "Unrecognized configuration class ..." for this auto class
            errors.append("%s: %s" % (cls_name, str(e).splitlines()[0]))
            if "attn_implementation" in str(e) or "attention" in str(e).lower():
                raise ModelError("--attn-implementation %s: %s; the implementations that work "
                                 "here: %s" % (attn_implementation, str(e).splitlines()[0],
                                               ", ".join(attn_implementations(cfg, device))))
    if model is None:
        raise ModelError("--model %s: transformers cannot build a decoder from it (%s)"
                         % (model_dir, "; ".join(errors)))
    decoder = _find_decoder(model)
    if len(decoder.layers) > n_run:  # a model that builds layers from another field
        decoder.layers = decoder.layers[:n_run]
    if len(decoder.layers) != n_run:
        raise ModelError("--model %s: expected %d decoder layers after loading, found %d"
                         % (model_dir, n_run, len(decoder.layers)))
    del model
    decoder.eval().requires_grad_(False)
    if device == "cpu":
        decoder.to("cpu")
    return decoder, n_all


def final_norm(decoder):
    """The decoder's final norm (.norm, or .final_layernorm as in Bamba and
    Granite hybrids, .final_norm, .ln_f); ModelError when it has none."""
    for name in ("norm", "final_layernorm", "final_norm", "ln_f"):
        m = getattr(decoder, name, None)
        if m is not None:
            return m
    raise ModelError("%s has no final norm (.norm, .final_layernorm, .final_norm or .ln_f): "
                     "capture index %d (the final normed output) is not available; capture "
                     "up to %d instead" % (type(decoder).__name__, len(decoder.layers),
                                           len(decoder.layers) - 1))


class Capture:
    """Forward hooks writing captured layers into `out` [T, k*H] (set per
    forward call with begin()): column slice j gets layers[j]'s real tokens,
    at the chunk's dest rows."""

    def __init__(self, decoder, layers, n_layers, hidden_size):
        self.hidden_size = hidden_size
        self.out = None
        self.chunk = None
        self.seen = 0
        self._handles = []
        for j, layer in enumerate(layers):
            if layer == 0:
                h = decoder.layers[0].register_forward_pre_hook(self._pre_hook(j), with_kwargs=True)
            elif layer < n_layers:
                h = decoder.layers[layer - 1].register_forward_hook(self._hook(j))
            else:
                h = final_norm(decoder).register_forward_hook(self._hook(j))
            self._handles.append(h)

    def begin(self, out, chunk):
        self.out, self.chunk, self.seen = out, chunk, 0

    def _write(self, j, x):
        H = self.hidden_size
        flat = x.reshape(-1, H)
        dst = self.out[:, j * H:(j + 1) * H]
        if self.chunk.index is None:
            dst.copy_(flat)
        else:
            dst.index_copy_(0, self.chunk.dest, flat.index_select(0, self.chunk.index).to(dst.dtype))
        self.seen += 1

    def _pre_hook(self, j):
        def hook(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self._write(j, x)
        return hook

    def _hook(self, j):
        def hook(module, args, output):
            x = output[0] if isinstance(output, (tuple, list)) else output
            self._write(j, x)
        return hook

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []


class Chunk:
    """One forward call of a batch: model inputs, and where its real tokens
    go in the batch's [T, k*H] output (dest rows; None = all, in order).
    A packed chunk also carries its sequences' boundaries: `groups`, the
    right-padded sub-batches a per-sequence mixer runs ((n, L, row, col)
    index tensors, see per_sequence_mixers), and for flash kernels `varlen`,
    transformers' cu_seq_lens_q/k and max_length_q/k."""

    def __init__(self, input_ids, attention_mask, position_ids, index, dest, padded_tokens,
                 groups=None, varlen=None):
        self.input_ids, self.attention_mask, self.position_ids = input_ids, attention_mask, position_ids
        self.index, self.dest, self.padded_tokens = index, dest, padded_tokens
        self.groups, self.varlen = groups, varlen

    def run(self, decoder):
        ctx = getattr(decoder, "_hsflow_chunk", None)
        if ctx is not None:
            ctx[0] = self
        try:
            # a padded call (no position ids given) holds one sequence a row
            padded = self.position_ids is None
            with _known_unpacked() if padded else contextlib.nullcontext():
                decoder(input_ids=self.input_ids, attention_mask=self.attention_mask,
                        position_ids=self.position_ids, use_cache=False, **(self.varlen or {}))
        finally:
            if ctx is not None:
                ctx[0] = None


@contextlib.contextmanager
def _known_unpacked():
    """For a padded call, whose rows each hold one sequence at the model's
    own positions 0..L-1: transformers' packed-sequence check
    (masking_utils.find_packed_sequence_indices, run by every causal mask
    when no attention mask is given) returns None for such rows, but only
    after reading a GPU value on the host, a stream synchronisation per
    call that keeps the host from queueing the next forward while this one
    runs (on the H200, an 8-layer Llama call: 116 ms of host time against
    12 without it). The answer is known, so it is given without the read.
    Where transformers has no such function, nothing changes."""
    try:
        from transformers import masking_utils
    except ImportError:
        masking_utils = None
    orig = getattr(masking_utils, "find_packed_sequence_indices", None)
    if orig is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = _not_packed
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = orig


def _not_packed(position_ids):
    return None


def _to(a, device):
    """A numpy array on `device`; to a GPU through page-locked memory without
    blocking, so the next batch's inputs never wait for the running forward."""
    import torch
    t = torch.from_numpy(np.ascontiguousarray(a))
    if getattr(device, "type", device) == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _groups(lens, token_budget):
    """Sequence indices longest first, in groups whose right-padded [n, Lmax]
    holds at most max(token_budget, Lmax) tokens."""
    order = np.argsort(-lens, kind="stable")
    out, i = [], 0
    while i < len(order):
        L = int(lens[order[i]])
        n = max(1, min(len(order) - i, max(token_budget, L) // max(L, 1)))
        out.append(order[i:i + n])
        i += n
    return out


def _grid(cu, lens, seqs):
    """For the sequences `seqs`: (n, L, rows, cols, src): token src[j] of the
    packed row sits at [rows[j], cols[j]] of a right-padded [n, L] grid."""
    n, sl = len(seqs), lens[seqs]
    L = int(sl.max())
    rows = np.repeat(np.arange(n, dtype=np.int64), sl)
    cols = np.arange(int(sl.sum()), dtype=np.int64) - np.repeat(np.cumsum(sl) - sl, sl)
    src = np.repeat(cu[seqs], sl) + cols
    return n, L, rows, cols, src


def batch_chunks(input_ids, cu_seqlens, packed, token_budget, device, varlen=False):
    """The forward calls for one batch of the plan. Packed: one call over
    all T tokens with position ids restarting per sequence (and, with
    varlen=True for flash kernels, cu_seq_lens_q/k and max_length_q/k).
    Padded: the sequences longest first, right-padded and grouped so that
    each call's [n, Lmax] holds at most max(token_budget, Lmax) tokens."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    lens = np.diff(cu)
    T = int(cu[-1])
    ids = np.asarray(input_ids, dtype=np.int64)
    if packed:
        pos = np.arange(T, dtype=np.int64) - np.repeat(cu[:-1], lens)
        groups = []
        for seqs in _groups(lens, token_budget):
            n, L, rows, cols, src = _grid(cu, lens, seqs)
            groups.append((n, L, _to(rows, device), _to(cols, device), _to(src, device)))
        kw = None
        if varlen:
            c = _to(cu.astype(np.int32), device)
            m = int(lens.max()) if len(lens) else 0
            kw = {"cu_seq_lens_q": c, "cu_seq_lens_k": c, "max_length_q": m, "max_length_k": m}
        return [Chunk(_to(ids, device).view(1, T), None, _to(pos, device).view(1, T), None, None,
                      T, groups, kw)]
    chunks = []
    for seqs in _groups(lens, token_budget):
        n, L, rows, cols, src = _grid(cu, lens, seqs)
        grid = np.zeros((n, L), np.int64)
        grid[rows, cols] = ids[src]
        # Right padding under a causal mask: a real token never attends to a
        # pad, so no attention mask is passed (sdpa keeps its flash kernel);
        # the pads' own states are computed and dropped.
        # Position ids are each row's 0..L-1, transformers' default: passing
        # none also spares its packed-sequence check, a host sync per call.
        chunks.append(Chunk(_to(grid, device), None, None, _to(rows * L + cols, device),
                            _to(src, device), n * L))
    return chunks


# ---- what each layer needs to be packed ----------------------------------------

# Token mixers that carry a state along the sequence: linear attention (Gated
# DeltaNet, lightning attention, retention), state-space and Mamba mixers,
# short and causal convolutions, RG-LRU and RWKV blocks.
_STATEFUL = re.compile(r"DeltaNet|Delta_?Rule|Mamba|Mixer|SSM|ShortConv|Conv|Recurrent|RgLru|"
                       r"Rwkv|Lightning|LinearAttention|LinearAttn|Retention|Hyena|"
                       r"TemporalBlock|Mlstm|Slstm", re.I)
_ATTENTION = re.compile(r"Attention|Attn", re.I)
_PER_TOKEN = re.compile(r"MLP|MoE|Moe|Expert|FeedForward|FFN|Norm|Linear|Dropout|Identity|"
                        r"Embedding|Router|Gate|Act|Scale|Rotary", re.I)


def layer_kinds(decoder):
    """For each decoder layer, its direct submodules' (name, class, kind),
    kind one of 'stateful' (a mixer carrying a state along the sequence,
    run per sequence when packed), 'attention' (kept within each sequence by
    transformers' packed masks or cu_seqlens), 'per-token' (MLP, MoE, norms)
    or 'other'."""
    out = []
    for layer in decoder.layers:
        row = []
        for name, m in layer.named_children():
            cls = type(m).__name__
            if _STATEFUL.search(cls):
                kind = "stateful"
            elif _ATTENTION.search(cls):
                kind = "attention"
            elif _PER_TOKEN.search(cls):
                kind = "per-token"
            elif re.search(r"^(linear_attn|mamba|mixer|conv|short_conv|ssm|temporal_block|"
                           r"recurrent)$", name):
                kind = "stateful"
            elif _ATTENTION.search(name):
                kind = "attention"
            elif _PER_TOKEN.search(name):
                kind = "per-token"
            else:
                kind = "other"
            row.append((name, cls, kind))
        out.append(row)
    return out


def describe_layer(decoder, i):
    """'decoder layer i (Qwen3NextDecoderLayer: linear_attn Qwen3NextGatedDeltaNet
    (stateful), mlp Qwen3NextSparseMoeBlock (per-token))', naming its types."""
    kinds = layer_kinds(decoder)[i]
    parts = ["%s %s (%s)" % (n, c, k) for n, c, k in kinds if k != "per-token" or "oe" in c]
    return "decoder layer %d (%s: %s)" % (i, type(decoder.layers[i]).__name__,
                                          ", ".join(parts) or "no submodules")


_BOUNDARY_KW = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
                "cu_seqlens", "position_ids", "cache_position", "attention_mask")


def per_sequence_mixers(decoder):
    """Makes every stateful mixer of the decoder (layer_kinds) run on the
    sequences of a packed chunk apart: its [1, T, H] input is scattered into
    the chunk's right-padded [n, Lmax, H] groups, the mixer runs on each
    group with no boundary arguments (each row starts its own state; causal,
    so a real token never sees the pads after it), and the real tokens'
    outputs are gathered back into [1, T, H]. Outside a packed chunk the
    mixer runs as before. Returns the wrapped mixers as (layer, name, class)."""
    ctx = getattr(decoder, "_hsflow_chunk", None)
    if ctx is None:
        ctx = [None]
        decoder._hsflow_chunk = ctx
    wrapped = []
    for i, (layer, kinds) in enumerate(zip(decoder.layers, layer_kinds(decoder))):
        for name, cls, kind in kinds:
            if kind != "stateful":
                continue
            mod = getattr(layer, name)
            orig = mod.forward

            def forward(*args, _orig=orig, **kw):
                c = ctx[0]
                if c is None or c.groups is None:
                    return _orig(*args, **kw)
                if args:
                    x, args = args[0], args[1:]
                else:
                    x = kw.pop("hidden_states")
                for k in _BOUNDARY_KW:
                    if k in kw:
                        kw[k] = None
                flat = x.reshape(x.shape[-2], x.shape[-1])
                out, rest = None, None
                for n, L, rows, cols, src in c.groups:
                    g = flat.new_zeros((n, L, flat.shape[-1]))
                    g[rows, cols] = flat.index_select(0, src)
                    y = _orig(g, *args, **kw)
                    if isinstance(y, (tuple, list)):
                        y, rest = y[0], tuple(y[1:])
                    if out is None:
                        out = y.new_empty((1, flat.shape[0], y.shape[-1]))
                    out[0].index_copy_(0, src, y[rows, cols])
                return out if rest is None else (out,) + rest
            mod.forward = forward
            wrapped.append((i, name, cls))
    return wrapped


def _parity(got, ref):
    """hs-forward's parity bound, relative to the layer's scale: (relative
    L2 error, max error over max |ref|); within bf16 noise when the first is
    <= 2e-2 and the second <= 6e-2."""
    d = (got.float() - ref.float())
    rn = float(ref.float().norm()) or 1e-30
    rm = float(ref.float().abs().max()) or 1e-30
    return float(d.norm()) / rn, float(d.abs().max()) / rm


PARITY_L2, PARITY_MAX = 2e-2, 6e-2


def probe_packing(decoder, device, lens=(5, 11, 7), seed=0):
    """Runs a few short random sequences packed into one row and each alone,
    hooking every decoder layer; returns None when every layer's states of
    every sequence agree within bf16 noise (_parity), else the text naming
    the first layer (and its types) that differs, the sequence and the
    error."""
    import torch
    vocab = decoder.embed_tokens.num_embeddings
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (int(sum(lens)),), generator=g).numpy()
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    got = {}

    def hook(i):
        def h(module, args, output):
            x = output[0] if isinstance(output, (tuple, list)) else output
            got.setdefault(i, []).append(x.detach().reshape(-1, x.shape[-1]).clone())
        return h
    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(decoder.layers)]
    try:
        with torch.inference_mode():
            varlen = getattr(decoder.config, "_attn_implementation", "") or ""
            batch_chunks(ids, cu, True, 1 << 20, device, varlen="flash" in varlen)[0].run(decoder)
            packed = {i: v[0] for i, v in got.items()}
            for s in range(len(lens)):
                got.clear()
                batch_chunks(ids[cu[s]:cu[s + 1]], np.array([0, lens[s]]), False, 1 << 20,
                             device)[0].run(decoder)
                for i in range(len(decoder.layers)):
                    l2, mx = _parity(packed[i][cu[s]:cu[s + 1]], got[i][0])
                    if l2 > PARITY_L2 or mx > PARITY_MAX:
                        return ("%s gives sequence %d of %d (%d tokens, after %d packed before it) "
                                "other states packed than alone: relative error %.3g (bound %g)"
                                % (describe_layer(decoder, i), s, len(lens), lens[s], cu[s], l2,
                                   PARITY_L2))
    finally:
        for h in handles:
            h.remove()
    return None
