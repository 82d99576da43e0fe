# SPDX-License-Identifier: Apache-2.0
"""hsflow batches as SpecForge's DFlash-family training batches.

SpecForge (SGLang's drafter trainer, specforge 0.2) trains its DFlash,
Domino and DSpark drafters on [B, S] rows: its offline path reads one
feature file per sample, normalizes it (normalize_offline_sample: each
tensor cut to max_len, a batch dimension of one, and the sample refused
unless its loss mask has two consecutive supervised tokens) and its
collator right-pads the samples of a step with zeros to the longest and
stacks them. batches() makes that same dict from each hsflow batch, one
sample per row (not packed: the DFlash mask lets a block see every context
token before its anchor and has no document ids):

    import hsflow
    from hsflow.integrations import specforge as hs_sf

    model = OnlineDFlashModel(draft, lm_head, embed_tokens, mask_token_id, ...)
    with hsflow.Consumer(listen="0.0.0.0:7000", gpu=0, arrays="torch") as c:
        for d in hs_sf.batches(c, model):
            loss, accuracy, metrics = model(**d)
            loss.backward()
            ...

Each dict holds, for the n samples of one batch, S the longest:
  input_ids      [n, S] int64   right-padded with 0
  loss_mask      [n, S] int64   0 on the padding
  hidden_states  [n, S, k*H]    the drafter's target_layer_ids, concatenated
                                in its order, as SpecForge's capture writes
                                them; zeros on the padding
and, for DSpark only (its input is DFlash's plus this key):
  target_last_hidden_states [n, S, H]  the target's final state, after its
                                final norm: hsflow's layer N (L)
on the consumer's device, in the delivered dtype (bf16, the target's).
These are every key, dtype and shape SpecForge's collator gives the model
(build_collator / build_dspark_collator over normalize_offline_sample /
normalize_dspark_offline_sample), and nothing else: the dict goes into the
model's forward as it is.

Layers (docs/model.md): SpecForge names a target layer by its zero-based
decoder layer id j, captured after that layer: hsflow's index j + 1. The
producers must capture the drafter's target_layer_ids plus one, in that
order (and, for DSpark, L = N last); anything else is refused naming the
--layers to give. DSpark's target_last_hidden_states is what SGLang's
logits processor gets (the state its lm_head reads, after the final norm;
the model projects it with the target's lm_head as it is), so hsflow's L
is that state exactly. A context layer at hsflow's N (SpecForge id N - 1)
is refused: hsflow's N is after the norm and SpecForge's capture of the
last decoder layer is not.

Refused samples: a sample whose loss mask (after the max_len cut) has no
two consecutive supervised tokens gives DFlash no anchor; SpecForge's data
preparation drops it and its normalizer raises. batches() leaves it out of
the row set, counts it (the iterator's `refused`, `refused_ids`) and says
so; a batch with no sample left yields nothing. Past max_refused (a
fraction of the samples seen, checked once 100 were seen and at the end)
the iteration fails naming the count, since a dataset of that many
reply-less samples is most likely masked wrongly.
"""
import sys

import numpy as np

# SpecForge algorithm -> whether its model takes target_last_hidden_states.
# Domino takes exactly DFlash's input; DSpark DFlash's plus the final state.
ALGORITHMS = {"dflash": False, "domino": False, "dspark": True}


class LayoutError(ValueError):
    """The producers' layout does not fit the drafter; the text says what to give."""


