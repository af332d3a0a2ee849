"""Room 2 of the backend: native code, independent of the NPU.

The machinery that turns LLVM IR into running code on this CPU: the host CPU description and
the target in force (`host`), the MCJIT engine and runtime symbols (`jit`), the ELF loader of
cached objects (`elfload`), the kernel cache in memory and on disk (`kernel_cache`), compile
workers and the crash-proof compile server (`workers`, `isolate`) and tiered compilation
(`tiering`). It imports only `npu.cancel` (the flag compiled kernels poll) from below: nothing
here knows an ISA instruction.
"""
