"""Memory planning: which tensors of a model share which device allocation (texture RFC, part A1 and the addendum
"Storage scope based memory planning").

`plan_memory` walks the nodes (steps) in order. At each step it first allocates a storage for every tensor produced
there, then releases the storages of the tensors whose last use is that step: a node's output never takes the
storage of one of its own inputs, and two tensors share a storage only when their live ranges [first, last] are
disjoint. A `TokenAllocator` dispatches on the scope:

- buffers ("global", 1-D, TVM's StorageAllocator): tensors of any dtype share by bytes. A request takes the idle pool
  with the smallest size that fits, else the largest smaller one, which grows to the request. Pools more than
  `MATCH_RANGE_1D` times larger or smaller than the request are skipped, so a tiny tensor does not pin a huge pool.
- textures (any "texture..." scope, 2-D, TVM's TokenAllocator2D): only idle pools of the same scope and dtype (the
  packing and the image channel type must match). Among pools the request fits in, the least wasted area wins; if
  none fits, the pool needing the least added area grows to (max height, max width), but only when that adds less
  than a new texture of the request's size would; else a new pool is made. Pools whose height or width differs from
  the request's by more than `MATCH_RATIO_2D` times are skipped. Planned bytes thus never exceed naive bytes.

Tensors that must not share storage with anything later (model inputs the caller owns, outputs read after the run,
weights) are given `last = n_steps`: they stay live past the final node. Whether a texture fits the device's image2d
limits is the caller's check (the storage-scope pass), not the planner's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MATCH_RANGE_1D = 16  # TVM StorageAllocator's match_range
MATCH_RATIO_2D = 5   # TVM TokenAllocator2D's max_ratio, per axis


def is_texture_scope(scope: str) -> bool:
    return scope.startswith("texture")


def _matches(scope: str, query: str | None) -> bool:
    """`query`: None (all), a family ("buffer" or "global" for buffers, "texture" for every texture scope), or an
    exact texture scope such as "texture:weight"."""
    if query is None:
        return True
    if query in ("buffer", "global"):
        return not is_texture_scope(scope)
    return is_texture_scope(scope) if query == "texture" else scope == query


@dataclass
class Entry:
    """One tensor to place. `shape` is physical: for "global" an element count or any shape (only its bytes
    matter); for a texture scope (height, width, 4) RGBA pixels. `first`: the step (node index) that produces it;
    `last`: the step that reads it last (`n_steps` keeps it live past the final node, so it is never reused)."""
    name: str
    scope: str
    dtype: str
    shape: tuple | int
    first: int
    last: int

    def __post_init__(self):
        what = f"memory entry {self.name!r}"
        if self.scope != "global" and not is_texture_scope(self.scope):
            raise ValueError(f"{what}: scope {self.scope!r} cannot be planned; use 'global' (a buffer) "
                             f"or a texture scope such as 'texture'")
        try:
            self.itemsize = np.dtype(self.dtype).itemsize
        except TypeError:
            raise ValueError(f"{what}: unknown dtype {self.dtype!r}; use e.g. 'float32' or 'float16'") from None
        self.shape = (int(self.shape),) if np.isscalar(self.shape) else tuple(int(s) for s in self.shape)
        if not self.shape or min(self.shape) <= 0:
            raise ValueError(f"{what}: shape {self.shape} must have positive extents")
        if self.texture and (len(self.shape) != 3 or self.shape[2] != 4):
            raise ValueError(f"{what}: a texture's physical shape is (height, width, 4), got {self.shape}")
        if not 0 <= self.first <= self.last:
            raise ValueError(f"{what}: steps must satisfy 0 <= first <= last, got first={self.first}, "
                             f"last={self.last}")

    @property
    def texture(self) -> bool:
        return is_texture_scope(self.scope)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass
class Pool:
    """One device allocation. Buffer pools are raw bytes shared by every dtype: scope "global", dtype "uint8",
    shape (nbytes,). Texture pools keep their entries' scope and dtype; shape (height, width, 4)."""
    id: int
    scope: str
    dtype: str
    shape: tuple

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


