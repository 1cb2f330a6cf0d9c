"""Placement of ranks on GPUs (trident/runtime/placement.py) and the job's MPS daemon
(trident/runtime/mps.py), on any machine: the daemon is a stand-in script that speaks the control
daemon's protocol as trident uses it (a `control` pipe; `get_server_list` and `quit`)."""
import os
import stat
import subprocess
import sys
import textwrap
import warnings

import pytest

import trident
from trident.runtime import mps, placement
from trident.runtime.launch import sharing_env

FAKE_CONTROL = textwrap.dedent("""\
    #!{python}
    # stand-in for nvidia-cuda-mps-control: `-f` serves until told `quit`; without
    # arguments it is the client, which fails when no daemon has made the control pipe
    import os, sys, time
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    control = os.path.join(pipe, "control")
    if sys.argv[1:] == ["-f"]:
        open(os.path.join(os.environ["CUDA_MPS_LOG_DIRECTORY"], "pid"), "w").write(str(os.getpid()))
        os.mkfifo(control)
        while True:
            with open(control) as f:
                if "quit" in f.read():
                    os.unlink(control)
                    sys.exit(0)
    if not os.path.exists(control):
        print("Cannot find MPS control daemon process"); sys.exit(1)
    command = sys.stdin.read()
    if "quit" in command:
        with open(control, "w") as f:
            f.write(command)
""")


