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


def test_oracle_example_says_verl_needs_token_counts():
    """The oracle example lists its conventions; "verl" whitens per token and raises
    ShapeError without token_counts, so the README says so where it names it, and the
    example runs under "verl" once token_counts are passed."""
    block = next(b for b in BLOCKS if "gdpo.gdpo_advantages(" in b and 'convention="spec"' in b)
    line = next(ln for ln in block.splitlines() if '"verl"' in ln)
    assert "token_counts" in line, line
    from spec import ShapeError

    with pytest.raises(ShapeError, match="token_counts is required"):
        exec(compile(block.replace('convention="spec",', 'convention="verl",'), "README.md verl", "exec"), {})
    exec(compile(block.replace('convention="spec",', 'convention="verl", token_counts=[3, 1, 2, 4],'),
                 "README.md verl", "exec"), {})
