"""Process groups for emitted modules: fork N local ranks (tests, ``verify``), or join a ``torchrun`` job.

- :func:`launch` runs ``fn(*args)`` on ``nproc`` fresh ranks of one process group and returns every rank's
  result, rank order.  Ranks are forked (ARCHITECTURE.md: 4 gloo ranks start in ~0.1 s once torch is
  imported, against 5 s spawned): they inherit the parent's imports and objects -- a model, a captured graph,
  a plan -- so nothing is pickled on the way in.  The group meets over a ``FileStore`` in a temporary directory
  (no TCP port to collide with parallel test runs).  A rank that raises, or ranks that hang past ``timeout``,
  end the whole launch with :class:`LaunchError` carrying the failing rank's traceback.  NCCL ranks are
  spawned (CUDA does not survive fork), so ``fn`` and ``args`` must then pickle.
- :func:`init_from_env` joins the group ``torchrun`` describes (``nccl`` with CUDA, else ``gloo``).
- :func:`device_mesh` lays a ``DeviceMesh`` of the given shape over all ranks (rank = row-major coordinate,
  as :mod:`autoshard.cluster` lays them out) and :func:`default_device` says where this rank computes.

Example::

    def work(x):
        mesh = device_mesh((2, 2))
        return mesh.get_coordinate()

    launch(work, 4, torch.ones(1))     # [[0, 0], [0, 1], [1, 0], [1, 1]]
"""

from __future__ import annotations

import importlib
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autoshard.errors import AutoshardError

__all__ = ["LaunchError", "default_device", "device_mesh", "init_from_env", "launch"]

Backend = Literal["gloo", "nccl"]


class LaunchError(AutoshardError, RuntimeError):
    """A rank of a local launch failed or hung."""


def default_device() -> torch.device:
    """``cuda:<current>`` when the default process group runs NCCL, else ``cpu``."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_mesh(mesh_shape: Sequence[int]) -> Any:
    """A ``DeviceMesh`` of ``mesh_shape`` over every rank of the default group (row-major rank order)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = tuple(int(n) for n in mesh_shape)
    world = dist.get_world_size()
    if int(torch.tensor(shape).prod()) != world:
        raise LaunchError(
            f"mesh {shape} needs {int(torch.tensor(shape).prod())} ranks, the group has {world}"
        )
    return init_device_mesh(default_device().type, shape)


def init_from_env(backend: Backend | None = None) -> torch.device:
    """Join the process group ``torchrun`` set up (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` ... in the
    environment) and return this rank's device.  Backend: ``nccl`` when CUDA is available, else ``gloo``."""
    if "RANK" not in os.environ:
        raise LaunchError("no RANK in the environment: start this script with torchrun --nproc_per_node N")
    chosen: Backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if chosen == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        keep_world_unreferenced()
        dist.init_process_group(chosen)
    return default_device()


def keep_world_unreferenced() -> None:
    """Import ``torch.distributed.nn`` before the default group exists.

    Its functions take ``group=group.WORLD`` as a default, evaluated at import: imported after
    ``init_process_group`` (DCP imports it, lazily) they hold the world group for good, so
    ``destroy_process_group`` cannot free it and gloo's worker threads outlive the script into interpreter
    shutdown, where one dropping a finished collective's tensor aborts the process (examples/train.py).
    Imported first, the default is ``None`` and destroying the group joins its workers.
    """
    importlib.import_module("torch.distributed.nn")


def launch(
    fn: Callable[..., Any],
    nproc: int,
    *args: Any,
    backend: Backend = "gloo",
    timeout: float = 120.0,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nproc`` ranks of a new process group; return each rank's result (module doc)."""
    if nproc < 1:
        raise LaunchError(f"nproc must be >= 1, got {nproc}")
    ctx: Any = mp.get_context("spawn" if backend == "nccl" else "fork")
    with tempfile.TemporaryDirectory(prefix="autoshard-launch-") as tmp:
        store = Path(tmp) / "store"
        procs = [
            ctx.Process(
                target=_rank_main, args=(rank, nproc, backend, str(store), tmp, fn, args), daemon=True
            )
            for rank in range(nproc)
        ]
        for p in procs:
            p.start()
        _wait(procs, timeout)
        return _results(Path(tmp), nproc)


def _rank_main(
    rank: int,
    nproc: int,
    backend: Backend,
    store: str,
    tmp: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
) -> None:
    torch.set_num_threads(1)
    out = Path(tmp) / f"rank{rank}.pt"
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=nproc)
        value = fn(*args)
        torch.save({"ok": True, "value": value}, out)
    except BaseException:
        torch.save({"ok": False, "error": traceback.format_exc(), "at": time.time()}, out)
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _wait(procs: list[Any], timeout: float) -> None:
    """Join every rank; on the first failure or past the deadline, kill the others (they would hang)."""
    deadline = time.monotonic() + timeout
    while any(p.is_alive() for p in procs):
        failed = any(p.exitcode not in (None, 0) for p in procs)
        late = time.monotonic() > deadline
        if failed or late:
            alive = [rank for rank, p in enumerate(procs) if p.is_alive()]
            for p in procs:
                p.kill()
                p.join()
            if late and not failed:
                raise LaunchError(f"ranks {alive} still running after {timeout:.0f} s (a hang?): killed them")
            return
        time.sleep(0.005)


def _results(tmp: Path, nproc: int) -> list[Any]:
    records: dict[int, dict[str, Any]] = {}
    for rank in range(nproc):
        path = tmp / f"rank{rank}.pt"
        if path.exists():
            records[rank] = torch.load(path, weights_only=False)
    failures = sorted((record["at"], rank) for rank, record in records.items() if not record["ok"])
    if failures:
        # The first rank to fail is the cause: a peer that dies can make the others fail later (gloo's
        # "connection closed by peer" inside init_process_group), and those are consequences, not the story.
        rank = failures[0][1]
        others = f" (then ranks {[r for _, r in failures[1:]]})" if len(failures) > 1 else ""
        raise LaunchError(f"rank {rank} of {nproc} failed first{others}:\n{records[rank]['error']}")
    missing = [rank for rank in range(nproc) if rank not in records]
    if missing:
        raise LaunchError(f"ranks {missing} left no result (killed, or crashed before Python could report)")
    return [records[rank]["value"] for rank in range(nproc)]