@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """A stand-in control binary first on PATH, and an empty default pipe directory."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    path = bin_dir / mps.CONTROL
    path.write_text(FAKE_CONTROL.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon-here"))
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    monkeypatch.delenv("TRIDENT_MPS", raising=False)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_round_robin_placement():
    assert [placement.device_index(r, 1) for r in range(4)] == [0, 0, 0, 0]
    assert [placement.device_index(r, 2) for r in range(5)] == [0, 1, 0, 1, 0]
    assert [placement.device_index(r, 8) for r in range(4)] == [0, 1, 2, 3]
    assert placement.ranks_on_each_gpu(4, 1) == [4]
    assert placement.ranks_on_each_gpu(3, 2) == [2, 1]
    assert placement.ranks_on_each_gpu(2, 8) == [1, 1]
    with pytest.raises(ValueError, match="no GPU"):
        placement.device_index(0, 0)


def test_share_of_sms_keeps_every_rank_resident():
    for total in (78, 114, 132):
        assert placement.share_of_sms(total, 1) == total
        for ranks in (2, 3, 4, 8):
            share = placement.share_of_sms(total, ranks)
            assert 1 <= share and share * ranks <= total
            assert share % 2 == 0             # whole TPCs
    assert placement.share_of_sms(132, 2) == 66
    assert placement.share_of_sms(132, 4) == 32
    # an MPS client with a percentage is told its share by CUDA already
    assert placement.share_of_sms(66, 2, percentage=50) == 66
    assert placement.share_of_sms(32, 4, percentage=25) == 32
    assert placement.share_of_sms(3, 4) == 1                        # never zero


def test_private_daemon_starts_and_stops_leaving_nothing(fake_control):
    daemon = mps.PrivateDaemon(fake_control)
    pid = int(open(os.path.join(daemon.log_dir, "pid")).read())
    assert _alive(pid)
    assert mps.daemon_reachable(fake_control, daemon.pipe_dir)
    assert daemon.env == {"CUDA_MPS_PIPE_DIRECTORY": daemon.pipe_dir,
                          "CUDA_MPS_LOG_DIRECTORY": daemon.log_dir}
    root = daemon.root
    daemon.stop()
    assert not _alive(pid), "the MPS daemon outlived stop()"
    assert not os.path.exists(root)
    daemon.stop()                               # idempotent (atexit calls it again)


def test_ensure_starts_a_private_daemon_only_when_none_runs(fake_control):
    env, daemon, note = mps.ensure("auto")
    try:
        assert daemon is not None and "private" in note
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir
        os.environ["CUDA_MPS_PIPE_DIRECTORY"] = daemon.pipe_dir     # now one runs: reuse it
        env2, daemon2, note2 = mps.ensure("auto")
        assert daemon2 is None and "running daemon" in note2
        assert env2["CUDA_MPS_PIPE_DIRECTORY"] == daemon.pipe_dir
    finally:
        daemon.stop()


def test_without_mps_warns_once_or_refuses(fake_control, monkeypatch):
    monkeypatch.setattr(mps, "control_binary", lambda: None)
    monkeypatch.setattr(mps, "_warned", False)
    with pytest.warns(RuntimeWarning, match="time-slice"):
        env, daemon, note = mps.ensure("auto")
    assert env == {} and daemon is None and "none" in note
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mps.ensure("off")                        # warned once already: silent now
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control -d"):
        mps.ensure("require")
    with pytest.raises(ValueError, match="TRIDENT_MPS"):
        mps.ensure("sometimes")


def test_sharing_env_gives_each_rank_an_equal_share(fake_control, monkeypatch):
    env, daemon, _ = sharing_env(4, 1)
    try:
        assert env["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] == "1"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env[mps.ANSWERED_ENV] == daemon.pipe_dir         # the ranks need not ask
    finally:
        daemon.stop()
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40")     # the user's setting wins
    env, daemon, _ = sharing_env(3, 2)
    try:
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    finally:
        daemon.stop()


def _placement_facts(ctx):
    return ctx.ranks_per_device, ctx.shares_device, ctx.nccl_available, ctx.usable_sms, \
        ctx.heap_mapping


def test_context_reports_its_placement(pool):
    for ranks, shares, nccl, sms, mapping in pool.run(_placement_facts):
        if pool.backend == "cpu":
            assert (ranks, shares, nccl, sms) == (1, False, True, None)
            assert "/dev/shm" in mapping
        else:
            assert ranks >= 1 and shares == (ranks > 1) and nccl == (ranks == 1)
            assert sms >= 1 and "symmetric memory" in mapping


# --- co-residency is enforced, never assumed: the MPS cap of ranks that share a GPU ------

CAP = placement.CAP_VAR


def test_ranks_on_my_gpu_and_the_fair_share():
    assert placement.ranks_on_my_gpu(8, 8, 3) == 1             # a GPU each
    assert placement.ranks_on_my_gpu(2, 1, 1) == 2
    assert [placement.ranks_on_my_gpu(3, 2, r) for r in range(3)] == [2, 1, 2]
    assert [placement.ranks_on_my_gpu(4, 0, r) for r in range(4)] == [1] * 4    # no GPU
    assert [placement.fair_share(n) for n in (1, 2, 3, 4, 8)] == [100, 50, 33, 25, 12]


@pytest.mark.parametrize("ranks, env, cuda_init, mps_running, expect", [
    # a GPU of its own: nothing to do, whatever else holds
    (1, {}, True, False, ({}, None)),
    # shared, under MPS, before CUDA initialises: the cap is set to the fair share
    (2, {}, False, True, ({CAP: "50"}, 50.0)),
    (3, {}, False, True, ({CAP: "33"}, 33.0)),
    # a cap already set, no larger than the share: kept (also after CUDA initialised)
    (2, {CAP: "50"}, True, True, ({}, 50.0)),
    (4, {CAP: " 20 "}, False, True, ({}, 20.0)),
    (3, {CAP: "33.3"}, True, True, ({}, 33.3)),
    # no MPS daemon, but TRIDENT_MPS=off: the ranks time-slice; no cap is in force
    (2, {"TRIDENT_MPS": "off"}, True, False, ({}, None)),
    (2, {"TRIDENT_MPS": "off", CAP: "50"}, False, False, ({}, None)),
    # a daemon answers: its clients need the cap even with TRIDENT_MPS=off
    (2, {"TRIDENT_MPS": "off"}, False, True, ({CAP: "50"}, 50.0)),
])
def test_share_plan_decides(ranks, env, cuda_init, mps_running, expect):
    before = dict(env)
    assert placement.share_plan(ranks, env, cuda_init, mps_running) == expect
    assert env == before                                        # pure: env is only read


@pytest.mark.parametrize("ranks, env, cuda_init, mps_running, error, words", [
    # too late to set the cap: names the variable, its value, and the daemon
    (2, {}, True, True, RuntimeError, [f"export {CAP}=50", "nvidia-cuda-mps-control -d"]),
    (4, {CAP: ""}, True, True, RuntimeError, [f"export {CAP}=25"]),
    # a cap larger than the share (refused, not warned: the peers' programs may starve)
    (2, {CAP: "100"}, False, True, ValueError, [f"{CAP}=100", "at most 50", f"{CAP}=50"]),
    (4, {CAP: "30"}, True, True, ValueError, ["at most 25"]),
    # not a percentage
    (2, {CAP: "half"}, False, True, ValueError, ["not a percentage"]),
    (2, {CAP: "0"}, False, True, ValueError, ["not a percentage"]),
    (2, {CAP: "150"}, False, True, ValueError, ["not a percentage"]),
    # ranks share a GPU and no MPS daemon answers: refused under TRIDENT_MPS=require
    # (warned under auto: test_share_plan_warns_without_a_daemon)
    (2, {"TRIDENT_MPS": "require", "CUDA_MPS_PIPE_DIRECTORY": "/x/pipe"}, False, False,
     RuntimeError, ["/x/pipe", "nvidia-cuda-mps-control -d", f"export {CAP}=50"]),
    (2, {"TRIDENT_MPS": "sometimes"}, False, True, ValueError, ["TRIDENT_MPS"]),
])
def test_share_plan_refuses(ranks, env, cuda_init, mps_running, error, words):
    with pytest.raises(error) as info:
        placement.share_plan(ranks, env, cuda_init, mps_running)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_share_plan_warns_without_a_daemon():
    """No daemon answers (or a busy one does not in time): the ranks time-slice, which is
    slow but cannot starve a waiting grid, so "auto" warns and still sets the cap."""
    with pytest.warns(RuntimeWarning, match="no MPS control daemon answered") as rec:
        assert placement.share_plan(2, {}, False, False) == ({CAP: "50"}, 50.0)
    for w in ("nvidia-cuda-mps-control -d", f"export {CAP}=50", "TRIDENT_MPS=off"):
        assert w in str(rec[0].message), w


@pytest.fixture
def fresh_placement(monkeypatch):
    """placement's process-wide state, put back after the test."""
    monkeypatch.setattr(placement, "_cap_in_force", placement._UNKNOWN)
    monkeypatch.setattr(placement, "_mps_answers", {})
    monkeypatch.setattr(placement, "_sms", {})
    monkeypatch.setattr(placement, "_ranks_per_device", 1)
    monkeypatch.delenv(CAP, raising=False)
    monkeypatch.delenv("TRIDENT_MPS", raising=False)
    return monkeypatch


