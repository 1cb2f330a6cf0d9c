"""A warm Launch's kernel queued by one driver call, its arguments packed once.

Triton's C launcher (triton_launch.py's hot path) parses every parameter of the kernel
from Python objects at every call -- constexprs too, some 30-45 of them for trident's
collectives -- into C values, builds the launch config, releases the GIL and calls
cuLaunchKernelEx: 5.3 µs of an eager all-reduce's 9.0 on an H200 host (docs/latency.md).
A launch plan's arguments do not change between calls (a heap tensor's address is its
plan's key), so here they are packed once, as the launcher would pack them, into C
storage behind a `void*` array, with a CUlaunchConfig of the same grid, block, shared
memory and attributes (PDL, cooperative); a call sets the config's stream and calls
cuLaunchKernelEx through ctypes. One pointer argument may be live (a fresh output, a
plain tensor: triton_launch.Live): its storage is rewritten before the call.

What it covers: kernels whose parameters are pointers, integers and floats, of one CTA
per program, without global or profiling scratch. Anything else (TMA descriptors,
clusters, scratch, a missing driver entry point, Triton internals not as expected)
gets `None` from `build`, and the Launch keeps Triton's launcher. If the driver call
fails (e.g. no CUDA context current on this thread, which Triton's launcher would make),
the Launch drops this path and calls Triton's launcher from then on, which raises the
real error if there is one.

Triton's internals it reads (triton 3.6; any change makes `build` return None or packs
what the launcher packs, and tests/test_cu_launch.py checks both): the CompiledKernel's
`src.signature` (one type string per parameter, "constexpr" for those the launcher skips),
`packed_metadata` (num_warps, num_ctas, shared memory) and `function`; the CudaLauncher's
`launch_pdl`, `launch_cooperative_grid` and scratch sizes; and the launcher's parameter
list: the non-constexpr arguments in order, then the global and profiling scratch
pointers (triton/backends/nvidia/driver.py, make_launcher).
"""
from __future__ import annotations

import ctypes
import struct

ENABLED = True               # an A/B knob (bench/lab/launch_cost.py): False keeps Triton's launcher
PDL_ATTRIBUTE = 6            # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
COOPERATIVE_ATTRIBUTE = 2    # CU_LAUNCH_ATTRIBUTE_COOPERATIVE

INTS = {"i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16,
        "i32": ctypes.c_int32, "i64": ctypes.c_int64, "u1": ctypes.c_uint8,
        "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
        "u64": ctypes.c_uint64}


def _fp16(v):
    return ctypes.c_uint16(struct.unpack("<H", struct.pack("<e", v))[0])


def _bf16(v):
    return ctypes.c_uint16(struct.unpack("<I", struct.pack("<f", v))[0] >> 16)


def _fp32(v):
    return ctypes.c_uint32(struct.unpack("<I", struct.pack("<f", v))[0])


def _fp64(v):
    return ctypes.c_uint64(struct.unpack("<Q", struct.pack("<d", v))[0])


# the launcher's own packing of float scalars (triton/backends/nvidia/driver.py pack_*)
FLOATS = {"fp16": _fp16, "bf16": _bf16, "fp32": _fp32, "f32": _fp32, "fp64": _fp64}


class LaunchAttribute(ctypes.Structure):      # CUlaunchAttribute: id, pad, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_int), ("rest", ctypes.c_char * 60)]


class LaunchConfig(ctypes.Structure):         # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint),
                ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_entry = False               # False: not looked up yet; None: not available


def _launch_entry():
    """libcuda's cuLaunchKernelEx, or None where there is none."""
    global _entry
    if _entry is False:
        try:
            _entry = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
            _entry.restype = ctypes.c_int
        except (OSError, AttributeError):
            _entry = None
    return _entry


class Direct:
    """One kernel's launch, packed (see the module docstring). `config.hStream` is set by
    the caller before each `entry(config_ref, function, params, None)`; `live`, if not
    None, is the storage of the one pointer argument read per call."""
    __slots__ = ("entry", "config", "config_ref", "function", "params", "storage", "attrs",
                 "live", "empty")

    def __init__(self, entry, config, attrs, function, storage, live, empty):
        self.entry, self.config, self.attrs = entry, config, attrs
        self.config_ref = ctypes.byref(config)
        self.function = ctypes.c_void_p(function)
        self.storage = storage
        self.params = (ctypes.c_void_p * len(storage))(*[ctypes.addressof(s) for s in storage])
        self.live, self.empty = live, empty

    def __call__(self, stream: int) -> int:
        """Queue the kernel on `stream`: 0, or the driver's error code."""
        if self.empty:
            return 0
        self.config.hStream = stream
        return self.entry(self.config_ref, self.function, self.params, None)


def build(compiled, launcher, grid: tuple, packed: tuple, live_pos: int | None = None):
    """A Direct for `compiled` (a CompiledKernel, `launcher` its CudaLauncher) with every
    parameter's value in `packed` (constexprs included, pointers as ints), or None where
    this path does not cover the kernel. `live_pos`: the position of the one pointer
    argument that changes per call."""
    entry = _launch_entry()
    if entry is None:
        return None
    try:
        signature = list(compiled.src.signature.values())
        num_warps, num_ctas, shared = compiled.packed_metadata
        pdl, coop = launcher.launch_pdl, launcher.launch_cooperative_grid
        if launcher.global_scratch_size or launcher.profile_scratch_size:
            return None
    except (AttributeError, TypeError, ValueError):
        return None
    if num_ctas != 1 or len(signature) != len(packed):
        return None
    storage, live = [], None
    for pos, (ty, value) in enumerate(zip(signature, packed)):
        if ty == "constexpr":
            continue
        if not isinstance(ty, str):
            return None
        if ty[0] == "*":
            if value is not None and not isinstance(value, int):
                return None
            c = ctypes.c_uint64(value or 0)
            if pos == live_pos:
                live = c
        elif ty in INTS and isinstance(value, (int, bool)):
            c = INTS[ty](int(value))
        elif ty in FLOATS and isinstance(value, (int, float)):
            c = FLOATS[ty](float(value))
        else:
            return None                           # TMA descriptors and what else may come
        storage.append(c)
    if live_pos is not None and live is None:
        return None
    storage += [ctypes.c_uint64(0), ctypes.c_uint64(0)]   # global and profiling scratch
    attrs = (LaunchAttribute * 2)()
    n = 0
    for on, attribute in ((pdl, PDL_ATTRIBUTE), (coop, COOPERATIVE_ATTRIBUTE)):
        if on:
            attrs[n].id, attrs[n].value = attribute, 1
            n += 1
    gx, gy, gz = grid
    config = LaunchConfig(gx, gy, gz, 32 * num_warps, 1, 1, shared, None, attrs, n)
    return Direct(entry, config, attrs, compiled.function, storage, live, gx * gy * gz == 0)
