"""`gdpo audit`: every input format, clear errors for malformed files, exit codes."""

import json

import numpy as np
import pytest
import torch

from gdpo_tools import audit, cli

R = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [2.0, 2.0], [2.0, 2.0]])
G = np.array([0, 0, 0, 0, 1, 1])


def _write(tmp_path, fmt):
    p = tmp_path / f"batch.{fmt}"
    if fmt == "npz":
        np.savez(p, rewards=R, group_ids=G, weights=np.array([1.0, 2.0]))
    elif fmt == "pt":
        torch.save({"reward_acc": torch.tensor(R[:, 0]), "reward_fmt": torch.tensor(R[:, 1]),
                    "group_ids": torch.tensor(G)}, p)
    elif fmt == "jsonl":
        p.write_text("\n".join(json.dumps({"group": int(g), "rewards": {"acc": r[0], "fmt": r[1]}})
                               for r, g in zip(R.tolist(), G)))
    else:
        p.write_text("group,acc,fmt\n" + "\n".join(f"{g},{r[0]},{r[1]}" for r, g in zip(R.tolist(), G)))
    return p


@pytest.mark.parametrize("fmt", ["npz", "pt", "jsonl", "csv"])
def test_each_format_reads_the_same_batch(tmp_path, fmt):
    b = audit.read_batch(_write(tmp_path, fmt))
    assert np.array_equal(b.rewards, R) and np.array_equal(b.group_ids, G)
    report = audit.audit(b, weights=[1.0, 2.0])
    g1 = report["groups"][1]
    codes = {f["code"] for f in g1["findings"]}
    assert not g1["signal"] and {"collapsed-column", "no-signal", "two-samples"} <= codes, codes
    assert report["impl_vs_oracle"]["max_error_over_bound"] <= 1.0
    assert report["status"] == audit.WARN


def test_cli_json_and_exit_code(tmp_path, capsys):
    code = cli.main(["audit", str(_write(tmp_path, "csv")), "--json", "--weights", "1", "2"])
    report = json.loads(capsys.readouterr().out)
    assert code == report["status"] == audit.WARN
    assert report["weights"] == [1.0, 2.0]
    assert set(report["peers"]) == {"trl", "verl", "nemo_rl", "nvlabs", "ms_swift", "multireward_grpo"}


def test_builtin_example_flags_every_kind(capsys):
    assert cli.main(["audit"]) == audit.WARN
    out = capsys.readouterr().out
    for finding in ("[collapsed-column]", "[exact-cancellation]", "[ill-conditioned]", "[eps-dominated]",
                    "[two-samples]", "status"):
        assert finding in out
    for term in ("ulp:", "cond:", "structural zero:", "n_g:"):  # each term the findings use is defined
        assert "\n  " + term in out, term


def test_clean_batch_exits_zero(tmp_path):
    p = tmp_path / "ok.csv"
    p.write_text("group,a,b\n0,1,0\n0,0,1\n0,2,5\n1,3,1\n1,0,2\n1,1,7\n")
    assert cli.main(["audit", str(p)]) == audit.OK


def test_bad_npz_and_contract_errors(tmp_path, capsys):
    p = tmp_path / "b.npz"
    np.savez(p, rewards=R, group_ids=G[:5])
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED
    assert "'group_ids' has 5 entries for 6 samples" in capsys.readouterr().err
    q = tmp_path / "nan.npz"
    np.savez(q, rewards=np.where(R == 2.0, np.nan, R), group_ids=G)
    assert cli.main(["audit", str(q)]) == audit.NOT_AUDITED
    assert "NaN" in capsys.readouterr().err


