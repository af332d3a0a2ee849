"""Build tools/native_lane.c into the machine code lazymath/_threads.py maps (`_LANE_CODE`).

    python tools/build_native_lane.py        # prints the Python constants to paste

Needs gcc, objcopy and nm (binutils). The code must be position independent with no
relocations (no globals, no libc, no PLT): the script refuses an object that has any.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = ["-O2", "-fPIC", "-ffreestanding", "-fno-stack-protector", "-fcf-protection=none",
         "-fno-asynchronous-unwind-tables", "-fno-exceptions", "-fno-jump-tables"]  # fmt: skip
EXPORTS = ("lane_spin", "lane_tsc", "lane_work", "lane_launch", "lane_ring", "lane_stop")


def build() -> tuple[bytes, dict]:
    src = os.path.join(HERE, "native_lane.c")
    with tempfile.TemporaryDirectory() as d:
        obj, binf = os.path.join(d, "lane.o"), os.path.join(d, "lane.bin")
        subprocess.run(["gcc", *FLAGS, "-c", src, "-o", obj], check=True)
        relocs = subprocess.run(["objdump", "-r", obj], check=True, capture_output=True,
                                text=True).stdout  # fmt: skip
        if "R_X86_64" in relocs:
            sys.exit(f"relocations in the object, refused:\n{relocs}")
        subprocess.run(["objcopy", "-O", "binary", "-j", ".text", obj, binf], check=True)
        code = open(binf, "rb").read()
        syms = {}
        for line in subprocess.run(["nm", obj], check=True, capture_output=True,
                                   text=True).stdout.splitlines():  # fmt: skip
            parts = line.split()
            if len(parts) == 3 and parts[2] in EXPORTS:
                syms[parts[2]] = int(parts[0], 16)
    missing = set(EXPORTS) - set(syms)
    if missing:
        sys.exit(f"missing symbols: {sorted(missing)}")
    return code, syms


def main() -> None:
    code, syms = build()
    gcc = subprocess.run(["gcc", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"# tools/native_lane.c, {gcc}: gcc {' '.join(FLAGS)}")
    print("_LANE_CODE = bytes.fromhex(")
    h = code.hex()
    for i in range(0, len(h), 88):
        print(f'    "{h[i : i + 88]}"')
    print(")")
    print("_LANE_SYMBOLS = {")
    for k, v in sorted(syms.items(), key=lambda kv: kv[1]):
        print(f'    "{k}": 0x{v:X},')
    print("}")


if __name__ == "__main__":
    main()
