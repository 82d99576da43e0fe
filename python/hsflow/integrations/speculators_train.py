# SPDX-License-Identifier: Apache-2.0
"""speculators' own trainer fed from an hsflow store: the `hsflow` hidden-states
backend and the command hsflow-speculators-train.

speculators 0.9's train CLI (`speculators train`, `python -m speculators.train`)
reads each sample's hidden states through a hs_connectors HiddenStatesBackend
chosen by --hidden-states-backend. Importing this module registers one more,
`hsflow`, which serves sample i of --data-path from an hsflow store:

    hsflow-data store export STORE ROWS --format rows --verifier TARGET
    hsflow-speculators-train --data-path ROWS --hidden-states-backend hsflow \\
        --verifier-name-or-path TARGET --speculator-type eagle3 ...   # every speculators flag

ROWS holds the dataset rows speculators' ArrowDataset reads (input_ids,
loss_mask, seq_len) with each row's hsflow sample id; the backend maps row i
to its sample id, the sample id to its store batch and row (from each
region's sample_ids), and reads that sample's tokens and states. Each batch's
region is read whole and checked against the store's checksum the first time
a process touches it (and its sample ids against the index), then only the
sample's own rows are read. The states come back as hs_connectors' file
backend returns them: hidden_states [T, k, H] bf16 (fp8 stores dequantised as
the consumer does) and token_ids [T] int64, which speculators checks against
the row.

hsflow's last layer is N after the final norm; speculators' drafter applies
the verifier's norm to its last layer. hsflow-speculators-train therefore
makes the drafter's verifier_norm an identity (use_normed_targets) when the
states are hsflow's (this backend, or files `hsflow-data store export
--normed-final-state` marked so), after checking the store's layers against
the drafter's target_layer_ids and N. Everything else is speculators' own:
its flags, config resolution, model, data loaders, scheduler, validation,
checkpoints and save_pretrained.
"""
import json
import os
import sys

import numpy as np

try:
    from hs_connectors import HiddenStatesBackend, HiddenStatesTransfer
    _MISSING = None
except ImportError as _e:  # main() says what to install; nothing registers
    HiddenStatesBackend, HiddenStatesTransfer, _MISSING = None, object, _e

from ..data.store import HEADER, Store, StoreError, _checksum64, _fp8_to_bf16_bits, _lib, \
    _read_fd, check_fp8_rows, offsets, sample_index

EXPORT_RECORD = "hsflow_export.json"


def read_export_record(data_path):
    """The record `hsflow-data store export` left in data_path, or None."""
    try:
        with open(os.path.join(data_path, EXPORT_RECORD), "rb") as f:
            raw = f.read(1 << 20)
        rec = json.loads(raw)
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("format") == "hsflow-export" else None


