"""Launch epochs: how a kernel reuses its flags without ever resetting them.

A kernel that signals peers through flags numbers its launches: launch e sets flags to e
and waits for flags to reach e, so nothing resets a flag between calls (no memset, no
value from the host; a CUDA graph can replay the launch). The epoch of the running
launch is one more than the epoch the previous launch stored, and the last program of
the launch stores it, found with a counter of programs:

    epoch = tdl.launch_epoch(state + EPOCH)                # every program, first
    ...the launch's work: flags set to, and waited for at, epoch...
    if tdl.last_program_out(state + DONE, num_programs):   # every program, last
        ...what must follow the whole launch's data (e.g. an ack to every peer)...
        tl.store(state + EPOCH, epoch)

`epoch` and `done` are this rank's own words (not read by peers). All ranks launch the
same kernels in the same order, so a launch has the same epoch on every rank.
"""
import triton
import triton.language as tl


@triton.jit
def launch_epoch(epoch_word):
    """This launch's epoch: one more than the epoch the previous launch stored."""
    return tl.load(epoch_word, volatile=True) + 1


@triton.jit
def last_program_out(counter, num_programs, SYS: tl.constexpr = True):
    """Count this program as finished; True in the one of `num_programs` that finishes
    last, which also sets `counter` back to 0 for the next launch.

    A program barrier, then an acq_rel atomic at system scope: it releases every store
    this program made (those into peers' heaps too) and, in the last program, acquires
    them all, so a flag the last program signals afterwards covers the whole launch.
    SYS=False: at GPU scope, for a launch whose programs each signal their peers
    themselves (the last program then only orders this rank's own memory: its epoch,
    counts, poison); it spares each program a system-scope fence."""
    tl.debug_barrier()
    if SYS:
        done = tl.atomic_add(counter, 1, sem="acq_rel", scope="sys")
    else:
        done = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    last = done == num_programs - 1
    if last:
        tl.store(counter, 0)
    return last
