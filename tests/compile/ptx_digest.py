"""A digest of each kernel's PTX with the source-location lines taken out, to show that
moving Python files leaves every kernel unchanged:

    python -m tests.compile.sm90 --ptx-dir A         (on one tree; then B on the other)
    python -m tests.compile.ptx_digest A B           (prints the kernels that differ)

What is dropped carries only where the source lies: `.loc` and `.file` lines, the DWARF
sections at the end (`.section .debug_*`), and `//` comments (LLVM writes file:line
there). Everything else -- instructions, registers, labels, shared memory -- is compared.
"""
from __future__ import annotations

import hashlib
import os
import sys


def normalise(ptx: str) -> str:
    lines = []
    for line in ptx.splitlines():
        stripped = line.strip()
        if stripped.startswith(".section") and ".debug" in stripped:
            break                                   # DWARF only from here on
        if stripped.startswith((".loc", ".file")):
            continue
        code = line.split("//", 1)[0].rstrip()
        if code:
            lines.append(code)
    return "\n".join(lines) + "\n"


def digests(folder: str) -> dict[str, str]:
    """{file name: sha256 of its normalised PTX} for every .ptx file in `folder`."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".ptx"):
            with open(os.path.join(folder, name)) as f:
                out[name] = hashlib.sha256(normalise(f.read()).encode()).hexdigest()
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 1:
        for name, digest in digests(argv[0]).items():
            print(digest, name)
        return 0
    a, b = digests(argv[0]), digests(argv[1])
    differ = sorted(n for n in a.keys() & b.keys() if a[n] != b[n])
    only = sorted(a.keys() ^ b.keys())
    for name in differ:
        print("differs:", name)
    for name in only:
        print(f"only in {argv[0] if name in a else argv[1]}: {name}")
    same = len(a.keys() & b.keys()) - len(differ)
    print(f"{same} of {len(a.keys() | b.keys())} PTX files identical "
          f"(source locations aside)")
    return 0 if not differ and not only else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
