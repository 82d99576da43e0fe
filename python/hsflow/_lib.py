# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of include/hsflow.h and the lookup of libhsflow.so.

The structures below mirror the C header field by field (same order, same
types); tests/python/test_api.py compiles a small C program that prints the
C offsets and compares them with these. Change both together.
"""
import ctypes
import ctypes.util
import os
import re
import shutil

from . import _dtypes

HS_OK = 0
HS_ERR_CLOSED = -9
HS_ERR_TIMEOUT = -11
HS_ERR_NOSPACE = -12

HS_ORDER_ARRIVAL = 0
HS_ORDER_PLAN = 1
HS_HIDDEN_BF16 = _dtypes.BF16.id  # hs_hidden_dtype_t
HS_HIDDEN_FP8 = _dtypes.FP8.id

_c_u16 = ctypes.c_uint16
_c_u32 = ctypes.c_uint32
_c_u64 = ctypes.c_uint64


class ConsumerConfig(ctypes.Structure):
    """hs_consumer_config_t."""
    _fields_ = [
        ("listen_host", ctypes.c_char_p),
        ("listen_port", _c_u16),
        ("cache_bytes", _c_u64),
        ("epochs", _c_u32),
        ("gpu", ctypes.c_int),
        ("order", ctypes.c_int),
        ("prefetch", _c_u32),
        ("verify_synthetic", ctypes.c_bool),
        ("insecure", ctypes.c_bool),
        ("secret_file", ctypes.c_char_p),
        ("transport", ctypes.c_char_p),
        ("verify_threads", _c_u32),
        ("peer_timeout_s", _c_u32),
        ("net_devices", ctypes.c_char_p),
        ("require_rdma", ctypes.c_bool),
        ("metrics", ctypes.c_char_p),
        ("journal", ctypes.c_char_p),
        ("resume_state", ctypes.c_char_p),
        ("lease_timeout_s", ctypes.c_double),
        ("force", ctypes.c_bool),
        ("rank", _c_u32),
        ("world", _c_u32),
        ("uneven", ctypes.c_int),
        ("status_interval_s", ctypes.c_double),
        ("handshake_timeout_s", ctypes.c_double),
        ("no_producer_warn_s", ctypes.c_double),
        ("tcp_sockbuf", _c_u64),
        ("ucx_no_memh", ctypes.c_bool),
        ("reserved0", ctypes.c_char_p),
        ("expect_plan", ctypes.c_char_p),
        ("expect_layout", ctypes.c_char_p),
        ("expect_dataset", ctypes.c_char_p),
        ("deliver", ctypes.c_int),  # hs_hidden_dtype_t
        ("lease_min_tokens_per_s", ctypes.c_double),
        ("store", ctypes.c_char_p),
        ("expect_target", ctypes.c_char_p),
        ("more", _c_u64 * 16),  # options newer than the fields above, set by name
    ]


class OptionInfo(ctypes.Structure):
    """hs_option_info_t: one option of the consumer's table."""
    _fields_ = ([(n, ctypes.c_char_p) for n in ("name", "type", "flag", "env", "metavar",
                                                "default_text", "unit", "choices", "help")]
                + [("min", ctypes.c_double), ("max", ctypes.c_double),
                   ("min_open", ctypes.c_bool), ("shared_flag", ctypes.c_bool)])


def _fields(ctype, *names):
    return [(n, ctype) for n in names]


# what a delivered batch (hs_batch_t) and a producer's work (hs_work_t) both
# describe, in their order
_BATCH_SHAPE = ("epoch", "batch", "n_seqs", "n_tokens", "hidden_size", "n_layers")
_BATCH_ARRAYS = ("cu_seqlens", "sample_ids", "input_ids", "loss_mask", "hidden")
_FP8_ARRAYS = ("hidden_fp8", "hidden_scales")


class CBatch(ctypes.Structure):
    """hs_batch_t."""
    _fields_ = (_fields(_c_u32, *_BATCH_SHAPE) + _fields(ctypes.c_void_p, "layers", *_BATCH_ARRAYS)
                + [("on_device", ctypes.c_bool)] + _fields(_c_u64, "bytes", "handle", "ticket")
                + [("hidden_dtype", ctypes.c_int)] + _fields(ctypes.c_void_p, *_FP8_ARRAYS))


