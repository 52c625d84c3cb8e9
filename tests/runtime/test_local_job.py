"""``run_local`` starts real ranks through torch's launcher (``torchrun --standalone``, gloo) and ends a failed
job in one line with the rank's exit code (and its error, under ``worker``), never torch's ``ChildFailedError``
traceback; ``fail`` records the line in torch's per-worker error file, which plain ``torchrun`` shows as the root
cause."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A 2-rank job.  "fail": a gloo group all-reduces (the count proves the ranks ran together), then rank 1 meets
# bad input.  Otherwise no torch in the ranks (faster): they note they started, then sleep, or rank 1 exits.
WORKER = """
import os
import sys
import time
from pathlib import Path

out, how = Path(sys.argv[1]), sys.argv[2]
if how == "fail":
    import torch, torch.distributed as dist
    from autoshard.runtime import init_from_env
    from autoshard.runtime.local_job import fail

    init_from_env()
    total = torch.ones(1)
    dist.all_reduce(total)
    (out / f"rank{dist.get_rank()}").write_text(str(int(total.item())))
    if dist.get_rank() == 1:
        fail("worker.py: error: rank 1 met bad input; pass good input")
    dist.destroy_process_group()
    raise SystemExit(0)
rank = int(os.environ["RANK"])
(out / f"rank{rank}").write_text("started")
if how == "raise" and rank == 1:  # an error of the rank's own, a BaseException as DCP's CheckpointException is
    from autoshard.runtime.local_job import worker

    class Broken(BaseException):
        pass

    def main():
        raise Broken("saving failed on ranks [1]\\nTraceback (most recent call last): (RANK 1)\\nOSError: disk full")

    worker(main)
if how == "sleep":
    time.sleep(120)
if rank == 1:
    raise SystemExit(int(how))
"""

LAUNCH = "import sys; from autoshard.runtime.local_job import run_local; sys.exit(run_local(2, sys.argv[1:]))"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _argv(tmp_path: Path, how: str) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return [sys.executable, "-c", LAUNCH, str(script), str(tmp_path), how]


def _launch(tmp_path: Path, how: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_argv(tmp_path, how), env=_env(), capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_a_rank_that_fails_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _launch(tmp_path, "fail")
    assert done.returncode == 2, done.stderr
    assert done.stderr == "worker.py: error: rank 1 met bad input; pass good input\n"  # once, from rank 1
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["2", "2"]  # the all-reduce ran


@pytest.mark.slow
def test_a_rank_that_exits_otherwise_is_named_with_its_code(tmp_path: Path) -> None:
    done = _launch(tmp_path, "3")
    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr and "ChildFailedError" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("rank 1 (pid ")
    assert done.stderr.strip().endswith("exited with code 3 (its output is above)")


@pytest.mark.slow
def test_a_rank_that_raises_is_named_with_its_error(tmp_path: Path) -> None:
    done = _launch(tmp_path, "raise")
    assert done.returncode == 1, done.stderr
    assert "ChildFailedError" not in done.stderr and "torch/distributed/" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rank 1 (pid ") and last.endswith(
        "exited with code 1: Broken: saving failed on ranks [1] ... OSError: disk full (its traceback is above)"
    )


@pytest.mark.slow
def test_an_interrupted_launch_is_one_line(tmp_path: Path) -> None:
    """SIGINT to the launcher while both ranks run: torch's agent stops them (passing the signal on: each rank's
    own KeyboardInterrupt is its script's to report); the launcher adds one line, not torch's traceback, and
    exits 130."""
    job = subprocess.Popen(_argv(tmp_path, "sleep"), env=_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    job.send_signal(signal.SIGINT)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 130, err
    assert err.endswith("\ninterrupted (SIGINT): the ranks were stopped\n")
    assert "SignalException" not in err and "torch/distributed/" not in err


def test_fail_records_the_line_for_torch_and_prints_it_on_rank_0(tmp_path, monkeypatch, capsys) -> None:
    import json

    from autoshard.runtime import local_job

    record = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(record))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv(local_job.LAUNCHED, raising=False)
    with pytest.raises(SystemExit) as stop:
        local_job.fail("x: error: bad")
    assert stop.value.code == 2 and capsys.readouterr().err == "x: error: bad\n"
    assert local_job._one_line(json.loads(record.read_text())) == "x: error: bad"
    monkeypatch.setenv(local_job.LAUNCHED, "1")  # under run_local the launcher prints it
    with pytest.raises(SystemExit):
        local_job.fail("x: error: bad")
    assert capsys.readouterr().err == ""


def test_autoshards_warnings_on_a_rank_are_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan mismatch a rank's runtime warns of (the trial's `--zero 3` run printed Python's file:line form
    and the source line, once per rank) reads as one line naming the rank; other libraries' keep their form."""
    from autoshard.codegen.assign import PlanMismatchWarning
    from autoshard.runtime.local_job import _rank_warning

    monkeypatch.setenv("RANK", "1")

    def standard(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, *_: object
    ) -> str:
        return f"{filename}:{lineno}: {category.__name__}: {message}\n"

    mismatch = PlanMismatchWarning("lm_head's reduce-scatter\n  is not bucketed")
    line = _rank_warning(standard, mismatch, PlanMismatchWarning, "x.py", 7)
    assert (
        line == "autoshard: warning (rank 1): PlanMismatchWarning: lm_head's reduce-scatter is not bucketed\n"
    )
    assert (
        _rank_warning(standard, FutureWarning("old api"), FutureWarning, "x.py", 7)
        == "x.py:7: FutureWarning: old api\n"
    )
