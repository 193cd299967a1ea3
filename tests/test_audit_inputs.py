"""`gdpo audit` on malformed files: every one is a clean refusal (exit 2, one message naming the
array or column, its shape or dtype, and the row), never a traceback or a silent reinterpretation.
Each refusal is also the spec's error class for its kind (spec/errors.py)."""

import json
import warnings

import numpy as np
import pytest
import torch

from gdpo_tools import audit, cli
from spec.errors import GroupError, InputDtypeError, OutOfRangeError, SegmentError, ShapeError, WeightError

R = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
G = np.array([0, 0, 1, 1])
BIG = 2**53 + 1  # the first integer float64 cannot hold


def npz(**arrays):
    def write(p):
        np.savez(p, **arrays)  # allow_pickle defaults to True: object arrays are written
    return "npz", write


def pt(obj):
    return "pt", lambda p: torch.save(obj, p)


def text(suffix, body):
    if isinstance(body, bytes):
        return suffix, lambda p: p.write_bytes(body)
    return suffix, lambda p: p.write_text(body)


def jsonl(*recs):
    return text("jsonl", "\n".join(r if isinstance(r, str) else json.dumps(r) for r in recs))


def bare_npy(p):
    with open(p, "wb") as f:
        np.save(f, R)


def sparse_pt():
    return pt({"rewards": torch.tensor(R).to_sparse(), "group_ids": torch.tensor(G)})


LONG_DOUBLE = np.finfo(np.longdouble).nmant > 52