class HsflowTransfer(HiddenStatesTransfer):
    """Serves row i of `data_path` from the hsflow store at `store_path`.
    Picklable (speculators' loader workers are spawned): the store is opened
    lazily in each process."""

    def __init__(self, store_path, data_path):
        self.store_path, self.data_path = store_path, data_path
        self._st = None

    def __getstate__(self):
        return {"store_path": self.store_path, "data_path": self.data_path}

    def __setstate__(self, state):
        self.__init__(state["store_path"], state["data_path"])

    def setup(self):
        if self._st is not None:
            return
        import datasets
        st = Store(self.store_path)
        try:
            missing = st.missing()
            if missing:
                raise StoreError("%s holds %d of %d batches: the hsflow backend serves a "
                                 "complete store (fill it with the consumer's --store)"
                                 % (self.store_path, len(st.loc), st.n_batches))
            rows = datasets.load_from_disk(self.data_path).with_format(None)
            if "sample_id" not in rows.column_names:
                raise StoreError("%s: its rows have no sample_id column; write them with "
                                 "hsflow-data store export %s %s --format rows"
                                 % (self.data_path, self.store_path, self.data_path))
            self._sids = list(rows["sample_id"])
            self._index = sample_index(st)
        except BaseException:
            st.close()
            raise
        self._st, self._lib, self._verified = st, _lib(), set()

    def _verify(self, batch):
        st = self._st
        region = st.read(batch)
        if _checksum64(self._lib, region[HEADER:]) != st.loc[batch][3]:
            raise StoreError("batch %d of %s fails its checksum: run hsflow-data store verify; "
                             "the consumer computes it again at its next run"
                             % (batch, self.store_path))
        n = int(st.n_seqs[batch])
        o = offsets(n, int(st.n_tokens[batch]), st.hidden_size, len(st.layers), st.dtype)
        ids = np.frombuffer(region, "<u8", n, o["sample_ids"]).tolist()
        if any(self._index.get(sid) != (batch, row) for row, sid in enumerate(ids)):
            raise StoreError("batch %d of %s changed while it was read" % (batch,
                                                                           self.store_path))
        self._verified.add(batch)

    def sample(self, file_idx):
        """(token_ids int64 [T], hidden bf16 bits uint16 [T, k, H]) of row file_idx."""
        self.setup()
        st = self._st
        if not 0 <= file_idx < len(self._sids):
            raise StoreError("row %d is outside the %d rows of %s"
                             % (file_idx, len(self._sids), self.data_path))
        sid = self._sids[file_idx]
        if sid not in self._index:
            raise StoreError("row %d is sample %d, which the store %s does not hold: not the "
                             "rows of this store" % (file_idx, sid, self.store_path))
        batch, row = self._index[sid]
        if batch not in self._verified:
            self._verify(batch)
        shard, off, _, _ = st.loc[batch]
        fd, what = st._fds[shard], "%s: batch %d" % (st.shard_path(shard), batch)
        n, t = int(st.n_seqs[batch]), int(st.n_tokens[batch])
        k, h = len(st.layers), st.hidden_size
        o = offsets(n, t, h, k, st.dtype)
        cu = np.frombuffer(_read_fd(fd, 8, what, off + o["cu_seqlens"] + 4 * row), "<i4")
        a, b = int(cu[0]), int(cu[1])
        if not 0 <= a < b <= t:
            raise StoreError("%s: sample %d's rows %d..%d are not inside its %d tokens"
                             % (what, sid, a, b, t))
        tok = np.frombuffer(_read_fd(fd, 4 * (b - a), what, off + o["input_ids"] + 4 * a), "<i4")
        if st.dtype == "fp8":
            q = np.frombuffer(_read_fd(fd, (b - a) * k * h, what, off + o["hidden"] + a * k * h),
                              "u1").reshape(b - a, k * h)
            scales = np.frombuffer(_read_fd(fd, 4 * (b - a), what, off + o["scales"] + 4 * a),
                                   "<f4")
            check_fp8_rows(batch, q, scales)  # as the consumer and export refuse them
            hid = _fp8_to_bf16_bits(q, scales)
        else:
            hid = np.frombuffer(_read_fd(fd, 2 * (b - a) * k * h, what,
                                         off + o["hidden"] + 2 * a * k * h), "<u2")
        return tok.astype(np.int64), hid.reshape(b - a, k, h)

    def get_cached(self, file_idx):
        import torch
        tok, hid = self.sample(int(file_idx))
        states = torch.from_numpy(hid.astype(np.int16)).view(torch.bfloat16)
        return {"hidden_states": states, "token_ids": torch.from_numpy(tok)}

    def get_generated(self, hs_transfer_params):
        raise StoreError("the hsflow backend serves a complete store and generates nothing; "
                         "a sample it lacks is an error (on_missing does not apply)")


