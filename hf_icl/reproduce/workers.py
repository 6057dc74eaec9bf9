"""Worker processes that never outlive the run that started them.

:func:`worker_pool` is the one place the reproductions open a process pool (spawned workers). A worker
stops when its parent is gone, however the parent ended:

- killed (``SIGKILL``, the out-of-memory killer): on Linux the kernel sends the worker ``SIGKILL`` as its
  parent dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere a daemon thread in the worker polls ``os.getppid()``
  and exits the worker once it has been re-parented;
- interrupted (``SIGINT``/Ctrl-C, ``SIGTERM``) or failed (an error in one job): the parent cancels the
  pending jobs and terminates the workers before the error propagates, instead of waiting for their
  (possibly hour-long) jobs to finish.

Workers ignore ``SIGINT`` (a Ctrl-C at a terminal reaches the whole process group): the parent stops them.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context

#: seconds between a worker's checks that its parent is alive (the portable fallback)
PARENT_POLL_S = 0.5
#: seconds the parent waits for terminated workers to exit before it kills them
TERMINATE_GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies. No-op elsewhere or on failure."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no libc symbol: the polling thread still covers it
        return


def _watch_parent(parent_pid: int, interval: float) -> None:
    while True:
        if os.getppid() != parent_pid:  # re-parented: the parent is gone
            os._exit(1)
        time.sleep(interval)


def _init_worker(parent_pid: int, interval: float) -> None:
    """Initializer of every worker: die with the parent, ignore Ctrl-C (the parent stops the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent_pid, interval), name="watch-parent", daemon=True).start()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Cancel the pending jobs and end every worker now: SIGTERM, then SIGKILL after a grace period."""
    processes = list(getattr(pool, "_processes", {}).values())  # CPython's pool keeps {pid: Process}
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(1.0)


class _Terminated(SystemExit):
    """SIGTERM in the parent while a pool is open: unwinds like ``sys.exit(143)``, stopping the workers."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated(128 + signum)


@contextmanager
def worker_pool(n: int) -> Iterator[ProcessPoolExecutor]:
    """``with worker_pool(n) as pool:`` a ``ProcessPoolExecutor`` of ``n`` spawned workers that die with this
    process. Leaving the block normally waits for the submitted jobs; leaving it by an exception (a job's error,
    Ctrl-C, or ``SIGTERM``, which raises ``SystemExit(143)`` while the pool is open in the main thread) cancels
    the pending jobs and terminates the workers first."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer (the number of worker processes), got {n!r}")
    pool = ProcessPoolExecutor(
        n, mp_context=get_context("spawn"), initializer=_init_worker, initargs=(os.getpid(), PARENT_POLL_S)
    )
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        try:
            yield pool
            pool.shutdown(wait=True)
        except BaseException:
            if in_main:  # a second SIGTERM must not cut the clean-up short
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            _stop_workers(pool)
            raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
