"""What fuses with what — read this file top to bottom to know the fusion policy.

Every grouping decision in `grouping.py` looks up one of these tables; every refusal records the
reason string from here (plus specifics), so `Schedule.fusion_log` answers "why did this not
fuse?".
"""

from __future__ import annotations

from lazymath.graph.ops import ELEMENTWISE

# (producer kind, consumer kind): (fuses?, reason when it does not)
FUSE: dict[tuple[str, str], tuple[bool, str]] = {
    ("elementwise", "elementwise"): (True, ""),
    ("view", "elementwise"): (True, ""),  # views are strides, read in place
    ("elementwise", "reduce"): (True, ""),  # prologue, computed as the tile is loaded
    ("reduce", "elementwise"): (True, ""),  # epilogue on the reduced tile
    ("matmul", "elementwise"): (True, ""),  # epilogue on the L0C tile before write-out
    ("elementwise", "matmul"): (True, ""),  # operand prologue in the GM -> L1 load, when cheap
    ("reduce", "reduce"): (False, "a reduce feeding a reduce needs its full result first"),
    ("matmul", "matmul"): (False, "a matmul operand must be complete in GM before packing"),
    ("reduce", "matmul"): (False, "a matmul operand must be complete in GM before packing"),
    ("matmul", "reduce"): (False, "the Cube writes its tile once; a reduction over it runs after"),
    ("aicpu", "elementwise"): (False, "AI CPU kernels run separately from AI Core kernels"),
    ("elementwise", "aicpu"): (False, "AI CPU kernels run separately from AI Core kernels"),
    # user kernels (`lazymath.kernel`) are fusion boundaries: they read and write dense GM
    ("custom", "elementwise"): (
        False,
        "a user kernel writes its output to GM; its consumers run in their own kernel",
    ),  # fmt: skip
    ("elementwise", "custom"): (False, "a user kernel reads dense inputs from GM"),
    ("custom", "custom"): (False, "a user kernel reads dense inputs from GM"),
    ("custom", "reduce"): (
        False,
        "a user kernel writes its output to GM; its consumers run in their own kernel",
    ),  # fmt: skip
    ("custom", "matmul"): (
        False,
        "a user kernel writes its output to GM; its consumers run in their own kernel",
    ),  # fmt: skip
}

# Ops the 910B FixPipe applies on the way L0C -> GM (relu, cast). A split-architecture Cube core
# has no UB, so any other epilogue op runs in a separate Vector kernel that meets it in GM.
# From the op records (`graph.ops`, trait `fixpipe`).
FIXPIPE_OPS = frozenset(k for k, m in ELEMENTWISE.items() if m.info.fixpipe)

# On the split 910B a matmul's epilogue that holds an expensive op (`EXPENSIVE_OPS`: GELU's erf,
# SiLU's sigmoid, tanh, a divide) runs on the AIVs of a MIX kernel (AIC FixPipes each L0C tile to
# an L2-resident GM workspace slot, the AIVs apply the epilogue -- bias, activation, residual add
# -- while the AIC computes the next tile), as conv1d's implicit GEMM does: the Vector work
# overlaps the Cube's instead of following it, and the product never makes an HBM round trip.
# Cycle model, ascend910b, fp32 x (M, K) @ w.T (K, N) + bias, act, + residual, MIX vs Cube +
# Vector kernels: 4096x768x3072 gelu 1163 vs 1217 us, silu 229 vs 350, no activation 225 vs
# 279; 512x768x768 gelu 47.7 vs 56.0, silu 17.9 vs 16.4, none 14.2 vs 14.0; 64x96x128 within
# 7 % either way. A cheap epilogue (bias, scale, residual add alone) keeps the two-kernel plan:
# it gains only on large products, and a size rule is not written yet.
MATMUL_MIX_EPILOGUE = True
MIX_EPILOGUE_NEEDS = (
    "an expensive op (transcendental or divide) in the epilogue: a cheap "
    "epilogue on the split device stays a Vector kernel after the Cube kernel"
)

# Ops whose recomputation is not cheap (a divide, a square root or a transcendental): the op
# records' cost class (`OpInfo.expensive`).
EXPENSIVE_OPS = frozenset(k for k, m in ELEMENTWISE.items() if m.info.expensive)