class TokenAllocator:
    """Idle pools and the requests against them; dispatches to the 1-D or 2-D rule by the entry's scope."""

    def __init__(self):
        self.pools: list[Pool] = []
        self.idle: set[int] = set()

    def request(self, e: Entry) -> int:
        pool = self._reuse_2d(e) if e.texture else self._reuse_1d(e)
        if pool is None:
            pool = (Pool(len(self.pools), e.scope, e.dtype, e.shape) if e.texture
                    else Pool(len(self.pools), "global", "uint8", (e.nbytes,)))
            self.pools.append(pool)
        self.idle.discard(pool.id)
        return pool.id

    def release(self, pool_id: int) -> None:
        self.idle.add(pool_id)

    def _idle(self, keep) -> list[Pool]:
        return [self.pools[i] for i in sorted(self.idle) if keep(self.pools[i])]  # sorted: deterministic ties

    def _reuse_1d(self, e: Entry) -> Pool | None:
        n = e.nbytes
        near = self._idle(lambda p: p.scope == "global" and n <= p.nbytes * MATCH_RANGE_1D
                          and p.nbytes <= n * MATCH_RANGE_1D)
        fits = [p for p in near if p.nbytes >= n]
        if fits:
            return min(fits, key=lambda p: p.nbytes)
        if not near:
            return None
        pool = max(near, key=lambda p: p.nbytes)
        pool.shape = (n,)
        return pool

    def _reuse_2d(self, e: Entry) -> Pool | None:
        h, w, _ = e.shape

        def near(p: Pool) -> bool:
            if (p.scope, p.dtype) != (e.scope, e.dtype):
                return False
            ph, pw, _ = p.shape
            return max(h / ph, ph / h, w / pw, pw / w) <= MATCH_RATIO_2D

        def cost(p: Pool) -> tuple[int, int]:  # (added area, wasted area): fitting pools (added 0) come first
            grown = max(h, p.shape[0]) * max(w, p.shape[1])
            return grown - p.shape[0] * p.shape[1], grown - h * w

        candidates = self._idle(near)
        if not candidates:
            return None
        pool = min(candidates, key=cost)
        if cost(pool)[0] >= h * w:  # growing would cost at least a new texture of this size
            return None
        pool.shape = (max(h, pool.shape[0]), max(w, pool.shape[1]), 4)
        return pool


@dataclass
class MemoryPlan:
    storage_id: dict  # entry name -> pool id
    pools: list       # Pool, indexed by id
    entries: list = field(repr=False)

    def scope_of(self, name: str) -> str:
        """The storage_scope of an entry's pool, as the artifact's graph JSON records it."""
        return self.pools[self.storage_id[name]].scope

    def planned_bytes(self, scope: str | None = None) -> int:
        return sum(p.nbytes for p in self.pools if _matches(p.scope, scope))

    def naive_bytes(self, scope: str | None = None) -> int:
        """One allocation per entry."""
        return sum(e.nbytes for e in self.entries if _matches(e.scope, scope))

    def totals(self) -> dict:
        """``{"buffer" | "texture": {"pools", "planned", "naive"}}`` for the scope families present."""
        families = {"texture" if is_texture_scope(e.scope) else "buffer" for e in self.entries}
        return {f: {"pools": sum(_matches(p.scope, f) for p in self.pools), "planned": self.planned_bytes(f),
                    "naive": self.naive_bytes(f)} for f in sorted(families)}

    def summary(self) -> str:
        """A table of pools, planned and naive bytes per exact scope, and the total."""
        scopes = sorted({p.scope for p in self.pools}, key=lambda s: (is_texture_scope(s), s))
        rows = [(s, sum(p.scope == s for p in self.pools), sum(p.nbytes for p in self.pools if p.scope == s),
                 sum(e.nbytes for e in self.entries if e.scope == s)) for s in scopes]
        rows.append(("total", len(self.pools), self.planned_bytes(), self.naive_bytes()))
        lines = [f"{'scope':<16}{'pools':>6}{'planned bytes':>16}{'naive bytes':>16}{'saving':>9}"]
        for s, n, planned, naive in rows:
            saving = f"{100 * (1 - planned / naive):.1f}%" if naive else "-"
            lines.append(f"{s:<16}{n:>6}{planned:>16,}{naive:>16,}{saving:>9}")
        return "\n".join(lines)