# (id, (suffix, writer), spec class the refusal must also be, pattern the message must match)
CASES = [
    # rewards: shape
    ("rewards_3d_npz", npz(rewards=R[:, :, None], group_ids=G), ShapeError, r"'rewards' has shape \(4, 2, 1\)"),
    ("rewards_3d_pt", pt({"rewards": torch.tensor(R)[:, :, None], "group_ids": torch.tensor(G)}), ShapeError,
     r"'rewards' has shape \(4, 2, 1\); expected \(N,\) or \(N, K\)"),
    ("rewards_0d", npz(rewards=np.float64(1.0), group_ids=G), ShapeError, r"'rewards' has shape \(\)"),
    ("rewards_no_rows", npz(rewards=np.zeros((0, 2)), group_ids=np.zeros(0, int)), ShapeError,
     r"'rewards' has shape \(0, 2\): no samples"),
    ("rewards_no_columns", npz(rewards=np.zeros((4, 0)), group_ids=G), ShapeError,
     r"'rewards' has shape \(4, 0\): no reward columns"),
    ("reward_component_2d", npz(reward_x=R, group_ids=G), ShapeError, r"'reward_x' has shape \(4, 2\)"),
    ("reward_component_empty", npz(reward_x=np.zeros(0), group_ids=np.zeros(0, int)), ShapeError,
     r"'reward_x' has shape \(0,\): no samples"),
    ("ragged_list_pt", pt({"rewards": [[1.0, 0.0], [1.0]], "group_ids": [0, 0]}), ShapeError,
     r"'rewards' is not a rectangular array"),
    # rewards: dtype
    ("rewards_complex", npz(rewards=R + 1j, group_ids=G), InputDtypeError,
     r"'rewards' holds complex numbers \(dtype complex128\)"),
    ("rewards_complex_pt", pt({"rewards": torch.tensor(R + 1j), "group_ids": torch.tensor(G)}), InputDtypeError,
     r"'rewards' holds complex numbers"),
    ("rewards_bool", npz(rewards=R > 0, group_ids=G), InputDtypeError, r"'rewards' holds booleans \(dtype bool\)"),
    ("rewards_text", npz(rewards=R.astype(str), group_ids=G), InputDtypeError, r"'rewards' holds text"),
    ("rewards_object", npz(rewards=R.astype(object), group_ids=G), InputDtypeError,
     r"'rewards' holds Python objects \(dtype object\)"),
    ("reward_component_bool", npz(reward_x=R[:, 0] > 0, reward_y=R[:, 1], group_ids=G), InputDtypeError,
     r"'reward_x' holds booleans"),
    ("rewards_dict_pt", pt({"rewards": {"acc": torch.tensor(R[:, 0])}, "group_ids": torch.tensor(G)}), None,
     r"'rewards' is a dict \(keys \['acc'\]\), not an array"),
    ("rewards_sparse_pt", sparse_pt(), None, r"'rewards' is a torch.sparse_coo tensor"),
    # rewards: values float64 cannot hold
    ("rewards_int_inexact", npz(rewards=np.array([[1, 0], [0, 0], [1, BIG], [0, 1]]), group_ids=G),
     OutOfRangeError, rf"'rewards' row 2 \(0-based\), column 'r1': {BIG} is not exactly a float64 "
                      r"\(the nearest is 9007199254740992.0\)"),
    ("rewards_uint64_inexact", npz(reward_x=np.array([0, 1, 2**64 - 1, 3], np.uint64), group_ids=G),
     OutOfRangeError, rf"'reward_x' row 2 \(0-based\): {2**64 - 1} is not exactly a float64"),
    pytest.param("rewards_longdouble", npz(rewards=R.astype(np.longdouble) + np.longdouble(2) ** -60, group_ids=G),
                 OutOfRangeError, r"'rewards' row 0 \(0-based\), column 'r0': .* is not exactly a float64",
                 marks=pytest.mark.skipif(not LONG_DOUBLE, reason="long double is float64 here")),
    # both layouts, names
    ("rewards_and_components", npz(rewards=R, reward_x=R[:, 0], group_ids=G), None,
     r"both a 'rewards' array and per-component arrays \['reward_x'\]"),
    ("names_wrong_length", npz(rewards=R, group_ids=G, names=np.array(["a"])), ShapeError,
     r"'names' has shape \(1,\); expected one name per reward column, shape \(2,\)"),
    ("names_2d", npz(rewards=R, group_ids=G, names=np.array([["a", "b"]])), ShapeError, r"'names' has shape \(1, 2\)"),
    ("names_numbers", npz(rewards=R, group_ids=G, names=np.array([0, 1])), None, r"'names' holds .* not text"),
    ("names_repeated", npz(rewards=R, group_ids=G, names=np.array(["a", "a"])), None, r"'names' repeats \['a'\]"),
    ("names_with_components", npz(reward_x=R[:, 0], group_ids=G, names=np.array(["y"])), None,
     r"a 'names' array goes with 'rewards'"),
    ("names_object", npz(rewards=R, group_ids=G, names=np.array(["a", 1], dtype=object)), None,
     r"'names' holds Python objects"),
    # group and unit labels
    ("group_ids_2d", npz(rewards=R, group_ids=G.reshape(2, 2)), GroupError,
     r"'group_ids' has shape \(2, 2\); expected one label per sample, shape \(4,\)"),
    ("group_ids_column", npz(rewards=R, group_ids=G[:, None]), ShapeError, r"'group_ids' has shape \(4, 1\)"),
    ("group_ids_nan", npz(rewards=R, group_ids=np.array([0.0, 0.0, np.nan, 1.0])), GroupError,
     r"'group_ids' row 2 \(0-based\): nan is not an integer label"),
    ("group_ids_inf", npz(rewards=R, group_ids=np.array([0.0, 0.0, 1.0, np.inf])), GroupError,
     r"'group_ids' row 3 \(0-based\): inf is not an integer label"),
    ("group_ids_bool", npz(rewards=R, group_ids=G > 0), GroupError, r"'group_ids' holds booleans"),
    ("group_ids_complex", npz(rewards=R, group_ids=G + 0j), GroupError, r"'group_ids' holds complex numbers"),
    ("group_ids_uint64_overflow", npz(rewards=R, group_ids=np.array([0, 0, 2**64 - 1, 2**64 - 1], np.uint64)),
     GroupError, rf"'group_ids' row 2 \(0-based\): {2**64 - 1} is not an integer label"),
    ("unit_ids_2d", npz(rewards=R, group_ids=G, unit_ids=G.reshape(2, 2)), SegmentError,
     r"'unit_ids' has shape \(2, 2\)"),
    ("unit_ids_float", npz(rewards=R, group_ids=G, unit_ids=np.array([0.0, 0.5, 1.0, 1.0])), SegmentError,
     r"'unit_ids' row 1 \(0-based\): 0.5 is not an integer label"),
    # weights
    ("weights_wrong_length", npz(rewards=R, group_ids=G, weights=np.ones(3)), WeightError,
     r"'weights' has shape \(3,\); expected one weight per reward column \['r0', 'r1'\], shape \(2,\)"),
    ("weights_2d", npz(rewards=R, group_ids=G, weights=np.ones((1, 2))), ShapeError, r"'weights' has shape \(1, 2\)"),
    ("weights_0d", npz(rewards=R[:, :1], group_ids=G, weights=np.float64(2.0)), WeightError,
     r"'weights' has shape \(\)"),
    ("weights_complex", npz(rewards=R, group_ids=G, weights=np.array([1.0, 1j])), WeightError,
     r"'weights' holds complex numbers"),
    ("weights_text", npz(rewards=R, group_ids=G, weights=np.array(["1", "2"])), WeightError, r"'weights' holds text"),
    ("weights_int_inexact", npz(rewards=R, group_ids=G, weights=np.array([1, BIG])), WeightError,
     rf"'weights' entry 1 \(0-based, 'r1'\): {BIG} is not exactly a float64"),
    # containers
    ("pt_int_key", pt({"rewards": torch.tensor(R), "group_ids": torch.tensor(G), 3: torch.tensor(1.0)}), None,
     r"keys must be array names \(strings\), found 3"),
    ("npz_bare_array", ("npz", bare_npy), None, r"one bare array \(np.save\), not an archive of named arrays"),
    # CSV
    ("csv_not_a_number", text("csv", "group,acc\n0,1\n0,x\n"), InputDtypeError,
     r"line 3, column 'acc': 'x' is not a number"),
    ("csv_no_group", text("csv", "acc,fmt\n1,2\n"), GroupError, r"must name a 'group' column"),
    ("csv_short_row", text("csv", "group,acc,fmt\n0,1,2\n0,1\n"), ShapeError, r"line 3 has 2 fields, the header 3$"),
    ("csv_float_label", text("csv", "group,acc\n0.5,1\n1,2\n"), GroupError,
     r"line 2, column 'group': '0.5' is not an integer label"),
    ("csv_duplicate_column", text("csv", "group,acc,acc\n0,1,0\n0,0,1\n"), None,
     r"the header names \['acc'\] more than once"),
    ("csv_pandas_index", text("csv", ",group,acc\n0,0,1\n1,0,0\n"), ShapeError,
     r"column 1 of the header has no name .*to_csv\(\.\.\., index=False\)"),
    ("csv_not_utf8", text("csv", b"group,acc\n0,\xff\n0,1\n"), None, r"not UTF-8 text"),
    ("csv_int_inexact", text("csv", f"group,acc\n0,1\n0,{BIG}\n"), OutOfRangeError,
     rf"line 3, column 'acc': {BIG} is not exactly a float64"),
    ("csv_unit_label", text("csv", "group,unit,acc\n0,0,1\n0,x,0\n"), SegmentError,
     r"line 3, column 'unit': 'x' is not an integer label"),
    # JSONL
    ("jsonl_not_json", jsonl({"group": 0, "rewards": [1]}, '{"group": 0, "rewards": [1'), None,
     r"line 2 is not JSON: Expecting ',' delimiter \(column 27\)"),
    ("jsonl_other_keys", jsonl({"group": 0, "rewards": {"a": 1}}, {"group": 0, "rewards": {"b": 1}}), ShapeError,
     r"line 2 has reward keys \['b'\], expected \['a'\]"),
    ("unknown_suffix", text("txt", "hello"), None, r"unknown format '.txt'"),
    ("jsonl_record_not_object", jsonl([1, 2], {"group": 0, "rewards": [1]}), None,
     r"line 1 needs 'group' and 'rewards' \(it is a JSON array\)"),
    ("jsonl_rewards_number", jsonl({"group": 0, "rewards": 5}, {"group": 0, "rewards": 6}), InputDtypeError,
     r"line 1: 'rewards' is a JSON number"),
    ("jsonl_rewards_empty", jsonl({"group": 0, "rewards": []}, {"group": 0, "rewards": []}), ShapeError,
     r"line 1 has no rewards"),
    ("jsonl_mixed_layouts", jsonl({"group": 0, "rewards": {"a": 1, "b": 0}}, {"group": 0, "rewards": [0, 1]}), None,
     r"line 2 gives 'rewards' as a JSON array, line 1 as a JSON object"),
    ("jsonl_bool_reward", jsonl({"group": 0, "rewards": [1.0]}, {"group": 0, "rewards": [True]}), InputDtypeError,
     r"line 2, column 'r0': True is not a number \(a JSON boolean\)"),
    ("jsonl_string_reward", jsonl({"group": 0, "rewards": {"a": "1.5"}}, {"group": 0, "rewards": {"a": 1}}),
     InputDtypeError, r"line 1, column 'a': '1.5' is not a number \(a JSON string\)"),
    ("jsonl_huge_int_reward", jsonl({"group": 0, "rewards": [1]}, '{"group": 0, "rewards": [1' + "0" * 400 + "]}"),
     OutOfRangeError, r"line 2, column 'r0': 10{19}\.\.\.0{8} \(401 characters\) is not exactly a float64 "
     r"\(the nearest is inf\)$"),
    ("jsonl_int_inexact_reward", jsonl({"group": 0, "rewards": [1]}, {"group": 0, "rewards": [BIG]}),
     OutOfRangeError, rf"line 2, column 'r0': {BIG} is not exactly a float64"),
    ("jsonl_bool_group", jsonl({"group": True, "rewards": [1]}, {"group": True, "rewards": [0]}), GroupError,
     r"line 1, column 'group': True is not an integer or text label \(a JSON boolean\)"),
    ("jsonl_float_group", jsonl({"group": 0.5, "rewards": [1]}, {"group": 0.5, "rewards": [0]}), GroupError,
     r"line 1, column 'group': 0.5 is not an integer label \(a label is an integer, or text"),
    ("jsonl_unit_missing_first", jsonl({"group": 0, "rewards": [1]}, {"group": 0, "unit": 0, "rewards": [0]}),
     SegmentError, r"line 1 has no 'unit' but line 2 has one"),
]


