"""The README opens with the two commands and reads in one screen; its Python examples and
those of every page under docs/ run as written."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: (id, code) of every ```python block: "README.md block 0", "docs/oracle.md block 0", ...
BLOCKS = [(f"{page.relative_to(ROOT).as_posix()} block {i}", code)
          for page in PAGES
          for i, code in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))]
#: The most lines the README may have (issue 24: a README that reads in one screen).
MAX_README_LINES = 110


def test_pages_have_examples():
    """The trainer recipe in the README, the call in docs/adopting.md and the oracle's fields in
    docs/oracle.md are examples; a regex that stopped finding them would test nothing."""
    pages = {name.rsplit(" block ", 1)[0] for name, _ in BLOCKS}
    assert {"README.md", "docs/adopting.md", "docs/oracle.md"} <= pages, pages


@pytest.mark.parametrize("name, code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_example_runs(name, code):
    exec(compile(code, name, "exec"), {})


def test_readme_opens_with_the_two_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# ") and lines[1] == "" and lines[2] == "```bash", lines[:3]
    first = re.search(r"```bash\n(.*?)```", text, flags=re.S).group(1).splitlines()
    assert len(first) == 2, first
    assert "pip install" in first[0] and "gdpo" in first[0]
    assert first[1].startswith("python3 -m pytest")
    ci = (README.parent / ".ci" / "run").read_text()
    assert first[1].split("#")[0].strip() in ci, ".ci/run must run exactly the README's test command"
    after = text[text.index("```", text.index("```bash") + 3) + 3:].lstrip("\n").splitlines()[0]
    assert re.fullmatch(r"The tests take about \d+ minutes on 2 cores\.", after), after


def test_readme_fits_one_screen():
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move detail to docs/"


def test_oracle_example_says_verl_needs_token_counts():
    """The oracle example lists its conventions; "verl" whitens per token and raises
    ShapeError without token_counts, so the example says so where it names it, and the
    example runs under "verl" once token_counts are passed."""
    name, block = next((n, b) for n, b in BLOCKS if "gdpo.gdpo_advantages(" in b and 'convention="spec"' in b)
    line = next(ln for ln in block.splitlines() if '"verl"' in ln)
    assert "token_counts" in line, (name, line)
    from spec import ShapeError

    with pytest.raises(ShapeError, match="token_counts is required"):
        exec(compile(block.replace('convention="spec",', 'convention="verl",'), f"{name} verl", "exec"), {})
    exec(compile(block.replace('convention="spec",', 'convention="verl", token_counts=[3, 1, 2, 4],'),
                 f"{name} verl", "exec"), {})
