"""The group of ranks a run belongs to (MLX's own distributed engine, ``mx.distributed``).

Under ``mlx.launch`` (ring, JACCL, MPI) or with the NCCL variables set (``MLX_RANK``,
``MLX_WORLD_SIZE``, ``NCCL_HOST_IP``, ``NCCL_PORT``) the group is ``mx.distributed.init`` of that
backend; otherwise it is a world of one, and everything here is a no-op.

Two ways to use several ranks: in *lockstep* (a sharded model: every rank runs the same loop and
computes the same results, so only rank 0 writes files: ``writes_here``), or *spread* (each rank
runs its own share of independent work and rank 0 gathers it: ``gather``). Small Python values go
from rank 0 to every rank with ``broadcast``, arrays with ``broadcast_array``: sums over the group
with zeros on every rank but 0.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np

from specbench.common import wire

#: The variables each backend's launcher sets, in the order they are recognised.
_LAUNCHERS = (
    ("nccl", ("NCCL_HOST_IP", "MLX_WORLD_SIZE", "MLX_RANK")),
    ("jaccl", ("MLX_JACCL_COORDINATOR", "MLX_RANK")),
    ("jaccl", ("MLX_IBV_DEVICES", "MLX_RANK")),
    ("ring", ("MLX_HOSTFILE", "MLX_RANK")),
    ("mpi", ("OMPI_COMM_WORLD_SIZE",)),
    ("mpi", ("PMI_SIZE",)),
)

#: Prefixes of the variables a launcher sets for its ranks (removed for child processes: ``detach_children``).
_LAUNCHER_PREFIXES = ("MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE", "MLX_JACCL", "MLX_IBV", "NCCL_HOST_IP", "NCCL_PORT")
_MPI_PREFIXES = ("OMPI_", "PMI_", "PMIX_")

_state: dict[str, Any] = {"group": None, "backend": None, "lockstep": False}
T = TypeVar("T")


def launched_backend() -> str | None:
    """The backend whose launcher started this process ("nccl", "jaccl", "ring", "mpi"), from the
    environment; None when none did."""
    for backend, names in _LAUNCHERS:
        if all(os.environ.get(name) for name in names):
            return backend
    return None


def local_ring_env(ranks: int, port: int, folder: str | os.PathLike) -> list[dict[str, str]]:
    """The variables ``mlx.launch -n RANKS --backend ring`` gives each local rank (``MLX_RANK`` and a
    hostfile of consecutive ports from ``port``, written into ``folder``), for starting ranks directly."""
    hostfile = os.path.join(folder, "ring-hosts.json")
    with open(hostfile, "w") as f:
        json.dump([[f"127.0.0.1:{port + r}"] for r in range(ranks)], f)
    return [{"MLX_RANK": str(r), "MLX_HOSTFILE": hostfile} for r in range(ranks)]


def free_ports(count: int) -> int:
    """A port p with p .. p + count - 1 free on localhost (the ring backend listens on consecutive ports)."""
    import socket

    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            start = probe.getsockname()[1]
        if start + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(start, start + count):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no free consecutive ports on localhost for the ring backend")


def run_ranks(command: Sequence[str], rank_envs: Sequence[dict[str, str]], logs: Sequence[str | None]) -> int:
    """Start ``command`` once per rank with this process's environment plus that rank's variables (as a
    launcher would: ``local_ring_env``), each rank's output into its log file (None: this console), and
    wait for them all; the highest exit code. Interrupted, it stops every rank."""
    import subprocess

    procs, files = [], []
    try:
        for env, log in zip(rank_envs, logs):
            out = open(log, "w") if log else None  # noqa: SIM115 (closed below, after the rank ends)
            files.append(out)
            stderr = subprocess.STDOUT if out else None
            procs.append(subprocess.Popen(list(command), env={**os.environ, **env}, stdout=out, stderr=stderr))
        return max(proc.wait() for proc in procs)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
        for f in files:
            if f:
                f.close()


def group() -> mx.distributed.Group:
    """The global group: the launched backend's (initialised on first use), or a world of one."""
    if _state["group"] is None:
        backend = launched_backend()
        if backend is None:
            _state["group"], _state["backend"] = mx.distributed.init(), "single"
        else:
            try:
                _state["group"] = mx.distributed.init(strict=True, backend=backend)
            except RuntimeError as err:
                raise RuntimeError(
                    f"this process was launched for MLX's {backend} backend, which failed to start ({err}); "
                    f"check the launcher's hostfile or variables, or that this MLX build has the {backend} backend"
                ) from err
            _state["backend"] = backend if _state["group"].size() > 1 else "single"
    return _state["group"]


