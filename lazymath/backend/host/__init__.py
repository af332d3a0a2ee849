"""Room 3 of the backend: the host mapping, where the NPU program meets the real CPU.

How each ISA instruction runs at host speed: the LLVM lowering of the Vector instructions
(`lower_llvm`) and of the Cube instructions (`lower_cube`: Mmad -> GEMM microkernels), the
microkernels themselves (`gemm`, conv1d's implicit im2col packing `im2col`, bfloat16 helpers
`bfloat16`), the precompiled microkernel and vector math libraries (`uklib`, `vmlib`) and the
host roofline (`roofline`). Built on both rooms below it: `npu` (what to run) and `native`
(how to compile and call it).
"""
