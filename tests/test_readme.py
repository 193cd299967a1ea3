"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i):
    exec(compile(BLOCKS[i], f"README.md block {i}", "exec"), {})


def test_readme_opens_with_the_two_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert "pip install" in first[0] and "gdpo" in first[0]
    assert first[1].startswith("python3 -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert first[1].split("#")[0].strip() in ci, ".ci/run must run exactly the README's test command"
