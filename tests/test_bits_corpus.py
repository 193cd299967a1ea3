"""impl's outputs on a fixed corpus, bit for bit: a permanent regression guard.

Every public entry point of impl.gdpo and impl.adapters runs on a seeded corpus
(random, extreme, collapsed, cancelling, ragged labelled groups, several
segment_sizes, every input and output dtype, two gloo ranks); each outcome (the
output's dtype, shape and raw bytes, or a refusal's class and message) is
recorded as a sha256 digest, with the first values in hex so a failure shows
what moved. The digests live in tests/data/bits_corpus.json. A refactor that
keeps bits passes unchanged; any change of bits fails here.

Regenerate (only when a change of bits is intended, and say so in the commit):

    python3 tests/test_bits_corpus.py --write
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import _dist  # noqa: E402

from impl import adapters, gdpo  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data", "bits_corpus.json")
REGENERATE = "python3 tests/test_bits_corpus.py --write"
HEAD = 4  # values shown in hex per outcome

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
IN_DTYPES = {"f16": F16, "bf16": BF16, "f32": F32, "f64": F64}
OUT_DTYPES = {"f64": F64, "f32": F32, "f16": F16, "bf16": BF16, "e4m3": torch.float8_e4m3fn,
              "e5m2": torch.float8_e5m2}


# --- outcomes as digests ------------------------------------------------------------------------


def _tensor_outcome(t: torch.Tensor) -> dict:
    t = t.detach().to("cpu").contiguous().reshape(-1)
    raw = (t.to(torch.uint8) if t.dtype == torch.bool else t.view(torch.uint8)).numpy().tobytes()
    dtype = str(t.dtype).replace("torch.", "")
    h = hashlib.sha256(f"{dtype}|{t.numel()}|".encode() + raw).hexdigest()
    head = [float(x).hex() for x in t[:HEAD].to(torch.float64).tolist()] if t.dtype != torch.bool \
        else [bool(x) for x in t[:HEAD].tolist()]
    return {"sha256": h, "dtype": dtype, "n": t.numel(), "head": head}


def _error_outcome(exc: BaseException) -> dict:
    mro = [c.__name__ for c in type(exc).__mro__ if c.__module__ != "builtins"]
    msg = str(exc)
    return {"sha256": hashlib.sha256(f"{'/'.join(mro)}|{msg}".encode()).hexdigest(), "error": mro,
            "message": msg[:200]}


def _run_local(thunk) -> dict:
    try:
        out = thunk()
    except Exception as exc:  # noqa: BLE001 - a refusal is an outcome too
        return _error_outcome(exc)
    return _tensor_outcome(out)


# --- the local corpus ------------------------------------------------------------------------------


def _rng(i):
    return np.random.default_rng(20260105 + i)


def _t(a, dtype=F64):
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=dtype)


def _fits(a, dtype) -> bool:
    """Every value finite in ``dtype`` (a set beyond its range would only test the refusal of inf)."""
    return bool(torch.isfinite(_t(a, dtype)).all())


def _reward_sets() -> dict:
    """Named (rewards float64 array, grouping kwargs) pairs."""
    sets = {}
    r = _rng(0)
    sets["random_n16_k3_gs4"] = (r.standard_normal((16, 3)), {"group_size": 4})
    sets["random_n12_k1_gs2"] = (r.standard_normal((12, 1)), {"group_size": 2})
    sets["random_n64_k2_gs8"] = (r.standard_normal((64, 2)) * 10 + 3, {"group_size": 8})
    sets["random_vector_k1"] = (r.standard_normal(12), {"group_size": 3})
    sets["binary_n32_k2_gs8"] = (r.integers(0, 2, (32, 2)).astype(np.float64), {"group_size": 8})
    # extremes (float64): near the float64 limit, tiny, subnormal, ill-conditioned real signal
    sets["huge_f64"] = (np.array([[1.7e308, -1.7e308], [-1.7e308, 1.7e308], [1e308, 0.0], [-1e308, 5.0]]),
                        {"group_size": 2})
    sets["huge_tiny_mix"] = (np.array([[1e300], [1e-300], [-1e300], [5e-324], [0.0], [1e-310], [3e-320], [-2e-310]]),
                             {"group_size": 4})
    sets["subnormal"] = (np.array([[5e-324, 1e-320], [1e-323, 2e-320], [0.0, 3e-320], [-5e-324, 4e-320]]),
                         {"group_size": 4})
    sets["close_real_signal"] = (np.array([[10000.0], [10000.005], [10000.010], [10000.015]]), {"group_size": 4})
    C = 3.0
    d = r.standard_normal(12)
    sets["cancelling_columns"] = (np.stack([C - d, d], axis=1), {"group_size": 4})
    sets["collapsed_columns"] = (np.array([[1.0, 2.0], [1.0, 3.0], [1.0, 4.0], [5.0, 5.0], [5.0, 5.0], [5.0, 5.0]]),
                                 {"group_size": 3})
    sets["all_collapsed"] = (np.full((8, 2), 7.25), {"group_size": 4})
    sets["n2_groups"] = (r.standard_normal((10, 2)) * 1e5, {"group_size": 2})
    # ragged labelled groups, labels in any order
    labels = np.array([3, 3, 1, 1, 1, 7, 7, 7, 7, 2, 2, 9, 9, 9, 9, 9, 9])
    sets["labelled_ragged"] = (r.standard_normal((labels.size, 2)), {"group_ids": r.permutation(labels).tolist()})
    lab2 = np.repeat(np.arange(6), [2, 3, 4, 5, 6, 7])
    sets["labelled_ragged_tensor"] = (r.standard_normal((lab2.size, 3)),
                                      {"group_ids": torch.tensor(r.permutation(lab2))})
    # so ragged that padding exceeds 4x the batch: the bucketed layout
    lab3 = np.concatenate([np.zeros(200, np.int64), np.repeat(np.arange(1, 41), 2)])
    sets["labelled_bucketed"] = (r.standard_normal((lab3.size, 2)), {"group_ids": r.permutation(lab3).tolist()})
    lab4 = np.array([5, 5, 6, 6, 6, 5, 6, 5])
    sets["labelled_collapsed"] = (np.array([[2.0, 1.0], [2.0, 4.0], [1.0, 3.0], [2.0, 3.0], [3.0, 3.0], [2.0, 9.0],
                                            [1.0, 3.0], [2.0, 1.0]]), {"group_ids": lab4.tolist()})
    return sets


def _weight_sets(k: int) -> dict:
    out = {"none": None}
    if k == 2:
        out.update({"half": [1.0, 0.5], "f32_merges": [16777216.0, 16777217.0], "negative": [-1.0, 2.5],
                    "huge": [2.0 ** 1000, 3.0 * 2.0 ** 999], "int": [2, 3], "tensor": torch.tensor([0.25, 4.0])})
    elif k == 3:
        out.update({"mixed": [1.0, 1e-3, 1e3]})
    return out


def local_cases() -> dict:
    """name -> thunk. Names are stable: the data file is keyed by them."""
    cases = {}
    for sname, (r, grouping) in _reward_sets().items():
        k = 1 if r.ndim == 1 else r.shape[1]
        n = r.shape[0]
        for wname, w in _weight_sets(k).items():
            kw = dict(grouping, weights=w)
            cases[f"normalize_rewards/{sname}/w={wname}"] = (
                lambda r=r, kw=kw: gdpo.normalize_rewards(_t(r), **kw))
            cases[f"group_has_signal/{sname}/w={wname}"] = (
                lambda r=r, kw=kw: gdpo.group_has_signal(_t(r), **kw))
            cases[f"gdpo_advantages/{sname}/w={wname}/f64"] = (
                lambda r=r, kw=kw: gdpo.gdpo_advantages(_t(r), **kw, segment_sizes=[r.shape[0]], out_dtype=F64))
        for dname, dt in IN_DTYPES.items():
            if not _fits(r, dt):  # beyond the format's range: the extremes of each format are below
                continue
            for oname, ot in OUT_DTYPES.items():
                cases[f"gdpo_advantages/{sname}/in={dname}/out={oname}"] = (
                    lambda r=r, g=grouping, dt=dt, ot=ot: gdpo.gdpo_advantages(_t(r, dt), **g, out_dtype=ot))
            cases[f"normalize_rewards/{sname}/in={dname}"] = (
                lambda r=r, g=grouping, dt=dt: gdpo.normalize_rewards(_t(r, dt), **g))
        for eps in (0.0, 1e-6, 1e10):
            cases[f"gdpo_advantages/{sname}/eps={eps!r}"] = (
                lambda r=r, g=grouping, eps=eps: gdpo.gdpo_advantages(_t(r), **g, eps=eps, out_dtype=F64))
            cases[f"normalize_rewards/{sname}/eps={eps!r}"] = (
                lambda r=r, g=grouping, eps=eps: gdpo.normalize_rewards(_t(r), **g, eps=eps))
        if "group_size" in grouping and n % 2 == 0 and n >= 8:
            gs = grouping["group_size"]
            for segname, seg in {"halves": [n // 2, n // 2], "empty_first": [0, n - gs, gs],
                                 "per_group": [gs] * (n // gs)}.items():
                cases[f"gdpo_advantages/{sname}/seg={segname}"] = (
                    lambda r=r, g=grouping, seg=seg: gdpo.gdpo_advantages(_t(r), **g, segment_sizes=seg,
                                                                          out_dtype=F64))
        # Python lists and NumPy arrays as rewards
        cases[f"gdpo_advantages/{sname}/list"] = (lambda r=r, g=grouping: gdpo.gdpo_advantages(r.tolist(), **g))
        cases[f"gdpo_advantages/{sname}/numpy"] = (lambda r=r, g=grouping: gdpo.gdpo_advantages(r, **g))

    # each input format's own extremes: its largest finite values, its subnormals, a cancelling pair
    for dname, dt in IN_DTYPES.items():
        fi = torch.finfo(dt)
        big, sub = float(fi.max), float(fi.smallest_normal) * 2.0 ** -(fi.bits // 4)
        ext = {"max": np.array([[big, -big], [-big, big], [big / 2, 0.0], [-big, big / 4]]),
               "subnormal": np.array([[sub, 3 * sub], [2 * sub, 0.0], [0.0, sub], [-sub, 5 * sub]]),
               "cancel": np.array([[big / 2 - 1.0, 1.0], [big / 2 - 2.0, 2.0], [big / 4, big / 4], [0.0, big / 2]])}
        for ename, r in ext.items():
            r = np.asarray(torch.tensor(r, dtype=dt).to(F64))  # exact in the format
            for oname, ot in OUT_DTYPES.items():
                cases[f"gdpo_advantages/extreme_{ename}/in={dname}/out={oname}"] = (
                    lambda r=r, dt=dt, ot=ot: gdpo.gdpo_advantages(_t(r, dt), group_size=2, out_dtype=ot))
            cases[f"normalize_rewards/extreme_{ename}/in={dname}"] = (
                lambda r=r, dt=dt: gdpo.normalize_rewards(_t(r, dt), group_size=2))
            cases[f"whiten/extreme_{ename}/in={dname}"] = (
                lambda r=r, dt=dt: gdpo.whiten(_t(r[:, 0], dt), out_dtype=F64))

    # whiten alone
    r = _rng(1)
    vsets = {"random": r.standard_normal(20), "huge": np.array([1.7e308, -1.7e308, 1e308, 0.0, -5.0]),
             "tiny": np.array([5e-324, 1e-320, -3e-321, 0.0, 2e-310]), "collapsed": np.full(6, -2.5),
             "close": np.array([10000.0, 10000.005, 10000.010, 10000.015]),
             "big_unit": r.standard_normal(3000) * 1e3, "outlier": np.concatenate([np.zeros(999), [1.0]])}
    for vname, v in vsets.items():
        for dname, dt in IN_DTYPES.items():
            if not _fits(v, dt):
                continue
            for oname, ot in OUT_DTYPES.items():
                cases[f"whiten/{vname}/in={dname}/out={oname}"] = (
                    lambda v=v, dt=dt, ot=ot: gdpo.whiten(_t(v, dt), out_dtype=ot))
        for eps in (0.0, 1e-6, 1e10):
            cases[f"whiten/{vname}/eps={eps!r}"] = (lambda v=v, eps=eps: gdpo.whiten(_t(v), eps=eps, out_dtype=F64))
    v = r.standard_normal(24)
    for segname, seg in {"one": [24], "uneven": [3, 10, 11], "empties": [0, 5, 0, 19, 0], "pairs": [2] * 12,
                         "tensor": torch.tensor([12, 12]), "collapsed_unit": [4, 20]}.items():
        vv = v.copy()
        if segname == "collapsed_unit":
            vv[:4] = 1.5
        cases[f"whiten/segments={segname}"] = (
            lambda vv=vv, seg=seg: gdpo.whiten(_t(vv), segment_sizes=seg, out_dtype=F64))
    cases["whiten/empty"] = lambda: gdpo.whiten(torch.zeros(0, dtype=F64))
    cases["whiten/list"] = lambda: gdpo.whiten([1.0, 2.0, 4.0, 8.0], out_dtype=F64)

    # refusals (class and message are part of the contract)
    ok = _rng(2).standard_normal((8, 2))
    refusals = {
        "nan": lambda: gdpo.gdpo_advantages(_t(np.where(np.arange(16).reshape(8, 2) == 5, np.nan, ok)), group_size=4),
        "group_ids_length": lambda: gdpo.normalize_rewards(_t(ok), group_ids=[0, 0, 1, 1]),
        "weights_length": lambda: gdpo.normalize_rewards(_t(ok), group_size=4, weights=[1.0, 2.0, 3.0]),
        "singleton_group": lambda: gdpo.normalize_rewards(_t(ok), group_ids=[0, 0, 0, 1, 1, 1, 1, 2]),
        "group_size_1": lambda: gdpo.normalize_rewards(_t(ok), group_size=1),
        "group_size_3": lambda: gdpo.normalize_rewards(_t(ok), group_size=3),
        "both_groupings": lambda: gdpo.normalize_rewards(_t(ok), group_size=4, group_ids=[0] * 8),
        "zero_weights": lambda: gdpo.normalize_rewards(_t(ok), group_size=4, weights=[0.0, 0.0]),
        "int_rewards": lambda: gdpo.normalize_rewards(torch.ones(8, 2, dtype=torch.int64), group_size=4),
        "bad_eps": lambda: gdpo.whiten(_t([1.0, 2.0]), eps=-1.0),
        "segments_sum": lambda: gdpo.whiten(_t([1.0, 2.0, 3.0]), segment_sizes=[1, 1]),
        "singleton_unit": lambda: gdpo.whiten(_t([1.0, 2.0, 3.0]), segment_sizes=[1, 2]),
        "float8_overflow": lambda: gdpo.whiten(_t(np.concatenate([np.zeros(300000), [1.0]])),
                                               out_dtype=torch.float8_e4m3fn),
        "empty_rewards": lambda: gdpo.gdpo_advantages(torch.zeros(0, 2, dtype=F64), group_size=2),
        "combined_overflow": lambda: gdpo.normalize_rewards(_t(ok), group_size=4, weights=[1.7e308, 1.7e308]),
    }
    for name, thunk in refusals.items():
        cases[f"refusal/{name}"] = thunk

    # adapters
    r = _rng(3)
    rw = r.standard_normal((12, 2))
    cases["trl_advantages/plain"] = lambda: adapters.trl_advantages(_t(rw, F32), 4)
    cases["trl_advantages/weights_f64"] = lambda: adapters.trl_advantages(_t(rw), 3, [1.0, 0.25], out_dtype=F64)
    cases["trl_advantages/segments"] = lambda: adapters.trl_advantages(_t(rw), 4, segment_sizes=[4, 8])
    cases["trl_advantages/refusal_none"] = lambda: adapters.trl_advantages(_t(rw), None)
    cases["trl_advantages/refusal_weights"] = lambda: adapters.trl_advantages(_t(rw), 4, [1.0])
    tok = r.standard_normal((6, 5))
    mask = torch.tensor((r.random((6, 5)) < 0.7) | (np.arange(5) == 0), dtype=torch.float32)
    acc = _t(tok, F32)
    fmt = _t(r.integers(0, 2, (6, 5)), F32)
    cases["verl_advantages/two_keys"] = lambda: adapters.verl_advantages(
        {"acc": acc, "fmt": fmt}, mask, ["a", "a", "b", "b", "b", "a"], weights={"acc": 1.0, "fmt": 0.5})
    cases["verl_advantages/f64_segments"] = lambda: adapters.verl_advantages(
        {"acc": acc.double()}, mask, [0, 0, 1, 1, 2, 2], segment_sizes=[2, 4], out_dtype=F64)
    cases["verl_advantages/refusal_key"] = lambda: adapters.verl_advantages(
        {"acc": acc, "fmt": torch.zeros(6, 4)}, mask, [0, 0, 1, 1, 2, 2])
    lab = ["x", "y", "x", ("t", 1), "y", ("t", 1), "x"]
    comp = {"acc": _t(r.standard_normal(7), F32), "len": _t(r.standard_normal(7) * 100, F64)}
    cases["labelled_advantages/hashable"] = lambda: adapters.labelled_advantages(comp, lab)
    cases["labelled_advantages/weights"] = lambda: adapters.labelled_advantages(
        comp, lab, weights={"len": 0.01, "acc": 1.0}, out_dtype=torch.bfloat16)
    cases["labelled_advantages/refusal_singleton"] = lambda: adapters.labelled_advantages(
        comp, ["x", "y", "x", "z", "y", "x", "x"])
    return cases


# --- the distributed corpus (2 gloo ranks) --------------------------------------------------------


def dist_scenarios() -> list:
    r = _rng(4)
    v0, v1 = r.standard_normal(9), r.standard_normal(14) * 3
    coll = [[2.0, 2.0, 2.0], [2.0, 2.0]]
    rw0, rw1 = r.standard_normal((8, 2)), r.standard_normal((12, 2))
    lab0 = r.permutation([0, 0, 1, 1, 1, 2, 2, 2]).tolist()
    lab1 = r.permutation([5, 5, 5, 5, 6, 6, 7, 7, 7, 8, 8, 8]).tolist()
    plain = [v0.tolist(), v1.tolist()]
    return [
        ("whiten_one_unit", "whiten", {"values": plain}),
        ("whiten_units_uneven", "whiten", {"values": plain, "sizes": [[2, 0, 7], [5, 6, 3]]}),
        ("whiten_f32_out_f16", "whiten", {"values": plain, "dtype": "float32", "out_dtype": "float16"}),
        ("whiten_collapsed", "whiten", {"values": coll, "sizes": [[3], [2]]}),
        ("whiten_empty_shard", "whiten", {"values": [v0.tolist(), []], "sizes": [[4, 5], [0, 0]]}),
        ("whiten_extremes", "whiten", {"values": [[1.7e308, -1.7e308, 0.0], [5e-324, 1e308]]}),
        ("gdpo_group_size", "gdpo", {"rewards": [rw0.tolist(), rw1.tolist()], "group_size": 4,
                                     "sizes": [[4, 4], [8, 4]], "weights": [[1.0, 0.5], [1.0, 0.5]]}),
        ("gdpo_labelled", "gdpo", {"rewards": [rw0.tolist(), rw1.tolist()], "group_ids": [lab0, lab1],
                                   "out_dtype": "float32"}),
        ("gdpo_bf16_in", "gdpo", {"rewards": [rw0.tolist(), rw1.tolist()], "group_size": 2, "dtype": "bfloat16",
                                  "out_dtype": "bfloat16"}),
        ("gdpo_empty_shard", "gdpo", {"rewards": [rw0.tolist(), []], "group_size": 2}),
        ("gdpo_huge_weights", "gdpo", {"rewards": [rw0.tolist(), rw1.tolist()], "group_ids": [lab0, lab1],
                                       "weights": [[2.0 ** 1000, 1.0], [2.0 ** 1000, 1.0]]}),
        ("refusal_units_disagree", "whiten", {"values": plain, "sizes": [[9], [7, 7]]}),
        ("refusal_nan_one_rank", "whiten", {"values": [v0.tolist(), [float("nan")] + v1.tolist()[1:]]}),
        ("adapter_trl", "adapter", {"adapter": "trl_advantages", "args": [
            {"rewards_per_func": ("tensor", rw0.tolist(), "float32"), "num_generations": 4},
            {"rewards_per_func": ("tensor", rw1.tolist(), "float32"), "num_generations": 4}]}),
        ("adapter_labelled", "adapter", {"adapter": "labelled_advantages", "args": [
            {"rewards": {"a": ("tensor", rw0[:, 0].tolist(), "float64")}, "labels": lab0},
            {"rewards": {"a": ("tensor", rw1[:, 0].tolist(), "float64")}, "labels": lab1}]}),
    ]


def _dist_outcome(rec: dict) -> dict:
    if rec["status"] == "ok":
        res = rec["result"]
        text = json.dumps(res, sort_keys=True)
        return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "dtype": res["dtype"],
                "n": len(res["hex"]), "head": res["hex"][:HEAD]}
    mro = [m for m in rec["mro"] if m not in ("Exception", "BaseException", "object")]
    return {"sha256": hashlib.sha256(f"{'/'.join(mro)}|{rec['msg']}".encode()).hexdigest(), "error": mro,
            "message": rec["msg"][:200]}


def dist_outcomes() -> dict:
    run = _dist.run_group(2, dist_scenarios(), group_timeout_s=20.0, deadline_s=150.0)
    out = {}
    for name, _, _ in dist_scenarios():
        for rank, rec in sorted(run.by_rank(name).items()):
            out[f"dist2/{name}/rank{rank}"] = _dist_outcome(rec)
    return out


def compute() -> dict:
    out = {name: _run_local(thunk) for name, thunk in local_cases().items()}
    out.update(dist_outcomes())
    return out


# --- the test ---------------------------------------------------------------------------------------


def _stored() -> dict:
    with open(DATA) as f:
        return json.load(f)["outcomes"]


def _diff(name, want, got) -> str:
    return f"  {name}:\n    stored   {json.dumps(want)}\n    computed {json.dumps(got)}"


def _check(stored: dict, computed: dict):
    missing = sorted(set(stored) - set(computed))
    extra = sorted(set(computed) - set(stored))
    changed = [n for n in stored if n in computed and stored[n] != computed[n]]
    if missing or extra or changed:
        lines = [f"bits of impl changed on {len(changed)} of {len(stored)} corpus outcomes "
                 f"({len(missing)} cases gone, {len(extra)} new); regenerate with `{REGENERATE}` "
                 f"only if the change is intended"]
        lines += [_diff(n, stored[n], computed[n]) for n in changed[:20]]
        lines += [f"  gone: {n}" for n in missing[:10]] + [f"  new: {n}" for n in extra[:10]]
        raise AssertionError("\n".join(lines))


def test_local_corpus_bits_unchanged():
    stored = {k: v for k, v in _stored().items() if not k.startswith("dist2/")}
    computed = {name: _run_local(thunk) for name, thunk in local_cases().items()}
    _check(stored, computed)


@pytest.mark.distributed
def test_distributed_corpus_bits_unchanged():
    stored = {k: v for k, v in _stored().items() if k.startswith("dist2/")}
    _check(stored, dist_outcomes())


def test_corpus_covers_what_it_claims():
    """The corpus is only a guard where it reaches: every entry point, dtype and kind of case."""
    names = list(_stored())
    for entry in ("gdpo_advantages", "normalize_rewards", "whiten", "group_has_signal", "trl_advantages",
                  "verl_advantages", "labelled_advantages", "refusal", "dist2"):
        assert any(n.startswith(entry + "/") for n in names), f"no corpus case for {entry}"
    for d in IN_DTYPES:
        assert any(f"/in={d}/" in n for n in names), f"no corpus case with {d} input"
    for d in OUT_DTYPES:
        assert any(n.endswith(f"/out={d}") for n in names), f"no corpus case with {d} output"
    assert sum("error" in v for v in _stored().values()) >= 10, "too few refusals in the corpus"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}  (rewrites {DATA}; only when a change of impl's bits is intended)")
    outcomes = compute()
    os.makedirs(os.path.dirname(DATA), exist_ok=True)
    with open(DATA, "w") as f:
        json.dump({"about": f"sha256 of impl's outcomes on the corpus of tests/test_bits_corpus.py; "
                            f"regenerate with `{REGENERATE}` only if a change of bits is intended",
                   "outcomes": outcomes}, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {len(outcomes)} outcomes to {DATA}")
