"""The README's Python examples (and docs/templates.md's and docs/tuning.md's) run as written (on the default
device)."""
import re
from pathlib import Path


def test_readme_kernel_example_runs(capsys):
    text = (Path(__file__).parent.parent / "docs" / "templates.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "build(b.kernel(" in b]
    exec(compile(example, "README.md", "exec"), {})
    assert "read_imagef(X, sampler" in capsys.readouterr().out


def test_readme_template_example_runs(capsys):
    text = (Path(__file__).parent.parent / "docs" / "templates.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "get_template(" in b]
    exec(compile(example, "README.md", "exec"), {})
    assert int(capsys.readouterr().out.split()[0]) > 100


def test_readme_model_example_runs(capsys):
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "compile_model(" in b]
    exec(compile(example, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("(1, 10)") and "planned" in out


def test_tuning_docs_pandas_example_runs_on_the_shipped_log(capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parent.parent)  # the example names logs/ relative to the repository
    text = (Path(__file__).parent.parent / "docs" / "tuning.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "load_logs(" in b]
    exec(compile(example, "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) >= 5 and "gain" in "".join(lines)
