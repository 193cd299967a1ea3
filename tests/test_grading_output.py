"""What ``gdpo check`` says (conformance/grading.py): the verdict line, the probes' statement, the
findings with one example and one replay line each, the table, the JSON, the exit codes."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import _once
from conformance import grading
from conformance.subject import Subject

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _grade(target: str, shape: str = "trl", select: str | None = None, domain=None) -> grading.Grading:
    return grading.grade(Subject(target, shape, "spec", domain=domain), select=select)


def test_a_conforming_grading_says_so_and_its_json_records_the_cases(tmp_path_factory):
    proc, data = _once.default_check(tmp_path_factory)
    assert proc.returncode == grading.EXIT_OK, proc.stdout + proc.stderr
    assert data["schema"] == grading.JSON_SCHEMA and data["findings"] == [] and data["exit_status"] == 0
    assert data["precision"] == "float64" and data["probes"]["formula"] is None, data["probes"]
    assert data["verdict"].endswith("conforms: no finding on the 1 properties graded"), data["verdict"]
    row = next(r for r in data["properties"] if r["name"] == "plain")
    assert row["verdict"] == "passed" and row["cases"] >= 25 and len(row["digest"]) == 16, row
    assert all(r["verdict"] == "skipped" for r in data["properties"] if r["name"] != "plain")


def test_a_wrong_implementation_fails_with_a_finding_its_example_and_replay_line(tmp_path):
    """0.1% off everywhere: one formula finding, whose replay line fails alike (exit 1)."""
    (tmp_path / "off_gdpo.py").write_text(
        "from impl import gdpo\n"
        "def advantages(*args, **kwargs):\n"
        "    return gdpo.gdpo_advantages(*args, **kwargs) * 1.001\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "off_gdpo:advantages", "-k",
                           "plain", "--json", str(out), "--details"], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert proc.returncode == grading.EXIT_FINDINGS, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    [f] = data["findings"]
    assert f["category"] == "formula" and f["regime"] == "ordinary magnitudes" and f["properties"] == ["plain"], f
    assert "--- finding 1: formula differs from the paper ---" in proc.stdout  # --details: the full text
    replay = subprocess.run(shlex.split(f["repro"]), capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert replay.returncode == 1 and "[formula differs from the paper]" in replay.stdout, replay.stdout + replay.stderr


def test_the_graded_codes_overflow_warnings_are_findings_not_noise():
    """NumPy float32 code overflows on the extreme cases and warns at every one; gdpo check printed
    those RuntimeWarnings (128 lines on stderr for the whole grading). The findings say what
    overflowed; the warnings are not printed."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        g = _grade("paper_impls:correct_numpy_f32", select="range")
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []
    assert {f.category for f in g.findings} >= {"non_finite"}, g.findings


