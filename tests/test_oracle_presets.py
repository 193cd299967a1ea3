"""Each convention preset reproduces a plain float64 evaluation of that peer's formula.

On well-conditioned inputs (distinct values of order one in every group column)
the float64 formula is accurate, so the oracle under the same convention must
agree with it within the error model's bound, including the NaN and singleton
rules, which the inputs below exercise where the convention defines them.
"""

import numpy as np
import pytest

from gdpo_tools.peer_formulas import formula
from oracle import gdpo
from spec import CONVENTIONS


def _batch(seed, conv):
    rng = np.random.default_rng(seed)
    sizes = [4, 3, 5, 2]
    rows = []
    for n in sizes:
        base = rng.permutation(n).astype(float)[:, None] + rng.uniform(0, 0.5, (n, 3))
        rows.append(base)
    r = np.vstack(rows)
    groups = np.repeat(np.arange(len(sizes)), sizes)
    units = np.where(groups < 2, 0, 1)
    tokens = rng.integers(1, 50, size=r.shape[0])
    if conv.singleton != "error":  # a singleton group, handled by the convention's rule
        r = np.vstack([r, [[0.3, 1.5, -2.0]]])
        groups = np.append(groups, 9)
        units = np.append(units, 1)
        tokens = np.append(tokens, 7)
    return r, groups, units, tokens


@pytest.mark.parametrize("name", sorted(CONVENTIONS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_matches_its_float64_formula(name, seed):
    conv = CONVENTIONS[name]
    r, g, u, t = _batch(seed, conv)
    w = [1.0, 0.5, 2.0]
    tc = t if conv.whiten == "per_token" else None
    res = gdpo.gdpo_advantages(r, g, weights=w, unit_ids=u, convention=name, token_counts=tc)
    ref = formula(name, r, g, unit_ids=u, weights=w, token_counts=t)
    err = np.abs(res.float64 - ref)
    assert np.all(err <= res.allowed("float64")), (
        f"{name}: worst |oracle - formula| = {err.max():.3e} at sample {int(err.argmax())}")


@pytest.mark.parametrize("name", ["trl", "nvlabs", "ms_swift", "verl", "nemo_rl", "multireward_grpo"])
def test_preset_nan_rule(name):
    conv = CONVENTIONS[name]
    r, g, u, t = _batch(5, conv)
    r[1, 0] = np.nan
    tc = t if conv.whiten == "per_token" else None
    res = gdpo.gdpo_advantages(r, g, unit_ids=u, convention=name, token_counts=tc)
    ref = formula(name, r, g, unit_ids=u, token_counts=t)
    assert np.array_equal(np.isnan(res.float64), np.isnan(ref)), name
    ok = ~np.isnan(ref)
    assert np.all(np.abs(res.float64[ok] - ref[ok]) <= res.allowed("float64")[ok])
    if conv.nan == "propagate":  # NaN fills the group, then (if Eq. 6 runs) its whole unit
        scope = (g == g[1]) if conv.whiten == "none" else (u == u[1])
        assert np.isnan(res.float64[scope]).all() and not np.isnan(res.float64[~scope]).any()
    else:
        assert not np.isnan(res.float64).any()


def test_spec_refuses_what_peers_accept():
    r, g, u, t = _batch(0, CONVENTIONS["trl"])
    r[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        gdpo.gdpo_advantages(r, g, convention="spec")


def test_unit_collapsed_is_reported_without_batch_whitening_too():
    """Found by review: under a convention with no Eq. 6 (multireward_grpo) the flag read
    False for a unit whose combined values are all exactly 0 (each column constant in its group)."""
    og = gdpo
    res = og.gdpo_advantages([[5e-324, 0.8], [5e-324, 0.8]], [0, 0], weights=[1.0, -1.0], convention="multireward_grpo")
    assert res.combined.exact_zero.all() and res.unit_collapsed.tolist() == [True]
    res = og.gdpo_advantages([[1.0, 0.8], [0.0, 0.8]], [0, 0], weights=[1.0, -1.0], convention="multireward_grpo")
    assert res.unit_collapsed.tolist() == [False]
