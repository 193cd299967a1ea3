"""The error contract: every refusal is a subclass of :class:`GDPOError`, a ``ValueError``
(callers who catch ``ValueError`` keep working); its message names where (group, column, rank).

Each class's docstring is its "raised when" in spec/gdpo.md section 6, and :data:`ERROR_EXAMPLES`
/ :data:`NOT_RAISED` are its examples there, which tests/test_spec.py runs against impl.gdpo.
"""

import re


class GDPOError(ValueError):
    """Base of every error the specification prescribes."""


class NonFiniteError(GDPOError):
    """A reward (or a value passed to ``whiten``) is NaN or infinite (convention
    ``nan="error"``, the default ``missing="refuse"``), in any column, whatever that
    column's weight (0 included: a zero weight does not make a NaN reward data). Under
    ``missing="unscored"`` a NaN reward is data (its reward function did not score that
    sample: section 2) and only an infinite one is refused. A NaN or infinite *weight* is
    a WeightError, not this."""


class InputDtypeError(GDPOError, TypeError):
    """Rewards (or ``whiten``'s values) of an integer, bool, complex or float8 dtype
    (float8 is an output format only), not a tensor or sequence of real numbers, or a
    sparse or nested tensor. A Python (nested) list or tuple has no dtype: its ints and
    floats are values alike (binary rewards ``[[1], [0], [1], [1]]`` compute), each read
    exactly; a bool in it, or an int that no float64 equals (beyond 2**53), is refused,
    named by row and column (impl, oracle and ``gdpo audit`` alike), while a tensor or
    array of an integer dtype is refused by its dtype. Also an ``out_dtype`` that is not a supported floating dtype;
    an ``eps`` that is not a real number; a ``missing`` other than ``"refuse"`` and
    ``"unscored"``; a ``diagnostics`` that is not an ``impl.gdpo.Diagnostics``; a
    ``process_group`` that is not a torch ProcessGroup (a refusal on that rank alone:
    without a usable group there is nothing to agree over). Also a ``TypeError``."""


class ShapeError(GDPOError):
    """Rewards not (N,) or (N, K) (``whiten``: values not (N,)), an empty batch (without
    a process group), or lengths that disagree: ``group_ids`` not one label per row
    (also a GroupError), ``weights`` not one per reward column (also a WeightError)."""


class GroupError(GDPOError):
    """Malformed group metadata: a group of one sample (a label used once, or
    ``group_size`` 1), N not a multiple of ``group_size``, both or neither of
    ``group_ids`` and ``group_size``, labels that are not integers (a bool among them too:
    torch would read ``[1, True]`` as ``[1, 1]``; float labels, a tensor, an array or a list
    of floats, are refused whatever their values, ``[0.0, 0.0, 1.0, 1.0]`` included, by impl,
    the oracle and ``gdpo audit`` alike: a float label is not a label), or labels not
    covering the batch (wrong length: also a ShapeError)."""


class WeightError(GDPOError):
    """Weights that are all zero, NaN or infinite, of the wrong length (also a
    ShapeError), not a sequence of real numbers, a number float64 cannot hold
    exactly, or one beyond float64's range."""


class SegmentError(GDPOError):
    """Malformed whitening-unit metadata (``segment_sizes``): not a sequence of ints, a
    negative size, sizes not summing to this rank's sample count, or a unit of one
    sample over all ranks (with a process group also a DistributedError). Ranks that
    disagree on the number of units, or give ``segment_sizes`` on some ranks and None
    on others, raise a DistributedError, not this."""


class OutOfRangeError(GDPOError):
    """A value that cannot be computed or cannot survive the cast to the output dtype:
    ``eps`` NaN, infinite or negative; Eq. 7 overflowing float64 (weights too large), or,
    as a permitted refusal, a single term w_k z_k beyond DBL_MAX where c fits;
    a whitened value whose correct rounding overflows ``out_dtype`` (section 7: in
    practice float8 outputs only). impl.gdpo computes rewards anywhere in float64 range:
    a float64 reward beyond float32 range is not an error there. The contract permits
    either answer for such a reward, computed correctly or refused with this class naming
    it, and the conformance suite grades both. The permission is for rewards only:
    ``whiten`` computes every finite float64 value (its values are Eq. 7's float64 c,
    which leave float32's range whenever the weights are large)."""


# --- cases the contract files under two headings (spec/gdpo.md section 6: "also a ...") -----------


class GroupLengthError(GroupError, ShapeError):
    """``group_ids`` of the wrong length: both malformed group metadata
    (labels do not cover the batch) and a length disagreement."""


