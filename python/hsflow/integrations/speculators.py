# SPDX-License-Identifier: Apache-2.0
"""hsflow batches as speculators' training batches (EAGLE-3 and DFlash).

speculators (vLLM's drafter training library) trains on one packed row per
step: the dict its collate (speculators/train/data.py, CollateFn) makes from
a list of samples. batches() makes the same dict from each hsflow batch,
without the padding up to --total-seq-len:

    import hsflow
    from hsflow.integrations import speculators as hs_spec

    model = DFlashDraftModel.from_training_args(...)      # or Eagle3DraftModel
    with hsflow.Consumer(listen="0.0.0.0:7000", gpu=0, arrays="torch") as c:
        for d in hs_spec.batches(c, model):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss, metrics = model(**d, **train_kwargs)
            loss.backward()
            ...

Each dict holds, for the n samples of T tokens of one batch:
  hidden_states               [1, T, k*H] bf16  every captured layer but the last
  verifier_last_hidden_states [1, T, H]   bf16  the last captured layer: L
  input_ids, loss_mask        [1, T] int64
  position_ids                [1, T] int64      from 0 in each sample
  document_ids                [1, T] int64      the sample's index in the batch
  lengths, sample_ids         [n]    int64      sample_ids: the dataset's index
  error_records               0                 (speculators counts dropped
                                                samples; hsflow drops none)
on the consumer's device (its GPU, or the host). For EAGLE-3 the samples
are shifted first as speculators' own pipeline does (shift_batch, its
per-sample preprocess for eagle3): each sample loses its first token's
ids, mask and target state and its last token's context states, so T is
the batch's tokens less n, and position ids start at 1.

Padding: speculators' EAGLE-3 on flex attention (its default) needs a row
of whole 128-token flex blocks; batches() pads its rows to that multiple
as speculators' collate pads (zeros, document id -1), and no other row
(pad_to, flex_block_multiple).

Views: for DFlash the two hidden-state tensors are views of the delivered
batch (its columns), with no copy; EAGLE-3's shift needs a gather (one
device copy of the states). The token-sized tensors are converted to int64
as the collate makes them. The batch is released, and the views become
invalid, when the next dict is asked for: copy what you keep.

Layers (docs/model.md): speculators numbers a target layer as Hugging Face's
output_hidden_states does, which is hsflow's numbering, except for the last:
its verifier_last_hidden_states comes from vLLM's capture at id N, the last
decoder layer's output *before* the final norm, and the model applies the
verifier's final norm itself (verifier_norm). hsflow's index N (L) is the
output *after* that norm, the state the verifier's lm_head reads. batches()
therefore makes the model's verifier_norm pass its input through
(use_normed_targets): the targets are then lm_head(L), exactly the
verifier's logits, where the norm applied twice would have mis-scaled them.
The producers must capture the drafter's target_layer_ids and then L, in
that order; anything else is refused naming the --layers to give.
"""
import numpy as np

# speculators' algorithm name -> whether its pipeline shifts each sample
# (train/cli.py: preprocess_fns, shift_batch for eagle3).
ALGORITHMS = {"eagle3": True, "dflash": False}


class LayoutError(ValueError):
    """The producers' layout does not fit the drafter; the text says what to give."""


def _torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("hsflow.integrations.speculators needs torch and speculators (%s): "
                          "pip install 'hsflow[speculators]'" % e) from None
    return torch


def _unwrap(model):
    """The speculators model inside a DDP / FSDP / compile wrapper."""
    seen = 0
    while not hasattr(model, "config") and hasattr(model, "module") and seen < 4:
        model, seen = model.module, seen + 1
    if not hasattr(model, "config") and hasattr(model, "_orig_mod"):
        model = model._orig_mod
    return model


