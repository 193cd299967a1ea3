"""`gdpo audit`'s honesty (issue 43 point 9, issue 45): NaN rewards read as "not scored" where
asked (a masked array's mask alike), two columns that cancel on some rows of a group, and rows
named as the file shows them."""

import json

import numpy as np
import pytest
import torch

from gdpo_tools import audit, cli
from impl import gdpo as impl

NAN = np.nan


def _findings(report, code):
    return {g["group"]: f for g in report["groups"] for f in g["findings"] if f["code"] == code}


def _codes(report):
    return {g["group"]: sorted(f["code"] for f in g["findings"]) for g in report["groups"]}


# ------------------------------------------------------------------ missing="unscored"

UNSCORED_CSV = ("group,a,b\n"
                "0,1,0\n0,0,nan\n0,1,1\n0,0,1\n"  # lines 2-5: b not scored on line 3
                "1,nan,2\n1,nan,5\n1,3,2\n"  # lines 6-8: a scored once, so z = 0 throughout
                "2,nan,nan\n2,1,1\n2,1,1\n")  # lines 9-11: a row without a score, the rest equal


def test_missing_unscored_audits_a_batch_with_nan_as_impl_reads_it(tmp_path, capsys):
    p = tmp_path / "nan.csv"
    p.write_text(UNSCORED_CSV)
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED  # the default refuses, and says what to do
    assert "line 3, column 'b' (group 0) is NaN" in capsys.readouterr().err
    assert cli.main(["audit", str(p), "--missing", "unscored", "--json"]) == audit.OK
    report = json.loads(capsys.readouterr().out)
    assert (report["missing"], report["unscored_rewards"], report["rows_without_score"]) == ("unscored", 5, 1)
    said = {g: f["message"] for g, f in _findings(report, "unscored").items()}
    assert said == {0: "1 reward(s) not scored: b (line 3); each has z = 0 and is left out of its column's mean "
                       "and std",
                    1: "2 reward(s) not scored: a (lines 6, 7); each has z = 0 and is left out of its column's mean "
                       "and std",
                    2: "2 reward(s) not scored: a (line 9); b (line 9); each has z = 0 and is left out of its "
                       "column's mean and std"}
    # group 1: a scored once is constant over its scored rows; group 2: nothing varies among the scored rows
    assert _codes(report) == {0: ["unscored"], 1: ["collapsed-column", "unscored"],
                              2: ["collapsed-column", "no-signal", "unscored"]}
    assert [g["signal"] for g in report["groups"]] == [True, True, False]
    assert report["impl_vs_oracle"]["groups_checked"] == 3 and report["impl_vs_oracle"]["max_error_over_bound"] <= 1
    # the same decisions as impl.gdpo's own missing="unscored"
    b = audit.read_batch(p)
    has = impl.group_has_signal(torch.tensor(b.rewards), group_ids=torch.tensor(b.group_ids), missing="unscored")
    assert has.tolist() == [True, True, False]


def test_missing_unscored_scaled_method_reports_what_the_exact_one_does(tmp_path):
    b = audit.read_batch(_write(tmp_path, "nan.csv", UNSCORED_CSV))
    exact = audit.audit(b, exact=True, peers=False, missing="unscored")
    scaled = audit.audit(b, exact=False, peers=False, missing="unscored")
    assert not scaled["method"]["exact"] and _codes(scaled) == _codes(exact)
    assert scaled["units"][0]["collapsed"] is exact["units"][0]["collapsed"] is False


def test_an_infinite_reward_is_refused_under_unscored_too(tmp_path, capsys):
    p = _write(tmp_path, "inf.csv", "group,a\n0,1\n0,nan\n0,-inf\n1,0\n1,1\n")
    assert cli.main(["audit", str(p), "--missing", "unscored"]) == audit.NOT_AUDITED
    assert capsys.readouterr().err == (f"gdpo audit: {p}: line 4, column 'a' (group 0) is -inf: the specification "
                                       "refuses non-finite rewards\n")


def test_a_unit_without_two_scored_rows_is_collapsed(tmp_path):
    p = _write(tmp_path, "u.csv", "group,unit,a\n0,0,1\n0,0,0\n1,1,nan\n1,1,nan\n2,1,nan\n2,1,3\n")
    units = {u["unit"]: u for u in audit.audit(audit.read_batch(p), missing="unscored", exact=False)["units"]}
    assert not units[0]["collapsed"] and units[1]["collapsed"]
    assert units[1]["findings"][0]["message"] == ("unit 1 has fewer than 2 rows with a scored reward, so each of its "
                                                  "advantages is exactly 0 (Eq. 6 exact collapse)")


def test_a_masked_array_is_unscored_where_asked_and_refused_otherwise():
    """Issue 45: the mask was ignored, and the values under it were used as rewards."""
    data = np.array([[1.0, 0.0], [0.0, 100.0], [1.0, 1.0], [0.0, 1.0], [5.0, 2.0], [-50.0, 1.0], [3.0, 2.0]])
    mask = np.zeros(data.shape, bool)
    mask[1, 1] = mask[5, 0] = True
    groups = np.array([0, 0, 0, 0, 1, 1, 1])
    masked = audit.Batch(np.ma.array(data, mask=mask), groups, None, None, ["a", "b"], "api")
    with pytest.raises(audit.AuditInputError, match=r"^api: 'rewards' is a masked array with 2 masked entries "
                                                    r"\(row 1 \(0-based\), column 'b' the first\); --missing unscored"):
        audit.audit(masked)
    as_nan = audit.Batch(np.where(mask, NAN, data), groups, None, None, ["a", "b"], "api")
    plain = audit.Batch(data, groups, None, None, ["a", "b"], "api")
    assert audit.audit(masked, missing="unscored") == audit.audit(as_nan, missing="unscored")
    assert audit.audit(masked, missing="unscored")["unscored_rewards"] == 2
    assert audit.audit(plain)["groups"] != audit.audit(masked, missing="unscored")["groups"]  # the mask matters here


