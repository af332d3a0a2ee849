"""The cancel flag that stops running kernels early (Ctrl-C on a long realize).

Native kernels poll it in their tile loops (the runtime symbol ``lazymath_cancel``, see
`lower_llvm`), the numpy interpreter in its ISA loops (`interp`): nonzero asks every running
kernel to return at its next tile. The engine sets it only while it interrupts a realize
(`engine._run_program`) and clears it once the kernels have returned. Every request bumps an
epoch: a run that overlapped one may have had kernels cut short, and runs again.

A module of its own (ctypes only, no LLVM) so every backend shares one flag and the engine
can interrupt any of them without loading the compiler.
"""

from __future__ import annotations

import ctypes

CANCEL_SYMBOL = "lazymath_cancel"
CANCEL = ctypes.c_int32(0)
EPOCH = [0]  # read directly (a list item, no call) on the program-cache hit path


def request() -> None:
    EPOCH[0] += 1
    CANCEL.value = 1


def clear() -> None:
    CANCEL.value = 0


def epoch() -> int:
    return EPOCH[0]
