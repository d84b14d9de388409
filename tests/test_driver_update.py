"""A driver update keeps the tuned configs: records of the same device (platform and name) under another driver
apply where this driver has none, ranked below its own, and the compile says so."""
import dataclasses
import warnings

import pytest

import tuner
from tuner.compile.compiler import model_tasks
from tuner.logs.best import OtherDriverWarning
from tuner.logs.record import Record


@pytest.fixture
def conv_model(conv3x3_onnx):
    return conv3x3_onnx(8)


def _records(model, info, seconds: float) -> list:
    """A successful record of every task of the model's buffer plan on ``info`` (its fallback config)."""
    out = []
    for task in model_tasks(model, info, scope="buffer"):
        bound = task.bind(info) if hasattr(task, "bind") else task
        out.append(Record.new(task.template, task.workload, bound.fallback(info), info, costs=[seconds]))
    return out


def test_a_log_of_another_driver_applies_and_says_so(conv_model, device):
    old = dataclasses.replace(device.info, driver_version="1.0-before-the-update")
    assert old.fingerprint != device.info.fingerprint
    with pytest.warns(OtherDriverWarning, match="1.0-before-the-update"):
        mod = tuner.compile_model(conv_model, log=_records(conv_model, old, 1e-3), target=device.info.to_dict(),
                                  scope="buffer")
    assert [n.tuned for n in mod.spec.nodes if n.template] == [True]


def test_this_drivers_records_rank_above_another_drivers(conv_model, device):
    old = dataclasses.replace(device.info, driver_version="1.0-before-the-update")
    mine, theirs = _records(conv_model, device.info, 5e-3), _records(conv_model, old, 1e-6)  # theirs look faster
    with warnings.catch_warnings():
        warnings.simplefilter("error", OtherDriverWarning)  # nothing of theirs is used: no warning
        h = tuner.apply_history_best(mine + theirs).for_device(device.info)
    r = h.query(mine[0].template, mine[0].workload, device.info.fingerprint, mine[0].scopes)
    assert r.median_s == pytest.approx(5e-3) and r.driver == device.info.driver_version


def test_another_device_never_applies(conv_model, device):
    other = dataclasses.replace(device.info, name="Another GPU")
    h = tuner.apply_history_best(_records(conv_model, other, 1e-3))
    assert h.for_device(device.info) is h


def test_an_untuned_layer_takes_the_nearest_tuned_config_and_says_where_from(tmp_path, device):
    """A layer with no record of its own gets the config of the nearest tuned workload of its template (the
    same shapes with another epilogue first), checked against the space; the artifact says where it came from."""
    from tuner.templates import get_template
    t = get_template("conv2d")
    info = device.info
    tuned = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=(1, 1, 1, 1), activation="relu")
    scopes = {"input": "buffer", "weight": "buffer", "output": "buffer"}
    from tuner.logs.record import scope_knobs
    cfg = t.fallback_with(tuned, info, **scope_knobs(scopes), **t.model_knobs)
    cfg = dataclasses.replace(cfg, tile_oc=1)  # not the fallback's choice: a transfer is visible
    rec = Record.new("conv2d", tuned, cfg, info, costs=[1e-3])
    h = tuner.apply_history_best([rec])
    plain = t.workload(data=(1, 8, 8, 8), kernel=(8, 8, 3, 3), padding=(1, 1, 1, 1))  # no epilogue: untuned
    got, src = h.transfer(t, plain, info, scopes, t.model_knobs)
    assert got.tile_oc == 1 and src is rec
    far = t.workload(data=(1, 64, 32, 32), kernel=(32, 64, 1, 1))
    moved = h.transfer(t, far, info, scopes, t.model_knobs)
    from tuner.logs.best import invalid_config
    assert moved is None or invalid_config(t, far, info, dataclasses.asdict(moved[0])) is None