def test_the_graded_codes_user_warnings_are_not_printed():
    """torch warns "std(): degrees of freedom is <= 0" where a textbook code meets a group of one
    sample; gdpo check printed it above its report. The finding says the input was accepted."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        g = _grade("paper_impls:no_eq6_clip3", select="errors")
    assert [str(w.message) for w in seen if issubclass(w.category, UserWarning)] == []
    assert any("groups of one sample" in f.headline() for f in g.findings), [f.headline() for f in g.findings]


def test_a_replay_line_too_long_for_the_first_screen_is_left_to_details():
    """float32 code overflows at Eq. 4's sum only on a group of many rows: its replay line holds the
    whole case (over 2,000 characters). The first screen points to --details, which prints it."""
    g = _grade("paper_impls:correct_f32", select="large")
    [f] = [f for f in g.findings if len(f.repro) > grading.REPLAY_COLUMNS]
    screen = grading.render(g)
    assert max(len(line) for line in screen.splitlines()) <= grading.REPLAY_COLUMNS
    assert f"replay: too long for this screen ({len(f.repro):,} characters)" in screen, screen
    assert f.repro in grading.render(g, details=True)


def test_the_graders_own_error_is_no_verdict(monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("a bug of the grader")

    monkeypatch.setattr(grading, "grade", broken)
    assert grading.main("impl.gdpo:gdpo_advantages", None, None) == grading.EXIT_GRADER
    err = capsys.readouterr().err
    assert "the grader itself failed (this is not a verdict on the implementation" in err and "a bug of the grader" in err


def test_a_permitted_refusal_of_another_class_is_a_note_not_a_failure():
    """A float64 code that refuses a reward beyond float32's range with a ValueError, graded through
    the trl shape with float64 rewards declared: the contract permits that refusal (OutOfRangeError
    is its class), so the row passes, noting the class; no threshold is invented for it."""
    g = _grade("paper_impls:refuses_beyond_f32", select="range", domain={"input_dtypes": ("float64",)})
    row = next(r for r in g.rows if r.name == "range")
    assert row.verdict == "passed" and any("ValueError" in n for n in row.notes), row
    assert g.findings == []
    text = grading.render(g)  # the note said once, under the table; each row's notes in the JSON
    assert text.count(row.notes[0]) == 1 and f"{row.notes[0]}, in 1 row(s): range" in text, text
    assert list(next(r for r in grading.as_json(g)["properties"] if r["name"] == "range")["notes"]) == list(row.notes)


def test_a_note_is_said_once_under_the_table_naming_its_rows():
    """Every error row of a code refusing with ValueError repeated the same note (33 rows of one
    grading), drowning the rows that matter: the note is one line naming its rows."""
    note = "refused with ValueError, not the spec.errors class (such a refusal passes; fails under --strict-errors)"
    rows = [grading.Row("plain", "failed", cases=30, failed=2, categories=("refused",), notes=(note,)),
            grading.Row("rounding", "failed", cases=28, failed=1, categories=("precision",))]
    rows += [grading.Row(f"errors:case_{i}", "passed", cases=25, notes=(note,)) for i in range(30)]
    lines = grading.table(types.SimpleNamespace(rows=rows))
    assert sum(note in ln for ln in lines) == 1, lines
    at = next(i for i, ln in enumerate(lines) if ln.startswith(note))
    assert lines[at] == f"{note}, in 31 row(s): plain; all 30 errors:* rows", lines
    assert any(ln.startswith("passed (30): errors:case_0") for ln in lines), lines
    rows.append(grading.Row("errors:other", "passed", cases=25))  # not every error row: each named
    lines = grading.table(types.SimpleNamespace(rows=rows))
    at = next(i for i, ln in enumerate(lines) if ln.startswith(note))
    assert lines[at] == f"{note}, in 31 row(s):", lines
    said = lines[at + 1]
    assert said.startswith("  plain; errors: case_0, case_1, case_2") and len(said) <= grading.SCREEN_COLUMNS, said
    assert said.endswith("... (--json: each row's notes)"), said  # 30 names do not fit: clipped at a name
    assert next(ln for ln in lines if ln.startswith("plain ")).rstrip().endswith("refused"), lines


def test_no_table_header_over_nothing():
    """Where every row passed, the header of the failed rows stood over no row."""
    rows = [grading.Row("plain", "passed", cases=30), grading.Row("rounding", "passed", cases=28)]
    assert grading.table(types.SimpleNamespace(rows=rows)) == ["passed (2): plain, rounding"]
    rows.append(grading.Row("offsets", "failed", cases=30, failed=1, categories=("precision",)))
    assert grading.table(types.SimpleNamespace(rows=rows))[0].startswith("property ")


def test_a_row_stops_at_its_first_hang():
    """Rank 1 raises while rank 0 waits in all_reduce: every case of a multi-process row hangs,
    and each hang costs the grace, the kill and a restart of the pool of ranks (a float64 code of
    this kind took 18 minutes to grade). The row stops at its first hang: one protocol finding
    that says so, the other cases counted as not checked, on the screen and in the JSON."""
    g = _grade("_native_impls:rank1_raises_alone", "gdpo", select="dist_values_2")  # (a module the ranks import)
    row = next(r for r in g.rows if r.name == "dist_values_2")
    assert row.verdict == "failed" and row.failed == 1 and row.unchecked == row.cases - 1 >= 25, row
    [f] = g.findings
    assert f.category == "protocol" and "did not return within the deadline" in f.detail, f.detail
    assert f"the ranks hung: the last {row.unchecked} case(s) not checked" in grading.render(g)
    assert next(r for r in grading.as_json(g)["properties"] if r["name"] == "dist_values_2")["unchecked"] == row.unchecked


def test_a_clear_refusal_of_another_class_on_every_rank_passes_with_a_note(monkeypatch):
    """Every rank raising the same ValueError together, naming the offending rank, is the
    distributed contract kept but for its class: it passes, noted as on one process (heldout5's
    correct code failed every dist_errors case "breaks the protocol"); --strict-errors fails it."""
    g = _grade("_native_impls:impl_plain_value_errors", "gdpo", select="dist_errors_2")
    [row] = [r for r in g.rows if r.name == "dist_errors_2"]
    assert row.verdict == "passed" and any("refused with ValueError" in n for n in row.notes), (row, g.findings)
    monkeypatch.setenv("GDPO_STRICT_ERRORS", "1")
    g = _grade("_native_impls:impl_plain_value_errors", "gdpo", select="dist_errors_2")
    assert {f.category for f in g.findings} == {"protocol"}, [f.headline() for f in g.findings]


def test_findings_at_extreme_magnitudes_only_point_to_the_domain():
    """TRL's float32 formula fails only where float32 overflows: the screen says from which
    magnitudes and how to declare a range below them (heldout5: a maintainer never found --domain);
    a code with a finding at ordinary magnitudes gets no such line (the negative control)."""
    shown = grading.render(_grade("_native_impls:trl_float32", select="plain,range"))
    assert "every finding is at extreme magnitudes (|rewards| from about" in shown, shown
    assert "--domain max_abs_reward=1e6 --domain max_abs_weight=1e6" in shown
    assert "declare their range" not in grading.render(_grade("_native_impls:trl_biased_std", select="plain,range"))


def test_each_rank_whitening_its_shard_alone_is_a_formula():
    """A code that ignores the process group whitens each rank's shard as if it were the batch: a
    formula finding naming that (heldout5: "accuracy beyond its own precision", 17th of 25)."""
    g = _grade("_native_impls:impl_shard_alone", "gdpo", select="dist_values_2")
    assert [f.cause for f in g.findings if f.category in ("formula", "precision")] == \
        ["Eq. 6: over each rank's shard alone, not the batch across ranks (no all_reduce?)"], g.findings


def test_a_code_without_whitening_units_is_graded_across_ranks():
    """A code that takes no segment_sizes (declared units=false) had no multi-process row graded,
    and one that refused units beside a process group was refused on every cross-rank case:
    whitening each shard alone passed unseen (heldout6 m19, m21). One unit is now passed as none."""
    domain = {"units": False}
    g = _grade("_native_impls:impl_without_units", "gdpo", select="dist_values_2,dist_errors_2", domain=domain)
    assert not g.findings and [r.verdict for r in g.rows if r.name.startswith("dist")] == ["passed"] * 2, g.rows
    g = _grade("_native_impls:impl_without_units_shard_alone", "gdpo", select="dist_values_2", domain=domain)
    assert [f.cause for f in g.findings if f.category in ("formula", "precision")] == \
        ["Eq. 6: over each rank's shard alone, not the batch across ranks (no all_reduce?)"], g.findings


def test_a_code_without_units_gets_the_pinned_examples_of_one_unit():
    """heldout8 m08 (Eq. 6 divided by N - world size, no segment_sizes taken) failed 4 of 50
    multi-process cases, the drawn ones mostly holding rows on one rank: the pinned example of
    one unit spanning two ranks, which shows it, was left out of a code that takes no units.
    One unit is passed as none there, as the drawn cases pass it."""
    from conformance import runner
    from conformance.properties import BY_NAME
    for domain, units in (({"units": False}, None), (None, (4,))):
        subject = Subject("_native_impls:impl_without_units", "gdpo", "spec", domain=domain)
        split = [c for c in runner.pinned_cases(BY_NAME["dist_values_2"], subject)
                 if c.note.startswith("K = 1 example split over 2 ranks")]
        assert [[s.segment_sizes for s in c.shards] for c in split] == [[units, units]], split


def test_a_refusal_that_names_another_rank_in_an_error_case_is_that_refusal():
    """A code refusing empty shards (every rank raising it together, naming the empty rank) got,
    beside that refusal, a protocol finding per error case that met an empty shard: "the error
    does not name rank 1, whose input is refused" (heldout6 m20: three findings, one cause)."""
    g = _grade("_native_impls:impl_refusing_empty_shards", "gdpo", select="dist_values_2,dist_errors_2,dist_errors_4")
    assert [(f.category, f.cause.split(";")[0]) for f in g.findings] == \
        [("refused", "rank 0 raised ValueError: rank 0: rewards are empty, shape (0, 1)")], g.findings
    assert {"dist_errors_2", "dist_errors_4"} & set(g.findings[0].rows), g.findings[0].rows


