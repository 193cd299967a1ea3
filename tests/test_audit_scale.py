"""`gdpo audit` beyond EXACT_SAMPLES (issue 19): impl.gdpo's float64 values settle each group and
the oracle runs where a finding needs it. Both methods must report the same findings on the
same batch, the scaled one must still catch a wrong implementation, and the JSON report
follows its documented schema."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gdpo_tools import audit, cli
from gdpo_tools.audit import run


def _batch(groups: int = 120, seed: int = 3) -> audit.Batch:
    """Run-shaped groups, and one group of each kind a finding names, some far into the batch."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(groups):
        n = 8
        block = np.stack([(rng.random(n) < 0.5), np.round(rng.lognormal(5, 0.7, n)), rng.random(n) < 0.9], 1)
        rows.append(block.astype(np.float64))
    C, d = 1e12, np.array([0.1, 0.2, 0.3, 0.7])
    special = [
        np.stack([C - d, C - (C - d), np.zeros(4)], 1),  # exact cancellation (weights 1, 1)
        np.stack([C - d, d, np.ones(4)], 1),  # near-cancellation: ill-conditioned
        np.array([[0.0, 1.0, 1.0], [0.0, 1.00001, 1.0], [1.0, 1.00002, 0.0], [1.0, 1.00003, 1.0]]),  # eps-dominated
        np.array([[0.0, 3.0, 1.0], [1.0, 9.0, 1.0]]),  # n_g = 2
        np.array([[1e39, 0.0, 1.0], [-1e39, 1.0, 0.0], [0.0, 2.0, 1.0]]),  # beyond float32
        np.ones((4, 3)),  # no signal
    ]
    for j, block in enumerate(special):
        rows.insert(7 + 17 * j, block)
    r = np.vstack(rows)
    sizes = [b.shape[0] for b in rows]
    group = np.repeat(np.arange(len(rows)) * 3 + 5, sizes)  # labels that are not 0..G-1
    return audit.Batch(r, group.astype(np.int64), None, None, ["correct", "length", "format"], "drawn")


def _codes(report) -> dict:
    return {g["group"]: sorted(f["code"] for f in g["findings"]) for g in report["groups"]}


def test_the_scaled_method_reports_what_the_exact_one_does(monkeypatch):
    monkeypatch.setattr(run, "SAMPLED_GROUPS", 20)  # the batch has 126 groups
    batch = _batch()
    exact = audit.audit(batch, exact=True, peers=False)
    scaled = audit.audit(batch, exact=False, peers=False)
    assert exact["method"]["exact"] and not scaled["method"]["exact"]
    assert scaled["method"]["groups_checked_by_oracle"] < exact["method"]["groups_checked_by_oracle"]
    assert _codes(scaled) == _codes(exact)
    assert scaled["counts"] == exact["counts"] and scaled["status"] == exact["status"] == audit.WARN
    for code in ("exact-cancellation", "ill-conditioned", "eps-dominated", "two-samples", "float32-range",
                 "no-signal", "collapsed-column"):
        assert exact["counts"].get(code), code  # the batch exercises every group finding
    assert scaled["impl_vs_oracle"]["max_error_over_bound"] <= 1.0


def test_the_scaled_method_still_catches_a_wrong_implementation(monkeypatch):
    """Negative control: impl.gdpo 0.1% off in Eq. 4 + 7 is caught on the sampled groups."""
    from impl import gdpo as impl

    monkeypatch.setattr(run, "SAMPLED_GROUPS", 20)
    real = impl.normalize_rewards
    monkeypatch.setattr(impl, "normalize_rewards", lambda *a, **k: real(*a, **k) * 1.001)
    report = audit.audit(_batch(), exact=False, peers=False)
    assert report["status"] == audit.DISAGREE and report["counts"]["impl-disagrees"] > 0


