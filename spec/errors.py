"""The error contract: every refusal is a subclass of :class:`GDPOError`.

``GDPOError`` derives from ``ValueError`` so that callers who already catch
``ValueError`` around their advantage computation keep working. Each subclass
names one kind of bad input; the message names where (group, column, rank).
"""


class GDPOError(ValueError):
    """Base of every error the specification prescribes."""


class NonFiniteError(GDPOError):
    """A reward or weight is NaN or infinite (convention ``nan="error"``)."""


class InputDtypeError(GDPOError, TypeError):
    """An integer, bool or complex tensor where real floats are required."""


class ShapeError(GDPOError):
    """Shapes or lengths disagree (rewards vs labels vs weights), or input is empty."""


class GroupError(GDPOError):
    """Malformed group metadata: a group of one, labels not covering the batch,
    a batch that is not a multiple of ``group_size``."""


class WeightError(GDPOError):
    """Weights that are all zero, non-finite, or of the wrong length."""


class SegmentError(GDPOError):
    """Malformed whitening-unit metadata: missing, negative, not summing to the
    local sample count, or a unit count that differs between ranks."""


class OutOfRangeError(GDPOError):
    """A value that cannot be computed or cannot survive the cast to the output
    dtype (for example a float64 reward beyond float32 range)."""


class DistributedError(GDPOError):
    """Raised on every rank together when any rank's input is refused; the message
    names the offending rank(s) and the reason."""


#: Every class of the contract, by short name: tests and docs iterate over this.
ERROR_CLASSES = {
    cls.__name__: cls
    for cls in (
        GDPOError,
        NonFiniteError,
        InputDtypeError,
        ShapeError,
        GroupError,
        WeightError,
        SegmentError,
        OutOfRangeError,
        DistributedError,
    )
}
