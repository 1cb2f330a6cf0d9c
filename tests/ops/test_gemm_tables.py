"""gemm_table.json keyed by GPU model (trident/ops/gemm_tables.py) and how the GEMM core
picks its config from it (gemm.config_for): the package's tables resolve to candidates,
a GPU without a table takes the nearest measured one, a class without an entry the
nearest M bucket, swap-AB entries give the fused ops a plain config, and writing a GPU's
table keeps the others. No kernel runs here."""
import json

import pytest

from trident.ops import gemm, gemm_tables

H200 = ("NVIDIA H200", (9, 0))


def test_package_tables_resolve():
    """Every GPU's every class names a known config (fused_config a plain one: neither
    swap-AB nor Gluon); the H200 table is the one measured on 2026-11-26
    (bench/results/gemm-1xh200-2026-11-26.json) with its mid-M classes measured again on
    2026-12-02 (gemm-midm-1xh200-2026-12-02b.json), with the decode-size M edges, every
    class measured; no model is invented."""
    listed, tables = gemm_tables.read()
    assert "NVIDIA H200" in tables
    h200 = tables["NVIDIA H200"]
    assert h200.capability == (9, 0) and h200.m_edges == (1, 8, 16, 32, 64, 128, 256, 1024, 4096)
    assert sorted(h200.classes) == sorted(h200.all_classes())
    assert all(entry["measured"] for entry in h200.classes.values())
    assert h200.shape_class(256, 5120, 8192) == "m256-nbig-kbig"
    assert h200.shape_class(8192, 4096, 2048) == "mbig-n4096-k4096"
    assert h200.classes["mbig-nbig-kbig"]["measured"] is True
    for table in tables.values():
        for cls, entry in table.classes.items():
            assert gemm.resolve(entry["config"])["BM"] > 0, cls
            assert not gemm.resolve(entry.get("fused_config", entry["config"]))["SWAP_AB"] \
                or "fused_config" not in entry, cls
            if "fused_config" in entry:
                assert not gemm.resolve(entry["fused_config"]).get("GLUON"), cls
    assert set(listed) <= set(gemm.KNOWN)


def test_new_edges_have_a_bucket_per_bench_m():
    from trident.bench.gemm import DEFAULT_M
    t = gemm_tables.GpuTable("x")
    got = [t.shape_class(m, 8192, 4096).split("-")[0] for m in DEFAULT_M]
    assert got == [f"m{m}" for m in DEFAULT_M[:-1]] + ["mbig"]
    assert len(set(got)) == len(DEFAULT_M) == len(gemm_tables.M_EDGES) + 1
    assert t.shape_class(2, 8192, 4096).startswith("m8-")
    assert t.shape_class(65, 8192, 4096).startswith("m128-")


def _tables():
    def t(name, cap):
        return gemm_tables.GpuTable(name, cap, classes={"m64-nbig-kbig": {"config": name}})
    return {n: t(n, c) for n, c in [("NVIDIA H200", (9, 0)), ("NVIDIA H100 80GB HBM3", (9, 0)),
                                   ("NVIDIA A100-SXM4-80GB", (8, 0))]}


@pytest.mark.parametrize("name,cap,want", [
    ("NVIDIA H200", (9, 0), "NVIDIA H200"),                     # its own
    ("NVIDIA H100 PCIe", (9, 0), "NVIDIA H100 80GB HBM3"),      # same family
    ("NVIDIA H200 NVL", (9, 0), "NVIDIA H200"),
    ("NVIDIA H800", (9, 0), "NVIDIA H100 80GB HBM3"),           # same capability, first name
    ("NVIDIA A100-PCIE-40GB", (8, 0), "NVIDIA A100-SXM4-80GB"),
    ("NVIDIA L4", (8, 9), "NVIDIA A100-SXM4-80GB"),             # same major (8) first
    ("NVIDIA B200", (10, 0), "NVIDIA H100 80GB HBM3"),          # nearest major (9)
])
def test_pick_nearest_measured_table(name, cap, want):
    assert gemm_tables.pick(_tables(), name, cap).name == want


def test_pick_without_tables_and_families():
    assert gemm_tables.pick({}, "NVIDIA H200", (9, 0)) is None
    assert gemm_tables.family("NVIDIA H100 80GB HBM3") == "H100"
    assert gemm_tables.family("NVIDIA A100-SXM4-80GB") == "A100"
    assert gemm_tables.family("NVIDIA GH200 480GB") == "GH200"


def test_missing_class_takes_nearest_m_bucket():
    t = gemm_tables.GpuTable("x", classes={"m64-nbig-kbig": {"config": "a"},
                                           "m1024-nbig-kbig": {"config": "b"}})
    assert t.entry(100, 8192, 8192)["config"] == "a"       # m128: m64 is one bucket away
    assert t.entry(300, 8192, 8192)["config"] == "b"       # m256: m1024 one away, m64 two
    assert t.entry(5000, 8192, 8192)["config"] == "b"
    assert t.entry(64, 1024, 8192) is None                 # no entry of n4096-kbig


