"""Every environment variable trident reads, declared once: its name, type, default and
what it sets (NCCL's habit: each NCCL_* parameter declared once with its default).

Three kinds of variable:
  user      set by the user (the README's table lists these);
  launch    set by trident.launch for its rank processes (and read there);
  external  another program's variable that trident reads (torchrun's, CUDA's, Triton's).

Reading. `snapshot()` reads every TRIDENT_* variable at once into an `Options`, which a
Context makes when it is made (`ctx.options`): code that has a context reads its options
there, so a variable set after `import trident` counts from the next context, and no call
reads the environment. Code that runs before any context, or without one (placement, the
launcher, the MPS daemon, the sanitizer's switch, the choice of backend in _env.py, the
command-line tools), calls `get(name)` when it runs. A value that is not of the declared
type raises a ValueError naming the variable; an unset or empty variable takes its default.
Writing: `export`, `export_default` and `exported` set what trident sets for itself or
for the processes it starts; `environ` is a copy of the environment for a child process.
No other module of trident touches os.environ (tests/test_options.py).

docs/options.md begins with `markdown()` (tests/test_options.py checks it and says how to
remake it); the tests' own variables follow there, by hand (tests/ reads them).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping


# ---------------------------------------------------------------- the types of value
# Each parser takes the variable's stripped, non-empty text and returns its value, or
# raises ValueError saying what the value must be; `shape` is that, for the docs page.
def _shape(text: str):
    def mark(parse):
        parse.shape = text
        return parse
    return mark


def _integer(least: int) -> Callable[[str], int]:
    @_shape("a positive integer" if least == 1 else f"an integer >= {least}")
    def parse(raw: str) -> int:
        try:
            n = int(raw)
        except ValueError:
            n = least - 1
        if n < least:
            raise ValueError(parse.shape)
        return n
    return parse


@_shape("a positive number")
def _positive_number(raw: str) -> float:
    try:
        x = float(raw)
    except ValueError:
        x = -1.0
    if not x > 0:                       # also NaN
        raise ValueError(_positive_number.shape)
    return x


def _choice(*values: str) -> Callable[[str], str]:
    @_shape(f"one of {values}")
    def parse(raw: str) -> str:
        if raw.lower() not in values:
            raise ValueError(parse.shape)
        return raw.lower()
    return parse


_FALSE, _TRUE = ("0", "false", "no", "off"), ("1", "true", "yes", "on")


@_shape("0 or 1 (also false/true, no/yes, off/on)")
def _flag(raw: str) -> bool:
    if raw.lower() not in _FALSE + _TRUE:
        raise ValueError(_flag.shape)
    return raw.lower() in _TRUE


@_shape("0 (off) or anything else (on)")
def _interpret(raw: str) -> bool:
    """Triton's own reading of TRITON_INTERPRET: anything but 0/false is on."""
    return raw not in ("0", "false", "False")


@_shape("text")
def _text(raw: str) -> str:
    return raw