def backend() -> str:
    """The backend of the global group ("ring", "jaccl", "mpi", "nccl"), "single" for a world of one."""
    group()
    return _state["backend"]


def rank() -> int:
    return group().rank()


def size() -> int:
    return group().size()


def is_main() -> bool:
    """True on rank 0 (and in a world of one)."""
    return rank() == 0


def _sum(x: mx.array) -> mx.array:
    """``x`` summed over the group, evaluated. Work already queued (a sharded model's forwards, whose
    layers sum over the group too, possibly on another stream) finishes first, so every rank issues
    its collectives in the same order. NCCL sums on the GPU; the other backends on the CPU."""
    from mlx_lm.generate import generation_stream  # (loads mlx-lm: only once a group of several ranks sums)

    mx.synchronize(generation_stream)
    mx.synchronize()
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    stream = mx.cpu if on_gpu and backend() != "nccl" else None
    out = mx.distributed.all_sum(x, group=group(), stream=stream)
    mx.eval(out)
    return out


def broadcast_array(x: mx.array | None, shape: tuple[int, ...], dtype: mx.Dtype) -> mx.array:
    """Rank 0's array ``x`` (of ``shape`` and ``dtype``, which every rank must know) on every rank;
    ``x`` is ignored elsewhere. Returns ``x`` itself in a world of one."""
    if size() == 1:
        return x
    if is_main():
        if tuple(x.shape) != tuple(shape) or x.dtype != dtype:
            raise ValueError(f"broadcast_array: rank 0 holds {tuple(x.shape)} {x.dtype}, not {tuple(shape)} {dtype}")
        return _sum(x)
    return _sum(mx.zeros(shape, dtype=dtype))


def broadcast(value: Any = None) -> Any:
    """Rank 0's ``value`` on every rank (data: JSON's types, tuples, sets, bytes, arrays, polars frames,
    specbench's dataclasses; ``specbench.common.wire``); other ranks' ``value`` is ignored. When rank 0
    cannot send it, every rank raises. Returns ``value`` itself in a world of one."""
    sent = gather_outcomes(lambda: value if is_main() else None)[0]
    return value if is_main() else sent