def plan_memory(entries: list[Entry]) -> MemoryPlan:
    """Assign every entry a pool (see the module docstring for the rules). Storage ids are deterministic: pools are
    numbered in creation order, entries produced at the same step are served in the order given."""
    entries = list(entries)
    seen: set[str] = set()
    for e in entries:
        if e.name in seen:
            raise ValueError(f"memory entry {e.name!r} appears twice; entry names must be unique")
        seen.add(e.name)
    produced: dict[int, list[Entry]] = {}
    freed: dict[int, list[Entry]] = {}
    for e in entries:
        produced.setdefault(e.first, []).append(e)
        freed.setdefault(e.last, []).append(e)
    alloc, sid = TokenAllocator(), {}
    for step in sorted(produced.keys() | freed.keys()):
        for e in produced.get(step, ()):  # allocate all outputs of the step before freeing its inputs
            sid[e.name] = alloc.request(e)
        for e in freed.get(step, ()):
            alloc.release(sid[e.name])
    return MemoryPlan({e.name: sid[e.name] for e in entries}, alloc.pools, entries)


def check_plan(entries: list[Entry], plan: MemoryPlan) -> None:
    """Raise ValueError naming the entries if the plan shares storage between entries live at the same step, puts
    an entry in a pool too small for it, or mixes scopes (or, for textures, dtypes)."""
    users: dict[int, list[Entry]] = {}
    for e in entries:
        if e.name not in plan.storage_id:
            raise ValueError(f"memory entry {e.name!r} has no storage id in the plan")
        sid = plan.storage_id[e.name]
        if not 0 <= sid < len(plan.pools) or plan.pools[sid].id != sid:
            raise ValueError(f"memory entry {e.name!r}: storage id {sid} names no pool of the plan")
        p = plan.pools[sid]
        where = (f"memory entry {e.name!r} ({e.scope}, {e.dtype}, {e.shape}) in pool {sid} "
                 f"({p.scope}, {p.dtype}, {p.shape})")
        if e.texture:
            if (p.scope, p.dtype) != (e.scope, e.dtype):
                raise ValueError(f"{where}: a texture shares only with the same scope and dtype")
            if len(p.shape) != 3 or e.shape[0] > p.shape[0] or e.shape[1] > p.shape[1]:
                raise ValueError(f"{where}: the texture does not fit")
        elif is_texture_scope(p.scope) or e.nbytes > p.nbytes:
            raise ValueError(f"{where}: a buffer needs a buffer pool of at least {e.nbytes} bytes")
        users.setdefault(sid, []).append(e)
    for sid, es in users.items():
        es.sort(key=lambda e: (e.first, e.last))
        for a, b in zip(es, es[1:]):
            if b.first <= a.last:
                raise ValueError(f"memory entries {a.name!r} (steps {a.first}..{a.last}) and {b.name!r} (steps "
                                 f"{b.first}..{b.last}) are both live at step {b.first} but share storage {sid}")


def live_ranges(steps, keep=()) -> dict[str, tuple[int, int]]:
    """(first, last) per tensor from the nodes in order, each an (inputs, outputs) pair. Tensors read but never
    produced (model inputs) start at step 0; a tensor never read ends where it is produced; names in `keep` (model
    outputs, inputs the caller owns) last until len(steps), past the final node."""
    ranges: dict[str, list[int]] = {}
    for i, (inputs, outputs) in enumerate(steps):
        for t in inputs:
            ranges.setdefault(t, [0, i])[1] = i
        for t in outputs:
            r = ranges.setdefault(t, [i, i])
            r[1] = max(r[1], i)
    for t in keep:
        if t not in ranges:
            raise ValueError(f"kept tensor {t!r} is neither read nor produced by any step")
        ranges[t][1] = len(steps)
    return {t: (f, l) for t, (f, l) in ranges.items()}