def test_one_missing_check_is_one_finding_whichever_way_it_shows():
    """Labels of the wrong length, never checked: too many accepted silently, too few a crash. Two
    findings of one cause (heldout6 m17); now one, led by the acceptance, the crash said beside it."""
    g = _grade("_native_impls:impl_labels_length_unchecked", "gdpo", select="errors:labels_length")
    assert [(f.category, f.cause) for f in g.findings] == \
        [("accepted", "group labels of the wrong length (group_ids; verl: index)")], g.findings
    assert "other case(s), refused with another exception class: crashed IndexError" in g.findings[0].said, \
        g.findings[0].said


def _crashes_on_nan(rewards, num_generations, reward_weights):
    """TRL's float32 formula that indexes past an empty list on a NaN reward: a crash, no refusal."""
    if torch.isnan(rewards).any():
        return [][0]
    from _native_impls import trl_float32
    return trl_float32(rewards, num_generations, reward_weights)


def _no_units(rewards, *, group_ids=None, group_size=None, weights=None, eps=1e-4, out_dtype=torch.float32):
    """impl.gdpo behind a signature without segment_sizes (or a process group)."""
    from impl.gdpo import gdpo_advantages
    return gdpo_advantages(rewards, group_ids=group_ids, group_size=group_size, weights=weights, eps=eps,
                           out_dtype=out_dtype)