class WeightLengthError(WeightError, ShapeError):
    """``weights`` of the wrong length: a bad weight vector and a length disagreement."""

class DistributedError(GDPOError):
    """With a process group, raised on every rank together when any rank's input is
    refused, when ranks disagree on what must agree (``segment_sizes`` given or None,
    the number of units, input or output dtype, device type, eps, K, weights, ``missing``), or when
    a collective fails; the message names the offending rank(s) and the reason. Also a
    ProcessGroup that cannot be used (torch.distributed not initialized, this rank not
    a member, the group destroyed): raised on that rank at once. ``group.WORLD`` is None
    before ``init_process_group``, so passing it then runs a local call."""


def flush_modes() -> tuple[bool, bool]:
    """(flush-to-zero, denormals-are-zero): is each on in this thread's floating point? Read
    from two multiplications, where a subnormal input and a subnormal result meet them."""
    import numpy as np

    tiny = np.array([2.0 ** -1074, 2.0 ** -1022])
    with np.errstate(all="ignore"):
        daz = bool((tiny[:1] * 1.0)[0] == 0.0)  # a subnormal input read as 0
        ftz = bool((tiny[1:] * 0.5)[0] == 0.0)  # a subnormal result flushed to 0
    return ftz, daz


def process_state_error(modes: "tuple[bool, bool] | None" = None) -> "GDPOError | None":
    """A GDPOError naming the mode where this thread flushes subnormals to zero (a result: FTZ;
    an input: DAZ), which impl.gdpo and the oracle refuse (spec/gdpo.md section 6); None where
    neither is on. ``modes``: (flush-to-zero, denormals-are-zero) as another rank found them;
    None: this thread's (:func:`flush_modes`)."""
    ftz, daz = flush_modes() if modes is None else modes
    if not (daz or ftz):
        return None
    mode = " and ".join(m for m, on in (("flush-to-zero", ftz), ("denormals-are-zero", daz)) if on)
    return GDPOError(f"this process computes with {mode} on (torch.set_flush_denormal(True), or a library built "
                     "with -ffast-math, sets it): subnormal rewards, weights and intermediates would silently "
                     "become 0, so the exact result cannot be computed; call torch.set_flush_denormal(False) "
                     "first")


#: Every class of the contract, by short name: tests and docs iterate over this.
ERROR_CLASSES = {cls.__name__: cls for cls in (GDPOError, NonFiniteError, InputDtypeError, ShapeError, GroupError,
                                                WeightError, SegmentError, OutOfRangeError, DistributedError)}

#: Ranks of the process group ``group`` that a ranked example (one naming ``group``)
#: runs on; ``rank`` is the caller's rank in it.
EXAMPLE_WORLD = 2

