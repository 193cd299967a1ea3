"""What spec/gdpo.md says about the oracle's numbers is what they are, and the generator that
writes those numbers into the hand-edited document catches every one that went stale."""

import dataclasses
import math
import re
from fractions import Fraction

import numpy as np
import pytest

import oracle.gdpo
from gdpo_tools import spec_document as document
from oracle import gdpo
from spec import CONVENTIONS, error_model

COMMITTED = document.OUTPUT.read_text()
#: The document as a reader sees it: the values without their markers.
SPEC = document.VALUE.sub(lambda m: m["text"].strip("\n"), COMMITTED)


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


# ------------------------------------------------------------------ the generator can fail


def test_the_committed_values_are_those_computed_now():
    assert document.main(["--check"]) == 0
    assert document.render(COMMITTED) == COMMITTED and document.stale(COMMITTED) == []
    assert len(document.VALUE.findall(COMMITTED)) >= 50  # a regex that found no value would pass


@pytest.mark.parametrize("change", ["SAFETY", "group_eps"])
def test_a_changed_constant_makes_the_document_stale(change, monkeypatch, capsys):
    """The check's power: a constant moved in code, the committed number not rewritten, fails
    --check and names the value."""
    if change == "SAFETY":
        monkeypatch.setattr(error_model, "SAFETY", error_model.SAFETY * 2)
        name = "safety"
    else:
        monkeypatch.setitem(CONVENTIONS, "spec", dataclasses.replace(CONVENTIONS["spec"], group_eps=1e-5))
        name = "spec.group_eps"
    assert document.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "is stale" in err and f"  {name}: written " in err, err


def test_a_number_edited_by_hand_is_stale_and_prose_is_not():
    edited = COMMITTED.replace("<!-- value:safety -->2.0<", "<!-- value:safety -->2.5<", 1)
    assert edited != COMMITTED and document.stale(edited) == ["safety: written '2.5', computed '2.0'"]
    assert document.render(edited) == COMMITTED
    prose = COMMITTED.replace("This document specifies", "This document states", 1)
    assert prose != COMMITTED and document.render(prose) == prose and document.stale(prose) == []


def test_a_lost_an_unknown_or_a_misplaced_marker_is_an_error():
    m = next(m for m in document.VALUE.finditer(COMMITTED) if m["name"] == "merge_sign_flips")  # shown once
    lost = COMMITTED[:m.start()] + m["text"] + COMMITTED[m.end():]  # the number typed in, unmarked
    with pytest.raises(KeyError, match="shown nowhere"):
        document.render(lost)
    with pytest.raises(KeyError, match="does not compute"):
        document.render(COMMITTED + "\nsee <!-- value:nothing -->1<!-- /value -->\n")
    # a line that begins with a comment starts an HTML block: the paragraph would end there
    with pytest.raises(ValueError, match="begins a line"):
        document.render(COMMITTED.replace("of 8 samples", "of\n<!-- value:merge_sign_flips -->4<!-- /value -->"
                                          " of 8 samples", 1))