def test_nonfinite_rewards_are_named_by_the_files_column(tmp_path, capsys):
    """A NaN reward in CSV column 'acc' was reported as 'reward row 1, column 0' (the oracle's words)."""
    p = tmp_path / "nan.csv"
    p.write_text("group,acc,fmt\n0,1.0,0\n0,nan,1\n1,0.5,1\n1,0.25,0\n")
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED
    err = capsys.readouterr().err
    assert err == (f"gdpo audit: {p}: line 3, column 'acc' (group 0) is NaN: the specification refuses non-finite "
                   "rewards; --missing unscored reads a NaN as a reward not scored\n"), err
    q = tmp_path / "inf.csv"
    q.write_text("group,acc,fmt\n0,1.0,0\n0,1.0,-inf\n1,0.5,nan\n1,0.25,0\n")
    assert cli.main(["audit", str(q)]) == audit.NOT_AUDITED
    err = capsys.readouterr().err
    assert f"{q}: line 3, column 'fmt' (group 0) is -inf (and 1 more): the specification refuses" in err, err


def test_disagreeing_implementation_exits_3(monkeypatch, tmp_path):
    from impl import gdpo as impl

    real = impl.gdpo_advantages
    monkeypatch.setattr(impl, "gdpo_advantages", lambda *a, **k: real(*a, **k) * 1.001)
    assert cli.main(["audit", str(_write(tmp_path, "csv"))]) == audit.DISAGREE


def test_routine_binary_findings_are_reported_but_exit_zero(tmp_path, capsys):
    """Found by review: a healthy binary-reward batch exited 1 because a column was constant in a
    group (routine with binary rewards), so a CI gate on the exit code could not tell it from a
    suspect batch. Collapsed columns and groups without signal are still reported."""
    p = tmp_path / "binary.csv"
    p.write_text("group,correct,format\n0,1,1\n0,0,1\n0,1,1\n0,0,1\n1,1,1\n1,1,1\n1,1,1\n1,1,1\n"
                 "2,0,1\n2,1,0\n2,1,1\n2,0,0\n")
    assert cli.main(["audit", str(p)]) == audit.OK
    out = capsys.readouterr().out
    assert "[collapsed-column] column format constant within the group" in out and "[no-signal]" in out
    p.write_text(p.read_text() + "3,0,1\n3,1,1\n")  # a group of two: a warning
    assert cli.main(["audit", str(p)]) == audit.WARN


def test_refusals_name_the_file_and_the_files_own_row(tmp_path, capsys):
    """Found by review: with a unit column impl.gdpo saw the rows sorted by unit, so its Eq. 7
    overflow named row 0 for a group on file rows 4-7; a group of one and impl's refusals
    named no file."""
    p = tmp_path / "units.csv"
    p.write_text("group,unit,a,b,c\n1,1,1,2,3\n1,1,2,3,1\n0,0,1,0,1\n0,0,0,1,1\n1,1,3,1,2\n1,1,0,0,1\n"
                 "0,0,1,1,0\n0,0,2,2,2\n")
    assert cli.main(["audit", str(p), "--weights", "1e308", "1e308", "1e308"]) == audit.NOT_AUDITED
    err = capsys.readouterr().err
    assert err.startswith(f"gdpo audit: {p}: impl.gdpo refuses the batch: Eq. 7") and "line 7 (group label 1)" in err
    p = tmp_path / "ones.csv"
    p.write_text("group,a,b\n0,1,0\n0,0,1\n77,1,1\n1,1,0\n1,0,1\n5,0,0\n")
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED
    assert capsys.readouterr().err == (f"gdpo audit: {p}: group 77 (line 4) has 1 sample, as does 1 other group; "
                                       "Eq. 4's unbiased std needs at least 2 (drop such groups, or merge them)\n")


def test_json_is_strict_json(tmp_path, capsys):
    """Found by review: an infinite difference was written as Infinity, which strict parsers refuse."""
    report = {"a": float("inf"), "b": [float("-inf"), float("nan"), 1.5], "c": {"d": 2}}
    assert audit.report._strict_json(report) == {"a": "inf", "b": ["-inf", "nan", 1.5], "c": {"d": 2}}
    assert cli.main(["audit", str(_write(tmp_path, "csv")), "--json"]) == audit.WARN
    json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"non-standard JSON {name}"))


