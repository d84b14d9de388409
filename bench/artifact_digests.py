"""Does a change compile the same models? The zoo's models compiled for device profiles with a tree's tuner, each
artifact's files (kernels, graph.json, params.bin; not manifest.json, which dates the build) digested.

    # one tree at a time, each its own code (python -S: no editable install's path hooks), then compare
    PURE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    (cd TREE && PYTHONPATH=TREE:$PURE ../.venv/bin/python -S bench/artifact_digests.py --out /tmp/before.json \
        --profile intel=/tmp/intel.json --profile nvidia=/tmp/h200.json ...)
    python bench/artifact_digests.py --compare /tmp/before.json /tmp/after.json

``--profile NAME=PROFILE[:LOG[:TRANSFER_FROM]]``: a device profile (``tuner devices --json --device D``), the log
to compile with (default: ``logs/<its fingerprint>.jsonl`` if there is one) and a sibling to transfer from. Every
model is compiled with ``--scope`` auto, texture and buffer (no device is opened: ``target=``), at
``--input-size`` (64). The tree's own zoo builds the models, so both trees compile the same ONNX.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import warnings
from pathlib import Path


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json"):
        h.update(f.relative_to(folder).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def compile_all(profiles: list, models: list, size: int) -> dict:
    import tuner
    try:
        from tuner.zoo import models as zoo
    except ImportError:  # a tree from before the package split
        from tuner.graph import zoo
    from tuner.target import load_profile
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for spec in profiles:
            name, _, rest = spec.partition("=")
            path, log, sibling = (rest.split(":") + ["", ""])[:3]
            fp = load_profile(path).fingerprint
            log = log or (f"logs/{fp}.jsonl" if Path(f"logs/{fp}.jsonl").is_file() else None)
            for m in models:
                for scope in ("auto", "texture", "buffer"):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        mod = tuner.compile_model(getattr(zoo, m)(input_size=size), log=log, target=path, scope=scope,
                                                  **({"transfer_from": sibling} if sibling else {}))
                    d = Path(tmp) / f"{name}_{m}_{scope}"
                    mod.save(d)
                    out[f"{name} {m} {scope}"] = digest(d)
                    print(f"{name} {m} {scope} {out[f'{name} {m} {scope}']}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", action="append", default=[], help="NAME=PROFILE.json[:LOG[:TRANSFER_FROM]]")
    ap.add_argument("--models", default="resnet18,mobilenet_v2,mobilenet_v3_small")
    ap.add_argument("--input-size", type=int, default=64)
    ap.add_argument("--out", help="write the digests here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two --out files: which differ")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        same = [k for k in a if b.get(k) == a[k]]
        diff = sorted(set(a) ^ set(b) | {k for k in a if k in b and a[k] != b[k]})
        print(f"{len(same)} of {len(a)} artifacts identical" + (f"; differ: {', '.join(diff)}" if diff else ""))
        return 1 if diff else 0
    if not args.profile:
        print("error: give --profile NAME=PROFILE.json (tuner devices --json --device D > PROFILE.json)",
              file=sys.stderr)
        return 2
    out = compile_all(args.profile, args.models.split(","), args.input_size)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
