"""lazymath's block pool as a threadpoolctl library, so `threadpool_limits(n)` limits it.

threadpoolctl (>= 3) finds thread pools by the shared libraries loaded in the process and asks a
registered `LibController` subclass for each library whose file name starts with one of the
controller's `filename_prefixes`. lazymath's pool is Python threads over code mapped without a
shared library of its own, so the controller names the C library every process has loaded
(glibc's libc.so.6, musl's libc, macOS's libSystem, Windows' ucrtbase): threadpoolctl then lists
one "lazymath" pool (user_api "lazymath") and its limits call `lazymath._threads.set_num_threads`.
`threadpool_limits(1)` (what scikit-learn and Dask use around nested parallelism) runs every
kernel launch on the calling thread; leaving the block restores the previous count.

Registered when both are imported, in either order (`install`): at `import lazymath` if
threadpoolctl is loaded already, else by a one-shot import hook right after threadpoolctl
loads -- importing threadpoolctl itself (~90 KB of bytecode, 2-3 ms) would be a cost on every
`import lazymath` for a library most processes never touch. A missing threadpoolctl is no
error: nothing to limit lazymath with then."""

from __future__ import annotations

import importlib.util
import sys

from lazymath._lazy import deferred
from lazymath._version import __version__

_threads = deferred("lazymath._threads")  # the pool itself: loaded by the first limit or query


def register() -> bool:
    """Register the controller with threadpoolctl; False when threadpoolctl is missing or too
    old to accept custom controllers."""
    try:
        import threadpoolctl
    except ImportError:
        return False
    if not hasattr(threadpoolctl, "register") or not hasattr(threadpoolctl, "LibController"):
        return False
    known = getattr(threadpoolctl, "_ALL_CONTROLLERS", ())
    if any(c.__name__ == "LazymathController" for c in known):
        return True

    class LazymathController(threadpoolctl.LibController):
        """lazymath's kernel block pool (see the module)."""

        user_api = "lazymath"
        internal_api = "lazymath"
        filename_prefixes = ("libc.so", "libc.musl", "libsystem.b", "ucrtbase")

        def get_num_threads(self) -> int:
            return _threads.get_num_threads()

        def set_num_threads(self, num_threads: int) -> None:
            _threads.set_num_threads(max(1, int(num_threads)))

        def get_version(self) -> str:
            return __version__

    threadpoolctl.register(LazymathController)
    return True


class _RegisterAfterImport:
    """A meta-path finder that only watches for ``threadpoolctl``: it lets the normal finders
    find it, wraps the loader so the controller is registered once the module has run, and
    removes itself (one shot)."""

    def find_spec(self, name, path=None, target=None):
        if name != "threadpoolctl":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


class _Loader:
    """threadpoolctl's own loader, then `register`."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        register()


def install() -> None:
    """Register now if threadpoolctl is loaded, else as soon as something imports it."""
    if "threadpoolctl" in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterImport())
