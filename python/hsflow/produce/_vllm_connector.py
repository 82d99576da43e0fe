# SPDX-License-Identifier: Apache-2.0
"""hsflow's KV connector for vLLM's extract_hidden_states speculative
method, loaded by vLLM through kv_connector_module_path. vLLM caches the
captured layers of every prompt token in a cache-only layer of its KV cache;
when a request finishes, this connector reads the request's rows out of
that cache on tensor-parallel rank 0 and writes them, with the token ids the
scheduler saw, straight into the producer's shared-memory area for the
request's batch (_rows.Rows), then lets vLLM free the blocks. Where a
request's rows go comes with the request (kv_transfer_params "hsflow":
area index, sequence, first row, tag), never from its request id, which
vLLM may change. Nothing is written to a file per request.

Built on vLLM's ExampleHiddenStatesConnector for locating the cache-only
layer and its block size; what it writes and how differ (no files, no lock
files, no CUDA stream or pinned memory: it runs on vLLM's CPU build too)."""
from dataclasses import dataclass, field

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import \
    ExampleHiddenStatesConnector
from vllm.logger import init_logger

from ._rows import Rows

logger = init_logger(__name__)


@dataclass
class _Save:
    req_id: str
    dest: dict
    token_ids: list
    block_ids: list


@dataclass
class HsflowConnectorMetadata(KVConnectorMetadata):
    saves: list = field(default_factory=list)


class HsflowStatesConnector(ExampleHiddenStatesConnector):

    def __init__(self, vllm_config, role, kv_cache_config=None):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        extra.setdefault("use_synchronization_lock", False)
        extra.setdefault("num_writer_threads", 1)
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._areas = [dict(a) for a in extra.get("hsflow_areas", [])]
        self._mapped = {}
        self._saves = {}

    # ---- scheduler side ------------------------------------------------------

    def build_connector_meta(self, scheduler_output):
        meta = HsflowConnectorMetadata(saves=list(self._saves.values()))
        self._saves.clear()
        return meta

    def request_finished(self, request, block_ids):
        dest = (request.kv_transfer_params or {}).get("hsflow")
        if dest is None or request.prompt_token_ids is None:
            return False, None
        self._saves[request.request_id] = _Save(request.request_id, dict(dest),
                                                list(request.prompt_token_ids), list(block_ids))
        return True, None

    # ---- worker side ---------------------------------------------------------

    def wait_for_save(self):
        pass

    def _area(self, index):
        a = self._mapped.get(index)
        if a is None:
            d = self._areas[index]
            a = self._mapped[index] = Rows(d["path"], d["max_tokens"], d["max_seqs"], d["k"],
                                           d["hidden"], d["itemsize"])
        return a

    def _write(self, save):
        block = self._block_size
        ids = torch.tensor(save.block_ids, dtype=torch.long)
        slots = (ids.view(-1, 1) * block + torch.arange(block, dtype=torch.long)).view(-1)
        n = len(save.token_ids)
        if slots.numel() < n:
            raise RuntimeError("request %s has %d cache slots for %d tokens"
                               % (save.req_id, slots.numel(), n))
        slots = slots[:n]
        kv = self._kv_cache
        rows = kv[(slots // block).to(kv.device), :, (slots % block).to(kv.device)]
        rows = rows.to("cpu")
        d = save.dest
        if not self._area(d["area"]).write(d["seq"], d["row"], d["tag"], save.token_ids, rows):
            logger.error("hsflow: request %s (sequence %d, rows %d..%d) does not fit its "
                         "batch's area; refused", save.req_id, d["seq"], d["row"], d["row"] + n)

    def get_finished(self, finished_req_ids):
        """Writes the rows of the requests that finished (rank 0; the other
        ranks hold the same rows) and reports them done, so vLLM frees
        their blocks: the rows are in the producer's area by then."""
        done = set()
        if self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, HsflowConnectorMetadata) and self._is_tp_rank_zero:
                for save in meta.saves:
                    self._write(save)
                    done.add(save.req_id)
        return done or None, None

    def shutdown(self):
        for a in self._mapped.values():
            a.close()
        self._mapped = {}
        self._executor.shutdown(wait=False)