def speculators_default_layer_ids(n_target):
    """speculators' default target_layer_ids for an n_target-layer verifier
    (models/utils.py, resolve_target_layer_ids with none given), for EAGLE-3
    and DFlash alike: [2, N // 2, N - 3]. Refused, as speculators refuses
    it, where those repeat or leave 0..N (targets of fewer than 7 layers)."""
    ids = [2, n_target // 2, n_target - 3]
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) > n_target:
        raise ValueError("speculators' default target layers %s are not distinct layers of a "
                         "%d-layer target; give the drafter target_layer_ids and the producers "
                         "--layers explicitly" % (ids, n_target))
    return ids


def eagle3_layers(n_target):
    """The layers hsflow's producers capture for speculators' default
    EAGLE-3 drafter: its default target_layer_ids, then L = n_target, the
    final normed output (speculators' launch_vllm.py appends the last layer
    the same way, --include-last-layer)."""
    return speculators_default_layer_ids(n_target) + [n_target]


def algorithm(model):
    """speculators' algorithm name of `model` ('eagle3', 'dflash', ...)."""
    m = _unwrap(model)
    sc = getattr(getattr(m, "config", None), "speculators_config", None)
    alg = getattr(sc, "algorithm", None)
    if alg is None:
        raise TypeError("%s is not a speculators drafter (no config.speculators_config."
                        "algorithm); build it with Eagle3DraftModel / DFlashDraftModel"
                        % type(m).__name__)
    return alg


def target_layers(model):
    """The drafter's target_layer_ids: hsflow indices of every captured
    layer but the last."""
    ids = getattr(_unwrap(model), "target_layer_ids", None)
    if not ids:
        raise TypeError("%s has no target_layer_ids" % type(_unwrap(model)).__name__)
    return [int(i) for i in ids]


def target_layer_count(model):
    """N, the verifier's decoder layer count (hsflow's index of the final
    normed output), read from the verifier config the drafter names."""
    m = _unwrap(model)
    sc = m.config.speculators_config
    path = getattr(getattr(sc, "verifier", None), "name_or_path", None)
    if not path:
        raise LayoutError("the drafter's config names no verifier (speculators_config.verifier."
                          "name_or_path); pass n_target_layers= (the target's "
                          "num_hidden_layers)")
    from speculators.models.utils import get_verifier_config
    return int(get_verifier_config(path).num_hidden_layers)


def producer_layers(model, n_target_layers=None):
    """The layers the producers must capture for `model`, in order: its
    target_layer_ids, then L. As the --layers text: ','.join(map(str, ...))."""
    n = n_target_layers if n_target_layers is not None else target_layer_count(model)
    return target_layers(model) + [int(n)]


def use_normed_targets(model):
    """Makes the drafter's verifier_norm pass its input through, so that its
    targets are lm_head(L) from hsflow's final normed state L (speculators'
    own data carries the state before that norm and applies it here). The
    module and its weight stay (checkpoints keep their keys); a forward hook
    returns the input. Idempotent."""
    m = _unwrap(model)
    norm = getattr(m, "verifier_norm", None)
    if norm is None:
        raise TypeError("%s has no verifier_norm; hsflow.integrations.speculators serves "
                        "speculators' eagle3 and dflash drafters" % type(m).__name__)
    if not getattr(norm, "_hsflow_passes_input", False):
        norm.register_forward_hook(lambda module, args, output: args[0])
        norm._hsflow_passes_input = True
    return model