# A node with consumers in several kernels is recomputed in each of them when the work it would
# duplicate is at most this many ops and none is expensive: kernels here are memory bound, and a
# few vector ops cost less than a round trip through GM. Otherwise it is materialized once.
RECOMPUTE_MAX_OPS = 3

# An elementwise producer fuses into a matmul operand's GM -> L1 load when it reads exactly one
# buffer, has at most this many ops (the packing loop applies it per element) and none of them is
# in EXPENSIVE_OPS: transcendentals, divides and roots need the Vector unit's math library, which
# a data mover does not have, so such a producer runs as its own (costed, vmath) Vector kernel.
OPERAND_PROLOGUE_MAX_OPS = 8
# On a split device (910B) the Cube core (AIC) has no Vector unit and no UB, and MTE2 does no
# arithmetic: any operand prologue (even a cast or a negation) runs on the Vector cores (AIV) as
# its own kernel and reaches the Cube through GM.
SPLIT_PROLOGUE = ("matmul operand prologue: the split device's Cube core has no Vector unit "
                  "(MTE2 does no arithmetic), so it runs as its own Vector kernel")  # fmt: skip

# Caps per kernel: GM inputs (AscendC allows 64 queue buffers per kernel; each input needs a
# double-buffered queue) and scalar ops per fused expression (keeps compile time bounded).
MAX_KERNEL_INPUTS = 16
MAX_KERNEL_OPS = 192

# Node kinds that always end a kernel and write their result to GM.
MATERIALIZING_KINDS = frozenset({"reduce", "matmul", "pad", "concat", "conv1d", "fft", "custom"})

# Kinds that have no AI Core template yet and run on the AI CPU (numpy).
AICPU_KINDS = frozenset({"pad", "concat", "conv1d", "fft"})


# Row fusion. Reductions over the same axes of one shape, the elementwise ops that read their
# results broadcast back over the rows (softmax, log_softmax, layernorm, RMSnorm, var/std,
# x / norm(x)) and the elementwise ops before the first reduction form ONE row kernel. Its form
# is chosen from the device's UB capacity:
#   "resident"  a block of rows fits UB with double-buffered queues: read once, written once;
#   "online"    a row is wider than UB: two passes over the row in chunks, reductions that need
#               an earlier reduction merged online (running max + rescaled sum for softmax,
#               Chan/Welford for mean + squared deviations);
#   refused     neither: the first reduction is written to GM and the rest plans again.
# The fusion log records the form and why ("rows" entries).
def row_form(template, ir, spec) -> tuple[str | None, str]:
    """("resident" | "online" | None, reason) for a row kernel on `spec` (asks `template`,
    the backend's row template, for the UB footprint and the online patterns it knows)."""
    return template.choose(ir, spec)


# A sum over m of a matmul's product (sum(A @ B, axis=-2), possibly of an elementwise epilogue)
# is computed in the matmul kernel: on a coupled (910) core the vector unit folds each L0C
# tile's rows into a column accumulator in UB; on a split (910B) device, whose Cube core (AIC)
# has no UB, the kernel becomes a MIX kernel (AIC + AIV, tiles handed over in a GM workspace
# with cross-core flags; see templates/matmul.py). FixPipe cannot reduce, so that is the only
# honest one-kernel form there.
MATMUL_COL_SUM = True
# Likewise a sum / max / min over n (sum(A @ B, axis=-1), of an epilogue too): each output tile
# reduces its rows over its columns on the vector unit (910) or the AIVs (910B MIX); a row spans
# every N panel, so the panels' partials meet in a GM workspace and the last panel of a row
# block to arrive (an atomic counter) combines them in panel order (deterministic).
MATMUL_ROW_REDUCE = True
# softmax(x, axis=-1) of a matmul's product (a row kernel whose only input is the product) joins
# the matmul kernel in its online form: tiles write exp(x - their row max) and publish (max,
# sum); the last N panel of a row block rescales the block's rows in GM (read + write once more
# of the block, on chip-local L2 on a device, against a full GM round trip of the product).
MATMUL_SOFTMAX = True