class RefusedError(RuntimeError):
    """More samples were refused than max_refused allows."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("hsflow.integrations.specforge needs torch and specforge (%s): "
                          "scripts/install-engine-venv, or pip install torch transformers "
                          "pyyaml psutil and pip install --no-deps specforge==0.2.*"
                          % e) from None
    return torch


def _unwrap(model):
    """The SpecForge model inside a DDP / FSDP / compile wrapper."""
    seen = 0
    while not hasattr(model, "draft_model") and not hasattr(model, "target_layer_ids") and \
            hasattr(model, "module") and seen < 4:
        model, seen = model.module, seen + 1
    if hasattr(model, "_orig_mod"):
        model = model._orig_mod
    return model


def algorithm(model):
    """SpecForge's algorithm name of `model`: its training model
    (OnlineDFlashModel, OnlineDominoModel, OnlineDSparkModel) or its draft
    model (DFlashDraftModel, DominoDraftModel, DSparkDraftModel)."""
    m = _unwrap(model)
    names = [c.__name__ for c in type(m).__mro__]
    for alg, online, draft in (("dspark", "OnlineDSparkModel", "DSparkDraftModel"),
                               ("domino", "OnlineDominoModel", "DominoDraftModel"),
                               ("dflash", "OnlineDFlashModel", "DFlashDraftModel")):
        if online in names or draft in names:
            return alg
    raise TypeError("%s is not one of SpecForge's DFlash-family models (OnlineDFlashModel, "
                    "OnlineDominoModel, OnlineDSparkModel or their draft models); "
                    "hsflow.integrations.specforge serves those" % type(m).__name__)


def _draft(model):
    m = _unwrap(model)
    return getattr(m, "draft_model", m)


def target_layer_ids(model):
    """The drafter's target_layer_ids: SpecForge's zero-based decoder ids."""
    ids = getattr(_draft(model), "target_layer_ids", None)
    if not ids:
        raise TypeError("%s has no target_layer_ids" % type(_draft(model)).__name__)
    return [int(i) for i in ids]


def target_layer_count(model):
    """N, the target's decoder layer count, from the drafter's config
    (num_target_layers, which SpecForge's generated configs hold)."""
    n = getattr(getattr(_draft(model), "config", None), "num_target_layers", None)
    if not isinstance(n, int) or n < 1:
        raise LayoutError("the drafter's config has no num_target_layers; pass "
                          "n_target_layers= (the target's num_hidden_layers)")
    return n


def producer_layers(model, n_target_layers=None):
    """The layers (hsflow indices) the producers must capture for `model`,
    in order: its target_layer_ids plus one, then for DSpark L = N. As the
    --layers text: ','.join(map(str, ...))."""
    with_last = ALGORITHMS[algorithm(model)]
    n = int(n_target_layers) if n_target_layers is not None else target_layer_count(model)
    ctx = [j + 1 for j in target_layer_ids(model)]
    bad = [j for j in target_layer_ids(model) if j < 0 or j + 1 >= n]
    if bad:
        raise LayoutError(
            "the drafter's target_layer_ids %s include %s, which hsflow does not deliver as "
            "SpecForge captures it: ids run 0..%d for a %d-layer target, and id %d (hsflow "
            "index %d) is after the final norm in hsflow and before it in SpecForge's capture; "
            "build the drafter with other target_layer_ids" % (
                target_layer_ids(model), bad, n - 2, n, n - 1, n))
    return ctx + ([n] if with_last else [])


def check_layout(layers, model, n_target_layers=None):
    """Raises LayoutError unless a batch of `layers` (hsflow indices) fits `model`."""
    want = producer_layers(model, n_target_layers)
    got = [int(x) for x in layers]
    if got != want:
        alg = algorithm(model)
        raise LayoutError(
            "the producers capture layers %s, but SpecForge's %s drafter reads target_layer_ids "
            "%s (hsflow indices %s)%s: give the producers --layers %s" % (
                got, alg, target_layer_ids(model), [j + 1 for j in target_layer_ids(model)],
                ", then the final normed state L = %d" % want[-1] if ALGORITHMS[alg] else "",
                ",".join(str(x) for x in want)))


def anchored(loss_mask, cu_seqlens):
    """[n] bool: which samples of a packed batch have two consecutive
    supervised tokens (SpecForge's has_consecutive_supervised_tokens, per
    sample). loss_mask [T] (torch or numpy), cu_seqlens [n+1]."""
    m = np.asarray(loss_mask.cpu().numpy() if hasattr(loss_mask, "cpu") else loss_mask) != 0
    cu = np.asarray(cu_seqlens.cpu().numpy() if hasattr(cu_seqlens, "cpu") else cu_seqlens,
                    dtype=np.int64)
    pair = np.zeros(m.shape[0], dtype=np.int64)  # pair[t]: t and t + 1 both supervised
    if m.shape[0] > 1:
        pair[:-1] = m[:-1] & m[1:]
    ends = cu[1:-1][cu[1:-1] > 0]
    pair[ends - 1] = 0  # a pair across a sample boundary is not one
    cs = np.concatenate([[0], np.cumsum(pair)])
    return cs[cu[1:]] - cs[cu[:-1]] > 0


def collate(batch, with_last=False, max_len=None):
    """(dict, kept) for one hsflow Batch (torch arrays): the SpecForge dict
    (see the module's text) of the samples with anchors, and the [n] bool
    numpy array of which samples were kept. with_last: the batch's last
    layer is target_last_hidden_states (DSpark) and not context. max_len:
    cut each sample to its first max_len tokens, as SpecForge's normalizer
    does (None: whole samples). Returns (None, kept) when none is kept."""
    torch = _torch()
    hs = batch.hidden_states
    if not torch.is_tensor(hs):
        raise TypeError("the consumer delivers numpy arrays; build it with "
                        "hsflow.Consumer(..., arrays='torch')")
    dev = hs.device
    H, k = batch.hidden_size, batch.n_layers
    cu = batch.cu_seqlens
    cu = (cu.cpu().numpy() if torch.is_tensor(cu) else np.asarray(cu)).astype(np.int64)
    starts, lens = cu[:-1], np.diff(cu)
    if max_len is not None:
        lens = np.minimum(lens, int(max_len))
    # the anchor check on the cut samples: their masks, re-packed
    mask_np = batch.loss_mask
    mask_np = mask_np.cpu().numpy() if torch.is_tensor(mask_np) else np.asarray(mask_np)
    idx_np = np.concatenate([np.arange(s, s + ln) for s, ln in zip(starts, lens)]) \
        if len(lens) else np.zeros(0, np.int64)
    kept = anchored(mask_np[idx_np], np.concatenate([[0], np.cumsum(lens)]))
    if not kept.any():
        return None, kept
    starts, lens = starts[kept], lens[kept]
    S = int(lens.max())
    n = int(starts.shape[0])
    ar = np.arange(S, dtype=np.int64)
    valid_np = ar[None, :] < lens[:, None]
    idx_np = np.where(valid_np, starts[:, None] + ar[None, :], 0)
    idx = torch.from_numpy(idx_np).to(dev, non_blocking=True)
    valid = torch.from_numpy(valid_np).to(dev, non_blocking=True)

    def rows(a):  # a [T, ...] -> [n, S, ...], zeros past each sample's end
        g = a[idx]
        v = valid.view(n, S, *([1] * (g.dim() - 2)))
        return torch.where(v, g, torch.zeros((), dtype=g.dtype, device=dev))

    ctx_layers = k - 1 if with_last else k
    d = {
        "input_ids": rows(batch.input_ids.to(torch.int64)),
        "loss_mask": rows(batch.loss_mask.to(torch.int64)),
        "hidden_states": rows(hs[:, :ctx_layers * H]),
    }
    if with_last:
        d["target_last_hidden_states"] = rows(hs[:, ctx_layers * H:])
    return d, kept


class Feed:
    """The iterator batches() returns: SpecForge dicts, and the count of
    samples refused (no two consecutive supervised tokens).

    refused: samples refused so far; refused_ids: their dataset indices (the
    first 1000); samples: samples seen; rows: the dataset indices of the
    last dict's rows, in row order; tokens: the last dict's tokens, padding
    not counted."""

    def __init__(self, consumer, model, n_target_layers, with_batch, idle, max_len,
                 max_refused):
        self._consumer, self._model = consumer, model
        self._with_last = ALGORITHMS[algorithm(model)]
        self._n_target = n_target_layers
        self._with_batch, self._idle, self._max_len = with_batch, idle, max_len
        self.max_refused = max_refused
        self.refused, self.refused_ids, self.samples, self.rows, self.tokens = 0, [], 0, [], 0
        self._gen = self._iterate()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._gen)

    def _check_refused(self, final):
        if self.max_refused is None or not self.refused:
            return
        if (final or self.samples >= 100) and self.refused > self.max_refused * self.samples:
            raise RefusedError(
                "%d of %d samples had no two consecutive supervised tokens (SpecForge's DFlash "
                "family needs them for an anchor) and were refused, more than max_refused=%g of "
                "them: check the data's loss masks (hs-data stats), or raise max_refused"
                % (self.refused, self.samples, self.max_refused))

    def _iterate(self):
        torch = _torch()
        checked = None
        while True:
            try:
                b = self._consumer.next_batch(timeout=1.0 if self._idle is not None else None)
            except StopIteration:
                self._check_refused(True)
                return
            if b is None:
                self._idle()
                continue
            if b.layers != checked:
                check_layout(b.layers, self._model, self._n_target)
                checked = b.layers
            d, kept = collate(b, self._with_last, self._max_len)
            sid = b.sample_ids
            sid = (sid.cpu().numpy() if torch.is_tensor(sid) else np.asarray(sid)).astype(
                np.int64)
            self.samples += int(kept.shape[0])
            if not kept.all():
                gone = sid[~kept].tolist()
                self.refused += len(gone)
                room = 1000 - len(self.refused_ids)
                self.refused_ids.extend(gone[:max(room, 0)])
                print("hsflow.integrations.specforge: refused sample(s) %s of epoch %d batch %d: "
                      "no two consecutive supervised tokens (%d refused of %d seen)"
                      % (gone[:8] + (["..."] if len(gone) > 8 else []), b.epoch, b.batch,
                         self.refused, self.samples), file=sys.stderr, flush=True)
            self._check_refused(False)
            if d is None:
                continue
            self.rows = sid[kept].tolist()
            cu = b.cu_seqlens
            lens = np.diff(np.asarray(cu.cpu() if torch.is_tensor(cu) else cu, dtype=np.int64))
            if self._max_len is not None:
                lens = np.minimum(lens, self._max_len)
            self.tokens = int(lens[kept].sum())
            yield (b, d) if self._with_batch else d