def check_layout(layers, hidden_size, model, n_target_layers=None):
    """Raises LayoutError unless a batch of `layers` (hsflow indices) and
    `hidden_size` fits `model`: its target_layer_ids, then L."""
    want = producer_layers(model, n_target_layers)
    L = want[-1]
    got = [int(x) for x in layers]
    flag = ",".join(str(x) for x in want)
    m = _unwrap(model)
    H = getattr(getattr(m.config, "transformer_layer_config", None), "hidden_size", None)
    if H is not None and int(hidden_size) != int(H):
        raise LayoutError("the producers send hidden states of width %d, the drafter was built "
                          "for a verifier of hidden size %d: the producers and the drafter must "
                          "name the same target" % (hidden_size, H))
    if not got or got[-1] != L:
        raise LayoutError(
            "the producers capture layers %s, but speculators trains against the target's final "
            "normed output (hsflow index %d = L, its verifier_last_hidden_states), which must "
            "come last: give the producers --layers %s%s"
            % (got, L, flag, " (--eagle3-layers gives that set for the default EAGLE-3 drafter)"
               if want == eagle3_layers(L) else ""))
    if got[:-1] != want[:-1]:
        raise LayoutError(
            "the producers capture layers %s before L=%d, but the drafter was built with "
            "target_layer_ids %s: give the producers --layers %s, or build the drafter with "
            "target_layer_ids=%s" % (got[:-1], L, want[:-1], flag, got[:-1]))


def _lengths_as_collated(lengths, total):
    """speculators' CollateFn keeps lengths while they fit max_len (here the
    batch's tokens), the last one cut to what is left; the rest go."""
    out, cum = [], 0
    for ln in lengths:
        ln = int(ln)
        if ln + cum >= total:
            out.append(total - cum)
            break
        out.append(ln)
        cum += ln
    return out


def flex_block_multiple(model):
    """The multiple of tokens a row must have for this drafter. speculators'
    EAGLE-3 on flex attention (its default, simple_flex_attention) extends
    its block mask for each draft step by whole blocks
    (eagle3/attention.py: extend_mask_for_draft_tokens assumes the row is a
    whole number of flex blocks), which its collate gives by padding to
    --total-seq-len; a row of any other length fails in flex_attention (or,
    were it let through, would attend across the block edges). Other
    drafters and attention implementations take any length: 1."""
    m = _unwrap(model)
    if algorithm(m) != "eagle3" or getattr(m, "_attn_impl", None) != "simple_flex_attention":
        return 1
    try:
        from torch.nn.attention.flex_attention import _DEFAULT_SPARSE_BLOCK_SIZE as block
    except ImportError:
        block = 128
    return int(block)


def _padded(a, n, value=0):
    """a [T, ...] with rows appended up to n, filled with value (what
    speculators' collate pads with: zeros, and -1 for document ids)."""
    torch = _torch()
    if a.shape[0] == n:
        return a
    out = torch.full((n, *a.shape[1:]), value, dtype=a.dtype, device=a.device)
    out[:a.shape[0]] = a
    return out


