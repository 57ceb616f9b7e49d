"""Run a callback right after a module finishes importing (a post-import hook).

Why: importing every instrumentable library at agent start to patch it costs the
application hundreds of milliseconds and tens of MiB per worker, even for libraries it never
uses. Instead :func:`defer` registers a callback for a module name; a finder at the front of
``sys.meta_path`` notices when that module is imported, lets the rest of ``sys.meta_path``
find it as usual, and wraps the found loader's ``exec_module`` so the callback runs just
after the module body executed, still inside the import (other threads importing the same
module wait on the import system's module lock, so they never see it unpatched).

Guarantees: each callback runs at most once, whatever the number of threads importing;
nothing here raises into the importing code (a failing callback or finder is logged once and
skipped: the import itself proceeds); the finder leaves ``sys.meta_path`` when nothing is
pending. Deferred callbacks survive ``fork``, so prefork workers importing a library later
are patched too.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

log = logging.getLogger("swmp.instrument")

Callback = Callable[[], None]

_WRAPPED = "__swmp_post_import__"

_lock = threading.Lock()
_pending: dict[str, dict[str, Callback]] = {}  # module name -> {key: callback} not yet run
_logged: set[str] = set()  # problems already logged (once each)
_local = threading.local()  # names this thread is resolving (guards against re-entry)


def _reset_lock() -> None:
    # A thread of the parent may have held the lock at fork time; the child has one thread.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_lock)


def _log_once(key: str, msg: str, *args: Any) -> None:
    if key in _logged:
        return
    _logged.add(key)
    log.warning(msg, *args, exc_info=True)


class PostImportFinder:
    """The ``sys.meta_path`` entry. Finds nothing itself: it only hooks the pending names."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _pending:  # the common case, without a lock: a dict lookup
            return None
        busy: set[str] | None = getattr(_local, "busy", None)
        if busy is None:
            busy = _local.busy = set()
        if fullname in busy:
            return None  # another finder asked sys.meta_path again for this name: not us
        busy.add(fullname)
        try:
            spec = self._delegate(fullname, path, target)
            if spec is not None:
                _wrap(spec)
            return spec
        except Exception:
            _log_once(f"find:{fullname}", "swmp: cannot hook the import of %s; not instrumented", fullname)
            return None  # the normal search runs again without us
        finally:
            busy.discard(fullname)

    def _delegate(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        # What the import system would do next: ask the finders after this one (those
        # before it already said no). Calling them directly, rather than
        # importlib.util.find_spec, cannot come back here.
        finders = list(sys.meta_path)
        for i, finder in enumerate(finders):
            if finder is self:
                finders = finders[i + 1 :]
                break
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec  # type: ignore[no-any-return]
        return None

    def invalidate_caches(self) -> None:
        pass


def _wrap(spec: ModuleSpec) -> None:
    """Make ``spec.loader.exec_module`` run the pending callbacks after the module body."""
    loader = spec.loader
    real = getattr(loader, "exec_module", None)
    if loader is None or real is None:
        # A legacy loader without exec_module: there is no "body executed" moment to hook.
        _log_once(f"loader:{spec.name}", "swmp: %s has no exec_module; not instrumented", spec.name)
        return
    if getattr(real, _WRAPPED, False):
        return  # a loader shared by several modules (zip files) is wrapped once

    def exec_module(module: ModuleType) -> None:
        real(module)  # the module's own errors propagate, as without us
        _fire(getattr(module, "__name__", spec.name))

    setattr(exec_module, _WRAPPED, True)
    # An instance attribute: the loader keeps its class (isinstance checks, pkg_resources
    # adapters, get_source for tracebacks) and only this method changes.
    loader.exec_module = exec_module  # type: ignore[method-assign]


_finder = PostImportFinder()


def _fire(name: str) -> None:
    with _lock:
        callbacks = _pending.pop(name, None)
        if not _pending:
            _remove_finder()
    for key, cb in (callbacks or {}).items():
        try:
            cb()
        except Exception:
            _log_once(f"cb:{name}:{key}", "swmp: the post-import hook %r for %s failed; skipped", key, name)


def _remove_finder() -> None:
    # Rebind rather than remove in place: another thread may be iterating sys.meta_path
    # inside an import right now, and removing an element under its iterator would make it
    # skip the next finder.
    if any(f is _finder for f in sys.meta_path):
        sys.meta_path = [f for f in sys.meta_path if f is not _finder]


def defer(name: str, callback: Callback, key: str = "") -> None:
    """Run ``callback()`` once, right after module ``name`` is next imported.

    ``key`` names the callback: deferring the same key again for the same module replaces
    it (calling ``install_all`` twice must not patch twice). Empty: ``repr(callback)``.

    If the module is already (fully or partly) imported, the callback runs now: a partly
    imported module is being imported by another thread, and the callback's own import of
    it waits for that thread to finish.
    """
    with _lock:
        _pending.setdefault(name, {})[key or repr(callback)] = callback
        if not any(f is _finder for f in sys.meta_path):
            sys.meta_path.insert(0, _finder)
    # Checked after registering, so a concurrent import is either seen here or hooked.
    if name in sys.modules:
        _fire(name)


def pending() -> tuple[str, ...]:
    """Module names still waiting for their import."""
    with _lock:
        return tuple(_pending)


def clear() -> None:
    """Forget every pending callback and leave ``sys.meta_path``."""
    with _lock:
        _pending.clear()
        _remove_finder()


def active() -> bool:
    """Whether the finder is in ``sys.meta_path``."""
    return any(f is _finder for f in sys.meta_path)
