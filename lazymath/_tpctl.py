"""lazymath's block pool as a threadpoolctl library, so `threadpool_limits(n)` limits it.

threadpoolctl (>= 3) finds thread pools by the shared libraries loaded in the process and asks a
registered `LibController` subclass for each library whose file name starts with one of the
controller's `filename_prefixes`. lazymath's pool is Python threads over code mapped without a
shared library of its own, so the controller names the C library every process has loaded
(glibc's libc.so.6, musl's libc, macOS's libSystem, Windows' ucrtbase): threadpoolctl then lists
one "lazymath" pool (user_api "lazymath") and its limits call `lazymath._threads.set_num_threads`.
`threadpool_limits(1)` (what scikit-learn and Dask use around nested parallelism) runs every
kernel launch on the calling thread; leaving the block restores the previous count.

Registered when lazymath is imported and threadpoolctl is importable (a missing threadpoolctl
is no error: nothing to limit lazymath with then)."""

from __future__ import annotations

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