def test_the_scaled_method_is_chosen_beyond_exact_samples(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(run, "EXACT_SAMPLES", 100)
    p = tmp_path / "b.npz"
    b = _batch(groups=30)
    np.savez(p, rewards=b.rewards, group_ids=b.group_ids)
    assert cli.main(["audit", str(p)]) == audit.WARN
    out = capsys.readouterr().out
    assert "checked with: impl.gdpo's float64 values for every group; the exact oracle on" in out
    assert "peer conventions: not computed" in out
    assert cli.main(["audit", str(p), "--peers", "--json"]) == audit.WARN
    report = json.loads(capsys.readouterr().out)
    assert report["method"]["peers"] == "float formulas" and set(report["peers"]) == {
        "trl", "verl", "nemo_rl", "nvlabs", "ms_swift", "multireward_grpo"}


def _check_schema(report: dict) -> None:
    """The schema documented in docs/audit.md, key by key."""
    top = {"schema", "source", "samples", "groups_total", "units_total", "components", "weights", "eps", "missing",
           "unscored_rewards", "rows_without_score", "method",
           "counts", "groups_without_signal", "groups_with_warnings", "groups_with_routine_findings_only",
           "groups_listed", "groups", "units", "peers", "impl_vs_oracle",
           "status", "status_text"}
    assert set(report) == top, set(report) ^ top
    assert report["schema"] == audit.SCHEMA
    assert set(report["method"]) == {"exact", "groups_checked_by_oracle", "units_checked_by_oracle", "peers", "text"}
    for g in report["groups"]:
        assert set(g) == {"group", "size", "signal", "findings", "max_cond_combined", "max_cond_combined_sharp",
                          "cond_from", "impl_error_over_bound"}
        for f in g["findings"] + [f for u in report["units"] for f in u["findings"]]:
            assert {"code", "severity", "message", "advice"} <= set(f) and f["code"] in audit.KINDS
            assert f["severity"] == audit.KINDS[f["code"]].severity
    for u in report["units"]:
        assert set(u) == {"unit", "size", "collapsed", "findings", "max_cond", "max_cond_sharp",
                          "impl_error_over_bound"}
    if report["groups_listed"] == "all":
        assert sum(report["counts"].values()) == sum(len(g["findings"]) for g in report["groups"] + report["units"])
    for p in report["peers"].values():
        assert set(p) == {"why", "note", "method", "max_abs_difference"}


def test_the_json_report_follows_its_documented_schema(tmp_path, capsys):
    doc = (Path(__file__).resolve().parents[1] / "docs" / "audit.md").read_text()
    for code in audit.KINDS:
        assert f"`{code}`" in doc, f"finding {code} is not documented in docs/audit.md"
    assert cli.main(["audit", "--json"]) == audit.WARN
    _check_schema(json.loads(capsys.readouterr().out))
    p = tmp_path / "b.npz"
    b = _batch(groups=20)
    np.savez(p, rewards=b.rewards, group_ids=b.group_ids)
    assert cli.main(["audit", str(p), "--json"]) == audit.WARN
    _check_schema(json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("text, cls", [("group,a\n0,1\n0,x\n", "AuditDtypeError"),
                                       ("group,a\n0,1\n1,2\n", "GroupError")])
def test_malformed_input_gives_a_json_error_object_with_the_same_exit_code(tmp_path, capsys, text, cls):
    p = tmp_path / "bad.csv"
    p.write_text(text)
    assert cli.main(["audit", str(p), "--json"]) == audit.NOT_AUDITED
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["status"] == audit.NOT_AUDITED and report["error"]["code"] == "malformed-input"
    assert report["error"]["class"] == cls and report["error"]["message"].startswith(str(p))
    assert "gdpo audit:" in captured.err  # the text too, for a person reading the log


def test_progress_says_what_is_left(capsys):
    bar = run.Progress(True)
    bar.start("reading x")
    bar.stage_t0 -= 10  # ten seconds into the stage, a quarter done
    bar.update(0.25, force=True)
    err = capsys.readouterr().err
    assert "[audit] reading x: 25%" in err and "about 30 s left" in err


def test_text_reader_reads_in_chunks_the_same_batch(tmp_path, monkeypatch):
    """Chunk boundaries change nothing (rows, labels, the row a refusal names)."""
    from gdpo_tools.audit import read

    b = _batch(groups=10)
    p = tmp_path / "b.csv"
    p.write_text("group,a,b,c\n" + "".join(f"{g},{r[0]!r},{r[1]!r},{r[2]!r}\n" for g, r in zip(b.group_ids, b.rewards.tolist())))
    whole = audit.read_batch(p)
    monkeypatch.setattr(read, "CHUNK_ROWS", 7)
    parts = audit.read_batch(p)
    assert np.array_equal(whole.rewards, parts.rewards) and np.array_equal(whole.group_ids, parts.group_ids)
    assert np.array_equal(whole.rewards, b.rewards)
    lines = p.read_text().splitlines()
    lines[30] = lines[30].split(",")[0] + ",x,1,1"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(audit.AuditInputError, match=r"line 31, column 'a': 'x' is not a number"):
        audit.read_batch(p)


def test_chunks_of_whole_units_give_the_same_report(monkeypatch):
    """impl.gdpo runs on chunks of whole units (bounded memory); the chunking changes no bit."""
    b = _batch(groups=60)
    first = np.r_[True, b.group_ids[1:] != b.group_ids[:-1]]
    b.unit_ids = (np.cumsum(first) - 1) // 7  # units of 7 whole groups
    one = audit.audit(b, exact=False, peers=False)
    monkeypatch.setattr(run, "CHUNK_SAMPLES", 50)
    captured = {}
    real = run._impl_values

    def spy(*args, **kw):
        captured["out"] = real(*args, **kw)
        return captured["out"]

    monkeypatch.setattr(run, "_impl_values", spy)
    many = audit.audit(b, exact=False, peers=False)
    assert many == one
    monkeypatch.setattr(run, "CHUNK_SAMPLES", 10 ** 9)
    whole = real(b, run._Groups(b.rewards, b.group_ids), np.argsort(b.unit_ids, kind="stable"),
                 np.unique(b.unit_ids, return_inverse=True)[1], np.unique(b.unit_ids, return_counts=True)[1],
                 np.ones(3), 1e-4, run.Progress(False))
    for x, y in zip(captured["out"], whole):
        assert np.array_equal(x, y)


def test_beyond_list_every_group_routine_groups_are_counted_not_listed(monkeypatch):
    monkeypatch.setattr(run, "LIST_EVERY_GROUP", 10)
    monkeypatch.setattr(run, "SAMPLED_GROUPS", 20)
    full = audit.audit(_batch(), exact=False, peers=False)
    assert full["groups_listed"] == "with warnings" and len(full["groups"]) == full["groups_with_warnings"]
    assert all(any(f["severity"] != "routine" for f in g["findings"]) for g in full["groups"])
    assert full["counts"]["collapsed-column"] > sum(1 for g in full["groups"] for f in g["findings"]
                                                    if f["code"] == "collapsed-column")
    _check_schema(full)


def _reading_peak(path) -> tuple[int, audit.Batch | Exception]:
    """Peak bytes Python allocates while reading ``path`` (tracemalloc), and the batch or the refusal."""
    import tracemalloc

    tracemalloc.start()
    try:
        got = audit.read_batch(path)
    except audit.AuditInputError as e:
        got = e
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak, got


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_memory_follows_the_rows_not_the_bytes(tmp_path, fmt):
    """Issue 45: reading held a chunk of 65,536 lines whatever their length. The same 20,000 rows
    with 1 KB more per line (a completion's text in .jsonl, digits in .csv) peak within 2x of the
    plain file (measured: 0.99x and 1.15x; before this test: 3.7x and 3.5x)."""
    b = _batch(groups=2500)  # 20,000 rows and the special groups
    rows = zip(b.group_ids.tolist(), b.rewards.tolist())
    plain, padded = tmp_path / f"plain.{fmt}", tmp_path / f"padded.{fmt}"
    if fmt == "jsonl":
        recs = [{"group": g, "rewards": r} for g, r in rows]
        plain.write_text("".join(json.dumps(x) + "\n" for x in recs))
        padded.write_text("".join(json.dumps({**x, "completion": "x" * 1000}) + "\n" for x in recs))
    else:
        lines = [(g, [repr(v) for v in r]) for g, r in rows]
        plain.write_text("group,a,b,c\n" + "".join(f"{g},{','.join(c)}\n" for g, c in lines))
        padded.write_text("group,a,b,c\n" + "".join(f"{g},{c[0]},{c[1]},{c[2] + ' ' * 1000}\n" for g, c in lines))
    assert padded.stat().st_size > 10 * plain.stat().st_size
    (small, a), (big, c) = _reading_peak(plain), _reading_peak(padded)
    assert np.array_equal(a.rewards, c.rewards) and np.array_equal(a.rewards, b.rewards)
    assert big <= 2 * small, f"{fmt}: reading peaked at {big / 1e6:.1f} MB, the plain file at {small / 1e6:.1f} MB"


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_file_without_line_breaks_is_refused_at_the_line_limit(tmp_path, fmt):
    """Issue 45: a .jsonl linked to /dev/zero grew to 2.5 GB, then raised MemoryError (exit 1)."""
    from gdpo_tools.audit import read

    p = tmp_path / f"zero.{fmt}"
    p.symlink_to("/dev/zero")
    peak, refused = _reading_peak(p)
    assert str(refused) == (f"{p}: line 1 is longer than 1,048,576 characters, the limit of a line (one sample a "
                            "line); is it the batch's text file?") and read.MAX_LINE == 1 << 20
    assert peak < 8 * read.MAX_LINE, peak