def test_a_crash_is_no_refusal_and_an_untaken_keyword_says_what_to_declare():
    """An IndexError on a NaN reward, or a TypeError about the call's own arguments, passed the error
    rows as clear refusals (a new-user review); they fail, and a keyword the signature does not take
    says which declaration fits. A ValueError on a NaN (TRL's float32 formula) passes, noted."""
    [row] = [r for r in _grade("test_grading_output:_crashes_on_nan", select="errors:nan_reward").rows
             if r.name == "errors:nan_reward"]
    assert row.verdict == "failed" and row.categories == ("wrong_class",), row
    g = _grade("test_grading_output:_no_units", "gdpo", select="units")
    assert g.findings and all("it takes no segment_sizes (declare --domain units=false)" in f.cause
                              for f in g.findings), [f.cause for f in g.findings]


def test_a_declared_domain_leaves_out_the_rows_outside_it():
    """labels=false and units=false: the error cases that break labels or units, and the
    multi-process rows (which pass both), are not graded (a new-user review: a code refusing every
    label "passed" errors:group_of_one, and failed every dist_values case)."""
    s = Subject("impl.gdpo:gdpo_advantages", "gdpo", domain={"labels": False, "units": False})
    why = dict(grading._rows_to_run(s, None, False))
    for name in ("errors:group_of_one", "errors:float_labels", "errors:labels_length", "errors:segments_sum",
                 "errors:unit_of_one", "dist_values_2", "dist_errors_4", "units"):
        assert why[name] and "outside the declared domain" in why[name], (name, why[name])
    assert why["errors:nan_reward"] is None and why["plain"] is None and why["errors:eps_invalid"] is None
    assert dict(grading._rows_to_run(Subject("impl.gdpo:gdpo_advantages", "gdpo"), None, False))["dist_values_2"] is None


def test_the_error_rows_draw_the_declared_input_dtypes():
    """trl shape, input_dtypes=float64 declared: the error rows sent float32 rewards all the same."""
    from conformance import runner

    def dtypes(domain):
        cases = runner.row_cases("errors:nan_reward", Subject("_native_impls:trl_float32", "trl", domain=domain))
        return {c.dtype for group in cases for c in (group if isinstance(group, tuple) else (group,))}

    assert dtypes({"input_dtypes": ("float64",)}) == {"float64"} and dtypes(None) == {"float32"}