#: Calls that raise each class: Python expressions over ``torch``, the implementation's
#: ``gdpo_advantages`` and ``whiten``, ``nan`` and ``inf``; one naming ``group`` runs on every rank
#: (``rank``) of a gloo group of EXAMPLE_WORLD ranks, each of which must raise the class.
#: GDPOError, the base, is every example's.
ERROR_EXAMPLES: dict[str, tuple[str, ...]] = {
    "GDPOError": (),
    "NonFiniteError": (
        "gdpo_advantages(torch.tensor([[1.0], [nan]]), group_size=2)",
        "gdpo_advantages(torch.tensor([[1.0, nan], [0.0, 0.0]]), group_size=2, weights=[1.0, 0.0])",
        "whiten(torch.tensor([0.0, 1.0, inf]))",
        "gdpo_advantages(torch.tensor([[1.0, nan], [inf, 0.0]]), group_size=2, missing=\"unscored\")",
    ),
    "InputDtypeError": (
        "gdpo_advantages(torch.tensor([[1], [2]]), group_size=2)",
        "gdpo_advantages(torch.tensor([[True], [False]]), group_size=2)",
        "gdpo_advantages([[True], [False]], group_size=2)",
        "gdpo_advantages([[2**53 + 1], [0]], group_size=2)",
        "gdpo_advantages(torch.tensor([[1j], [2j]]), group_size=2)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, out_dtype=torch.int64)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, eps=\"1e-4\")",
        "gdpo_advantages(torch.tensor([[1.0], [nan]]), group_size=2, missing=\"skip\")",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]).to(torch.float8_e4m3fn), group_size=2)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]).to_sparse(), group_size=2)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, process_group=\"world\")",
    ),
    "ShapeError": (
        "gdpo_advantages(torch.zeros(2, 1, 1), group_size=2)",
        "gdpo_advantages(torch.zeros(0, 2), group_size=2)",
        "whiten(torch.zeros(2, 2))",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_ids=torch.tensor([0, 0, 0]))",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, weights=[1.0, 1.0])",
    ),
    "GroupError": (
        "gdpo_advantages(torch.tensor([[1.0], [2.0], [3.0]]), group_ids=torch.tensor([0, 0, 1]))",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=1)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0], [3.0]]), group_size=2)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, group_ids=torch.tensor([0, 0]))",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]))",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_ids=torch.tensor([0.0, 0.0]))",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_ids=[0.0, 0.0])",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_ids=torch.tensor([0, 0, 0]))",
    ),
    "WeightError": (
        "gdpo_advantages(torch.tensor([[1.0, 0.0], [2.0, 1.0]]), group_size=2, weights=[0.0, 0.0])",
        "gdpo_advantages(torch.tensor([[1.0, 0.0], [2.0, 1.0]]), group_size=2, weights=[nan, 1.0])",
        "gdpo_advantages(torch.tensor([[1.0, 0.0], [2.0, 1.0]]), group_size=2, weights=[1.0, inf])",
        "gdpo_advantages(torch.tensor([[1.0, 0.0], [2.0, 1.0]]), group_size=2, weights=[1.0])",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, weights=\"1\")",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, weights=[2**53 + 1])",
    ),
    "SegmentError": (
        "gdpo_advantages(torch.tensor([[1.0], [2.0], [3.0], [4.0]]), group_size=2, segment_sizes=[3])",
        "gdpo_advantages(torch.tensor([[1.0], [2.0], [3.0], [4.0]]), group_size=2, segment_sizes=[5, -1])",
        "gdpo_advantages(torch.tensor([[1.0], [2.0], [3.0], [4.0]]), group_size=2, segment_sizes=[3, 1])",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, segment_sizes=[1, 1] if rank == 0 else [2, 0], "
        "process_group=group)",
    ),
    "OutOfRangeError": (
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, eps=-1e-4)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, eps=nan)",
        "gdpo_advantages(torch.tensor([[1.0, 1.0], [2.0, 2.0]]), group_size=2, weights=[1.5e308, 1.5e308])",
        "gdpo_advantages(torch.cat([torch.ones(1, 1), torch.zeros(300000, 1)]), group_size=300001, "
        "out_dtype=torch.float8_e4m3fn)",
    ),
    "DistributedError": (
        "gdpo_advantages(torch.tensor([[1.0], [nan if rank == 0 else 2.0]]), group_size=2, process_group=group)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, segment_sizes=[2] if rank == 0 else None, "
        "process_group=group)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, segment_sizes=[2] if rank == 0 else [2, 0], "
        "process_group=group)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, weights=[1.0 + rank], process_group=group)",
        "gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, missing=\"unscored\" if rank == 0 else "
        "\"refuse\", process_group=group)",
    ),
}

#: Calls near each class's territory that do *not* raise it: (call, outcome), the
#: outcome the name of the class they raise instead, or ``"computes"``. Rendered and
#: run like ERROR_EXAMPLES.
NOT_RAISED: dict[str, tuple[tuple[str, str], ...]] = {
    "NonFiniteError": (
        ("gdpo_advantages(torch.tensor([[1.0, 0.0], [2.0, 1.0]]), group_size=2, weights=[nan, 1.0])",
         "WeightError"),
        ("gdpo_advantages(torch.tensor([[1.0, nan], [nan, nan], [2.0, 0.0], [0.0, 1.0]]), group_size=2, "
         "missing=\"unscored\")", "computes"),
    ),
    "InputDtypeError": (
        ("gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, out_dtype=torch.float8_e4m3fn)", "computes"),
        ("gdpo_advantages([[1], [0], [1], [1]], group_size=2)", "computes"),
        ("gdpo_advantages([[2**60], [0]], group_size=2)", "computes"),
    ),
    "SegmentError": (
        ("gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, segment_sizes=[2] if rank == 0 else [2, 0], "
         "process_group=group)", "DistributedError"),
    ),
    "OutOfRangeError": (
        ("gdpo_advantages(torch.tensor([[1e300], [0.0]], dtype=torch.float64), group_size=2)", "computes"),
        ("gdpo_advantages(torch.tensor([[1.0], [2.0]]), group_size=2, weights=[1e308])", "computes"),
    ),
}


def example_ranks(call: str) -> int:
    """How many ranks an example runs on: EXAMPLE_WORLD where it names ``group``, else 1."""
    return EXAMPLE_WORLD if re.search(r"\bgroup\b", call) else 1