def test_ensure_share_sets_the_cap_before_cuda_and_refuses_after(fresh_placement):
    """Too late is when the CUDA *driver* is initialised (cuInit: torch.cuda.is_available()
    runs it), not torch's lazy init: torch.cuda.is_initialized() is still False then, and
    a cap set at that point held nothing on one H100 under torchrun."""
    import torch
    mp = fresh_placement
    mp.setattr(placement, "_mps_running", lambda: True)
    mp.setattr(torch.cuda, "is_initialized", lambda: False)
    mp.setattr(placement, "driver_initialized", lambda: False)
    placement.ensure_share(1)                                   # alone on its GPU
    assert CAP not in os.environ and placement.cap_in_force() is None
    placement.ensure_share(4)
    assert os.environ[CAP] == "25" and placement.cap_in_force() == 25.0
    mp.delenv(CAP)
    mp.setattr(placement, "driver_initialized", lambda: True)  # torch's flag still False
    with pytest.raises(RuntimeError, match=f"export {CAP}=50"):
        placement.ensure_share(2)
    assert CAP not in os.environ


class _FakeDriver:
    """libcuda's cuDeviceGetCount as driver_initialized calls it."""

    def __init__(self, initialised: bool):
        self.initialised = initialised

    def cuDeviceGetCount(self, count):
        return 0 if self.initialised else placement.CUDA_ERROR_NOT_INITIALIZED


def test_driver_initialized_asks_the_driver(fresh_placement):
    import ctypes

    import torch
    mp = fresh_placement
    mp.setattr(torch.cuda, "is_initialized", lambda: False)
    mp.setattr(placement, "_libcuda", _FakeDriver(False))
    assert placement.driver_initialized() is False
    mp.setattr(placement, "_libcuda", _FakeDriver(True))      # cuInit ran, torch's flag not
    assert placement.driver_initialized() is True
    mp.setattr(placement, "_libcuda", None)                    # no driver library: torch's

    def no_library(name):
        raise OSError(f"{name}: cannot open shared object file")
    mp.setattr(ctypes, "CDLL", no_library)
    assert placement.driver_initialized() is False
    mp.setattr(torch.cuda, "is_initialized", lambda: True)
    assert placement.driver_initialized() is True


