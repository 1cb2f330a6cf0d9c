"""With TRACE=False a traced kernel compiles to the same machine code as its twin without
any tracing call. The real compiler runs in a child process (the test process may be
using the Triton interpreter); on a machine without a GPU it compiles for sm_90."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_trace_off_compiles_to_the_code_of_no_tracing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRIDENT_BACKEND")}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")   # fresh: no entry built with line info
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, "-m", "tests.trace.compile_twins", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["traced_ptx_reads_globaltimer"], result       # the check is not vacuous
    assert result["traced_ptx_differs"], result
    assert result["ptx_identical"], result
    if result["sass_compared"]:
        assert result["sass_identical"], result