def _case_id(c):
    return c.values[0] if hasattr(c, "values") else c[0]


@pytest.mark.parametrize("name,writer,spec_class,pattern", CASES, ids=[_case_id(c) for c in CASES])
def test_malformed_file_is_refused_cleanly(tmp_path, capsys, name, writer, spec_class, pattern):
    suffix, write = writer
    p = tmp_path / f"{name}.{suffix}"
    write(p)
    with pytest.raises(audit.AuditInputError, match=pattern) as info:
        audit.read_batch(p)
    if spec_class is not None:
        assert isinstance(info.value, spec_class)
    assert cli.main(["audit", str(p)]) == audit.NOT_AUDITED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gdpo audit: {p}: "), err


def test_npz_messages_are_not_wrapped_twice(tmp_path):
    """A refusal from inside an .npz reads as itself, not as 'not a readable .npz file (...)'."""
    p = tmp_path / "b.npz"
    np.savez(p, rewards=R, group_ids=G[:3])
    with pytest.raises(audit.AuditInputError) as info:
        audit.read_batch(p)
    assert str(info.value) == f"{p}: 'group_ids' has 3 entries for 4 samples"
    assert isinstance(info.value, GroupError) and isinstance(info.value, ShapeError)


def test_directory_is_refused(tmp_path, capsys):
    d = tmp_path / "batch.csv"
    d.mkdir()
    with pytest.raises(audit.AuditInputError, match="a directory, not a file"):
        audit.read_batch(d)
    assert cli.main(["audit", str(d)]) == audit.NOT_AUDITED


