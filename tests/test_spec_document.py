"""What spec/gdpo.md says about the oracle's numbers is what they are."""

import math
import re
from fractions import Fraction

import numpy as np

import oracle.gdpo
from gdpo_tools import spec_document as document
from oracle import gdpo

SPEC = document.OUTPUT.read_text()


def _section(title: str) -> str:
    start = SPEC.index(title)
    end = SPEC.find("\n## ", start + 1)
    return SPEC[start:] if end < 0 else SPEC[start:end]


def _exact_std(values) -> float:
    q = [Fraction(v) for v in values]
    m = sum(q) / len(q)
    return math.sqrt(float(sum((v - m) ** 2 for v in q) / (len(q) - 1)))


def test_one_pass_rows_quote_the_exact_std_of_the_inputs_they_use():
    """Section 8: the float32 rows compute on float32 inputs, so their exact std is of those
    (0.00126 at offset 1e4), not of the float64 roundings (0.00129)."""
    ctx = document.context()
    for key, values in (("exact_std_1000", [1000.0, 1000.01, 1000.02, 1000.03]),
                        ("exact_std_10000", [10000.0, 10000.001, 10000.002, 10000.003])):
        assert ctx[key] == document._g(_exact_std(np.array(values, dtype=np.float32).tolist()), 3)
        assert ctx[key + "_f64"] == document._g(_exact_std(values), 3)
    assert ctx["exact_std_10000"] == "0.00126" and ctx["exact_std_10000_f64"] == "0.00129"
    row = next(line for line in SPEC.splitlines() if line.startswith("| the same on `[10000.0"))
    assert "float32 inputs: 0.00126" in row


def test_cond_is_documented_as_the_first_order_change_it_is():
    """cond is the first-order change itself where cond_sharp (oracle.condition): a group
    of two moves only through eps (|dz/dr_j| = eps / (2 D^2) exactly), and there cond is
    that change to within 2^-19 (plus float64's few ulps in first_order below), where the
    stage-wise bound overstated it by about D / eps."""
    eps = 1e-4
    z = gdpo.standardize_groups(np.array([[0.0], [1.0]]), [0, 0], eps=eps)
    D = 1 / math.sqrt(2) + eps
    first_order = eps * (math.ulp(1.0) + 5e-324) / (2 * D * D)
    assert z.cond_sharp.all() and np.all(np.abs(z.cond / first_order - 1) <= 2.0 ** -19 + 1e-15)
    sec7 = _section("## 7.")
    assert "*upper bound* on the first-order" not in sec7 and "`cond_sharp`" in sec7
    assert "a large one does not show an ill-conditioned one" not in sec7
    assert "a large one an ill-conditioned one" in sec7
    assert "no implementation\ncan be more accurate" not in sec7
    assert "cond_sharp" in oracle.gdpo.__doc__ and "first-order change" in oracle.gdpo.__doc__
    assert "a large one proves nothing" not in oracle.gdpo.__doc__


def test_verl_preset_documents_the_mask_sum_term_it_leaves_out():
    sec9 = _section("## 9.")
    assert "`mask.sum() + 1e-8`" in sec9 and "1e-8 / T" in sec9
    assert np.float32(1.0) + np.float32(1e-8) == np.float32(1.0)  # the no-op the text states


def test_oracle_guarantees_name_the_input_and_tie_rules():
    sec10 = _section("## 10.")
    assert "taken exactly or refused" in sec10 and "rounded to even like any other, never refused" in sec10
    assert re.search(r"from \d+ bits on is tested", sec10)
