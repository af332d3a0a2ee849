"""Room 1 of the backend: the device-only NPU program.

What an Ascend-style NPU would run, and nothing about the CPU that emulates it: the ISA
(`isa`, its Cube part `isa_cube`, the binary `isa_codec`), the kernel IR that fusion hands over
(`kernel_ir`, evaluated by `ir_reference`), the templates that turn it into ISA programs
(`templates/`, `userkernel`, the vector math composites `vmath`, UB tiling `tiles`), and the
program's device-side consumers: the numpy interpreter (`interp`), the race checker (`races`),
the cycle cost model (`cost`), the Cube instructions' semantics for all three
(`cube_semantics`), the AI CPU kernels (`host_kernels`) and the cancel flag every running
kernel polls (`cancel`).

Imports nothing from `backend.native` or `backend.host`: a program can be built, printed,
interpreted and costed without LLVM.
"""