def test_weights_given_of_the_wrong_length_or_kind(tmp_path, capsys):
    b = audit.read_batch(_ok_npz(tmp_path))
    with pytest.raises(audit.AuditInputError, match=r"--weights has shape \(3,\)") as info:
        audit.audit(b, weights=[1.0, 2.0, 3.0])
    assert isinstance(info.value, WeightError) and isinstance(info.value, ShapeError)
    with pytest.raises(WeightError, match="holds complex numbers"):
        audit.audit(b, weights=[1.0, 1j])


def test_file_weights_are_checked_even_when_overridden(tmp_path, capsys):
    p = tmp_path / "w.npz"
    np.savez(p, rewards=R, group_ids=G, weights=np.ones(3))
    assert cli.main(["audit", str(p), "--weights", "1", "2"]) == audit.NOT_AUDITED
    assert "'weights' has shape (3,)" in capsys.readouterr().err


def _ok_npz(tmp_path):
    p = tmp_path / "ok.npz"
    np.savez(p, rewards=R, group_ids=G)
    return p


# ----------------------------------------------------------- near misses that are read, exactly


def _groups(p):
    return sorted(g["group"] for g in audit.audit(audit.read_batch(p))["groups"])


@pytest.mark.parametrize("fmt", ["npz", "csv", "jsonl"])
def test_large_integer_labels_stay_distinct(tmp_path, fmt):
    """2**53 and 2**53 + 1 are two groups (read through float64, they merged into one)."""
    a, b = 2**53, 2**53 + 1
    p = tmp_path / f"big.{fmt}"
    if fmt == "npz":
        np.savez(p, rewards=R, group_ids=np.array([a, a, b, b]))
    elif fmt == "csv":
        p.write_text("group,acc,fmt\n" + "\n".join(f"{g},{r[0]},{r[1]}" for g, r in zip([a, a, b, b], R.tolist())))
    else:
        p.write_text("\n".join(json.dumps({"group": g, "rewards": r}) for g, r in zip([a, a, b, b], R.tolist())))
    assert _groups(p) == [a, b]