def test_config_for_swap_entry(monkeypatch):
    """A swap-AB entry: the standalone GEMM gets it, the fused ops its fused_config (or
    the default plain tiles without one), never SPLIT_K or SWAP_AB keys."""
    gpu = ("Test GPU", (9, 0))
    table = gemm_tables.GpuTable("Test GPU", (9, 0), classes={
        "m64-nbig-kbig": {"config": "swab128x64x64_s6_w4_sk8", "fused_config": "64x128x64_s4_w4"},
        "m128-nbig-kbig": {"config": "swab128x32x128_s4_w4_sk8"}})
    monkeypatch.setattr(gemm, "INTERPRET", False)
    monkeypatch.setitem(gemm._picked, gpu, table)
    assert gemm.config_for(64, 8192, 8192, split_k=True, gpu=gpu) == \
        gemm.CANDIDATES["swab128x64x64_s6_w4_sk8"]
    fused = gemm.config_for(64, 8192, 8192, gpu=gpu)
    plain = dict(gemm.CANDIDATES["64x128x64_s4_w4"])
    del plain["SPLIT_K"], plain["SWAP_AB"]
    assert fused == plain
    fused = gemm.config_for(128, 8192, 8192, gpu=gpu)        # no fused_config: the default
    assert "SWAP_AB" not in fused and "SPLIT_K" not in fused and fused["BM"] == 128
    # the real table for an unmeasured GPU of the same family
    gemm._picked.pop(("NVIDIA H200 NVL", (9, 0)), None)
    assert gemm.table_for(("NVIDIA H200 NVL", (9, 0))).name == "NVIDIA H200"
    assert gemm.config_for(8192, 8192, 8192, split_k=True, gpu=H200) == \
        gemm.resolve("128x256x64_s3_w8")


def test_update_keeps_other_gpus(tmp_path):
    """Writing the H100's table into a new file makes the file of that model alone (with
    the package's candidates); writing it again replaces only the H100's table; another
    model's table written into it is kept beside; the package reads every
    gemm_table*.json beside gemm_table.json (an H100 file there is the H100's table, and
    an H100 without one takes the H200's); the single-table format of before reads as its
    device's table."""
    path = str(tmp_path / "gemm_table_h100.json")
    assert gemm_tables.file_for("NVIDIA H100 80GB HBM3").endswith("gemm_table_h100.json")
    h100 = gemm_tables.GpuTable("NVIDIA H100 80GB HBM3", (9, 0), classes={
        "m64-nbig-kbig": {"config": "swab128x64x64_s6_w4_sk8", "measured": True}})
    gemm_tables.update(path, h100, {"swab128x64x64_s6_w4_sk8": {"BM": 128}}, "test")
    listed, tables = gemm_tables.read(path)
    assert sorted(tables) == ["NVIDIA H100 80GB HBM3"]
    assert set(gemm_tables.read(gemm_tables.TABLE_PATH)[0]) <= set(listed)
    h100.classes = {"m128-nbig-kbig": {"config": "128x64x64_s6_w4_sk8", "measured": True}}
    gemm_tables.update(path, h100, {}, "test")
    other = gemm_tables.GpuTable("NVIDIA H100 PCIe", (9, 0), classes={
        "m128-nbig-kbig": {"config": "64x128x64_s4_w4", "measured": True}})
    gemm_tables.update(path, other, {}, "test")
    listed, tables = gemm_tables.read(path)
    assert list(tables["NVIDIA H100 80GB HBM3"].classes) == ["m128-nbig-kbig"]
    assert "swab128x64x64_s6_w4_sk8" in listed and "NVIDIA H100 PCIe" in tables
    # the package reads a model's file beside gemm_table.json
    import shutil
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    shutil.copy(gemm_tables.TABLE_PATH, pkg / "gemm_table.json")
    old_path = gemm_tables.TABLE_PATH
    try:
        gemm_tables.TABLE_PATH = str(pkg / "gemm_table.json")
        assert gemm_tables.pick(gemm_tables.read()[1], "NVIDIA H100 80GB HBM3",
                                (9, 0)).name == "NVIDIA H200"
        shutil.copy(path, pkg / "gemm_table_h100.json")
        tables = gemm_tables.read()[1]
        assert {"NVIDIA H200", "NVIDIA H100 80GB HBM3"} <= set(tables)
        assert gemm_tables.pick(tables, "NVIDIA H100 80GB HBM3", (9, 0)).name == \
            "NVIDIA H100 80GB HBM3"
        assert gemm_tables.pick(tables, "NVIDIA H200", (9, 0)).name == "NVIDIA H200"
    finally:
        gemm_tables.TABLE_PATH = old_path
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"classes": {"mbig-nbig-kbig": {
        "config": "128x256x64_s3_w8", "device": "NVIDIA H200"}}}))
    _, tables = gemm_tables.read(str(old))
    assert list(tables) == ["NVIDIA H200"] and tables["NVIDIA H200"].m_edges == (128, 512, 2048)
