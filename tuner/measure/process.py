"""A worker process with a per-call timeout: a call that does not answer in time kills the process (it is
started again on the next call), and a process that dies is reported, never propagated.

Workers are fresh interpreters (``python -m tuner.measure.serve``) speaking pickle over their stdin and
stdout: an OpenCL runtime does not survive a fork, and unlike multiprocessing's spawn this does not
re-import the caller's ``__main__``."""
from __future__ import annotations

import pickle
import select
import subprocess
import sys

from tuner.errors import ErrorCode


class Worker:
    def __init__(self, device_spec: str):
        self.device_spec = device_spec
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tuner.measure.serve", self.device_spec],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def call(self, job: str, args: tuple, timeout: float, timeout_code: ErrorCode):
        """``(ErrorCode, payload)``; on timeout ``(timeout_code, message)`` and the process is killed."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            pickle.dump((job, args), self.proc.stdin)
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
            if not ready:
                self.kill()
                return timeout_code, f"{job} did not finish within {timeout:g} s (worker killed)"
            result = pickle.load(self.proc.stdout)
            if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict) \
                    and result[1].pop("restart", False):
                self.kill()  # its device is unusable (a fault): the next call starts a fresh process
            return result
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError, pickle.UnpicklingError):
            code = self.proc.poll() if self.proc is not None else None
            if code is None and self.proc is not None:
                try:
                    code = self.proc.wait(2)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            return ErrorCode.UNKNOWN, f"the {job} worker died (exit code {code})"

    def kill(self) -> None:
        """End the process. Safe beside a ``kill`` in another thread (a measurer closing on Ctrl-C kills a builder
        whose own thread, its pipe gone, kills it too): it works on the process it found, not on ``self.proc``,
        which the other may have cleared meanwhile."""
        proc = self.proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass
        if self.proc is proc:  # not a process another thread has started since
            self.proc = None

    def close(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                pickle.dump(None, proc.stdin)
                proc.stdin.flush()
                proc.wait(2)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