class ConsumerStats(ctypes.Structure):
    """hs_consumer_stats_t."""
    _fields_ = [(n, _c_u64) for n in (
        "batches_planned", "batches_resumed", "batches_delivered", "duplicates", "checksum_failures",
        "protocol_errors", "producers_connected", "producers_seen", "producers_dropped",
        "bytes_received", "tokens_delivered", "tickets_out", "leases_returned",
        "cache_capacity", "cache_used", "cache_high_water", "cache_ready_bytes")] + [
        ("cache_prepare_s", ctypes.c_double),
        ("seconds", ctypes.c_double),
        ("starve_pct", ctypes.c_double),
        ("producer_stall_pct", ctypes.c_double),
        ("h2d_bytes", _c_u64),
        ("h2d_gbytes_per_s", ctypes.c_double),
        ("epochs", _c_u32),
        ("finished", ctypes.c_bool),
        ("epoch", _c_u32),
        ("run_pct", ctypes.c_double),
        ("eta_epoch_s", ctypes.c_double),
        ("eta_run_s", ctypes.c_double),
        ("supply_batches_per_s", ctypes.c_double),
        ("trainer_batches_per_s", ctypes.c_double),
        ("bottleneck", ctypes.c_int32),
    ] + [(n, _c_u64) for n in (
        "store_hits", "store_misses", "store_writes", "store_skipped", "store_bad",
        "store_batches", "store_bytes_written", "store_full")] + [
        ("window_s", ctypes.c_double),
        ("recent_tokens_per_s", ctypes.c_double),
        ("recent_gbytes_per_s", ctypes.c_double),
        ("recent_supply_batches_per_s", ctypes.c_double),
        ("recent_trainer_batches_per_s", ctypes.c_double),
        ("recent_starve_pct", ctypes.c_double),
        ("verify_threads", _c_u32),
        ("verify_pct", ctypes.c_double),
        ("recent_verify_pct", ctypes.c_double),
    ] + [(n, _c_u64) for n in (
        "producers_shm", "producers_tcp", "producers_ucx",
        "producers_seen_shm", "producers_seen_tcp", "producers_seen_ucx")] + [
        ("target_fingerprint", _c_u64),
        ("target_name", ctypes.c_char * 256),
    ]


class ProducerClientConfig(ctypes.Structure):
    """hs_producer_client_config_t."""
    _fields_ = [
        ("to", ctypes.c_char_p),
        ("data_path", ctypes.c_char_p),
        ("token_budget", _c_u32),
        ("max_seq_len", _c_u32),
        ("overflow_drop", ctypes.c_bool),
        ("seed", _c_u64),
        ("hidden_size", _c_u32),
        ("layers", ctypes.POINTER(ctypes.c_int32)),
        ("n_layers", _c_u32),
        ("prefetch", _c_u32),
        ("secret_file", ctypes.c_char_p),
        ("transport", ctypes.c_char_p),
        ("name", ctypes.c_char_p),
        ("connect_timeout_s", _c_u32),
        ("reconnect", ctypes.c_bool),
        ("hs_dtype", ctypes.c_int),
        ("status_interval_s", ctypes.c_double),
        ("staging_buffers", _c_u32),
        ("target_fingerprint", _c_u64),
        ("target_name", ctypes.c_char_p),
    ]


PRODUCER_STAGING_MAX = 4  # HS_PRODUCER_STAGING_MAX


class ProducerInfo(ctypes.Structure):
    """hs_producer_info_t."""
    _fields_ = [
        ("plan_hash", _c_u64),
        ("n_batches", _c_u32),
        ("max_batch_tokens", _c_u32),
        ("staging", ctypes.c_void_p * PRODUCER_STAGING_MAX),
        ("staging_bytes", _c_u64),
    ]


class CWork(ctypes.Structure):
    """hs_work_t."""
    _fields_ = (_fields(_c_u64, "ticket") + _fields(_c_u32, *_BATCH_SHAPE)
                + _fields(ctypes.c_void_p, *_BATCH_ARRAYS) + _fields(_c_u64, "bytes", "handle")
                + _fields(ctypes.c_void_p, *_FP8_ARRAYS))


class HsflowError(RuntimeError):
    """A call into libhsflow failed; `status` is the C status code (negative)
    and the message carries the library's text for it. The library also logs
    the details (what was wrong and what to do) on stderr."""

    def __init__(self, what, status=None):
        self.status = status
        if status is not None:
            what = "%s: %s (status %d)" % (what, status_str(status), status)
        super().__init__(what)


# How long one wait inside the library lasts before Python gets control back
# (so Ctrl-C and close() from another thread are seen).
POLL_MS = 100


