"""The worker process's side of ``process.Worker``: ``python -m tuner.measure.serve DEVICE``."""
from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback

from tuner.errors import ErrorCode


def _die_with_parent(poll_s: float = 0.2) -> None:
    """Exit as soon as the tuner that started this worker is gone, even mid-job (a build or a run can take
    seconds): the parent's death reparents us, which changes getppid()."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(1)
    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def serve(device_spec: str) -> None:
    """The worker's loop: answer ``(job, args)`` messages until ``None`` or end of input."""
    _die_with_parent()
    from tuner.measure import jobs
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the OpenCL runtime or a kernel prints must not corrupt the protocol
    inp = sys.stdin.buffer
    while True:
        try:
            msg = pickle.load(inp)
        except EOFError:
            return
        if msg is None:
            return
        job, args = msg
        try:
            result = getattr(jobs, job)(device_spec, *args)
        except BaseException as e:  # noqa: BLE001 - reported to the parent as UNKNOWN with the traceback
            result = (ErrorCode.UNKNOWN, f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")
        pickle.dump(result, out)
        out.flush()


if __name__ == "__main__":
    serve(sys.argv[1])
