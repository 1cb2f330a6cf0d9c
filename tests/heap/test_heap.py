"""The symmetric heap across ranks: offsets, reuse, mismatch detection, leaks."""
import os
import uuid

import pytest
import torch

import trident as td
from trident.runtime.heap import HeapFullError


def _offsets(ctx):
    ts = [ctx.empty(17, dtype=torch.float32), ctx.zeros(3, 5, dtype=torch.bfloat16),
          ctx.ones(1000, dtype=torch.int8), ctx.full((4, 4), 2.5, dtype=torch.float16),
          ctx.randn(33, dtype=torch.float32), ctx.rand(8, dtype=torch.float64),
          ctx.arange(10, 30, 3, dtype=torch.int32)]
    ts += [ctx.empty_like(ts[1]), ctx.zeros_like(ts[4])]
    base = ctx.heap_bases[ctx.rank].item()
    offs = [t.data_ptr() - base for t in ts]
    assert all(o % 256 == 0 for o in offs)
    assert all(ctx.is_symmetric(t) for t in ts)
    assert torch.equal(ts[6].cpu(), torch.arange(10, 30, 3, dtype=torch.int32))
    assert (ts[3] == 2.5).all() and (ts[2] == 1).all() and (ts[1] == 0).all()
    assert ts[7].shape == (3, 5) and ts[7].dtype == torch.bfloat16
    # free and reuse: a freed block comes back for a request that fits
    ctx.free(ts[2])
    again = ctx.empty(500, dtype=torch.int8)
    assert again.data_ptr() - base == offs[2]
    ctx.barrier()
    return offs


def test_symmetric_offsets_and_reuse(pool):
    offs = pool.run(_offsets)
    assert all(o == offs[0] for o in offs)


def _peer_views(ctx):
    t = ctx.full(6, -1.0, dtype=torch.float32)
    ctx.barrier()
    nxt = (ctx.rank + 1) % ctx.world_size
    ctx.peer_view(nxt, t[2:4]).copy_(torch.full((2,), float(ctx.rank)).to(ctx.device))
    ctx.barrier()
    assert ctx.heap_offset(t[2:4]) == ctx.heap_offset(t) + 8
    with pytest.raises(ValueError, match="symmetric heap"):
        ctx.peer_view(nxt, torch.zeros(2, device=ctx.device))
    return t.tolist()


def test_peer_view_writes_the_peers_copy(pool):
    w = pool.world_size
    got = pool.run(_peer_views)
    assert got == [[-1.0, -1.0] + [float((r - 1) % w)] * 2 + [-1.0, -1.0] for r in range(w)]


def _mismatch(ctx):
    ctx.empty(100 + (ctx.rank == 1) * 8, dtype=torch.uint8)
    ctx.barrier()


def test_asymmetric_allocation_is_caught(pool):
    if pool.world_size == 1:
        pytest.skip("needs two ranks: one rank cannot disagree with itself")
    with pytest.raises(td.HeapMismatchError) as e:
        pool.run(_mismatch)
    msg = str(e.value)
    assert "rank 0" in msg and "rank 1" in msg and "100 B" in msg and "108 B" in msg, msg


def _exhaust(ctx):
    with pytest.raises(HeapFullError) as e:
        ctx.empty(ctx.heap_size, dtype=torch.uint8)
    msg = str(e.value)
    assert f"heap size {ctx.heap_size} B" in msg and "in use" in msg and "TRIDENT_HEAP_SIZE" in msg
    ctx.barrier()


def test_heap_full_message(pool):
    pool.run(_exhaust)


