"""Which task to measure next: the model-level policy, with no device and no I/O (``model.tune_model`` drives it).

The objective is the model's latency, node by node: each tuned node of the model runs the fastest of the tasks
that can serve it (its texture and buffer variants, its Winograd alternatives, a mixed-scope kernel at a scope
boundary: one pool), so a node's time is the best median among them, and the model's is the sum over nodes
(``latency_s``). A task is worth a visit by the cut it can be expected to make in that sum (``expected_cut``):
for every node it serves, how far its best after one more visit, ``best x (1 - gain)``, would fall below the
node's time now. ``gain`` is a task's expected relative improvement from one visit: TVM's gradient scheduler's
blend of what the last visits gained (backward) and an optimistic prior that falls as the task's measurements
grow (forward), here ``PRIOR x (HALF_LIFE / (HALF_LIFE + measured - 1))^2``.

A task leaves the pool (``TaskState.done`` names why) when its space runs out, when ``patience`` measurements
in a row brought no improvement of at least ``MIN_GAIN``, or when early stopping ended its search. A task whose
every measurement failed is done after ``patience`` failures too: the node keeps its other variants.

    s = TaskScheduler({"t1": ["conv1"], "t2": ["conv1"]}, patience=24)
    s.observe("t1", [0.002], measured=1)      # its fallback: 2 ms
    key = s.pick()                            # the task with the largest expected cut, or None
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

PRIOR = 0.65  # expected relative gain of the first visits of a task that only its fallback was measured of: the
# H200's ResNet-18 layers ended at 0.39 to 0.81 of their fallback's time within minutes (bench/notes/budget.md), so
# a variant whose fallback is twice as slow as its node's best may still win
FAIL_LIMIT = 8  # measurements without a valid one after which a task is done, where another task serves its nodes
HALF_LIFE = 16.0  # the prior falls as (HALF_LIFE / (HALF_LIFE + measurements after the fallback))^2: to a quarter
# after 16, a twelfth after 40
BACKWARD = 3  # visits the backward gradient looks back over
ALPHA = 0.5  # weight of the backward gradient against the prior (TVM: 0.2 on its own scale)
MIN_GAIN = 0.01  # a new best must be at least this much faster to count as an improvement


@dataclass
class TaskState:
    key: object
    nodes: tuple  # the model's nodes the task can serve (each once per occurrence)
    best_s: float | None = None
    fallback_s: float | None = None  # the first successful median seen (the fallback config is measured first)
    measured: int = 0  # successful or failed measurements, the log's earlier ones included
    since_best: int = 0  # measurements since the last improvement of at least MIN_GAIN
    visits: list = field(default_factory=list)  # best_s after each visit
    done: str | None = None  # why the task gets nothing more

    def gain(self) -> float:
        """Expected relative improvement of the task's best from one more visit."""
        forward = PRIOR * (HALF_LIFE / (HALF_LIFE + max(0, self.measured - 1))) ** 2
        back = self.visits[-BACKWARD - 1:]
        if len(back) >= 2 and back[0] and back[-1]:
            backward = max(0.0, (back[0] - back[-1]) / back[0]) / (len(back) - 1)
            return ALPHA * backward + (1 - ALPHA) * forward
        return forward


class TaskScheduler:
    """The pool of a model's tasks and the nodes each serves: what each has measured, the model's latency by
    node, and the next task to visit (``pick``). ``patience``: measurements without an improvement after which a
    task is done (None: never)."""

    def __init__(self, tasks: dict | None = None, patience: int | None = 24):
        self.patience = patience
        self.tasks: dict = {}
        self.nodes: dict = {}  # node -> keys of the tasks that can serve it
        for key, nodes in (tasks or {}).items():
            self.add(key, nodes)

    def add(self, key, nodes) -> TaskState:
        """A task joins the pool (again: its nodes are merged)."""
        st = self.tasks.get(key)
        if st is None:
            st = self.tasks[key] = TaskState(key, tuple(nodes))
        else:
            st.nodes = tuple(dict.fromkeys((*st.nodes, *nodes)))
        for n in st.nodes:
            keys = self.nodes.setdefault(n, [])
            if key not in keys:
                keys.append(key)
        return st

    def observe(self, key, medians: list, measured: int | None = None) -> None:
        """A task's new measurements: ``medians`` of the successful ones (seconds), ``measured`` counting the
        failed ones too (default: as many as medians)."""
        st = self.tasks[key]
        n = len(medians) if measured is None else measured
        st.measured += n
        improved = False
        for m in medians:
            if st.fallback_s is None:
                st.fallback_s = m
            if st.best_s is None or m < st.best_s * (1 - MIN_GAIN):
                improved = True
            if st.best_s is None or m < st.best_s:
                st.best_s = m
        st.since_best = 0 if improved else st.since_best + n
        if self.patience is not None and st.since_best >= self.patience and st.done is None:
            st.done = (f"no improvement in {st.since_best} measurements" if st.best_s is not None
                       else f"{st.measured} measurements, none valid")
        if st.best_s is None and st.measured >= FAIL_LIMIT and st.done is None \
                and all(self.node_s(n) is not None for n in st.nodes):
            st.done = f"{st.measured} measurements, none valid (its nodes run another variant)"

    def end_visit(self, key) -> None:
        st = self.tasks[key]
        st.visits.append(st.best_s)

    def finish(self, key, why: str) -> None:
        if self.tasks[key].done is None:
            self.tasks[key].done = why

    def node_s(self, node) -> float | None:
        """A node's time: the best median among the tasks that serve it (None: none measured yet)."""
        times = [self.tasks[k].best_s for k in self.nodes.get(node, ()) if self.tasks[k].best_s is not None]
        return min(times, default=None)

    def latency_s(self) -> tuple:
        """``(seconds, nodes without a measurement)``: the model's tuned nodes, each at its best task."""
        total, missing = 0.0, 0
        for n in self.nodes:
            t = self.node_s(n)
            if t is None:
                missing += 1
            else:
                total += t
        return total, missing

    def expected_cut(self, key) -> float:
        """Seconds one more visit of the task is expected to take off the model's latency."""
        st = self.tasks[key]
        if st.done is not None:
            return 0.0
        if st.best_s is None:  # nothing valid yet: everything when its node has nothing valid either, else the
            # node's time, halved by each 4 failures (a variant that keeps failing is worth less and less)
            return sum(t * PRIOR * 0.5 ** (st.measured / 4) if (t := self.node_s(n)) is not None else math.inf
                       for n in st.nodes)
        after = st.best_s * (1 - st.gain())
        return sum(max(0.0, (self.node_s(n) or math.inf) - after) for n in st.nodes)

    def pick(self, exclude=()):
        """The open task with the largest expected cut (ties: the first added), or None when all are done."""
        best, best_cut = None, -1.0
        for key, st in self.tasks.items():
            if st.done is not None or key in exclude:
                continue
            cut = self.expected_cut(key)
            if cut > best_cut:
                best, best_cut = key, cut
        return best

    @property
    def open(self) -> list:
        return [k for k, st in self.tasks.items() if st.done is None]
