"""The device agent's measurement rate through ``tcp://``: this checkout against another one (``--tree``, e.g.
the code before issue 54's handshake), runs alternating, each run a fresh process of that checkout's tuner and a
fresh ``tuner-agent --listen 127.0.0.1:PORT`` of that checkout's build, with empty caches.

    python bench/agent_tcp.py --tree /tmp/old [--runs 3] [--trials 10] [--device D] [--out bench/results]

A run: the agent started with a token (``--token-file`` where the agent has it, else the old ``--token``), the
tuner connecting with ``tcp://127.0.0.1:PORT?token=T&device=N`` (both checkouts read it), one warm-up
measurement (not timed), then per workload ``--trials`` distinct random valid configs (the same seed every run)
measured through ``RuntimeRunner`` in batches of ``n_parallel`` as ``tune`` sends them, with the tuner's default
options. Rate = configs measured / wall seconds * 60, summed over the workloads. Build each checkout's agent
first (``make -C TREE/native agent``). Writes bench/results/agent_tcp_rate.json (every run) and prints a table."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# one run, in a fresh interpreter with the checkout first on sys.path: argv = TREE DEVICE TRIALS SCRATCH
RUN = r'''
import json, os, secrets, socket, subprocess, sys, time
tree, device, trials, scratch = sys.argv[1], sys.argv[2] or None, int(sys.argv[3]), sys.argv[4]
# this checkout alone: no other checkout's folders on the path, and not the editable install's finder (it maps
# tuner.templates to the installed checkout's templates/)
sys.path = [tree] + [p for p in sys.path if not os.path.exists(os.path.join(p or '.', 'tuner', '__init__.py'))]
sys.meta_path = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]  # nor its finder
import numpy as np
import tuner
from tuner.agent import AgentRuntime
from tuner.measure import MeasureInput, MeasureOptions
from tuner.measure.runtime_runner import RuntimeRunner
from tuner.native import opencl_env
from tuner.runtime.opencl.device import choose_device
assert tuner.__file__.startswith(tree), (tuner.__file__, tree)
WORKLOADS = [
    ("conv2d 3x3 32->32 28x28", "conv2d", ((1, 32, 28, 28), (32, 32, 3, 3)), {"padding": 1}),
    ("conv2d 1x1 64->64 14x14", "conv2d", ((1, 64, 14, 14), (64, 64, 1, 1)), {}),
    ("depthwise 3x3 64 28x28", "depthwise_conv2d", ((1, 64, 28, 28), (64, 1, 3, 3)), {"padding": (1, 1, 1, 1)}),
    ("dense 1x512 -> 256", "dense", ((1, 512), (256, 512)), {}),
]
info = choose_device(device)
agent = os.path.join(tree, "build", "native", "tuner-agent")
token = secrets.token_urlsafe(24)
tok = os.path.join(scratch, "token")
fd = os.open(tok, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
os.write(fd, (token + "\n").encode()); os.close(fd)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
helptext = subprocess.run([agent, "--help"], capture_output=True, text=True)
auth = ["--token-file", tok] if "--token-file" in helptext.stdout + helptext.stderr else ["--token", token]
env = {**opencl_env(), "POCL_CACHE_DIR": os.path.join(scratch, "pocl"), "XDG_CACHE_HOME": os.path.join(scratch, "cache")}
env.pop("TUNER_AGENT_TOKEN", None)
log = open(os.path.join(scratch, "agent.log"), "w")
server = subprocess.Popen([agent, "--listen", f"127.0.0.1:{port}", *auth, "--work-dir", os.path.join(scratch, "work")],
                          stdout=log, stderr=log, env=env)
try:
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
        except OSError:
            time.sleep(0.05)
    time.sleep(0.2)  # the probe's slot closes
    t_connect = time.perf_counter()
    rt = AgentRuntime(f"tcp://127.0.0.1:{port}?token={token}&device={info.index}")
    t_connect = time.perf_counter() - t_connect
    assert rt.info.fingerprint == info.fingerprint
    options = MeasureOptions()
    runner = RuntimeRunner(rt, options)
    def run(template, wl, cfgs):
        start, out = time.perf_counter(), []
        for i in range(0, len(cfgs), options.n_parallel):
            out += runner.measure([MeasureInput(template, wl, c) for c in cfgs[i:i + options.n_parallel]])
        return time.perf_counter() - start, out
    t0 = tuner.get_template("dense"); wl0 = t0.workload((1, 8), (8, 8))
    run("dense", wl0, [t0.fallback(wl0, info)])  # warm: the executor up, the templates imported
    rng = np.random.default_rng(0)
    rows = []
    for label, template, shapes, kw in WORKLOADS:
        t = tuner.get_template(template)
        wl = t.workload(*shapes, **kw)
        space = t.space(wl, info)
        seen, cfgs = set(), []
        for _ in range(50 * trials):
            values = space.sample(rng)
            key = tuple(sorted(values.items()))
            if key not in seen:
                seen.add(key); cfgs.append(t.make_config(values))
            if len(cfgs) == trials:
                break
        seconds, res = run(template, wl, cfgs)
        # the host's share, after: lowering, code generation, inputs and reference of each config again (no device;
        # during the run it overlaps the device's work on the previous config)
        host = sum(runner._host(MeasureInput(template, wl, c))[-1] for c in cfgs)
        rows.append({"workload": label, "seconds": seconds, "n": len(res), "ok": sum(r.ok for r in res),
                     "host_s": host, "configs": [repr(c) for c in cfgs]})
    runner.close(); rt.close()
finally:
    server.terminate(); server.wait(10)
print(json.dumps({"device": f"{info.platform} / {info.name} ({info.fingerprint})", "connect_s": t_connect,
                  "auth": auth[0], "rows": rows}))
'''


def one_run(tree: Path, device: str | None, trials: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-agent-tcp-") as scratch:
        r = subprocess.run([sys.executable, "-c", RUN, str(tree), device or "", str(trials), scratch],
                           capture_output=True, text=True, cwd=scratch)
        if r.returncode != 0:
            log = Path(scratch, "agent.log")
            raise SystemExit(f"run in {tree} failed:\n{r.stderr[-3000:]}\nagent log:\n"
                             f"{log.read_text()[-2000:] if log.exists() else ''}")
        return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", required=True, help="the other checkout (its agent built: make -C TREE/native agent)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each checkout, alternating")
    ap.add_argument("--trials", type=int, default=10, help="configs per workload")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default=str(HERE / "results"))
    args = ap.parse_args(argv)
    trees = {"before": Path(args.tree).resolve(), "now": ROOT}
    for label, tree in trees.items():
        if not (tree / "build" / "native" / "tuner-agent").is_file():
            raise SystemExit(f"no agent in {tree}/build/native: make -C {tree}/native agent")
    runs: dict = {k: [] for k in trees}
    for i in range(args.runs):
        for label in (("before", "now") if i % 2 == 0 else ("now", "before")):
            res = one_run(trees[label], args.device, args.trials)
            n = sum(r["n"] for r in res["rows"])
            secs = sum(r["seconds"] for r in res["rows"])
            res.update(label=label, run=i, rate=n / secs * 60.0, n=n, ok=sum(r["ok"] for r in res["rows"]),
                       seconds=secs, host_s=sum(r["host_s"] for r in res["rows"]), load=os.getloadavg()[0],
                       at=time.strftime("%H:%M:%S"))
            runs[label].append(res)
            print(f"run {i} {label}: {res['rate']:.1f} trials/min ({res['ok']}/{n} ok, {secs:.1f} s, host share "
                  f"{res['host_s']:.1f} s, connect {res['connect_s'] * 1000:.0f} ms, load {res['load']:.2f})", flush=True)
    same = all(r["configs"] == s["configs"] for a in runs["before"] for b in runs["now"]
               for r, s in zip(a["rows"], b["rows"]))
    med = {k: statistics.median(r["rate"] for r in v) for k, v in runs.items()}
    print(f"median trials/min: before {med['before']:.1f}, now {med['now']:.1f} "
          f"(now / before {med['now'] / med['before']:.3f}); the same configs both ways: {same}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_tcp_rate.json").write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()},
                                                         "trials": args.trials, "same_configs": same,
                                                         "median": med, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
