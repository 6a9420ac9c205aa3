"""Child processes that die with this one: QEMU VMs and the embedded host, whoever starts them.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is tied to the *thread* that forked the
child, not to the process: a child started from a worker thread (a pool of VM launchers, TRL's
rollout threads) would be signalled when that thread ends, long before the job does. So every such
child is started by one long-lived daemon thread here, and gets the signal only when the job's
process goes, however it goes (kill -9, out of memory): no VM or host outlives a killed job.
"""

from __future__ import annotations

import ctypes
import queue
import signal
import subprocess
import threading
from concurrent.futures import Future
from functools import partial

from envab.envs.placement import place_child

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _in_child(sig: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig)
    place_child()  # the environments' CPUs, when the job pinned them (envs/placement.py)


class _Starter(threading.Thread):
    def __init__(self):
        super().__init__(name="child-starter", daemon=True)
        self.requests: queue.Queue = queue.Queue()

    def run(self) -> None:
        while True:
            args, kwargs, sig, done = self.requests.get()
            try:
                proc = subprocess.Popen(args, preexec_fn=partial(_in_child, sig), **kwargs)
            except BaseException as e:  # handed to the caller
                done.set_exception(e)
            else:
                done.set_result(proc)


_starter: _Starter | None = None
_lock = threading.Lock()


def start_child(args, *, death_signal: int = signal.SIGTERM, **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(args, **popen_kwargs)`, started on the one thread that lives as long as
    this process, with `death_signal` sent to the child when this process dies."""
    global _starter
    with _lock:
        if _starter is None or not _starter.is_alive():
            _starter = _Starter()
            _starter.start()
    done: Future = Future()
    _starter.requests.put((args, popen_kwargs, death_signal, done))
    return done.result()