def test_pt_tensors_torch_can_dump_are_read(tmp_path):
    """bfloat16 (widened exactly) and tensors that require grad are read, not a traceback."""
    p = tmp_path / "bf16.pt"
    torch.save({"rewards": torch.tensor(R, dtype=torch.bfloat16), "group_ids": torch.tensor(G)}, p)
    assert np.array_equal(audit.read_batch(p).rewards, R)
    q = tmp_path / "grad.pt"
    torch.save({"rewards": torch.tensor(R, requires_grad=True), "group_ids": torch.tensor(G)}, q)
    assert np.array_equal(audit.read_batch(q).rewards, R)


def test_exact_integers_are_read(tmp_path):
    p = tmp_path / "ints.npz"
    big = 2**60  # beyond 2**53, but float64 holds it exactly
    np.savez(p, rewards=np.array([[1, big], [0, 0], [1, 1], [0, 1]]), group_ids=np.array([0, 0, 1, 1]),
             unit_ids=np.zeros(4, np.uint8), weights=np.array([1, 2]))
    b = audit.read_batch(p)
    assert b.rewards[0, 1] == float(big) and b.group_ids.dtype == np.int64 and b.weights.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("fmt", ["npz", "pt", "jsonl", "csv"])
def test_float_labels_are_refused_as_impl_and_the_oracle_refuse_them(tmp_path, fmt):
    """Issue 18: audit read whole-number float labels [0., 0., 1., 1.] that impl.gdpo refuses by
    their dtype (and the oracle too): one rule, spec section 6 (GroupError), in every format."""
    import torch

    from impl import gdpo
    from oracle import gdpo as og
    from spec.errors import GDPOError

    labels = [0.0, 0.0, 1.0, 1.0]
    p = tmp_path / f"b.{fmt}"
    if fmt == "npz":
        np.savez(p, rewards=R, group_ids=np.array(labels))
    elif fmt == "pt":
        torch.save({"rewards": torch.tensor(R), "group_ids": torch.tensor(labels)}, p)
    elif fmt == "jsonl":
        p.write_text("".join(json.dumps({"group": g, "rewards": list(r)}) + "\n" for g, r in zip(labels, R.tolist())))
    else:
        p.write_text("group,r0,r1\n" + "".join(f"{g},{r[0]},{r[1]}\n" for g, r in zip(labels, R.tolist())))
    with pytest.raises(GroupError, match=r"float"):
        audit.read_batch(p)
    for ids in (labels, torch.tensor(labels), np.array(labels)):
        with pytest.raises(GroupError, match=r"float"):
            gdpo.gdpo_advantages(torch.tensor(R), group_ids=ids)
        with pytest.raises(GDPOError, match=r"integers"):
            og.gdpo_advantages(R, ids)


