"""Kernels that run on the host without native code: the AI CPU (numpy on the host, for what no
AI Core unit does well) and the irref backend (the fused kernel IR evaluated with numpy).

Both expose the launch surface of a compiled AI Core kernel (`make_argv`, `run_block`,
`blocks`), with the 'argv' being the list of numpy arrays itself.
"""

from __future__ import annotations

import numpy as np

from ..graph import node as gn
from ..graph import reference
from . import ir_reference


class AicpuKernel:
    """A kernel on the AI CPU: the group's nodes evaluated by the numpy reference executor.

    Exposes the same launch surface as a compiled AI Core kernel (`make_argv`, `run_block`),
    with the 'argv' being the list of numpy arrays itself.
    """

    blocks = 1
    llvm_ir = None
    asm = None

    def __init__(self, name: str, nodes: list[gn.Node], inputs: list[gn.Node],
                 outputs: list[gn.Node]):  # fmt: skip
        self.name = name
        pos = {id(n): i for i, n in enumerate(inputs)}
        # a private copy of the group's structure, independent of the live graph
        steps = []
        local = {}
        for n in nodes:
            srcs = []
            for s in n.srcs:
                if id(s) in local:
                    srcs.append(("v", local[id(s)]))
                elif s.op == "const":
                    srcs.append(("c", s.realized))
                else:
                    srcs.append(("i", pos[id(s)]))
            local[id(n)] = len(steps)
            steps.append((_Light(n), srcs))
        self.steps = steps
        self.out_steps = [local[id(o)] for o in outputs]
        self.shapes = [(o.shape, o.dtype) for o in outputs]
        self.isa_text = "aicpu: " + " ".join(n.op for n, _ in steps)
        self.cost = None

    def make_argv(self, arrays):
        return list(arrays)

    def run_block(self, argv, block_idx: int = 0, block_num: int = 1) -> None:
        n_in = len(argv) - len(self.out_steps)
        ins = argv[:n_in]
        vals = []
        for n, srcs in self.steps:
            args = [vals[k] if t == "v" else (k if t == "c" else ins[k]) for t, k in srcs]
            vals.append(reference.evaluate(n, args))
        for out, k, (_shape, dtype) in zip(argv[n_in:], self.out_steps, self.shapes):
            out.reshape(-1)[:] = np.asarray(vals[k], dtype=dtype).reshape(-1)

    def __call__(self, *arrays):
        self.run_block(self.make_argv(arrays))


class IrRefKernel:
    """LAZYMATH_BACKEND=irref: run the fused kernel IR with numpy (`backend.ir_reference`).

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


class _Light:
    """The fields of a node the reference evaluator reads, without the graph behind it."""

    __slots__ = ("op", "arg", "dtype", "shape", "srcs")

    def __init__(self, n: gn.Node):
        self.op, self.arg, self.dtype, self.shape, self.srcs = n.op, n.arg, n.dtype, n.shape, ()