def gather(value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank (``[value]`` in a world of one)."""
    return gather_outcomes(lambda: value)


def _gathered_bytes(data: bytes) -> list[bytes]:
    """Every rank's ``data``, in rank order: two sums over the group, the lengths, then the bytes."""
    lengths = np.zeros(size(), dtype=np.int32)
    lengths[rank()] = len(data)
    lengths = np.array(_sum(mx.array(lengths)), copy=False).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(-(-lengths // 4) * 4)])
    buffer = np.zeros(int(offsets[-1]), dtype=np.uint8)
    buffer[offsets[rank()] : offsets[rank()] + len(data)] = np.frombuffer(data, dtype=np.uint8)
    # every backend sums int32 words
    received = np.array(_sum(mx.array(buffer.view(np.int32))), copy=False).astype(np.int32).tobytes()
    return [received[offsets[r] : offsets[r] + lengths[r]] for r in range(size())]


def agreed(value: Any, model: Any) -> Any:
    """Rank 0's ``value`` on every rank when ``model`` is sharded (every rank computed its own, e.g. read
    a file or picked by its own clock, and all must act alike on the model); ``value`` itself otherwise."""
    return broadcast(value) if is_sharded(model) else value


def barrier() -> None:
    """Wait until every rank gets here."""
    if size() > 1:
        _sum(mx.array([1], dtype=mx.int32))


def detach_children() -> None:
    """Let child processes started from now on (papermill's notebook kernels, for one) run in a world of
    one: the launcher's variables leave this process's environment once its own group has started.
    ``CUDA_VISIBLE_DEVICES`` stays, so a child uses its rank's GPU."""
    group()
    for name in list(os.environ):
        if name.startswith(_LAUNCHER_PREFIXES + _MPI_PREFIXES):
            del os.environ[name]


# -- spreading independent work over the ranks ----------------------------------------------------


def split(weights: Sequence[float], parts: int) -> list[list[int]]:
    """Indices of ``weights`` in ``parts`` shares of about equal total weight (the heaviest item first to
    the lightest share; ties to the lower share), each share in index order. Deterministic, so every
    rank computes the same split."""
    if parts < 1:
        raise ValueError(f"split: parts must be >= 1, got {parts}")
    loads, shares = [0.0] * parts, [[] for _ in range(parts)]
    for i in sorted(range(len(weights)), key=lambda i: (-float(weights[i]), i)):
        lightest = min(range(parts), key=lambda r: (loads[r], len(shares[r]), r))
        loads[lightest] += float(weights[i])
        shares[lightest].append(i)
    return [sorted(share) for share in shares]


def my_share(weights: Sequence[float]) -> list[int]:
    """This rank's indices of ``split(weights, size())`` (all of them in a world of one)."""
    return split(weights, size())[rank()]


def gather_outcomes(work: Callable[[], T]) -> list[T]:
    """Every rank's ``work()`` result, in rank order, on every rank. When ``work`` fails on some rank,
    every rank raises (no rank is left waiting for one that stopped): the failing rank its own error, the
    others one naming each failed rank's error, of the first one's type when that is a built-in exception."""
    try:
        value = work()
        data = wire.dumps((True, value)) if size() > 1 else b""
        error = None
    except Exception as err:
        builtin = type(err).__name__ if type(err).__module__ == "builtins" else "RuntimeError"
        data, error = wire.dumps((False, (builtin, f"{type(err).__name__}: {err}"))), err
    if size() == 1:
        if error is not None:
            raise error
        return [value]
    outcomes = [wire.loads(part) for part in _gathered_bytes(data)]
    if error is not None:
        raise error
    failed = [(r, value) for r, (ok, value) in enumerate(outcomes) if not ok]
    if failed:
        message = "; ".join(f"rank {r} failed: {text}" for r, (_, text) in failed)
        kind = getattr(builtins, str(failed[0][1][0]), None)
        try:
            raised = kind(message) if isinstance(kind, type) and issubclass(kind, Exception) else RuntimeError(message)
        except Exception:
            raised = RuntimeError(message)
        raise raised
    return [value for _, value in outcomes]


# -- who writes ---------------------------------------------------------------------------------


def set_lockstep(on: bool = True) -> None:
    """Mark this process as running in lockstep with its group (it holds a sharded model): every
    rank computes the same results, so files are written by rank 0 alone."""
    _state["lockstep"] = bool(on)


def lockstep() -> bool:
    """True when this process runs in lockstep with a group of more than one rank."""
    return _state["lockstep"] and size() > 1


def writes_here() -> bool:
    """Whether this rank writes files: always, unless it runs in lockstep and is not rank 0."""
    return not lockstep() or is_main()


def shard_group(model: Any) -> tuple[int, str] | None:
    """(group size, backend) of a model loaded sharded over a group of more than one rank, else None."""
    return getattr(model, "specbench_group", None)


def is_sharded(model: Any) -> bool:
    return shard_group(model) is not None