@pytest.mark.parametrize("text, said", [
    ("uid,a,b\nx,1,0\nx,0,1\n", "rename 'uid' to 'group' (exactly, no spaces)"),
    (" group,a,b\n0,1,0\n0,0,1\n", "rename ' group' to 'group' (exactly, no spaces)"),
], ids=["uid_column", "spaced_header"])
def test_verl_style_labels_are_refused_saying_what_to_do(tmp_path, capsys, text, said):
    """Found by review: a group column under another name was refused with no hint."""
    p = tmp_path / "b.csv"
    p.write_text(text)
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED
    assert said in capsys.readouterr().err


def test_string_uids_are_groups_as_the_adapters_take_them(tmp_path, capsys):
    """Issue 19: verl's string uids were refused ('map them as pandas.factorize does') though the
    adapters take them. Each distinct text is one group, reported by its text; the advantages
    are those of the same batch labelled by integers."""
    p = tmp_path / "uids.csv"
    p.write_text("group,a,b\n00a-1,1,0\n00a-1,0,1\n00a-1,1,1\nzz,0,0\nzz,1,1\nzz,1,0\n")
    q = tmp_path / "ints.csv"
    q.write_text("group,a,b\n5,1,0\n5,0,1\n5,1,1\n7,0,0\n7,1,1\n7,1,0\n")
    texts, ints = audit.read_batch(p), audit.read_batch(q)
    assert texts.group_names == ["00a-1", "zz"] and ints.group_names is None
    a, b = audit.audit(texts), audit.audit(ints)
    assert [g["group"] for g in a["groups"]] == ["00a-1", "zz"] and [g["group"] for g in b["groups"]] == [5, 7]
    assert [g["findings"] for g in a["groups"]] == [g["findings"] for g in b["groups"]]
    assert cli.main(["audit", str(p)]) == audit.OK
    assert "   00a-1     3" in capsys.readouterr().out


def test_a_large_batch_lists_only_groups_with_warnings(tmp_path, capsys):
    """Found by review: a 100k-row batch printed one line per group (12,514 lines), clean ones
    included, with no summary. Beyond LIST_ALL_GROUPS groups only those with warnings are listed."""
    rows = ["group,a,b"]
    for g in range(60):
        rows += [f"{g},{g % 2},1", f"{g},{1 - g % 2},1", f"{g},1,0"] if g != 7 else [f"{g},0,1", f"{g},1,1"]
    p = tmp_path / "many.csv"
    p.write_text("\n".join(rows) + "\n")
    assert cli.main(["audit", str(p)]) == audit.WARN
    out = capsys.readouterr().out
    assert "groups: 60; with warnings 1; with routine findings only 0; without signal 0" in out, out[:400]
    table = out.split("findings\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split()[0] == "7" and "[two-samples]" in table[0] and len(table) == 2, table
    assert table[1] == "(59 groups without warnings not listed: more than 50 groups; --json lists them)"


def test_signal_belongs_to_its_group_whatever_the_label_order(tmp_path):
    """Found while scaling audit: impl.gdpo.group_has_signal orders groups by first appearance,
    the report by label, and audit read one by the other's index: a file whose labels first
    appear unsorted (group 7 before group 3) reported the signal of one group for the other."""
    p = tmp_path / "order.csv"
    p.write_text("group,a,b\n7,1,0\n7,1,0\n7,1,0\n3,0,0\n3,1,0\n3,1,1\n")
    report = audit.audit(audit.read_batch(p))
    by_label = {g["group"]: g for g in report["groups"]}
    assert by_label[7]["signal"] is False and "no-signal" in {f["code"] for f in by_label[7]["findings"]}
    assert by_label[3]["signal"] is True and "no-signal" not in {f["code"] for f in by_label[3]["findings"]}
    q = tmp_path / "units.csv"  # unit 1 (every group without signal) first, unit 0 second
    q.write_text("group,unit,a\n7,1,1\n7,1,1\n3,0,0\n3,0,1\n")
    units = {u["unit"]: u for u in audit.audit(audit.read_batch(q))["units"]}
    assert units[1]["collapsed"] and not units[0]["collapsed"]