class Endpoint:
    """What Consumer and Producer share: `with` and garbage collection call
    close(), and the library's next batch or ticket is waited for in short
    waits. A subclass sets _closing (close() began, maybe in another thread)
    and _done (the run is over) to False before its first wait."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # A process forked from the one that made this object (a DataLoader
        # worker, say) has a copy without the library's threads: it must not
        # tear down what belongs to its parent.
        if getattr(self, "_owner_pid", None) not in (None, os.getpid()):
            return
        try:
            self.close()
        except Exception:
            pass

    def _wait_next(self, call, timeout, what):
        """Calls call(ms) (hs_consumer_next or hs_producer_next, waiting at
        most ms milliseconds) in waits of at most POLL_MS until it gives one.
        True when it did; False after `timeout` seconds (None: no limit)
        without one; StopIteration once close() began or the run is over;
        HsflowError(what) for any other status."""
        waited = 0.0
        while True:
            if self._closing:
                raise StopIteration
            ms = POLL_MS
            if timeout is not None:
                left = timeout - waited
                if left <= 0:
                    return False
                ms = max(1, min(ms, int(left * 1000)))
            st = call(ms)
            if st == HS_OK:
                return True
            if st == HS_ERR_TIMEOUT:
                waited += ms / 1000.0
                continue
            if st == HS_ERR_CLOSED:
                self._done = True
                raise StopIteration
            raise HsflowError(what, st)


_LIB_NAME = "libhsflow.so"
_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
# The checkout this package is python/hsflow of, when it is run from one
# (PYTHONPATH=python); None once installed, e.g. into site-packages.
_REPO_DIR = os.path.dirname(os.path.dirname(_PKG_DIR))
if not (os.path.isfile(os.path.join(_REPO_DIR, "include", "hsflow.h")) and
        os.path.isfile(os.path.join(_REPO_DIR, "python", "pyproject.toml"))):
    _REPO_DIR = None

_lib = None
_lib_path = None

_VERSION_RE = re.compile(r'^#define HSFLOW_VERSION_STRING "([^"]+)"', re.M)


def release_version():
    """The release this package is, from its one home, HSFLOW_VERSION_STRING
    in include/hsflow.h: read from the header when run from a checkout
    (PYTHONPATH=python), else the installed distribution's version (the
    wheel's, which pyproject.toml reads from the same header)."""
    if _REPO_DIR:
        with open(os.path.join(_REPO_DIR, "include", "hsflow.h")) as f:
            m = _VERSION_RE.search(f.read())
        if m:
            return m.group(1)
    try:
        from importlib.metadata import PackageNotFoundError, version
        return version("hsflow")
    except PackageNotFoundError:
        return "0+unknown"  # copied without its metadata: library_version() still says


def _candidates():
    env = os.environ.get("HSFLOW_LIB")
    if env:
        return [("HSFLOW_LIB", env)]
    # pip install ./python puts the library here.
    out = [("package directory", os.path.join(_PKG_DIR, _LIB_NAME))]
    if _REPO_DIR:
        out.append(("repository build", os.path.join(_REPO_DIR, "build", _LIB_NAME)))
    found = ctypes.util.find_library("hsflow")
    if found:
        out.append(("system library path", found))
    return out


def library_path():
    """The path of the libhsflow.so this package uses (loading it if needed)."""
    load()
    return _lib_path


