"""Kernels back to back: one batch of launches held behind a user event until all of it is enqueued, then
released and timed by wall clock, so the host's enqueue rate is not what is timed; the gaps between launches
are. ``Executable.time_stream`` and the GPU benchmark's launch floor both time this way."""
from __future__ import annotations

import time

import pyopencl as cl


def gated_batch(context, queue, calls, runs: int) -> tuple:
    """Enqueue ``runs`` rounds of ``calls`` (``(kernel, global size, local size or None)``, arguments already
    set) on ``queue`` behind a user event, release it and wait for the queue: ``(wall seconds per round from
    the release to the end, the launches' events in order)``. The gate is released even when an enqueue fails,
    so nothing stays blocked behind it."""
    gate, events = cl.UserEvent(context), []
    try:
        for _ in range(runs):
            for fn, g, l in calls:
                events.append(cl.enqueue_nd_range_kernel(queue, fn, g, l, wait_for=None if events else [gate]))
    finally:
        t0 = time.perf_counter()
        gate.set_status(cl.command_execution_status.COMPLETE)
    queue.finish()
    return (time.perf_counter() - t0) / runs, events