def test_json_dash_writes_the_json_to_standard_output(capsys, tmp_path, monkeypatch):
    """--json - wrote a file named '-' (a new-user review): the JSON goes to standard output, the
    screen to standard error."""
    monkeypatch.chdir(tmp_path)
    status = grading.main("_native_impls:trl_float32", "trl", None, "errors:weights_length", json_path="-")
    out, err = capsys.readouterr()
    assert json.loads(out)["exit_status"] == status and "property" in err and not (tmp_path / "-").exists()


def test_a_replay_of_a_module_not_found_is_a_usage_error(capsys):
    """Run from another folder, a replay line graded the missing module's ImportError as the
    code's refusal (or printed a traceback): one line, exit 2."""
    from conformance import replay

    case = '{"rewards":[["0x0.0p+0"],["0x1.0p+0"]],"dtype":"float32","out_dtype":"float32","group_size":2}'
    assert replay.main(["--impl", "no_such_module:fn", "--call-shape", "trl", "--case", case]) == 2
    assert "module 'no_such_module' not found" in capsys.readouterr().err


def test_the_trl_shape_passes_no_missing_keyword():
    """The reason a missing= row is not graded names the shape, not the code (trl_advantages takes it)."""
    why = Subject("impl.adapters:trl_advantages", "trl").unsupported(frozenset({"values", "missing"}))
    assert why.startswith("call shape 'trl' passes no missing= keyword"), why


def test_a_nan_where_the_exact_advantage_is_0_says_why_0():
    """eps 0 and a constant group: the specification's z is 0 where the paper's formula is 0/0; a
    NaN there said only "exact 0" (heldout5: unclear). The row names the clause."""
    from conformance.cases import Case, expected
    from conformance.compare import advantage_zero_clause, distance

    case = Case(((0.0,), (0.0,), (1.0,), (2.0,)), dtype="float64", group_size=2, eps=0.0)
    res = expected(case, "spec").result
    observed = res.float64.copy()
    observed[:2] = float("nan")
    allowed = np.full(case.n, 1e-3)  # a code's own error model allows it some error (float32, eps 0)
    v = distance(observed, res.float64, allowed, res.cond, "float64", zero_why=advantage_zero_clause(res, None))
    assert v.category == "non_finite" and "the exact result is 0 because" in v.rows[0], v.rows
    assert "constant in group" in v.rows[0], v.rows[0]


def test_select_takes_row_names_prefixes_and_parts():
    s = Subject("paper_impls:correct_f32", "trl", "spec")
    pick = (lambda sel: [n for n, why in grading._rows_to_run(s, sel, False) if not why])
    assert pick("plain") == ["plain"]
    assert pick("errors:nan_reward") == ["errors:nan_reward"]
    assert set(pick("errors")) >= {"errors:nan_reward", "errors:weights_length"} and "plain" not in pick("errors")
    assert pick("nan") == ["errors:nan_reward"]  # a part of a name: the rows it is part of
    assert set(pick("plain,range")) == {"plain", "range"}


@pytest.mark.parametrize("target", ["paper_impls:correct_f32", "paper_impls:no_std_eq4"])
def test_the_json_carries_what_the_screen_says(target):
    g = _grade(target, select="plain,errors:nan_reward")
    data = grading.as_json(g)
    assert data["verdict"] == grading.verdict_line(g) == grading.render(g).splitlines()[0]
    assert [f["cause"] for f in data["findings"]] == [f.cause for f in grading.FD.rank(g.findings)]
    for f in data["findings"]:
        assert f["repro"].startswith("python -m conformance.replay --impl ") and f["example_case"], f


def _column_result(rewards, num_generations, reward_weights):
    """A TRL-style code that returns its advantages as an (N, 1) column, NaN rewards and all."""
    import torch
    g = rewards.view(-1, num_generations, rewards.shape[1])
    z = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)
    c = (z * reward_weights).sum(-1).reshape(-1, 1)
    return (c - c.mean()) / (c.std() + 1e-4)


def test_a_column_shaped_result_is_a_finding_not_a_crash_of_the_grader():
    """An (N, 1) result: the valid cases are "output breaks its call shape", and a bad input it
    accepts is shown with its shape (the summary of such a result used to raise a TypeError, so
    ``gdpo check`` exited 3, "the grader itself failed")."""
    g = _grade("test_grading_output:_column_result", select="plain,errors")
    shape = [f for f in g.findings if str(f.category) == "call_shape"]
    assert shape and "of shape (2, 1)" in shape[0].headline(), [f.headline() for f in g.findings]
    accepted = [f for f in g.findings if str(f.category) == "accepted"]
    assert accepted and all("value(s) of shape (2, 1)" in f.said for f in accepted), [f.said for f in accepted]


