"""A killed, interrupted or failing reproduction leaves no worker process behind (hf_icl.reproduce.workers).

Each test starts a small parent process that opens :func:`worker_pool`, gives every worker a job that sleeps for
ten minutes, and prints the workers' PIDs once each is inside its job; then it ends the parent and polls (up to
POLL_S seconds, not a timing assertion) until no worker is alive.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from repo_paths import REPO

from hf_icl.reproduce.workers import worker_pool

WORKERS = 1  # each spawned worker imports torch: one keeps the signal tests fast (the error test runs two)
POLL_S = 30.0  # generous: a loaded machine may take a while to reap; the assertion is "eventually", not "fast"
START_S = 120.0  # spawning workers imports torch and hf_icl in each

PARENT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path

    def sleeper(markers):
        Path(markers, str(os.getpid())).write_text("")
        time.sleep(600)

    if __name__ == "__main__":
        from hf_icl.reproduce.workers import worker_pool

        markers, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        with worker_pool(n) as pool:
            jobs = [pool.submit(sleeper, markers) for _ in range(n)]
            while len(os.listdir(markers)) < n:
                time.sleep(0.05)
            print("READY", flush=True)
            if mode == "error":  # what a job's error re-raised by job.result() does to the block
                sys.stdin.readline()
                raise RuntimeError("a run failed")
            for job in jobs:
                job.result()
    """
)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, counts as gone)."""
    stat = Path(f"/proc/{pid}/stat")
    if stat.parent.parent.is_dir() and Path("/proc/self").exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def launch_parent(root: Path, mode: str, workers: int) -> tuple[subprocess.Popen, Path, int]:
    root.mkdir()
    script, markers = root / "parent.py", root / "markers"
    script.write_text(PARENT)
    markers.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    parent = subprocess.Popen(
        [sys.executable, str(script), str(markers), str(workers), mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return parent, markers, workers


def ready_parent(launched) -> tuple[subprocess.Popen, list[int]]:
    """Wait until every worker of a launched parent sits in its sleeping job; its PIDs."""
    parent, markers, workers = launched
    ready = wait_until(lambda: len(os.listdir(markers)) == workers or parent.poll() is not None, START_S)
    if not ready or parent.poll() is not None:
        parent.kill()
        out, err = parent.communicate()
        pytest.fail(f"the parent did not start its workers: {out}\n{err}")
    assert parent.stdout.readline().strip() == "READY"
    pids = [int(name) for name in os.listdir(markers)]
    assert len(set(pids)) == workers and parent.pid not in pids
    assert all(alive(pid) for pid in pids)
    return parent, pids


@pytest.fixture(scope="module")
def parents(tmp_path_factory):
    """Every scenario's parent, launched at once (each spends seconds importing torch, in parallel)."""
    root = tmp_path_factory.mktemp("workers")
    scenarios = {"sigkill": ("wait", WORKERS), "sigterm": ("wait", WORKERS), "sigint": ("wait", WORKERS)}
    scenarios["error"] = ("error", 2)
    launched = {name: launch_parent(root / name, mode, n) for name, (mode, n) in scenarios.items()}
    yield launched
    for parent, markers, _ in launched.values():
        parent.kill()
        parent.communicate()
        kill_survivors(int(name) for name in os.listdir(markers))


def kill_survivors(pids) -> None:
    for pid in pids:  # never leave a stray sleeper behind, even when the test fails
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["sigkill", "sigterm", "sigint"])
def test_no_worker_outlives_its_parent(parents, sig):
    parent, pids = ready_parent(parents[sig.name.lower()])
    try:
        parent.send_signal(sig)
        assert wait_until(lambda: parent.poll() is not None, POLL_S), "the parent did not exit"
        assert wait_until(lambda: not any(alive(pid) for pid in pids), POLL_S), [p for p in pids if alive(p)]
        if sig != signal.SIGKILL:  # it cleaned up and exited with an error status, no hang
            assert parent.returncode != 0
    finally:
        kill_survivors(pids)


def test_an_error_in_the_parent_stops_every_worker_and_propagates(parents):
    parent, pids = ready_parent(parents["error"])
    try:
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert wait_until(lambda: parent.poll() is not None, POLL_S), "the parent waited for the sleeping jobs"
        assert wait_until(lambda: not any(alive(pid) for pid in pids), POLL_S), [p for p in pids if alive(p)]
        assert parent.returncode != 0
        assert "RuntimeError: a run failed" in parent.stderr.read()
    finally:
        kill_survivors(pids)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, None])
def test_worker_pool_refuses_a_bad_size(n):
    with pytest.raises(ValueError, match=f"n must be a positive integer.*got {n!r}"):
        with worker_pool(n):
            pass