def collate(batch, shift, pad_to=1):
    """The speculators dict for one hsflow Batch (torch arrays): see the
    module's text. shift=True is EAGLE-3's per-sample shift. pad_to > 1
    pads the row up to a multiple of it as speculators' collate pads up to
    --total-seq-len (zeros; document id -1; lengths unchanged), which makes
    the hidden states a copy instead of views."""
    torch = _torch()
    hs = batch.hidden_states
    if not torch.is_tensor(hs):
        raise TypeError("the consumer delivers numpy arrays; build it with "
                        "hsflow.Consumer(..., arrays='torch')")
    dev = hs.device
    T, H, k = batch.n_tokens, batch.hidden_size, batch.n_layers
    cu = batch.cu_seqlens
    cu = (cu.cpu().numpy() if torch.is_tensor(cu) else np.asarray(cu)).astype(np.int64)
    lens = np.diff(cu)
    pos = np.arange(T, dtype=np.int64) - np.repeat(cu[:-1], lens)
    sid = batch.sample_ids
    sid = sid.to(torch.int64) if torch.is_tensor(sid) else \
        torch.from_numpy(np.asarray(sid).astype(np.int64)).to(dev)
    ctx, last = hs[:, :(k - 1) * H], hs[:, (k - 1) * H:]
    ids, mask = batch.input_ids, batch.loss_mask

    def on_dev(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=True)

    if shift:  # speculators.models.eagle3.data.shift_batch, per sample
        keep_in = on_dev(np.flatnonzero(pos != 0))
        keep_hs = on_dev(np.flatnonzero(pos != np.repeat(lens - 1, lens)))
        ids, mask, last = (a.index_select(0, keep_in) for a in (ids, mask, last))
        ctx = ctx.index_select(0, keep_hs)
        pos = pos[pos != 0]
        lens = np.maximum(lens - 1, 0)
    n_tok = int(pos.shape[0])
    lengths = _lengths_as_collated(lens, n_tok)
    docs = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    row = max(pad_to, -(-n_tok // pad_to) * pad_to) if pad_to > 1 else n_tok
    pos = np.concatenate([pos, np.zeros(row - n_tok, np.int64)])
    docs = np.concatenate([docs, np.full(row - n_tok, -1, np.int64)])
    return {
        "hidden_states": _padded(ctx, row).unsqueeze(0),
        "verifier_last_hidden_states": _padded(last, row).unsqueeze(0),
        "input_ids": _padded(ids.to(torch.int64), row).unsqueeze(0),
        "loss_mask": _padded(mask.to(torch.int64), row).unsqueeze(0),
        "position_ids": on_dev(pos).unsqueeze(0),
        "document_ids": on_dev(docs).unsqueeze(0),
        "lengths": on_dev(np.asarray(lengths, dtype=np.int64)),
        "sample_ids": sid[:len(lengths)],
        "error_records": 0,
    }


def batches(consumer, model, n_target_layers=None, with_batch=False, idle=None,
            pad_to="auto"):
    """Yields, for each batch the consumer delivers, the dict speculators'
    collate makes for its samples (see the module's text); `loss =
    model(**d, ...)[1]` works as it is. The consumer's previous batch is
    released when the next dict is asked for.

    model: the speculators drafter (Eagle3DraftModel or DFlashDraftModel,
    or a DDP/FSDP wrapper of one). Its algorithm decides the shift, its
    target_layer_ids and verifier the layers the producers must send
    (target_layer_ids, then L; refused otherwise with the --layers to
    give), and its verifier_norm is made to pass its input through
    (use_normed_targets). n_target_layers: the target's layer count, when
    the drafter's config names no verifier folder. with_batch=True yields
    (hsflow.Batch, dict) pairs, for the batch's epoch, id and figures.
    idle: called about once a second while no batch has come (to check
    that producers are still there); an exception it raises ends the
    iteration with that exception. pad_to: pad each row up to a multiple
    of it (see collate); "auto" pads where the drafter needs it
    (flex_block_multiple: EAGLE-3 on flex attention, to 128), 1 never."""
    alg = algorithm(model)
    if alg not in ALGORITHMS:
        raise TypeError("speculators' %r drafter is not served by hsflow.integrations."
                        "speculators (it serves %s)" % (alg, ", ".join(sorted(ALGORITHMS))))
    want = producer_layers(model, n_target_layers)
    use_normed_targets(model)
    if pad_to == "auto":
        pad_to = flex_block_multiple(model)
    if not isinstance(pad_to, int) or pad_to < 1:
        raise ValueError("pad_to must be 'auto' or a whole number >= 1, not %r" % (pad_to,))
    # checked now, not at the first batch: the generator below starts late
    return _iterate(consumer, model, ALGORITHMS[alg], want[-1], with_batch, idle, pad_to)


def _iterate(consumer, model, shift, n_target, with_batch, idle, pad_to):
    checked = None
    while True:
        try:
            b = consumer.next_batch(timeout=1.0 if idle is not None else None)
        except StopIteration:
            return
        if b is None:
            idle()
            continue
        if b.layers != checked:
            check_layout(b.layers, b.hidden_size, model, n_target)
            checked = b.layers
        d = collate(b, shift, pad_to)
        yield (b, d) if with_batch else d
