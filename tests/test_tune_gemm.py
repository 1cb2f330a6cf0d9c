"""`trident tune --gemm`: the GEMM core's table measured on this machine's GPU goes into the
user's cache, the look-up prefers it for this exact GPU model (tuned file > the package's
own table > same family > same or nearest capability), the file the tuning writes is what
the look-up reads (written here from synthetic rows by the bench's own writer), the
command refuses on the CPU emulation unless a test forces it, and `trident info` says which
table is used. No GPU kernel runs here; the forced run times the interpreter."""
import json
import os

import pytest

from trident.tools import tune
from trident.bench import gemm as bench
from trident.runtime.launch import default_backend
from trident.ops import gemm, gemm_tables
from trident.tools import info

H100 = "NVIDIA H100 80GB HBM3"
# the CPU emulation's own cases: its refusal, and a run forced on its tiny shapes (on a GPU
# machine both would measure the GPU, which bench/gpu_*.sh do with the real command)
CPU_ONLY = pytest.mark.skipif(default_backend() == "cuda", reason="CPU emulation cases")


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """An empty per-user cache for this test."""
    monkeypatch.setenv("TRIDENT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _row(m, impl, vs):
    return dict(M=m, N=8192, K=8192, impl=impl, vs_cublas=vs, vs_floor=vs / 2,
                shape_class=gemm_tables.shape_class(m, 8192, 8192))


def _tune_from_rows(device, rows, candidates, capability=(9, 0)):
    """What `trident tune --gemm` writes for a run of `rows` on `device` (its own writer)."""
    result = dict(device=device, capability=capability, hbm_read_gbps=3000.0)
    path = gemm_tables.tuned_path(device)
    bench.write_table(path, result, bench.summarize(rows), candidates, 2, keep_others=False)
    return path


def _package(tmp_path):
    """A package file with three models, each table naming its own config at every M."""
    path = str(tmp_path / "package.json")
    for i, (name, cap, cfg) in enumerate([("NVIDIA H200", (9, 0), "128x256x64_s3_w8"),
                                          (H100, (9, 0), "64x256x64_s4_w4"),
                                          ("NVIDIA A100-SXM4-80GB", (8, 0), "64x128x64_s4_w4")]):
        table = gemm_tables.GpuTable(name, cap, classes={"m64-nbig-kbig": {"config": cfg}})
        gemm_tables.update(path, table, {}, "test", keep_others=i > 0)
    return path


def test_lookup_order(cache, tmp_path):
    package = _package(tmp_path)
    rows = [_row(64, "cublas", 1.0), _row(64, "swab128x64x64_s6_w4_sk8", 1.2),
            _row(64, "64x128x64_s4_w4_sk8", 0.9)]
    tuned = _tune_from_rows(H100, rows, gemm.CANDIDATES)
    assert os.path.dirname(tuned) == str(cache / "tune")          # beside the ccl tables

    def look(name, cap):
        table, where = gemm_tables.lookup(name, cap, package)
        return table.name, table.entry(64, 8192, 8192)["config"], where

    name, cfg, where = look(H100, (9, 0))                           # tuned, this model
    assert name == H100 and where == f"tuned on this machine: {tuned}"
    assert cfg == gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]
    assert look("NVIDIA H200", (9, 0)) == ("NVIDIA H200", "128x256x64_s3_w8",
                                           "the package's table for NVIDIA H200")
    name, cfg, where = look("NVIDIA H100 PCIe", (9, 0))             # family: the package's
    assert (name, cfg) == (H100, "64x256x64_s4_w4") and "same model family" in where
    name, cfg, where = look("NVIDIA H800", (9, 0))                  # capability, sorted name
    assert (name, cfg) == (H100, "64x256x64_s4_w4") and "same compute capability" in where
    name, cfg, where = look("NVIDIA L4", (8, 9))
    assert name == "NVIDIA A100-SXM4-80GB" and "nearest compute capability" in where
    # without the tuned file the H100 takes the package's own; an unreadable one is passed
    os.remove(tuned)
    assert look(H100, (9, 0))[:2] == (H100, "64x256x64_s4_w4")
    with open(tuned, "w") as f:
        f.write("{not json")
    name, cfg, where = look(H100, (9, 0))
    assert (name, cfg) == (H100, "64x256x64_s4_w4") and "passed over the unreadable" in where
    # a tuned file of another model under this model's file name is not used
    other = gemm_tables.GpuTable("NVIDIA H100 80GB HBM3e", (9, 0), classes={})
    gemm_tables.update(tuned, other, {}, "test", keep_others=False)
    assert look(H100, (9, 0))[:2] == (H100, "64x256x64_s4_w4")


