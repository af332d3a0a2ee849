"""The registry of user kernels (`lazymath.kernel`): kernel key -> its definition.

A user kernel is one graph op (`Op.CUSTOM`); a node's ``arg`` is ``(key, params)``, where the
key names the definition (module, qualified name and a hash of its source, so editing the
kernel changes the key, the program-cache signature and the disk-cache key) and ``params`` is
a sorted tuple of (name, value) keyword parameters. The definition object is opaque here: the
layers that need it call its methods (`evaluate` for the reference executor, `build` for the
backend template, `reference_run` for the IR oracle), so graph/ imports nothing above it.
"""

from __future__ import annotations

from lazymath._lazy import load

_KERNELS: dict[str, object] = {}
# name -> key of the kernels lazymath itself writes with the builder (the Vector FFT,
# backend/npu/templates/fft.py), registered when their module is imported
BUILTIN: dict[str, str] = {}
# name -> deferred module that defines built-in kernel `name` (`provide`, by the driver): the
# template modules load with the first graph that uses them, not with every first realize
# (the FFT and conv1d templates and the user-kernel builder are ~150 KB of bytecode)
_PROVIDERS: dict[str, object] = {}


class UnknownKernelError(KeyError):
    """A graph, schedule or cached program names a user kernel this process has not defined."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown user kernel"


def register(key: str, definition: object) -> None:
    """Make `definition` the kernel for `key` (a redefinition with the same source replaces the
    previous object: same key, same program)."""
    _KERNELS[key] = definition


def provide(name: str, module: object) -> None:
    """Built-in kernel `name` is defined by `module` (a deferred module reference, _lazy.py),
    which registers it (`register`, ``BUILTIN[name] = key``) when it is imported."""
    _PROVIDERS[name] = module


def builtin(name: str) -> str:
    """The key of built-in kernel `name`, importing the module that defines it if needed."""
    key = BUILTIN.get(name)
    if key is None:
        if name not in _PROVIDERS:
            raise UnknownKernelError(f"no built-in kernel {name!r} (known: "
                                     f"{sorted(set(BUILTIN) | set(_PROVIDERS))})")  # fmt: skip
        load(_PROVIDERS[name])
        key = BUILTIN[name]
    return key


def get(key: str) -> object:
    try:
        return _KERNELS[key]
    except KeyError:
        pass
    for name in list(_PROVIDERS):  # a built-in's key (a program of another graph's nodes)
        if name not in BUILTIN:
            builtin(name)
    try:
        return _KERNELS[key]
    except KeyError:
        raise UnknownKernelError(
            f"user kernel {key!r} is not defined in this process (define it with "
            "@lazymath.kernel before running a graph or program that uses it)"
        ) from None


def registered() -> dict[str, object]:
    """key -> definition of every user kernel defined so far (a copy)."""
    return dict(_KERNELS)