# ------------------------------------------------------------------ partial cancellation

LENGTH = np.array([10.0, 25.0, 40.0, 55.0, 70.0, 30.0, 80.0, 5.0])
BREVITY = np.r_[100.0 - LENGTH[:5], 3.0, 90.0, 50.0]  # brevity = 100 - length on rows 0-4 only
CORRECT = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])


def _batch(r, names=("length", "brevity", "correct"), weights=None):
    return audit.Batch(np.asarray(r, dtype=np.float64), np.zeros(len(r), np.int64), None,
                       None if weights is None else np.asarray(weights, dtype=np.float64), list(names), "b")


def test_a_partial_cancellation_is_found_and_its_fraction_replays():
    """Between the rows where brevity = 100 - length, Eq. 4 + 7 move length's and brevity's
    weighted z together by `keeps` of what they move apart: replayed from impl.gdpo's z."""
    r = np.stack([LENGTH, BREVITY, CORRECT], 1)
    found = _findings(audit.audit(_batch(r)), "partial-cancellation")[0]
    assert found["columns"] == ["length", "brevity"] and found["rows"] == [0, 1, 2, 3, 4]
    assert found["message"].startswith("columns length and brevity cancel on 5 of 8 rows, rows 0, 1, 2, 3, 4 "
                                       "(0-based), where brevity = C - length (C = 100): between them their weighted "
                                       "z keep 5% of")
    z = impl.standardize_groups(torch.tensor(r), group_ids=torch.zeros(8, dtype=torch.int64)).double().numpy()
    for i, j in [(0, 1), (0, 4), (2, 3)]:
        together = abs((z[i, 0] + z[i, 1]) - (z[j, 0] + z[j, 1]))
        apart = abs(z[i, 0] - z[j, 0]) + abs(z[i, 1] - z[j, 1])
        # float64 z (1e-16 relative) lose 1/keeps = 20x in the difference: 1e-9 is far above that
        assert together / apart == pytest.approx(found["keeps"], rel=1e-9), (i, j)
    off = [k for k in range(5, 8)]  # rows off the line: the pair does not cancel there
    assert abs((z[off[0], 0] + z[off[0], 1]) - (z[off[1], 0] + z[off[1], 1])) > 0.5


def test_opposite_weights_cancel_a_constant_difference():
    r = np.stack([LENGTH, np.r_[LENGTH[:5] + 7.0, 1.0, 2.0, 60.0], CORRECT], 1)
    found = _findings(audit.audit(_batch(r, weights=[1.0, -1.0, 1.0])), "partial-cancellation")[0]
    assert "where brevity = length - C (C = -7)" in found["message"] and found["rows"] == [0, 1, 2, 3, 4]
    assert not _findings(audit.audit(_batch(r)), "partial-cancellation")  # equal signs add, not cancel


@pytest.mark.parametrize("case", ["weights_1_4", "binary_mirror", "independent", "whole_group_cancels"])
def test_no_partial_cancellation_where_no_signal_is_removed_or_no_relation_shown(case):
    """Negative controls: a weighting that keeps most of the signal (keeps 0.6); binary columns
    (r2 = 1 - r1 on any two rows of two values: no relation shown); unrelated columns; an exact
    cancellation of the whole group (its own finding)."""
    r = np.stack([LENGTH, BREVITY, CORRECT], 1)
    w = None
    if case == "weights_1_4":
        w = [1.0, 4.0, 1.0]
    elif case == "binary_mirror":
        r = np.stack([CORRECT, np.r_[1 - CORRECT[:6], 1.0, 1.0], LENGTH], 1)
    elif case == "independent":
        r = np.stack([LENGTH, LENGTH[::-1] ** 1.5, CORRECT], 1)
    else:
        r = np.stack([LENGTH, 100.0 - LENGTH], 1)
    report = audit.audit(_batch(r, names=("length", "brevity", "correct")[:r.shape[1]], weights=w))
    assert not _findings(report, "partial-cancellation"), report["groups"][0]["findings"]
    if case == "whole_group_cancels":
        assert _findings(report, "exact-cancellation")


# ------------------------------------------------------------------ rows as the file shows them


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_rows_are_named_by_the_files_own_lines(tmp_path, capsys):
    """Blank lines in a .jsonl and a quoted line break in a .csv label: the line an editor shows."""
    recs = [json.dumps({"group": 0, "rewards": [float(v)]}) for v in (1, 0, 1)]
    p = _write(tmp_path, "b.jsonl", f"{recs[0]}\n\n{recs[1]}\n\n\n{recs[2]}\n" + '{"group": 0, "rewards": [NaN]}\n')
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED
    assert f"{p}: line 7, column 'r0' (group 0) is NaN" in capsys.readouterr().err
    q = _write(tmp_path, "b.csv", 'group,r\n"a\nb",1\n"a\nb",0\nc,x\n')
    with pytest.raises(audit.AuditDtypeError, match=r"line 6, column 'r': 'x' is not a number"):
        audit.read_batch(q)
    rows = "\n".join(f"0,{x},{y},{c}" for x, y, c in zip(LENGTH, BREVITY, CORRECT))
    found = _findings(audit.audit(audit.read_batch(_write(tmp_path, "c.csv", "group,length,brevity,correct\n" + rows))),
                      "partial-cancellation")[0]
    assert found["rows"] == [2, 3, 4, 5, 6] and "rows, lines 2, 3, 4, 5, 6, where" in found["message"]