def load():
    """Loads libhsflow.so once: $HSFLOW_LIB, else the package directory (where
    pip install ./python puts it), else <repo>/build/libhsflow.so when this
    package is run from a checkout, else the system library path."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    tried = []
    for where, path in _candidates():
        if where != "system library path" and not os.path.exists(path):
            tried.append("%s (%s: not there)" % (path, where))
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s: %s)" % (path, where, e))
            continue
        _declare(lib)
        _lib, _lib_path = lib, path
        return lib
    raise HsflowError(
        "cannot find libhsflow.so; tried: " + "; ".join(tried) +
        ". Install the package with its library (pip install ./python, from the checkout), "
        "or build it (cmake -S . -B build && cmake --build build --target hsflow) "
        "and set HSFLOW_LIB=/path/to/libhsflow.so")


def _declare(lib):
    P = ctypes.POINTER
    i, v, vp = ctypes.c_int, None, ctypes.c_void_p
    sig = {
        "hsflow_status_str": (ctypes.c_char_p, [i]),
        "hsflow_version": (ctypes.c_char_p, []),
        "hsflow_git_describe": (ctypes.c_char_p, []),
        "hsflow_build_info": (ctypes.c_char_p, []),
        "hsflow_set_system_root": (v, [ctypes.c_char_p]),
        "hs_consumer_config_default": (v, [P(ConsumerConfig)]),
        "hs_consumer_create": (i, [P(ConsumerConfig), P(vp)]),
        "hs_consumer_config_set": (i, [P(ConsumerConfig), ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_char_p, ctypes.c_size_t]),
        "hs_consumer_option_count": (ctypes.c_uint32, []),
        "hs_consumer_option_info": (i, [ctypes.c_uint32, P(OptionInfo)]),
        "hs_consumer_port": (ctypes.c_uint16, [vp]),
        "hs_consumer_next": (i, [vp, P(CBatch), i]),
        "hs_consumer_release": (i, [vp, P(CBatch)]),
        "hs_consumer_unget": (i, [vp, P(CBatch)]),
        "hs_consumer_holds": (ctypes.c_bool, [vp, P(CBatch)]),
        "hs_consumer_stats": (v, [vp, P(ConsumerStats)]),
        "hs_consumer_state_save": (i, [vp, ctypes.c_char_p, ctypes.c_size_t,
                                       P(ctypes.c_size_t)]),
        "hs_consumer_stats_json": (i, [P(ConsumerStats), ctypes.c_char_p, ctypes.c_size_t]),
        "hs_consumer_status_line": (v, [vp, ctypes.c_char_p, ctypes.c_size_t]),
        "hs_consumer_destroy": (v, [vp]),
        "hs_producer_client_config_default": (v, [P(ProducerClientConfig)]),
        "hs_producer_client_config_set": (i, [P(ProducerClientConfig), ctypes.c_char_p,
                                              ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
        "hs_producer_open": (i, [P(ProducerClientConfig), P(vp)]),
        "hs_producer_next": (i, [vp, P(CWork), i]),
        "hs_producer_submit": (i, [vp, P(CWork)]),
        "hs_producer_close": (v, [vp]),
        "hs_producer_info": (i, [vp, P(ProducerInfo)]),
        "hs_fp8_quantize_rows": (i, [vp, ctypes.c_uint64, ctypes.c_uint64, vp, vp,
                                     P(ctypes.c_uint64)]),
        "hs_target_fingerprint": (i, [ctypes.c_char_p, P(ctypes.c_uint64)]),
        "hs_target_synthetic_fingerprint": (ctypes.c_uint64, []),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def status_str(status):
    """The library's text for a status code."""
    try:
        s = load().hsflow_status_str(int(status))
    except HsflowError:
        return "status %d" % status
    return s.decode() if s else "unknown status"


def library_version():
    """What the loaded libhsflow.so says of itself: {"version": "0.1.0",
    "git": "f08d450" or "" outside a checkout, "build": "CUDA off, UCX ..."},
    the same as `hs-consumer --version`."""
    lib = load()
    return {"version": lib.hsflow_version().decode(),
            "git": lib.hsflow_git_describe().decode(),
            "build": lib.hsflow_build_info().decode()}


def find_tool(name):
    """Path of an hsflow command (e.g. "hs-producer"): $HSFLOW_BIN_DIR, the
    bin/ folder next to the loaded library (pip install ./python puts the
    commands there), the library's own folder, the repository's build/bin
    when run from a checkout, then PATH. None when not found."""
    dirs = []
    if os.environ.get("HSFLOW_BIN_DIR"):
        dirs.append(os.environ["HSFLOW_BIN_DIR"])
    try:
        libdir = os.path.dirname(os.path.abspath(library_path()))
        dirs += [os.path.join(libdir, "bin"), libdir]
    except HsflowError:
        pass
    if _REPO_DIR:
        dirs.append(os.path.join(_REPO_DIR, "build", "bin"))
    for d in dirs:
        p = os.path.join(d, name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return shutil.which(name)


def version_text(prog):
    """What `PROG --version` prints for a Python command, as the C commands
    do: the release with the library's git checkout, its build options, and
    which libhsflow.so was loaded."""
    from . import __version__
    try:
        v = library_version()
    except HsflowError as e:
        return "%s %s\nlibrary: %s" % (prog, __version__, e)
    git = " (git %s)" % v["git"] if v["git"] else ""
    lines = ["%s %s%s" % (prog, __version__, git), "build: " + v["build"], "library: " + _lib_path]
    if v["version"] != __version__:
        lines.append("warning: the library is release %s, this package %s: reinstall one of them"
                     % (v["version"], __version__))
    return "\n".join(lines)


def add_version_flag(parser):
    """--version on an argparse parser: prints version_text() and exits 0."""
    import argparse

    class _Version(argparse.Action):
        def __init__(self, option_strings, dest, **kw):
            super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

        def __call__(self, p, namespace, values, option_string=None):
            print(version_text(p.prog))
            p.exit(0)

    parser.add_argument("--version", action=_Version,
                        help="the release, git checkout and build options, and the library used")