class HsflowBackend(HiddenStatesBackend or object):
    """speculators' --hidden-states-backend hsflow: states from an hsflow store."""

    @staticmethod
    def add_train_args(parser):
        parser.add_argument(
            "--hsflow-store", type=str, default=None,
            help="The hsflow store (hs-consumer --store DIR) that serves the states of "
                 "--data-path's rows. (Default: the store `hsflow-data store export` recorded "
                 "in --data-path/hsflow_export.json)")

    @staticmethod
    def add_launch_args(parser):
        pass  # hsflow's producers fill the store; nothing launches vLLM for it

    @staticmethod
    def from_train_args(args, data_path):
        store = getattr(args, "hsflow_store", None)
        if not store:
            rec = read_export_record(data_path)
            store = rec.get("store") if rec else None
        if not store:
            raise StoreError("--hidden-states-backend hsflow: give --hsflow-store DIR (the "
                             "consumer's --store), or rows written by hsflow-data store export "
                             "(which records it)")
        transfer = HsflowTransfer(store, data_path)
        transfer.setup()  # refuse a bad store or rows before any worker starts
        return transfer

    @staticmethod
    def build_kv_transfer_config(args):
        raise StoreError("the hsflow backend is fed by hsflow's producers, not by vLLM")


if HiddenStatesBackend is not None:
    HiddenStatesBackend.register("hsflow")(HsflowBackend)


def _store_layers(args):
    """(layers, hidden size) of the hsflow states this run trains on, or None
    when they are not hsflow's (another backend on files not marked normed)."""
    backend = getattr(args, "hidden_states_backend", "file")
    rec = read_export_record(args.data_path)
    if backend == "hsflow":
        with Store(HsflowBackend.from_train_args(args, args.data_path).store_path) as st:
            return list(st.layers), st.hidden_size
    if backend in ("file", "fp8") and rec and rec.get("final_state") == "normed" \
            and not getattr(args, "hidden_states_path", None):
        return list(rec["layers"]), int(rec["hidden_size"])
    return None


def _wrap_build(spec_cli):
    from . import speculators as hs_spec
    build = spec_cli.build_draft_model

    def build_draft_model(args, *a, **kw):
        model = build(args, *a, **kw)
        got = _store_layers(args)
        if got is not None:
            layers, hidden = got
            hs_spec.check_layout(layers, hidden, model)
            hs_spec.use_normed_targets(model)
            print("hsflow-speculators-train: states of layers %s (the last, N, after the final "
                  "norm): the drafter's verifier_norm passes them through"
                  % ",".join(map(str, layers)), file=sys.stderr)
        return model
    spec_cli.build_draft_model = build_draft_model


HELP = """usage: hsflow-speculators-train [speculators train flags...]

speculators' own train CLI (speculators 0.9, every flag unchanged; --help
lists them) with one more hidden-states backend, hsflow:

  hsflow-data store export STORE ROWS --format rows --verifier TARGET
  hsflow-speculators-train --data-path ROWS --hidden-states-backend hsflow \\
      --verifier-name-or-path TARGET --speculator-type eagle3 --epochs 3 ...
  torchrun --nproc_per_node 8 -m hsflow.integrations.speculators_train ...

--hsflow-store DIR names the store (default: the one the export recorded).
The drafter's verifier_norm becomes an identity on hsflow's states (their
last layer N is after the final norm); the store's layers must be the
drafter's target_layer_ids and then N. docs/speculators.md.
"""


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        from .. import __version__
        print("hsflow-speculators-train %s" % __version__)
        return 0
    if argv[:1] in (["-h"], ["--help"]):
        sys.stdout.write(HELP + "\nspeculators' flags:\n\n")
    try:
        if _MISSING is not None:
            raise _MISSING
        from speculators.train import cli as spec_cli
        from speculators.train.config import TrainConfig
    except ImportError as e:
        print("hsflow-speculators-train: needs speculators 0.9 (%s): pip install "
              "'hsflow[speculators]', or scripts/install-speculators-venv" % e, file=sys.stderr)
        return 2
    _wrap_build(spec_cli)
    try:
        spec_cli.main(TrainConfig.resolve(argv))
    except StoreError as e:
        print("hsflow-speculators-train: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