def test_written_file_is_what_the_gemm_core_reads(cache, monkeypatch):
    """The tuned file holds this model's table alone, with the configs it names; the GEMM
    core (gemm.config_for, as on a GPU) runs them, also one the package does not list."""
    gpu = ("Test GPU T1", (9, 0))
    tile = dict(BM=64, BN=64, BK=128, GROUP_M=4, num_stages=5, num_warps=4,
                WARP_SPECIALIZE=False, SPLIT_K=1, SWAP_AB=False)
    candidates = {**gemm.CANDIDATES, "tile_of_this_run": tile}
    rows = [_row(64, "tile_of_this_run", 1.3), _row(64, "64x128x64_s4_w4", 1.1),
            _row(8192, "128x256x64_s3_w8", 0.97), _row(8192, "tile_of_this_run", 0.7)]
    path = _tune_from_rows(gpu[0], rows, candidates)
    listed, tables = gemm_tables.read(path)
    assert list(tables) == [gpu[0]] and listed["tile_of_this_run"] == tile
    assert tables[gpu[0]].capability == (9, 0)
    with open(path) as f:
        assert json.load(f)["gpus"][gpu[0]]["classes"]["m64-nbig-kbig"]["config"] == \
            "tile_of_this_run"
    monkeypatch.setattr(gemm, "INTERPRET", False)
    gemm._picked.pop(gpu, None)
    try:
        assert gemm.config_for(40, 8192, 8192, split_k=True, gpu=gpu) == tile
        assert gemm.config_for(9000, 8192, 8192, split_k=True, gpu=gpu) == \
            gemm.CANDIDATES["128x256x64_s3_w8"]
        assert gemm.config_for(1024, 8192, 8192, split_k=True, gpu=gpu) == \
            gemm.CANDIDATES["128x256x64_s3_w8"]            # not measured: nearest M (mbig)
    finally:
        gemm._picked.pop(gpu, None)


@CPU_ONLY
def test_refused_on_the_cpu_emulation(cache, capsys):
    with pytest.raises(SystemExit) as exc:
        tune.main(["--gemm"])
    assert exc.value.code == 2
    assert "CPU emulation" in capsys.readouterr().err
    assert not os.path.exists(cache)
    with pytest.raises(ValueError, match="CPU emulation"):
        tune.tune_gemm(10, None, None, None, None)
    for argv in (["--gemm", "--world-size", "2"], ["--budget-s", "10"]):
        with pytest.raises(SystemExit):
            tune.main(argv)
        assert "--gemm" in capsys.readouterr().err


@CPU_ONLY
def test_forced_run_writes_the_cache_and_info_says_so(cache, capsys):
    info._gemm_info()
    before = capsys.readouterr().out
    assert before.startswith("GEMM core table for cpu: the package's table for ")
    assert tune.main(["--gemm", "--budget-s", "120", "--timeout-s", "60"],
                     force_on_cpu=True) == 0
    path = gemm_tables.tuned_path("cpu")
    assert f"written: {path}" in capsys.readouterr().out
    assert [p.name for p in (cache / "tune").glob("gemm-cpu-*.json")], "the results JSON"
    table, where = gemm_tables.lookup("cpu", None)
    assert where == f"tuned on this machine: {path}"
    [(cls, entry)] = table.classes.items()             # the two tiny shapes: one class
    assert cls == "m64-n4096-k4096" and entry["measured"] is True
    interpret = [dict(gemm.INTERPRET_CONFIG), dict(gemm.INTERPRET_CONFIG, SWAP_AB=True)]
    assert entry["config"] in interpret
    info._gemm_info()
    assert capsys.readouterr().out.startswith(f"GEMM core table for cpu: tuned on this "
                                              f"machine: {path}; unused here")
