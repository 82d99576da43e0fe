# SPDX-License-Identifier: Apache-2.0
"""The shared-memory area one in-flight batch's rows travel through, from
an engine's worker process (hsflow's vLLM connector) to the producer: no
per-sample file, one mapped file in /dev/shm per in-flight batch, written
in place by the engine's worker and read in place by the producer.

Layout (native byte order):
  header  int64 [max_seqs, 4]: per sequence (tag, rows, status, itemsize)
  tokens  int32 [max_tokens]: the token ids the engine saw
  states  [max_tokens, k, H] elements of `itemsize` bytes (the engine's
          dtype), at a 64-byte aligned offset
A sequence occupies rows [row, row + rows) of tokens and states. The writer
fills states and tokens, then the header's tag, rows and itemsize, and the
status last (1 written, 2 refused: the rows did not fit); the producer
clears the header before it submits a batch and accepts a sequence only
with its own tag, so nothing of an earlier batch in the same area is taken
for this one's."""
import mmap
import os

import numpy as np

HEADER_FIELDS = 4
TAG, ROWS, STATUS, ITEMSIZE = range(4)
WRITTEN, REFUSED = 1, 2


def _layout(max_tokens, max_seqs, k, hidden, itemsize):
    head = max_seqs * HEADER_FIELDS * 8
    tok = head
    states = (tok + max_tokens * 4 + 63) // 64 * 64
    return head, tok, states, states + max_tokens * k * hidden * itemsize


class Rows:
    """One mapped area. create=True makes the file (the producer);
    otherwise it maps the existing one (the engine's worker)."""

    def __init__(self, path, max_tokens, max_seqs, k, hidden, itemsize, create=False):
        self.path = path
        self.max_tokens, self.max_seqs = int(max_tokens), int(max_seqs)
        self.k, self.hidden, self.itemsize = int(k), int(hidden), int(itemsize)
        _, self.tok_off, self.states_off, size = _layout(self.max_tokens, self.max_seqs,
                                                         self.k, self.hidden, self.itemsize)
        flags = os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            elif os.fstat(fd).st_size != size:
                raise ValueError("%s is %d bytes, not the %d of its layout"
                                 % (path, os.fstat(fd).st_size, size))
            self.mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.header = np.frombuffer(self.mm, np.int64, self.max_seqs * HEADER_FIELDS,
                                    0).reshape(self.max_seqs, HEADER_FIELDS)
        self.tokens = np.frombuffer(self.mm, np.int32, self.max_tokens, self.tok_off)
        self.states_bytes = np.frombuffer(self.mm, np.uint8,
                                          self.max_tokens * self.k * self.hidden * self.itemsize,
                                          self.states_off)

    def describe(self):
        """What a writer needs to map it (goes to the engine in the
        connector's configuration)."""
        return {"path": self.path, "max_tokens": self.max_tokens, "max_seqs": self.max_seqs,
                "k": self.k, "hidden": self.hidden, "itemsize": self.itemsize}

    def clear(self, n_seqs):
        self.header[:n_seqs] = 0

    def write(self, seq, row, tag, token_ids, states):
        """Writes one sequence: token_ids (int sequence, n) and states (a CPU
        torch tensor [n, k, H] of the area's itemsize). Rows that do not fit
        are refused (status 2) rather than written out of bounds."""
        import torch
        n = len(token_ids)
        h = self.header
        ok = (0 <= seq < self.max_seqs and 0 <= row and row + n <= self.max_tokens and
              tuple(states.shape) == (n, self.k, self.hidden) and
              states.element_size() == self.itemsize)
        if not 0 <= seq < self.max_seqs:
            return False
        if ok:
            e = n * self.k * self.hidden * self.itemsize
            dst = torch.from_numpy(self.states_bytes[row * self.k * self.hidden * self.itemsize:]
                                   [:e])
            dst.copy_(states.contiguous().view(-1).view(torch.uint8))
            self.tokens[row:row + n] = np.asarray(token_ids, dtype=np.int64)
        h[seq, TAG] = tag
        h[seq, ROWS] = n
        h[seq, ITEMSIZE] = states.element_size()
        h[seq, STATUS] = WRITTEN if ok else REFUSED
        return ok

    def states(self, torch_dtype, n_tokens):
        """The states area as a torch tensor [n_tokens, k, H] (no copy)."""
        import torch
        b = torch.from_numpy(self.states_bytes[:n_tokens * self.k * self.hidden * self.itemsize])
        return b.view(torch_dtype).view(n_tokens, self.k, self.hidden)

    def close(self, unlink=False):
        self.header = self.tokens = self.states_bytes = None
        try:
            self.mm.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with the process
        if unlink:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
