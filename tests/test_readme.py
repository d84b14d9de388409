"""The README's Python example runs as written (on the default device)."""
import re
from pathlib import Path


def test_readme_kernel_example_runs(capsys):
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "build(b.kernel(" in b]
    exec(compile(example, "README.md", "exec"), {})
    assert "read_imagef(X, sampler" in capsys.readouterr().out


def test_readme_template_example_runs(capsys):
    text = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "get_template(" in b]
    exec(compile(example, "README.md", "exec"), {})
    assert int(capsys.readouterr().out.split()[0]) > 100
