"""Compile a traced kernel with TRACE=False and its twin without any tracing call, and
print (as JSON) whether their machine code is identical. Run as a script in a process of
its own (`python -m tests.trace.compile_twins [out.json]`): it needs the real Triton
compiler, which works without a GPU (for sm_90) even where the tests use the interpreter.
"""
import os
import re
import subprocess
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "0"          # before trident/triton pick their mode
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"  # line numbers differ between the twins

import json  # noqa: E402

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from trident.trace import device as trd  # noqa: E402
from trident.trace import tags  # noqa: E402


@triton.jit
def traced_copy(src, dst, trace_buf, rank, n, TILES: tl.constexpr, BLOCK: tl.constexpr,
                TRACE: tl.constexpr):
    t_kernel = trd.begin(TRACE)
    for i in range(TILES):
        t = trd.begin(TRACE)
        offs = (tl.program_id(0) * TILES + i) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < n)
        tl.store(dst + offs, x * 2, mask=offs < n)
        trd.end(trace_buf, t, tags.COPY, rank, TRACE)
    trd.end(trace_buf, t_kernel, tags.KERNEL, rank, TRACE)


@triton.jit
def plain_copy(src, dst, trace_buf, rank, n, TILES: tl.constexpr, BLOCK: tl.constexpr,
               TRACE: tl.constexpr):
    for i in range(TILES):
        offs = (tl.program_id(0) * TILES + i) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(src + offs, mask=offs < n)
        tl.store(dst + offs, x * 2, mask=offs < n)


SIGNATURE = {"src": "*fp32", "dst": "*fp32", "trace_buf": "*i64", "rank": "i32", "n": "i32",
             "TILES": "constexpr", "BLOCK": "constexpr", "TRACE": "constexpr"}


def target():
    try:
        from triton.runtime import driver
        return driver.active.get_current_target()
    except Exception:                             # no GPU here: compile for H100/H200
        return GPUTarget("cuda", 90, 32)


def compile_asm(fn, trace: bool, tgt) -> dict:
    src = ASTSource(fn, SIGNATURE, {"TILES": 4, "BLOCK": 512, "TRACE": trace})
    return triton.compile(src, target=tgt).asm


def normalize_ptx(ptx: str, name: str) -> str:
    ptx = re.sub(r"\.section\s+\.debug_\w+\s*\{.*?\}", "", ptx, flags=re.S)
    lines = [ln.strip() for ln in ptx.replace(name, "KERNEL").splitlines()]
    return "\n".join(ln for ln in lines if ln and not ln.startswith(("//", ".loc", ".file")))


def sass(cubin: bytes, name: str) -> str | None:
    """Disassembled instructions (cuobjdump from Triton's own toolchain), or None."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True,
                                  timeout=60, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    return "\n".join(ln.strip() for ln in text.replace(name, "KERNEL").splitlines()
                     if ln.strip().startswith("/*"))


def main() -> dict:
    tgt = target()
    off = compile_asm(traced_copy, False, tgt)
    plain = compile_asm(plain_copy, False, tgt)
    on = compile_asm(traced_copy, True, tgt)
    ptx_off, ptx_plain = normalize_ptx(off["ptx"], "traced_copy"), normalize_ptx(plain["ptx"], "plain_copy")
    sass_off, sass_plain = sass(off["cubin"], "traced_copy"), sass(plain["cubin"], "plain_copy")
    return {
        "target": f"{tgt.backend} sm_{tgt.arch}",
        "ptx_identical": ptx_off == ptx_plain,
        "ptx_lines": len(ptx_off.splitlines()),
        "sass_compared": sass_off is not None and sass_plain is not None,
        "sass_identical": sass_off == sass_plain and sass_off is not None,
        "sass_instructions": len((sass_off or "").splitlines()),
        "traced_ptx_reads_globaltimer": "%globaltimer" in on["ptx"],
        "traced_ptx_differs": normalize_ptx(on["ptx"], "traced_copy") != ptx_off,
    }


if __name__ == "__main__":
    result = json.dumps(main())
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as out:
            out.write(result)
    print(result)