def _bad_arguments(ctx):
    plain = torch.zeros(4, device=ctx.device)
    with pytest.raises(ValueError, match="not on this context's symmetric heap"):
        ctx.free(plain)
    t = ctx.zeros(64)
    with pytest.raises(ValueError, match="view inside an allocation"):
        ctx.free(t[8:])
    with pytest.raises(ValueError, match="symmetric heap"):
        ctx.check_symmetric(plain, "out")
    with pytest.raises(TypeError, match="torch.Tensor"):
        ctx.check_symmetric([1, 2], "out")
    with pytest.raises(ValueError, match="negative"):
        ctx.empty(-1)
    with pytest.raises(ValueError, match="positive"):
        ctx.set_timeout(0)
    assert not ctx.is_symmetric(t.cpu() if ctx.device.type != "cpu" else t.clone())
    ctx.all_reduce(t)                     # a plan for t's address, then t freed: the call
    ctx.free(t)                           # after it builds again and names the mistake
    with pytest.raises(ValueError, match=r"^all_reduce: t lies in heap memory given back "
                                         r"by ctx\.free \(heap offset \d+\): a tensor must "
                                         r"not be used after ctx\.free\(t\)"):
        ctx.all_reduce(t)
    a = ctx.zeros(8, 8, dtype=torch.bfloat16)
    ctx.free(a)
    with pytest.raises(ValueError, match=r"^matmul_all_reduce: a lies in heap memory given "
                                         r"back by ctx\.free"):
        ctx.matmul_all_reduce(a, torch.zeros(8, 8, dtype=torch.bfloat16, device=ctx.device))
    ctx.barrier()
    # td.init's own arguments, named before anything is made (they were an OSError of the
    # heap file, a str + float TypeError; the file of a heap_size=-1 stayed in /dev/shm, so
    # that the next td.init of the job raised FileExistsError)
    for kw, kind, text in (
            (dict(heap_size=-1), ValueError, r"heap_size must be a positive number of bytes "
                                             r"per rank .*, got -1$"),
            (dict(heap_size="1G"), TypeError, r"heap_size must be an int \(bytes per rank\), "
                                              r"got str '1G'$"),
            (dict(timeout=0), ValueError, r"timeout must be a positive, finite number of "
                                          r"seconds, got 0$"),
            (dict(timeout="5"), TypeError, r"timeout must be a number of seconds, got str "
                                           r"'5'$")):
        with pytest.raises(kind, match="^td.init: " + text):
            td.init(group=ctx.group, **kw)
    if ctx.world_size > 1 and ctx.backend == "cpu":
        # heaps of different sizes (a peer's is mapped at this rank's size: past its end
        # it is not memory); on every rank, naming each rank's size
        sizes = ", ".join(f"rank {r}: {(4 << 20) * (1 + r)} B" for r in range(ctx.world_size))
        with pytest.raises(ValueError, match=rf"^td.init: the ranks' heap sizes differ "
                                             rf"\({sizes}\); every rank must pass the same "
                                             rf"heap_size \(or TRIDENT_HEAP_SIZE\)$"):
            td.init(group=ctx.group, heap_size=(4 << 20) * (1 + ctx.rank))
    with td.init(group=ctx.group, heap_size=4 << 20) as other:    # and the next one works
        other.barrier()


def test_bad_arguments(pool):
    pool.run(_bad_arguments)


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _shm_files(job: str) -> list[str]:
    """Heap files of job `job` in /dev/shm (other trident jobs on the machine may create
    and remove theirs meanwhile: only this test's job counts)."""
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(f"trident-{job}-"))


def _heap_mappings() -> list[str]:
    """This process's mappings of heap files (a closed context must unmap its peers' too)."""
    with open("/proc/self/maps") as f:
        return sorted(line.split(None, 5)[-1] for line in f if "/dev/shm/trident-" in line)


def _gpu_free_bytes(ctx):
    if ctx.backend != "cuda":
        return 0
    torch.cuda.synchronize(ctx.device)
    return torch.cuda.mem_get_info(ctx.device)[0]


def _init_close_many(ctx, rounds, job):
    heap = 256 << 20 if ctx.backend == "cuda" else 4 << 20
    saved = os.environ.get("TRIDENT_JOB_ID")
    os.environ["TRIDENT_JOB_ID"] = job        # the contexts below name their heap files after it
    try:
        with td.init(heap_size=heap, group=ctx.group):   # first use may set up caches
            pass
        fds, maps, free = _fds(), _heap_mappings(), _gpu_free_bytes(ctx)
        ctx.barrier()                         # every rank has unlinked its file (each
        assert _shm_files(job) == [], _shm_files(job)   # does so after init's barrier)
        for i in range(rounds):
            with td.init(heap_size=heap, group=ctx.group) as other:
                x = other.randn(1000)
                assert other.is_symmetric(x) and not ctx.is_symmetric(x)
                other.barrier()
                del x
    finally:
        if saved is None:
            os.environ.pop("TRIDENT_JOB_ID", None)
        else:
            os.environ["TRIDENT_JOB_ID"] = saved
    assert _fds() == fds, (fds, _fds())
    assert _heap_mappings() == maps, (maps, _heap_mappings())
    ctx.barrier()                             # every rank has closed its last context
    assert _shm_files(job) == [], _shm_files(job)
    lost = free - _gpu_free_bytes(ctx)
    # a leaked heap would cost rounds * 256 MiB; allow 64 MiB of allocator/NCCL caches
    assert lost < 64 << 20, f"{lost / 2**20:.0f} MiB of GPU memory lost over {rounds} rounds"
    return rounds


def test_repeated_init_close_leaks_nothing(pool):
    job = f"leaktest{uuid.uuid4().hex[:8]}"   # whatever TRIDENT_JOB_ID the environment has
    assert pool.run(_init_close_many, 20, job) == [20] * pool.world_size


def _return_heap_view(ctx):
    t = ctx.full(8, float(ctx.rank), dtype=torch.float32)
    ctx.barrier()
    return t[2:5]          # a view of the heap travels back to the test process


def _heap_still_shared(ctx):
    from tests.language.test_rma import _every_pair
    _every_pair(ctx, 300, torch.float32)


def test_returning_a_heap_view_keeps_the_heap_mapped(pool):
    results = pool.run(_return_heap_view)
    assert [r.tolist() for r in results] == [[float(r)] * 3 for r in range(pool.world_size)]
    pool.run(_heap_still_shared)
