"""spec/generated/known_limits.md is generated, and stays true: a fresh fast run must agree with it.

The fast subset (``python -m gdpo_tools.limits --fast``) regenerates a subset of
the committed rows cell for cell (a row depends only on its own case and the
seed), and every documented limit must still reproduce, so a fix that removes a
limit fails here until the table and the entry are regenerated with it.
"""

from __future__ import annotations

import dataclasses

import os
import re
import sys

import pytest

from gdpo_tools.limits import generate as limits
from gdpo_tools.limits import tables as T
from gdpo_tools.limits.tables import Table

sys.path.insert(0, os.path.dirname(__file__))
import _once  # noqa: E402

REGENERATE = ("regenerate with `python -m gdpo_tools.limits` (about a minute at most here) and commit "
              "spec/generated/known_limits.md together with spec/generated/limits/*.png")


def _committed() -> str:
    if not limits.DEFAULT_OUT.exists():
        pytest.fail(f"{limits.DEFAULT_OUT} is missing: {REGENERATE}")
    return limits.DEFAULT_OUT.read_text()


def _committed_seed(text: str) -> int:
    m = re.search(r"^Seed: (\d+)\.", text, flags=re.M)
    assert m, f"no 'Seed: N.' line in {limits.DEFAULT_OUT}: {REGENERATE}"
    return int(m.group(1))


# ------------------------------------------------ reading the file back (the up-to-date check)

_TABLE_MARK = re.compile(r"<!-- table:(?P<id>[\w-]+) keys=(?P<keys>\d+) -->")


def _parse_tables(text: str) -> dict[str, dict]:
    """Tables of a rendered file outside the environment block: id -> {"head", "rows": {key: {col: cell}}}."""
    text = _strip_environment(text)
    out: dict[str, dict] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _TABLE_MARK.match(line.strip())
        if not m:
            continue
        keys = int(m.group("keys"))
        head = _cells(lines[i + 1])
        rows = {}
        for row_line in lines[i + 3:]:
            if not row_line.startswith("|"):
                break
            cells = _cells(row_line)
            rows[tuple(cells[:keys])] = dict(zip(head, cells))
        out[m.group("id")] = {"head": head, "rows": rows}
    return out


def _strip_environment(text: str) -> str:
    return re.sub(re.escape(limits.ENV_BEGIN) + r".*?" + re.escape(limits.ENV_END), "", text, flags=re.S)


