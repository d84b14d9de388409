"""What optuna-dashboard shows of a tuning study, read through its own HTTP API (its WSGI app, no server):
the study is named and labelled as the layer, the objective is named, and a failed measurement is a failed
trial (with its error), not a success valued 0."""
from __future__ import annotations

import io
import json
from wsgiref.util import setup_testing_defaults

import pytest

from tuner.errors import ErrorCode
from tuner.measure import MeasureResult
from tuner.search import tune
from tuner.templates import get_template

optuna_dashboard = pytest.importorskip("optuna_dashboard")

BUFFERS = {"input": "buffer", "weight": "buffer", "output": "buffer"}


class OneFailure:
    """The device, scripted: the first config fails to compile, every later one runs in 1 ms."""

    def __init__(self):
        self.calls = 0

    def measure(self, inputs):
        out = []
        for _ in inputs:
            self.calls += 1
            out.append(MeasureResult(ErrorCode.COMPILE, "error: use of undeclared identifier 'x'") if self.calls == 1
                       else MeasureResult(costs=[1e-3, 1e-3], max_rel_error=1e-7))
        return out


def _get(app, path: str):
    env = {}
    setup_testing_defaults(env)
    env.update(PATH_INFO=path, REQUEST_METHOD="GET", QUERY_STRING="", **{"wsgi.input": io.BytesIO()})
    status = []
    body = b"".join(app(env, lambda s, h, exc=None: status.append(s)))
    assert status[0].startswith("200"), (path, status, body[:300])
    return json.loads(body)


def test_dashboard_shows_layers_objective_and_failures(device, tmp_path):
    t = get_template("dense")
    wl = t.workload(data=(1, 64), weight=(32, 64))
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    res = tune("dense", wl, device=device, trials=4, log=str(tmp_path / "log.jsonl"), storage=storage,
               scopes=BUFFERS, progress=False, measurer=OneFailure(), sampler="random")
    assert res.measured == 4
    app = optuna_dashboard.wsgi(storage)

    studies = _get(app, "/api/studies")["study_summaries"]
    assert [s["study_name"] for s in studies] == [res.study_name]
    summary = studies[0]
    # the list reads as the layer: template, workload, scopes (the hash keeps names unique)
    assert summary["study_name"].startswith("dense-") and "64->32" in summary["study_name"]
    assert "[buffer/buffer/buffer]" in summary["study_name"]
    assert {"key": "label", "value": res.label} in summary["user_attrs"]

    detail = _get(app, f"/api/studies/{summary['study_id']}")
    assert detail["objective_names"] == ["GFLOP/s"]
    states = [tr["state"] for tr in detail["trials"]]
    assert states.count("Fail") == 1 and states.count("Complete") == 3, states
    failed = next(tr for tr in detail["trials"] if tr["state"] == "Fail")
    assert not failed.get("values"), failed  # no made-up 0
    assert {"key": "error", "value": "COMPILE"} in failed["user_attrs"]
    done = [tr for tr in detail["trials"] if tr["state"] == "Complete"]
    assert all(tr["values"] and float(tr["values"][0]) > 0 for tr in done)
    assert all(any(a["key"] == "record" for a in tr["user_attrs"]) for tr in done)  # the log, rebuildable