def batches(consumer, model, n_target_layers=None, with_batch=False, idle=None, max_len=None,
            max_refused=0.05):
    """A Feed over the consumer's batches: for each, the dict SpecForge's
    offline collator makes for its samples (see the module's text); `loss,
    accuracy, metrics = model(**d)` works as it is. The consumer's previous
    batch is released when the next dict is asked for.

    model: SpecForge's OnlineDFlashModel, OnlineDominoModel or
    OnlineDSparkModel (or its draft model, or a DDP wrapper). Its draft's
    target_layer_ids decide the layers the producers must send (refused
    otherwise, naming the --layers to give); DSpark adds L.
    n_target_layers: the target's layer count where the draft config has
    no num_target_layers. with_batch=True yields (hsflow.Batch, dict) pairs.
    idle: called about once a second while no batch has come; an exception
    it raises ends the iteration with it. max_len: SpecForge's
    data.max_length cut (None: whole samples). max_refused: the fraction of
    samples that may be refused (no anchor) before the iteration fails
    (None: no limit)."""
    producer_layers(model, n_target_layers)  # the model checked now, not at the first batch
    if max_len is not None and (not isinstance(max_len, int) or max_len < 2):
        raise ValueError("max_len must be a whole number >= 2 or None, not %r" % (max_len,))
    if max_refused is not None and not 0 <= max_refused <= 1:
        raise ValueError("max_refused is a fraction in [0, 1] or None, not %r" % (max_refused,))
    return Feed(consumer, model, n_target_layers, with_batch, idle, max_len, max_refused)
