"""``gdpo audit``: read a dumped batch and say what GDPO will do with it, in words, with what to do
about each finding.

Input formats (the reward components, group labels, optional units and weights):

* ``.npz`` / ``.pt`` (a dict saved with ``torch.save``): arrays ``rewards`` (N, K)
  *or* one array per component ``reward_<name>``; ``group_ids`` (N,); optional
  ``unit_ids`` (N,), ``weights`` (K,), ``names`` (K,);
* ``.jsonl``: one object per sample: ``{"group": g, "unit": u (optional),
  "rewards": {"name": value, ...}}`` (or ``"rewards": [values]``);
* ``.csv``: a header with ``group``, optional ``unit``, and one column per component.

Rewards and weights are real numbers (integers must be exact in float64); a file's ``weights``
go with the components in the order the report lists them (with ``reward_<name>`` arrays: sorted
by name). A NaN reward is refused, or, with ``--missing unscored`` (impl.gdpo's
``missing="unscored"``), a reward its function did not score; so is a
masked entry of a NumPy masked array given to :func:`audit`. Group labels are integers or text,
as the adapters take them (verl's string uids). Where every label is an integer (a CSV cell of digits, a JSON or
array integer) the labels are those integers (CSV "1" and "01": one group); otherwise each
distinct text is one group (JSON 1 and "1": one group, "1"; a .npz text array is always text). A
float label is refused whatever its value, as impl.gdpo and the oracle refuse it (spec section
6), and so is a bool. Unit labels are integers. Anything else is refused, never reinterpreted:
rewards of another shape, bool, complex, text or object values, arrays of the wrong shape or
length (labels and weights are 1-D), ``rewards`` together with ``reward_<name>`` arrays. Weights
on the command line (``--weights``) override those in the file. Text files are read in chunks
into arrays (never a Python object per cell), a line of at most 1,048,576 characters (a longer
one is refused), with progress and an estimate of the time left on stderr for files over 2 MB.
Rows are named as the file shows them: a line (1-based) of a .csv or .jsonl, a row (0-based) of
an array.

How it checks: up to 20,000 samples the exact oracle runs everywhere; beyond, where a finding
needs it and on a sample of groups (:mod:`gdpo_tools.audit.run`; ``--exact``: everywhere).

Findings (:data:`gdpo_tools.audit.findings.KINDS`): each has a stable code, a severity, a
sentence with the numbers and what to do. ``routine`` (``collapsed-column``, ``unscored``,
``no-signal``) exit 0; ``warning`` (``exact-cancellation``, ``partial-cancellation``,
``ill-conditioned``, ``eps-dominated``, ``two-samples``, ``float32-range``, ``unit-collapsed``)
exit 1; ``error`` (``impl-disagrees``) exit 3. The text report defines every term it uses.

Exit codes: 0 audited, nothing to warn about; 1 audited, warnings; 2 could not audit: the input
is malformed (the message names the file, the column and the line or row) or the audit failed
(an internal error: a bug to report), never a code of an audited batch; 3 impl.gdpo disagrees
with the oracle beyond the error model (a bug to report).

JSON (``--json``), schema ``gdpo-audit/3``: ``schema``, ``source``, ``samples``,
``groups_total``, ``units_total``, ``components``, ``weights``, ``eps``, ``missing`` ("refuse"
or "unscored"), ``unscored_rewards``, ``rows_without_score``; ``method`` (``exact``,
``groups_checked_by_oracle``, ``units_checked_by_oracle``, ``peers``, ``text``); ``counts``
(code -> how many groups or units have it); ``groups_without_signal``, ``groups_with_warnings``,
``groups_with_routine_findings_only``; ``groups_listed`` ("all", or "with warnings" beyond
10,000 groups, the others counted only) and ``groups``, each ``{group, size, signal, findings,
max_cond_combined, max_cond_combined_sharp, cond_from ("oracle" or "estimate"),
impl_error_over_bound (null where not checked)}``, each finding ``{code, severity, message,
advice, ...facts}`` (``rows``: the file's line or row numbers, as above); ``units``, each
``{unit, size, collapsed, findings, max_cond, max_cond_sharp, impl_error_over_bound}``;
``peers`` (name -> ``{why, note, method, max_abs_difference}``; empty when not computed);
``impl_vs_oracle`` (``max_error_over_bound``, ``groups_checked``); ``status``, ``status_text``.
Where it could not audit: ``{schema, source, status: 2, status_text: "could not audit", error:
{code: "malformed-input" or "internal-error", class, spec_classes, message}}``, with exit code 2
as in text. Non-finite numbers are the strings "inf", "-inf", "nan" (strict JSON).
"""

from gdpo_tools.audit.findings import KINDS  # noqa: F401
from gdpo_tools.audit.read import AuditDtypeError, AuditInputError, Batch, read_batch  # noqa: F401
from gdpo_tools.audit.report import main  # noqa: F401
from gdpo_tools.audit.run import DISAGREE, NOT_AUDITED, OK, SCHEMA, WARN, audit  # noqa: F401
