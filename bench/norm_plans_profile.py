"""Where the norms step's plans spend their time, node by node (issue 55): one model compiled three ways with the
same logs and scope, as the norms step compiles its candidates, without the plan timing -- its norms as they are
(``plain``: a statistics and an apply kernel, or one launch, a norm), applied by their readers (``as_read``:
``norms_applied_as_read``), and applied by their readers with their statistics from their producers
(``candidate``: ``norm_statistics_into_producers`` after it) -- each profiled (per-node medians of ``--repeats``
runs, profiling events) and timed whole. Writes ``<out>.json`` (per plan: latency, kernel sum, per-node times,
the convolutions' configs and where they came from) and prints the candidate's nodes beside the plain plan's.

It answers what ``compile --scope auto``'s plan timing cannot: why a candidate it did not keep is slower. On the
H200 (2026-12-04) the per-layer plan gave gn32_resnet's producers texture configs without ``split_k``, 53 -> 450 us
a convolution; in buffer scope the candidate ran as fast as ``as_read``, and both slower than ``plain``.

usage: python bench/norm_plans_profile.py MODEL.onnx --log 'logs/*.jsonl' --device nvidia --scope buffer --out F"""
from __future__ import annotations

import argparse
import json
import sys
import warnings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--log", required=True, help="logs (comma-separated globs)")
    p.add_argument("--device", default="nvidia")
    p.add_argument("--scope", default="auto", choices=("auto", "texture", "buffer"))
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", required=True, help="the JSON file to write")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    import tuner.compile.compiler as C
    from tuner.graph.passes_layer_norm import norm_statistics_into_producers, norms_applied_as_read
    from tuner.runtime.opencl.device import open_device
    dev = open_device(args.device)
    # as the norms step compiles its candidates (``fastest_plan``'s ``compile_``): one graph and one history, each
    # plan from its rewrite of the graph
    history = C.device_history(C.as_history(args.log.split(","), "auto"), dev.info, "auto", "float32")
    graph = C.load_graph(args.model)
    ways = {"plain": graph, "as_read": norms_applied_as_read(graph)}
    ways["candidate"] = norm_statistics_into_producers(ways["as_read"])
    res = {}
    for name, g in ways.items():
        plan = C.plan_graph(g, dev.info, args.scope, history, "float32")
        mod = C.module_of(C.compile_plan(plan, dev.info, history), dev)
        prof = mod.profile(args.repeats)
        res[name] = {
            "total_ms": prof["total_s"] * 1e3, "kernels_ms": prof["kernel_total_s"] * 1e3,
            "rows": [(r["node"], r["template"], round(r["median_s"] * 1e6, 1)) for r in prof["rows"]],
            "configs": {n.name: [n.config_source, n.config, {k: v for k, v in (n.workload or {}).items()
                                                                if k in ("data", "kernel")}]
                        for n in mod.spec.nodes if n.template == "conv2d"},
            "calls": {n.name: [c.kernel for c in n.calls] for n in mod.spec.nodes}}
        print(f"{name}: {res[name]['total_ms']:.3f} ms a run, kernels {res[name]['kernels_ms']:.3f} ms", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=str)
    plain = {r[0]: r[2] for r in res["plain"]["rows"]}
    for node, _, us in res["candidate"]["rows"]:
        print(f"{node:48s} plain {plain.get(node, '-'):>8} candidate {us:>8} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