def test_mps_running_asks_the_daemon_once(fresh_placement, fake_control, tmp_path):
    assert not placement._mps_running()                        # nothing at the pipe
    daemon = mps.PrivateDaemon(fake_control)
    try:
        fresh_placement.setenv("CUDA_MPS_PIPE_DIRECTORY", daemon.pipe_dir)
        assert placement._mps_running()
        fresh_placement.setattr(mps, "daemon_reachable", lambda *a: pytest.fail("asked again"))
        assert placement._mps_running()
    finally:
        daemon.stop()


FLAKY_CONTROL = textwrap.dedent("""\
    #!/bin/sh
    # stand-in client that fails its first $FAILS calls, then answers (counted in a file)
    n=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n + 1)) > "$COUNT"
    [ "$n" -ge "$FAILS" ] && exit 0
    echo "connection to the daemon broken"; exit 1
""")


def test_probe_asks_again_before_it_says_no_daemon(tmp_path, monkeypatch):
    """A client that fails beside a control pipe that is there is asked again (ranks of a
    launched job warned that no daemon answered at the default pipe where the launcher had
    just found one, under the GPU suite's load); a daemon that never answers is reported
    with what its client said."""
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    (pipe / "control").write_text("")
    client = tmp_path / "client"
    client.write_text(FLAKY_CONTROL)
    client.chmod(client.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("COUNT", str(tmp_path / "count"))
    monkeypatch.setenv("FAILS", "2")
    assert mps.daemon_reachable(str(client), str(pipe), tries=3, pause_s=0.01)
    assert (tmp_path / "count").read_text().strip() == "3"
    assert mps.last_probe(str(pipe)) is None
    (tmp_path / "count").unlink()
    monkeypatch.setenv("FAILS", "9")
    assert not mps.daemon_reachable(str(client), str(pipe), tries=3, pause_s=0.01)
    assert (tmp_path / "count").read_text().strip() == "3"
    why = mps.last_probe(str(pipe))
    assert "status 1" in why and "3 tries" in why and "broken" in why, why
    assert not mps.daemon_reachable(str(client), str(tmp_path / "none"))   # no pipe: no ask
    assert (tmp_path / "count").read_text().strip() == "3"
    with pytest.warns(RuntimeWarning, match="status 1 .3 tries"):
        placement.share_plan(2, {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, False, False)


def test_ranks_take_the_launchers_word_for_the_daemon(fresh_placement, tmp_path):
    pipe = tmp_path / "pipe"
    pipe.mkdir()
    fresh_placement.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    fresh_placement.setenv(mps.ANSWERED_ENV, str(pipe))
    asked = []
    fresh_placement.setattr(mps, "daemon_reachable", lambda *a: asked.append(a) or False)
    assert not placement._mps_running() and len(asked) == 1      # no control pipe: asked
    (pipe / "control").write_text("")
    fresh_placement.setattr(placement, "_mps_answers", {})
    assert placement._mps_running() and len(asked) == 1          # the launcher's word
    fresh_placement.setenv(mps.ANSWERED_ENV, str(tmp_path / "another"))
    fresh_placement.setattr(placement, "_mps_answers", {})
    assert not placement._mps_running() and len(asked) == 2      # another pipe's: asked


def test_usable_sms_follows_the_cap_in_force(fresh_placement):
    """Grids are sized by the SMs CUDA reports under the cap in force (an MPS client's cap:
    its share already), by reported // ranks without one (no MPS: the variable alone holds
    nothing), and never by more than the fair share."""
    import types

    import torch
    mp = fresh_placement
    reported = {"sms": 132}
    mp.setattr(torch.cuda, "get_device_properties",
               lambda i: types.SimpleNamespace(multi_processor_count=reported["sms"]))
    placement.set_ranks_per_device(2)
    assert placement.usable_sms(0) == 66                        # no cap: half, whole TPCs
    mp.setattr(placement, "_cap_in_force", 50.0)                # ensure_share found MPS + 50
    reported["sms"] = 66                                        # what CUDA reports then
    assert placement.usable_sms(0) == 66
    mp.setattr(placement, "_cap_in_force", None)                # the variable set, no MPS
    mp.setenv(CAP, "50")
    reported["sms"] = 132
    assert placement.usable_sms(0) == 66
    mp.setattr(placement, "_cap_in_force", placement._UNKNOWN)  # no decision: the variable
    mp.setenv(CAP, "25")
    reported["sms"] = 32
    placement.set_ranks_per_device(4)
    assert placement.usable_sms(0) == 32
    # a cap above the share (share_plan refuses it) still gives only the share
    assert placement.share_of_sms(132, 2, percentage=100) == 66
    assert placement.share_of_sms(79, 2, percentage=60) == 64   # 60 % reported, 50 % fair


def test_import_presets_the_cap_under_torchrun(fresh_placement):
    """trident/runtime/_env.py sets the cap at import for a torchrun rank that shares its GPU, so
    that a script that calls torch.cuda.set_device before trident.init gets it too."""
    import torch

    from trident.runtime import _env
    mp = fresh_placement
    mp.delenv("TRITON_INTERPRET", raising=False)               # not the CPU emulation
    mp.delenv("TRIDENT_BACKEND", raising=False)
    mp.setattr(placement, "driver_initialized", lambda: False)
    mp.setattr(torch.cuda, "device_count", lambda: 1)
    mp.setenv("LOCAL_WORLD_SIZE", "2")
    mp.setenv("LOCAL_RANK", "1")
    _env._preset_mps_cap()
    assert os.environ[CAP] == "50"
    mp.setenv(CAP, "20")                                        # a user's setting is kept
    _env._preset_mps_cap()
    assert os.environ[CAP] == "20"
    mp.delenv(CAP)
    mp.setattr(torch.cuda, "device_count", lambda: 2)           # a GPU each: nothing
    _env._preset_mps_cap()
    assert CAP not in os.environ
    mp.setattr(torch.cuda, "device_count", lambda: 1)
    mp.setattr(placement, "driver_initialized", lambda: True)  # too late: init refuses then
    _env._preset_mps_cap()
    assert CAP not in os.environ
    mp.setattr(placement, "driver_initialized", lambda: False)
    mp.setenv("TRIDENT_BACKEND", "cpu")                         # the CPU emulation: nothing
    _env._preset_mps_cap()
    assert CAP not in os.environ


IMPORT_ORDER = textwrap.dedent("""\
    import os, torch
    seen = []

    def is_available():     # torch's runs cudaGetDeviceCount, which initialises the driver
        seen.append(os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
        return False        # then the CPU emulation, as on this machine

    torch.cuda.is_available = is_available
    torch.cuda.device_count = lambda: 1        # NVML: one GPU visible, no driver init
    import trident
    print("cap when the driver initialised:", seen)
""")


def test_import_sets_the_cap_before_it_initialises_the_driver(tmp_path):
    """Issue 29 case 1 on one H100 under torchrun with an MPS daemon and no cap exported:
    the first fused all_gather_matmul timed out on one rank, waiting for a peer that
    finished with a correct result once the waiting rank's kernel had given up -- the
    mark of a rank whose grid held every SM. trident set the cap at import, but after its
    own torch.cuda.is_available(), which had already initialised the CUDA driver (where
    an MPS client takes its settings). The cap must be in the environment at that call."""
    script = tmp_path / "import_order.py"
    script.write_text(IMPORT_ORDER)
    env = {k: v for k, v in os.environ.items()
           if k not in (CAP, "TRITON_INTERPRET", "TRIDENT_BACKEND")}
    env.update(LOCAL_WORLD_SIZE="2", LOCAL_RANK="1", PYTHONPATH=os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(os.path.abspath(trident.__file__))),
                    env.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cap when the driver initialised: ['50']" in done.stdout, done.stdout


def test_sharing_env_refuses_a_larger_cap_and_stops_its_daemon(fake_control, monkeypatch):
    started = []

    class Recorded(mps.PrivateDaemon):
        def __init__(self, *args):
            super().__init__(*args)
            started.append(self)
    monkeypatch.setattr(mps, "PrivateDaemon", Recorded)
    monkeypatch.setenv(CAP, "60")
    with pytest.raises(ValueError, match="at most 50"):
        sharing_env(2, 1)
    assert len(started) == 1 and started[0].proc is None          # stopped
    assert not os.path.exists(started[0].root)


def test_sharing_env_without_mps_tells_the_ranks(fake_control, monkeypatch):
    """No daemon and none to start: the launcher warns once, and its ranks are told
    (TRIDENT_MPS=off) so that their own check lets them time-slice."""
    monkeypatch.setattr(mps, "control_binary", lambda: None)
    monkeypatch.setattr(mps, "_warned", True)
    env, daemon, note = sharing_env(2, 1)
    assert daemon is None and env["TRIDENT_MPS"] == "off" and CAP not in env
    assert placement.share_plan(2, env, True, False) == ({}, None)
