"""`tuner report` at scale and `--artifact` without a profile (issue 57, item 2).

The report draws a bounded number of figures whatever the size of the log: per template, the tasks of most
latency, ONE convergence figure (a line per task) and texture against buffer for the layers of most latency; it
drew a panel per task before (a minute of CPU on the shipped 3,336-record log). Its speed is measured by
bench/report.py; here a 10,000-record log must render with every section, a bounded number of images, in a
generous time. ``--artifact DIR`` without a profile profiles the artifact when the device it was compiled for is
attached, else says which command writes the profile (exit 2, one line)."""
from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path

import pytest

from tuner.analysis import load_logs, render_report
from tuner.analysis.report import convergence_figure, latency_shares
from tuner.analysis.summary import summarize
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "logs" / "nvidia-gpu-d4a6eca0.jsonl"
SECTIONS = ["Templates", "Where the time goes", "Convergence", "Texture against buffer", "Errors", "Tasks"]


def _sections(text: str) -> list[str]:
    return re.findall(r"<h2>([^<]+)</h2>", text)


def _images(text: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', text)]


@pytest.fixture(scope="module")
def big_log(tmp_path_factory) -> Path:
    """10,008 records: the shipped log three times, the batch of every workload 1, 2 and 3 (three times its
    tasks, each with the shipped log's history)."""
    if not SHIPPED.exists():
        pytest.skip("the shipped log is not in this tree")
    out = tmp_path_factory.mktemp("big") / "big.jsonl"
    lines = [json.loads(x) for x in SHIPPED.read_text().splitlines() if x.strip()]
    with open(out, "w") as f:
        for batch in (1, 2, 3):
            for d in lines:
                if isinstance(d["workload"].get("data"), list):
                    d["workload"]["data"][0] = batch
                f.write(json.dumps(d) + "\n")
    return out


@pytest.fixture(scope="module")
def big_frame(big_log):
    return load_logs(big_log)


@pytest.fixture
def small_log(tmp_path) -> Path:
    """The first 200 records of the shipped log."""
    if not SHIPPED.exists():
        pytest.skip("the shipped log is not in this tree")
    path = tmp_path / "small.jsonl"
    path.write_text("\n".join(SHIPPED.read_text().splitlines()[:200]) + "\n")
    return path


def test_a_report_of_10000_records_has_every_section_and_a_bounded_number_of_figures(big_log, big_frame):
    df = big_frame
    t0 = time.process_time()
    text = render_report(df, sources=[str(big_log)])
    cpu = time.process_time() - t0
    assert len(df) == 10_008
    tasks = summarize(df)
    assert len(tasks) > 400  # a panel per task would be 400 panels
    assert _sections(text) == SECTIONS
    images = _images(text)
    # templates, top tasks, convergence, texture/buffer: four figures, not one per task
    assert len(images) == 4 and all(png.startswith(b"\x89PNG") for png in images)
    assert max(len(png) for png in images) < 400_000  # no figure as tall as the task list
    for task in tasks["task"]:  # every task is still in the report: the tasks table
        assert task.replace("&", "&amp;").replace(">", "&gt;") in text
    assert "% of latency" in text and "cumulative %" in text
    assert cpu < 60, f"the report of 10,000 records took {cpu:.0f} s of CPU (bench/report.py measures it)"


def test_one_convergence_figure_a_line_per_task_integer_ticks_bounded_legend(big_frame):
    df = big_frame
    shares = latency_shares(summarize(df))
    fig = convergence_figure(df, shares)
    assert len(fig.axes) == 1
    ax = fig.axes[0]
    tasks = df.groupby(["device", "task"]).ngroups
    coloured = [line for line in ax.get_lines()]
    grey = ax.collections[0].get_segments()
    assert len(coloured) == 10 and len(coloured) + len(grey) == tasks  # a line per task, 10 named
    legend = fig.legends[0]
    assert len(legend.get_texts()) == 11  # the 10 tasks and "N other tasks"
    assert f"{tasks - 10} other tasks" in legend.get_texts()[0].get_text()
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    # the colored lines are the tasks of most latency, in order
    top = shares.head(10)["task"].tolist()
    assert [line.get_label().rsplit(" (", 1)[0] for line in coloured] == [t[:59] + "…" if len(t) > 60 else t
                                                                            for t in top]


def test_convergence_ticks_are_integers_on_a_short_log(tmp_path):
    """A few measurements per task: a linear axis, and no tick between two measurements (1, 1.5, 2, ...)."""
    lines = [x for x in SHIPPED.read_text().splitlines() if x.strip()][:6] if SHIPPED.exists() else []
    if not lines:
        pytest.skip("the shipped log is not in this tree")
    (tmp_path / "short.jsonl").write_text("\n".join(lines) + "\n")
    df = load_logs(tmp_path / "short.jsonl")
    fig = convergence_figure(df, latency_shares(summarize(df)))
    ax = fig.axes[0]
    fig.canvas.draw()
    assert ax.get_xscale() == "linear"
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks


# ------------------------------------------------------------------------------ --artifact without a profile

@pytest.fixture
def compiled(conv3x3_onnx, device, tmp_path, monkeypatch):
    """A one-convolution model compiled for the test device (attached), and a cache of the test's own."""
    import tuner
    monkeypatch.setenv("TUNER_CACHE_DIR", str(tmp_path / "cache"))
    mod = tuner.compile_model(conv3x3_onnx(8), device=device)
    return Path(mod.save(tmp_path / "art"))


def _tree(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): (p.stat().st_mode, p.read_bytes()) for p in sorted(d.rglob("*"))
            if p.is_file()}


def test_report_profiles_an_artifact_without_a_profile_when_its_device_is_attached(compiled, small_log, tmp_path,
                                                                                     capsys):
    before = _tree(compiled)
    out = tmp_path / "r.html"
    assert main(["report", str(small_log), "--artifact", str(compiled), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"profiled {re.escape(str(compiled))} on .* now", err), err
    text = out.read_text()
    assert "Compiled model: per-layer latency" in text and "<td>conv</td>" in text
    assert len(_images(text)) == 5
    assert _tree(compiled) == before  # nothing written into the artifact
    # the profile was kept (the user's cache): the next report reads it, measuring nothing
    assert main(["report", str(small_log), "--artifact", str(compiled), "-o", str(out)]) == 0
    assert "per-layer profile from" in capsys.readouterr().err


def test_report_names_the_command_when_the_artifact_has_no_profile_and_its_device_is_absent(
        compiled, small_log, tmp_path, capsys, monkeypatch):
    import tuner.analysis.report as report
    monkeypatch.setattr(report, "_attached", lambda fingerprint: None)  # as on a host without that device
    assert main(["report", str(small_log), "--artifact", str(compiled), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "which is not attached here" in err and f"`tuner run {compiled} --profile`" in err
    assert not (tmp_path / "r.html").exists()