def _batch_mean_baseline(rewards, num_generations, reward_weights):
    """Eq. 4 centred on the batch's column mean, divided by the group's own std."""
    g = rewards.view(-1, num_generations, rewards.shape[1])
    z = (g - rewards.mean(0)) / (g.std(1, keepdim=True) + 1e-4)
    c = (z * reward_weights).sum(-1).reshape(-1)
    return (c - c.mean()) / (c.std() + 1e-4)


def _interleaved_groups(rewards, num_generations, reward_weights):
    """Groups read as rows i, i + N/G, ... (a reshape the wrong way round); the maths otherwise right."""
    g = rewards.view(num_generations, -1, rewards.shape[1])
    z = (g - g.mean(0, keepdim=True)) / (g.std(0, keepdim=True) + 1e-4)
    c = (z * reward_weights).sum(-1).reshape(-1)
    return (c - c.mean()) / (c.std() + 1e-4)


@pytest.mark.parametrize("name, said, not_said", [
    ("_batch_mean_baseline", "the baseline is not the group's own mean", ("std",)),
    ("_interleaved_groups", "are the groups the contiguous blocks", ("baseline", "std"))])
def test_a_broken_relation_is_named_not_what_follows_from_it(name, said, not_said):
    """Eq. 4's relations presume each other: the groups, then the baseline, then the std. A code
    whose baseline is the batch mean also changes when a group's column is scaled, but it does
    divide by the group's std: only the baseline is named (held-out codes written from the paper
    were told "no division by the group's own std")."""
    g = _grade(f"test_grading_output:{name}", select="plain")
    formula = g.profile.formula or ""
    assert said in formula and not any(w in formula for w in not_said), formula


def _z_clipped(rewards, num_generations, reward_weights):
    """Eq. 4's z clipped to [-3, 3]: only a group of 11 or more can reach |z| > 3."""
    g = rewards.view(-1, num_generations, rewards.shape[1])
    z = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).clamp(-3.0, 3.0)
    c = (z * reward_weights).sum(-1).reshape(-1)
    return (c - c.mean()) / (c.std() + 1e-4)


def test_a_clip_of_z_is_a_formula_the_probes_name():
    """A clip of z at Eq. 4 shows only in groups of 11 or more; the probe of two groups of 12 makes
    it a formula finding at ordinary magnitudes (it was reported as precision at extreme ones)."""
    g = _grade("test_grading_output:_z_clipped", select="plain")
    formula = g.profile.formula or ""
    assert "off the paper's formula on 2 groups of 12, one outlier (|z| = 3.2 at Eq. 4)" in formula, formula


def _std_floored(rewards, num_generations, reward_weights):
    """A "safe" std: one below 1e-6 replaced by 1, as some trainers guard a constant group."""
    g = rewards.view(-1, num_generations, rewards.shape[1])
    std = g.std(1, keepdim=True)
    z = (g - g.mean(1, keepdim=True)) / (torch.where(std < 1e-6, 1.0, std) + 1e-4)
    c = (z * reward_weights).sum(-1).reshape(-1)
    return (c - c.mean()) / (c.std() + 1e-4)


def test_a_std_replaced_below_a_threshold_is_a_formula_the_probes_name():
    """A std below 1e-6 replaced by 1: the probes' stds went down to 1e-5 only, so the drawn cases
    of tiny rewards that show it were "accuracy beyond its own precision" (heldout5). The probe
    scaled by 2^-30 makes it a formula finding."""
    g = _grade("test_grading_output:_std_floored", select="plain")
    assert "formula on the first scaled by 2^-30" in (g.profile.formula or ""), g.profile.formula
    cats = [f.category for f in g.findings if f.regime == "ordinary magnitudes"]
    assert cats == ["formula"], [f.headline() for f in g.findings]