def _cells(line: str) -> list[str]:
    body = line.strip()[1:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def _compare(committed: str, regenerated: str) -> list[str]:
    """Every cell of ``regenerated`` must read the same in ``committed``; returns the differences."""
    old, new = _parse_tables(committed), _parse_tables(regenerated)
    problems = []
    for tid, table in new.items():
        if tid not in old:
            problems.append(f"table {tid!r} is missing from the committed file")
            continue
        if old[tid]["head"] != table["head"]:
            problems.append(f"table {tid!r}: columns {old[tid]['head']} committed, {table['head']} now")
            continue
        for key, cells in table["rows"].items():
            if key not in old[tid]["rows"]:
                problems.append(f"table {tid!r}, row {' / '.join(key)} is missing from the committed file")
                continue
            for col, cell in cells.items():
                was = old[tid]["rows"][key].get(col)
                if was != cell:
                    problems.append(f"table {tid!r}, row {' / '.join(key)}, column {col!r}: committed {was!r}, "
                                    f"measured now {cell!r}")
    return problems


@pytest.mark.slow  # the wheel's `gdpo limits --fast` run: the slow tier, with tests/test_installed_wheel.py
def test_committed_tables_agree_with_a_fresh_fast_run_and_every_limit_reproduces(tmp_path_factory):
    # the fast run is `gdpo limits --fast --out tables` of this checkout's wheel, made once per test run
    # for this test and tests/test_installed_wheel.py (the same code: a minute spent once)
    ran = _once.wheel_limits(tmp_path_factory)
    fresh = ran / "work" / "tables" / "known_limits.md"
    assert fresh.exists(), (f"`gdpo limits --fast` failed (exit {(ran / 'returncode').read_text()}):\n"
                            f"{(ran / 'stderr').read_text()[-3000:]}")
    text = fresh.read_text()
    assert _committed_seed(text) == _committed_seed(_committed()), "the fast run used another seed than the file"
    problems = _compare(_committed(), text)
    shown = "\n  ".join(problems[:25]) + (f"\n  ... and {len(problems) - 25} more" if len(problems) > 25 else "")
    stale = [f"{row['id']}: {row['limit']} -- measured now: {row['measured']}"
             for row in _parse_tables(text)["limits"]["rows"].values() if row["still reproduces"] != "yes"]
    message = []
    if stale:
        message.append("documented limits that no longer reproduce (a fix landed? then rewrite or delete the "
                       "entry in LIMITS, gdpo_tools/limits/generate.py):\n  " + "\n  ".join(stale))
    if problems:
        message.append(f"spec/generated/known_limits.md is stale ({len(problems)} cells differ):\n  {shown}")
    assert not message, "\n".join(message) + "\n" + REGENERATE


def test_committed_file_documents_exactly_the_current_limits_as_reproducing():
    rows = _parse_tables(_committed())["limits"]["rows"]
    committed = {key[0]: row["still reproduces"] for key, row in rows.items()}
    assert set(committed) == {lim.id for lim in limits.LIMITS}, f"limit ids differ from LIMITS: {REGENERATE}"
    assert all(v == "yes" for v in committed.values()), f"a committed limit is marked stale: {committed}"


def test_committed_plots_are_pngs():
    text = _committed()
    for name in ("cancellation.png", "eps.png", "variance.png"):
        assert f"(limits/{name})" in text, f"{name} is not linked from spec/generated/known_limits.md: {REGENERATE}"
        path = limits.DEFAULT_OUT.parent / "limits" / name
        assert path.exists() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{path} missing: {REGENERATE}"


def test_every_table_states_its_cases_and_rerun_command():
    text = _strip_environment(_committed())
    for section in re.split(r"\n(?=### )", text)[1:]:
        if "<!-- table:" not in section:
            continue
        assert "Rerun: `python -m gdpo_tools.limits" in section, section[:80]
    assert text.count("Cases:") >= 8


# ------------------------------------------------------------ the checker itself


_DOC = """Seed: 0.

{env_begin}
| generated | {stamp} |
{env_end}

<!-- table:demo keys=2 -->
| C | unit | err |
|---|---|---|
| 1e+03 | own | 1.2 |
| 1e+09 | own | 3.4e-05 |
"""


def _doc(stamp="today", err="1.2") -> str:
    return _DOC.format(env_begin=limits.ENV_BEGIN, env_end=limits.ENV_END, stamp=stamp).replace("| 1.2 |", f"| {err} |")


def test_checker_ignores_the_environment_block():
    assert _compare(_doc(stamp="yesterday"), _doc(stamp="today")) == []


def test_checker_reports_a_changed_cell_and_a_missing_row():
    assert _compare(_doc(err="1.2"), _doc(err="1.3")) == [
        "table 'demo', row 1e+03 / own, column 'err': committed '1.2', measured now '1.3'"]
    fewer = _doc().replace("| 1e+09 | own | 3.4e-05 |\n", "")
    assert _compare(fewer, _doc()) == ["table 'demo', row 1e+09 / own is missing from the committed file"]
    assert _compare(fewer.replace("table:demo", "table:other"), _doc())[0].startswith("table 'demo' is missing")


def test_a_limit_that_stops_reproducing_is_marked_stale():
    tables, variance = T.build_variance(True, 0, limits.Progress(enabled=False))
    assert {lim.id: ok for lim, ok, _ in limits.check_limits({"variance": variance})}["one-pass-float32"] is True
    fixed = dict(variance[(1e3, "float32", "one-pass")], var=1.6e-4)  # as if one-pass were suddenly accurate
    facts = {"variance": {**variance, (1e3, "float32", "one-pass"): fixed}}
    results = limits.check_limits(facts)
    assert {lim.id: ok for lim, ok, _ in results}["one-pass-float32"] is False
    assert "**NO: stale" in limits.render_table(limits.limits_table(results))


def test_a_limit_whose_case_did_not_run_is_stale_not_an_exception():
    results = limits.check_limits({})
    assert results and not any(ok for _, ok, _ in results)
    assert all(measured.startswith("not measured") for _, _, measured in results)


def test_rendered_tables_round_trip():
    t = Table("x", "X", "intro", ["a", "b|c"], [["1", "p|q"]], keys=1)
    parsed = _parse_tables(limits.render_table(t))
    assert parsed["x"]["rows"][("1",)] == {"a": "1", "b|c": "p|q"}


def test_only_prints_one_group(capsys):
    assert limits.main(["--only", "pairs", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "<!-- table:ng2 keys=1 -->" in out and "<!-- table:correlation keys=1 -->" in out
    assert "table:cancellation" not in out


def test_what_it_means_for_training_is_generated_and_classifies_by_the_real_ranges():
    """Issue 19: the page opens with which limits a realistic batch can reach, computed from where
    each entry's case starts against the ranges of real rewards (spec/generated/known_limits.md)."""
    text = _committed()
    assert text.index("## What this means for your training") < text.index("## Documented limits")
    rows = _parse_tables(text)["training"]["rows"]
    assert {key[0] if isinstance(key, tuple) else key for key in rows} == {lim.id for lim in limits.LIMITS}
    lim = limits.LIMITS[0]
    inside = dataclasses.replace(lim, reach=("magnitude", limits.REAL_MAX_REWARD))
    beyond = dataclasses.replace(lim, reach=("magnitude", limits.REAL_MAX_REWARD * 2))
    tiny = dataclasses.replace(lim, reach=("std", limits.REAL_MIN_STD / 2))
    assert [limits.reach_verdict(x)[2] for x in (inside, beyond, tiny)] == ["real", "constructed", "constructed"]
