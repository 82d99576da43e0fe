# SPDX-License-Identifier: Apache-2.0
"""Optional packages: a missing one is named with the extra that installs
it and the command that needs it, e.g.

    hsflow-data prepare needs transformers (No module named 'transformers'):
    pip install "hsflow[data]" (or pip install transformers)
"""
import importlib
import importlib.util

class MissingPackage(ImportError):
    """An optional package the command needs is not installed; the text says
    which extra installs it."""


def missing_text(package, command, extra, error=None, purpose=None):
    why = " (%s)" % error if error else ""
    what = " for %s" % purpose if purpose else ""
    return ('%s needs %s%s%s: pip install "hsflow[%s]" (or pip install %s)'
            % (command, package, what, why, extra, package))


def need(module, command, extra, package=None, purpose=None):
    """Imports MODULE, or raises MissingPackage naming PACKAGE (default: the
    module's top-level name), the extra and the command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingPackage(missing_text(package or module.split(".")[0], command, extra, e,
                                          purpose)) from e


def check(modules, command, extra):
    """Raises MissingPackage for the first of MODULES that is not installed,
    without importing any (a quick check before processes start)."""
    for m in modules:
        try:
            found = importlib.util.find_spec(m) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingPackage(missing_text(m, command, extra, "No module named %r" % m))
