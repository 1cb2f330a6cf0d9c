"""Placement of ranks on GPUs (trident/placement.py) and the job's MPS daemon
(trident/mps.py), on any machine: the daemon is a stand-in script that speaks the control
daemon's protocol as trident uses it (a `control` pipe; `get_server_list` and `quit`)."""
import os
import stat
import sys
import textwrap
import warnings

import pytest

from trident import mps, placement
from trident.launch import sharing_env

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