# ---------------------------------------------------------------- the declarations
@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable: `parse` turns its (stripped, non-empty) text into the
    value or raises ValueError saying what it must be; `default` is the value when it is
    unset or empty (`shown`: how the docs state a default that is not a plain value)."""
    name: str
    parse: Callable[[str], object]
    default: object
    kind: str
    doc: str
    shown: str = ""

    @property
    def field(self) -> str:
        """The attribute of Options that holds it: TRIDENT_HEAP_SIZE -> heap_size."""
        return self.name.removeprefix("TRIDENT_").lower()

    def read(self, env: Mapping[str, str] | None = None):
        raw = (os.environ if env is None else env).get(self.name, "").strip()
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.name} must be {exc}, got {raw!r}") from None


_V = Variable
VARIABLES: dict[str, Variable] = {v.name: v for v in (
    # -- the user's
    _V("TRIDENT_BACKEND", _choice("cpu", "cuda"), None, "user",
       "force the CPU emulation (Triton's interpreter) or GPUs", "GPUs when visible"),
    _V("TRIDENT_HEAP_SIZE", _integer(1), 1 << 30, "user",
       "symmetric heap bytes per rank (td.init(heap_size=...) overrides)", "1 GiB"),
    _V("TRIDENT_DEBUG", _flag, False, "user",
       "debug mode: a host check after every op (td.init(debug=...) overrides)"),
    _V("TRIDENT_MPS", _choice("auto", "off", "require"), "auto", "user",
       "ranks sharing a GPU: start or use an MPS daemon, run without one (time-sliced, "
       "milliseconds per wait), or fail without one"),
    _V("TRIDENT_NODE_SIZE", _integer(1), None, "user",
       "n consecutive ranks per node (the multi-node path on one machine)",
       "one node per host"),
    _V("TRIDENT_INTERNODE_GBPS", _positive_number, 50.0, "user",
       "the cost model's network bandwidth per GPU between nodes, GB/s"),
    _V("TRIDENT_INTERNODE_US", _positive_number, 10.0, "user",
       "the cost model's latency per hop between nodes, us"),
    _V("TRIDENT_GEMM", _choice("auto", "classic", "tma", "gluon"), "auto", "user",
       "the fused ops' GEMM core (auto: tma from 1024 rows; a call's gemm= overrides)"),
    _V("TRIDENT_MOE_HT_MIN_TOKENS", _integer(0), 1024, "user",
       "MoE's high-throughput kernels from this max_num_tokens"),
    _V("TRIDENT_CACHE_DIR", _text, None, "user",
       "where `trident tune` keeps its tables", "$XDG_CACHE_HOME/trident or ~/.cache/trident"),
    _V("TRIDENT_PLAN_CACHE", _integer(1), 512, "user", "launch plans kept per context"),
    _V("TRIDENT_PLAN_GRAPHS", _choice("multi", "all", "off"), "multi", "user",
       "which launch plans replay as CUDA graphs (GPUs): those of several steps, all "
       "(not the default until docs/latency.md 'Plan graphs' is settled), none"),
    _V("TRIDENT_SANITIZE", _flag, False, "user",
       "the race detector on the CPU emulation (raises RaceError)"),
    _V("TRIDENT_SANITIZE_SEED", _integer(0), None, "user",
       "the race detector's schedule (a report names the one to replay)", "random"),
    # -- set by trident.launch for its ranks
    _V("TRIDENT_JOB_ID", _text, None, "launch",
       "the job's id: names its heap files in /dev/shm (CPU emulation)", "random per context"),
    _V("TRIDENT_MPS_ANSWERED", _text, None, "launch",
       "the MPS pipe directory whose daemon the launcher found answering (ranks need not ask)"),
    # -- other programs' variables that trident reads
    _V("TRITON_INTERPRET", _interpret, False, "external",
       "Triton's interpreter (the CPU emulation); trident sets it where no GPU is visible"),
    _V("RANK", _text, None, "external", "torchrun: the rank (td.init starts the group)"),
    _V("WORLD_SIZE", _text, None, "external", "torchrun: the number of ranks"),
    _V("LOCAL_RANK", _integer(0), None, "external",
       "torchrun: the rank on this host (its GPU: LOCAL_RANK % GPUs)"),
    _V("LOCAL_WORLD_SIZE", _integer(1), None, "external",
       "torchrun: ranks on this host (more than GPUs: ranks share them; also the nodes)"),
    _V("CUDA_VISIBLE_DEVICES", _text, None, "external",
       "the GPUs of this process (the tuned tables' topology key)"),
    _V("CUDA_MPS_PIPE_DIRECTORY", _text, "/tmp/nvidia-mps", "external",
       "where the MPS control daemon listens"),
    _V("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", _text, None, "external",
       "an MPS client's share of the GPU (trident sets it for ranks that share one; "
       "placement.py checks it)"),
    _V("XDG_CACHE_HOME", _text, None, "external", "the user's cache folder", "~/.cache"),
    _V("NCCL_NVLS_ENABLE", _text, None, "external",
       "NCCL's NVLink multicast (trident sets 0 unless set; benchmarks record it)"),
    _V("TORCH_SYMM_MEM_DISABLE_MULTICAST", _text, None, "external",
       "torch symmetric memory's multicast (trident sets 1 unless set)"),
    _V("NVSHMEM_DISABLE_NVLS", _text, None, "external",
       "NVSHMEM's NVLink multicast (trident sets 1 unless set)"),
)}
TRIDENT = tuple(v for v in VARIABLES.values() if v.name.startswith("TRIDENT_"))


def variable(name: str) -> Variable:
    """The declaration of `name` (a KeyError for a name that is not declared here)."""
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in trident/runtime/options.py") from None


def get(name: str, otherwise=None, env: Mapping[str, str] | None = None):
    """The value of `name` now (from `env`, default this process's environment); when it
    is unset, its default, or `otherwise` where the default is None."""
    value = variable(name).read(env)
    return otherwise if value is None else value


def raw(name: str) -> str | None:
    """The text of `name` as set, unparsed (None: unset)."""
    return os.environ.get(variable(name).name)


# ---------------------------------------------------------------- the snapshot
Options = dataclasses.make_dataclass(
    "Options", [(v.field, object) for v in TRIDENT], frozen=True,
    namespace={"__doc__": "The TRIDENT_* variables as a Context read them when it was made "
                          "(ctx.options): one attribute per variable, named by `field` "
                          "(heap_size, debug, plan_graphs, ...). dataclasses.replace makes "
                          "a changed copy."})


def snapshot(env: Mapping[str, str] | None = None) -> Options:
    """Every TRIDENT_* variable read now (from `env`, default the environment)."""
    return Options(**{v.field: v.read(env) for v in TRIDENT})


# ---------------------------------------------------------------- writing
def export(name: str, value) -> None:
    """Set `name` in this process's environment (its child processes inherit it)."""
    os.environ[name] = str(value)


def export_default(name: str, value) -> None:
    """Set `name` unless it is set already."""
    os.environ.setdefault(name, str(value))


@contextlib.contextmanager
def exported(updates: Mapping[str, str]):
    """Set `updates` in this process's environment for the block (the processes it starts
    inherit them), then put back what was there."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update({k: str(v) for k, v in updates.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def environ(**updates: str) -> dict[str, str]:
    """A copy of this process's environment with `updates`: a child process's."""
    return dict(os.environ, **updates)


# ---------------------------------------------------------------- the docs page
_KINDS = (("user", "The user's variables (README's table)"),
          ("launch", "Set by trident.launch for its ranks"),
          ("external", "Other programs' variables that trident reads"))


def _default(v: Variable) -> str:
    if v.shown or v.default is None:
        return v.shown or "unset"
    return str(int(v.default)) if isinstance(v.default, bool) else str(v.default)


def markdown() -> str:
    """docs/options.md: every declaration above, by kind."""
    lines = ["# Environment variables", "",
             "Every variable trident reads, as `trident/runtime/options.py` declares it "
             "(this page is its `markdown()`). A Context reads the "
             "TRIDENT_* ones once, when it is made (`ctx.options`); a bad value raises a "
             "ValueError that names the variable.", ""]
    for kind, title in _KINDS:
        lines += [f"## {title}", "", "| variable | values | default | what it sets |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| `{v.name}` | {v.parse.shape} | {_default(v)} | {v.doc} |"
                  for v in VARIABLES.values() if v.kind == kind]
        lines.append("")
    return "\n".join(lines)
