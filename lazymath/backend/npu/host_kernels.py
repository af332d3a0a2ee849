"""Kernels that run on the host without native code: the AI CPU (its kernel IR, a straight-line
numpy program, for what no AI Core unit does well) and the irref backend (the fused kernel IR
evaluated with numpy).

Both expose the launch surface of a compiled AI Core kernel (`make_argv`, `run_block`,
`blocks`), with the 'argv' being the list of numpy arrays itself.
"""

from __future__ import annotations

import numpy as np

from lazymath.backend.npu import ir_reference
from lazymath.backend.npu.kernel_ir import AicpuKernel
from lazymath.graph import reference


class AicpuRunner:
    """Runs an AI CPU kernel IR (`kernel_ir.AicpuKernel`): each step by the numpy reference
    executor's rule for its op (`graph.reference.evaluate`), in order, then the results into
    the output arrays.

    Exposes the same launch surface as a compiled AI Core kernel (`make_argv`, `run_block`),
    with the 'argv' being the list of numpy arrays itself.
    """

    blocks = 1
    llvm_ir = None
    asm = None

    def __init__(self, name: str, ir: AicpuKernel):
        self.name = name
        self.ir = ir
        # per step: what the evaluator reads of it (numpy dtypes), or the constant's 0-d array
        self._steps = [(_Step(st), st.srcs, _const(st)) for st in ir.steps]
        self._dtypes = [np.dtype(v.dtype) for v in ir.outputs]
        self.isa_text = ir.as_text()
        self.cost = None

    def make_argv(self, arrays):
        return list(arrays)

    def run_block(self, argv, block_idx: int = 0, block_num: int = 1) -> None:
        ir = self.ir
        n_in = len(ir.inputs)
        vals: list = []
        for st, srcs, const in self._steps:
            op = st.op
            if op == "load":
                vals.append(argv[st.arg])
            elif op == "const":
                vals.append(const)
            else:
                vals.append(reference.evaluate(st, [vals[k] for k in srcs]))
        for out, k, dtype in zip(argv[n_in:], ir.results, self._dtypes):
            out.reshape(-1)[:] = np.asarray(vals[k], dtype=dtype).reshape(-1)

    def __call__(self, *arrays):
        self.run_block(self.make_argv(arrays))


class IrRefKernel:
    """LAZYMATH_BACKEND=irref: run the fused kernel IR with numpy (`backend.npu.ir_reference`).

    Isolates the fusion layer: a graph that is right here but wrong on llvm/interp points at
    the templates or the lowering, not at fusion.
    """

    blocks = 1
    llvm_ir = None
    asm = None
    cost = None

    def __init__(self, name: str, ir):
        self.name = name
        self.ir = ir
        self.isa_text = f"irref: {ir.kind} kernel (numpy evaluation of the kernel IR)"

    def make_argv(self, arrays):
        return list(arrays)

    def run_block(self, argv, block_idx: int = 0, block_num: int = 1) -> None:
        ir_reference.run(self.ir, argv)


class _Step:
    """The fields of a step the reference evaluator reads (it takes graph-node-like records:
    op, arg, numpy dtype, shape)."""

    __slots__ = ("op", "arg", "dtype", "shape")

    def __init__(self, st):
        self.op, self.arg, self.dtype, self.shape = st.op, st.arg, np.dtype(st.dtype), st.shape


def _const(st) -> np.ndarray | None:
    if st.op != "const":
        return None
    a = np.array(st.arg, dtype=st.dtype)
    a.flags.writeable = False
    return a