def test_an_empty_cell_and_a_json_null_are_rewards_not_scored(tmp_path):
    """pandas writes NaN as an empty cell (and JSON as null): read as NaN, so --missing unscored
    takes them and the default refuses them as NaN rewards, naming the line (they were 'not a number')."""
    c = tmp_path / "blank.csv"
    c.write_text("group,acc,fmt\n0,1,0.5\n0,,0.25\n1,0,1\n1,1,0\n")
    j = tmp_path / "null.jsonl"
    j.write_text("".join(json.dumps({"group": g, "rewards": {"acc": a, "fmt": 1.0}}) + "\n"
                         for g, a in ((0, 1.0), (0, None), (1, 0.0), (1, 1.0))))
    for p in (c, j):
        assert np.isnan(audit.read_batch(p).rewards[1, 0]), p
        assert cli.main(["audit", str(p), "--missing", "unscored"]) in (0, 1)


def test_csv_with_a_byte_order_mark_is_read(tmp_path):
    p = tmp_path / "bom.csv"
    p.write_bytes("\ufeffgroup,acc\n0,1\n0,0\n".encode())
    assert audit.read_batch(p).names == ["acc"]


def test_text_group_labels_are_groups_in_every_format(tmp_path):
    """Issue 19: string uids (text group_ids in .npz, JSON strings in .jsonl) are one group per
    distinct text, as the adapters take them; a non-integral number is still no label."""
    r = np.array([[1.0], [0.0], [1.0], [0.5]])
    p = tmp_path / "t.npz"
    np.savez(p, rewards=r, group_ids=np.array(["b", "b", "a", "a"]))
    q = tmp_path / "t.jsonl"
    q.write_text("".join(json.dumps({"group": g, "rewards": [float(v)]}) + "\n" for g, v in zip("bbaa", r[:, 0])))
    for path in (p, q):
        batch = audit.read_batch(path)
        assert [batch.group_label(g) for g in batch.group_ids] == ["b", "b", "a", "a"], path


@pytest.mark.parametrize("records, said", [
    ([1, 1.0, 2, 2], r"line 2, column 'group': 1.0 is a float, not an integer label"),
    ([1, True, 2, 2], r"line 2, column 'group': True is not an integer or text label \(a JSON boolean\)"),
], ids=["float_after_int", "bool_after_int"])
def test_a_json_float_or_bool_label_is_refused_after_an_equal_integer(tmp_path, records, said):
    """Found by review: 1.0 and true hash as 1, so after a label 1 they joined group 1 silently."""
    p = tmp_path / "b.jsonl"
    p.write_text("".join(json.dumps({"group": g, "rewards": [float(i % 2)]}) + "\n" for i, g in enumerate(records)))
    with pytest.raises(GroupError, match=said):
        audit.read_batch(p)