def _z_clipped_at_10(rewards, num_generations, reward_weights):
    """Eq. 4's z clipped to [-10, 10]: only a group of 102 or more can reach |z| > 10."""
    g = rewards.view(-1, num_generations, rewards.shape[1])
    z = ((g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)).clamp(-10.0, 10.0)
    c = (z * reward_weights).sum(-1).reshape(-1)
    return (c - c.mean()) / (c.std() + 1e-4)


def _a_clipped_at_10(rewards, num_generations, reward_weights):
    """The paper's formula, advantages clamped to [-10, 10] after Eq. 6, as PPO-style codes do."""
    g = rewards.view(-1, num_generations, rewards.shape[1])
    z = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-4)
    c = (z * reward_weights).sum(-1).reshape(-1)
    return ((c - c.mean()) / (c.std() + 1e-4)).clamp(-10.0, 10.0)


@pytest.mark.parametrize("name, said", [("_z_clipped_at_10", "formula on 2 groups of 128, one outlier"),
                                        ("_a_clipped_at_10", "after Eq. 6: advantages clipped to [-10, 10]")])
def test_a_clip_at_10_is_a_formula_the_probes_name(name, said):
    """A clip at 10, of z at Eq. 4 or of the advantages after Eq. 6, shows only where one outlier
    stands among 102 or more samples of a group: no drawn case and no probe of groups of 12 had
    one, and such codes conformed. The probe of two groups of 128 makes it a formula finding (the
    catalogue's clip after Eq. 6, read off that probe's output)."""
    g = _grade(f"test_grading_output:{name}", select="plain")
    formula = g.profile.formula or ""
    assert said in formula and not g.ok, formula


@pytest.mark.parametrize("domain", [["max_columns=0"], ["group_sizes=1"], ["max_abs_reward=0"], ["max_abs_weight=0"],
                                    ["min_columns=5", "max_columns=2"]])
def test_a_domain_that_leaves_nothing_to_draw_is_a_usage_error(domain, capsys):
    """A new user's `--domain max_columns=0` graded nothing and said "conforms" (exit 0), for a function
    that only raised. A domain that leaves cases is accepted."""
    from gdpo_tools import cli

    args = ["check", "--impl", "_native_impls:trl_float32", "--call-shape", "trl"]
    assert cli.main(args + [x for d in domain for x in ("--domain", d)]) == grading.EXIT_USAGE
    assert "leaves nothing to draw" in capsys.readouterr().err
    Subject("_native_impls:trl_float32", "trl", domain={"max_columns": 1, "max_abs_reward": 1.0}).context()


def test_a_selection_or_json_path_that_cannot_work_is_a_usage_error_before_the_run(tmp_path, capsys):
    assert grading.main("_native_impls:trl_float32", "trl", None, select="nosuchword") == grading.EXIT_USAGE
    assert "-k 'nosuchword' names no row" in capsys.readouterr().err
    missing = str(tmp_path / "no" / "such" / "folder" / "x.json")
    assert grading.main("_native_impls:trl_float32", "trl", None, select="plain", json_path=missing) == \
        grading.EXIT_USAGE
    assert "cannot be written" in capsys.readouterr().err


def test_nothing_graded_is_no_verdict(tmp_path, capsys):
    """Every row chosen skipped (here: the multi-process rows, under --single-process) is exit 2,
    not "conforms"."""
    out = tmp_path / "g.json"
    assert grading.main("_native_impls:trl_float32", "trl", None, select="dist_values", single_process=True,
                        json_path=str(out)) == grading.EXIT_USAGE
    assert "nothing graded" in capsys.readouterr().out
    assert json.loads(out.read_text())["exit_status"] == grading.EXIT_USAGE


def test_an_output_that_is_no_tensor_is_never_taken_for_a_refusal():
    """A code returning a list of NaNs on a NaN reward passed errors:nan_reward as "refused with
    NotATensor", the grader's own exception; a code that raises a clear error of another class there
    still passes, noted."""
    rows = {r.name: r for r in _grade("_native_impls:trl_float32_as_list", select="errors:nan_reward").rows}
    assert rows["errors:nan_reward"].verdict == "failed" and rows["errors:nan_reward"].categories == ("call_shape",)
    rows = {r.name: r for r in _grade("_native_impls:plain_value_errors", "gdpo", select="errors:nan_reward").rows}
    assert rows["errors:nan_reward"].verdict == "passed" and rows["errors:nan_reward"].notes, rows
