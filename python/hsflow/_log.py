# SPDX-License-Identifier: Apache-2.0
"""The Python side's logger, in the C library's format: "[HH:MM:SS.mmm tag
LEVEL] message" on stderr, the level from HS_LOG_LEVEL (error, warn, info,
debug, trace; default info)."""
import logging
import os
import sys
import time

_LEVELS = {"error": logging.ERROR, "warn": logging.WARNING, "warning": logging.WARNING,
           "info": logging.INFO, "debug": logging.DEBUG, "trace": logging.DEBUG}
_NAMES = {logging.ERROR: "ERROR", logging.WARNING: "WARN", logging.INFO: "INFO",
          logging.DEBUG: "DEBUG", logging.CRITICAL: "ERROR"}


class _Format(logging.Formatter):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag

    def format(self, r):
        t = time.localtime(r.created)
        text = "[%02d:%02d:%02d.%03d %s %s] %s" % (t.tm_hour, t.tm_min, t.tm_sec,
                                                   int(r.msecs), self.tag,
                                                   _NAMES.get(r.levelno, "INFO"), r.getMessage())
        if r.exc_info:
            text += "\n" + self.formatException(r.exc_info)
        return text


def setup(tag, name="hsflow.produce"):
    """The logger `name` ('hsflow.produce' by default), writing with `tag`."""
    log = logging.getLogger(name)
    log.handlers = []
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(_Format(tag))
    log.addHandler(h)
    log.propagate = False
    log.setLevel(_LEVELS.get(os.environ.get("HS_LOG_LEVEL", "info").lower(), logging.INFO))
    return log