def test_json_integer_and_its_text_are_one_group(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text("".join(json.dumps({"group": g, "rewards": [float(v)]}) + "\n"
                         for g, v in zip([1, "1", "u", "u"], [0, 1, 0, 1])))
    b = audit.read_batch(p)
    assert b.group_names == ["1", "u"] and b.group_ids.tolist() == [0, 0, 1, 1]


def test_json_rewards_that_are_arrays_are_refused_by_row(tmp_path):
    """Found by review: one-element arrays as reward values read as a (N, 1, 1) batch and crashed."""
    p = tmp_path / "n.jsonl"
    p.write_text("".join(json.dumps({"group": 0, "rewards": {"a": [1.0]}}) + "\n" for _ in range(4)))
    with pytest.raises(audit.AuditDtypeError, match=r"line 1, column 'a': \[1.0\] is not a number \(a JSON array\)"):
        audit.read_batch(p)


# ------------------------------------------- every refusal: "could not audit", in the code and the JSON


def _link(target):
    return lambda p: p.symlink_to(target)


#: Refused by the audit itself, not the reader: (id, (suffix, writer), extra arguments).
REFUSED_LATER = [
    ("nan_reward", npz(rewards=np.where(R == 1.0, np.nan, R), group_ids=G), []),
    ("inf_reward_unscored", text("csv", "group,a\n0,1\n0,inf\n1,0\n1,nan\n"), ["--missing", "unscored"]),
    ("group_of_one", text("csv", "group,a\n0,1\n0,0\n7,1\n"), []),
    ("eq7_overflow", npz(rewards=np.repeat([[1.0], [0.0]], 3, axis=1)[[0, 1, 0, 1]], group_ids=G,
                         weights=np.full(3, 1e308)), []),
    ("weights_given_wrong_length", npz(rewards=R, group_ids=G), ["--weights", "1", "2", "3"]),
    ("file_weights_wrong_when_overridden", npz(rewards=R, group_ids=G, weights=np.ones(3)), ["--weights", "1", "2"]),
    ("group_ids_short", npz(rewards=R, group_ids=G[:3]), []),
    ("directory", ("csv", lambda p: p.mkdir()), []),
    ("no_such_file", ("csv", lambda p: None), []),
    # issue 45
    ("meta_tensor_pt", pt({"rewards": torch.empty(4, 2, device="meta"), "group_ids": torch.tensor(G)}), []),
    ("dev_zero_jsonl", ("jsonl", _link("/dev/zero")), []),
    ("dev_zero_csv", ("csv", _link("/dev/zero")), []),
    ("dev_zero_npz", ("npz", _link("/dev/zero")), []),
    ("dev_zero_pt", ("pt", _link("/dev/zero")), []),
    ("long_line_jsonl", text("jsonl", '{"group": 0, "rewards": [1], "x": "' + "y" * (1 << 20) + '"}\n'), []),
    ("unsafe_pt", pt({"rewards": torch.tensor(R), "group_ids": torch.tensor(G), "note": object()}), []),
    ("masked_array_pt", pt({"rewards": np.ma.array(R, mask=R > 0), "group_ids": G}), ["--missing", "unscored"]),
    ("not_a_pickle_pt", text("pt", b"\x00\x01garbage"), []),
    ("not_a_zip_npz", text("npz", b"garbage\n"), []),
]
UNAUDITABLE = [pytest.param(*c.values[:2], [], marks=c.marks, id=c.values[0]) if hasattr(c, "values") else
               pytest.param(*c[:2], [], id=c[0]) for c in CASES] + [pytest.param(*c, id=c[0]) for c in REFUSED_LATER]


@pytest.mark.parametrize("name,writer,args", UNAUDITABLE)
def test_every_refusal_says_could_not_audit_in_the_exit_code_and_the_json(tmp_path, capsys, name, writer, args):
    """Issue 45: a crash exited 1, the code of "warnings", and wrote no JSON. Every input the
    audit refuses exits NOT_AUDITED with a JSON error object and one short line on stderr
    (no torch advice, no 400-digit values)."""
    suffix, write = writer
    p = tmp_path / f"{name}.{suffix}"
    write(p)
    assert cli.main(["audit", str(p), *args, "--json"]) == audit.NOT_AUDITED == 2
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert (report["status"], report["status_text"], report["error"]["code"]) == (2, "could not audit",
                                                                                 "malformed-input"), report
    assert report["error"]["message"].startswith(f"{p}: ")
    assert err.splitlines() == [f"gdpo audit: {report['error']['message']}"], err
    assert len(err) < 400 and "\x1b" not in err and "weights_only" not in err, err


@pytest.mark.parametrize("error", [RuntimeError("boom"), MemoryError(), NotImplementedError()],
                         ids=lambda e: type(e).__name__)
def test_an_internal_error_is_could_not_audit_never_warnings(tmp_path, capsys, monkeypatch, error):
    from gdpo_tools.audit import report

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(report, "audit", fail)
    p = _ok_npz(tmp_path)
    assert cli.main(["audit", str(p), "--json"]) == audit.NOT_AUDITED
    out, err = capsys.readouterr()
    said = json.loads(out)["error"]
    assert said["code"] == "internal-error" and said["class"] == type(error).__name__
    assert said["message"].startswith(f"{p}: gdpo audit failed, an internal error ({type(error).__name__}")
    assert err.startswith("Traceback") and err.endswith(f"gdpo audit: {said['message']}\n")


def test_an_audit_that_cannot_be_imported_is_could_not_audit(tmp_path, capsys, monkeypatch):
    """A broken install (torch missing here) exits 2 too, not 1 from a traceback."""
    import sys

    import gdpo_tools

    monkeypatch.delattr(gdpo_tools, "audit")
    for name in [m for m in sys.modules if m.startswith("gdpo_tools.audit")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "torch", None)
    p = _ok_npz(tmp_path)
    assert cli.main(["audit", str(p), "--json"]) == 2
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["error"]["code"] == "internal-error" and err.startswith("gdpo audit: could not audit")
    # the fields of every other refusal (gdpo_tools.audit.report.error_json), schema and source included
    monkeypatch.undo()
    from gdpo_tools.audit.report import error_json

    expected = error_json(str(p), ImportError("x"), "x")
    assert report.keys() == expected.keys() and report["error"].keys() == expected["error"].keys()
    assert (report["schema"], report["source"]) == (expected["schema"], str(p))


def test_an_npz_that_is_not_a_zip_is_named_so(tmp_path):
    """NumPy answers a file that is neither a zip archive nor an .npy with advice about pickles."""
    p = tmp_path / "x.npz"
    p.write_bytes(b"garbage\n")
    with pytest.raises(audit.AuditInputError, match=r"x\.npz: not a readable \.npz file \(not a zip archive") as e:
        audit.read_batch(p)
    assert "pickle" not in str(e.value)


def test_an_unsafe_pt_is_refused_in_one_line(tmp_path):
    p = tmp_path / "b.pt"
    torch.save({"rewards": torch.tensor(R), "group_ids": torch.tensor(G), "note": object()}, p)
    with pytest.raises(audit.AuditInputError) as info:
        audit.read_batch(p)
    assert str(info.value) == (f"{p}: refused: it holds a Python object (object) that only an unsafe load would "
                               "build (one that can run code); save a dict of tensors")


def test_a_bad_eps_is_named_as_the_option(tmp_path):
    """``--eps -1`` is the command line's fault, not the file's: the refusal names the option."""
    b = audit.read_batch(_ok_npz(tmp_path))
    with pytest.raises(OutOfRangeError, match=r"^--eps -1.0: eps must be finite and >= 0$"):
        audit.audit(b, eps=-1.0)


def test_eps_0_with_a_constant_column_warns_nothing_and_says_why(tmp_path):
    """``--eps 0`` on a group whose column is constant printed NumPy's "divide by zero" twice, and
    its ill-conditioned finding's advice spoke only of offsets and cancelling columns."""
    p = tmp_path / "eps0.npz"
    np.savez(p, rewards=np.array([[1.0, 0.0], [1.0, 0.1], [1.0, 0.2], [0.0, 1.0], [1.0, 1.1], [0.0, 1.2]]),
             group_ids=np.array([0, 0, 0, 1, 1, 1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = audit.audit(audit.read_batch(p), eps=0.0)
    codes = {f["code"] for g in report["groups"] for f in g["findings"]}
    assert "ill-conditioned" in codes and "with eps 0" in audit.KINDS["ill-conditioned"].advice, codes
