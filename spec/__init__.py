"""The numerical specification of GDPO (arXiv 2601.05242) as data that code imports.

Nothing in this package depends on the rest of the project: ``oracle``, ``impl``
and ``conformance`` read their constants, conventions, error classes and error
model from here, so a number is written exactly once.
"""

from spec.constants import (DEFAULT_EPS, DEFAULT_OUT_DTYPE, FLOAT32_MAX, FLOAT32_UNIT_ROUNDOFF, FLOAT64_UNIT_ROUNDOFF,
                            MIN_GROUP_SIZE)
from spec.conventions import CONVENTIONS, Convention, get_convention
from spec.errors import (DistributedError, GDPOError, GroupError, InputDtypeError, NonFiniteError, OutOfRangeError,
                         SegmentError, ShapeError, WeightError)

__all__ = ["DEFAULT_EPS", "DEFAULT_OUT_DTYPE", "FLOAT32_MAX", "FLOAT64_UNIT_ROUNDOFF", "FLOAT32_UNIT_ROUNDOFF",
           "MIN_GROUP_SIZE", "CONVENTIONS", "Convention", "get_convention", "GDPOError", "NonFiniteError",
           "InputDtypeError", "ShapeError", "GroupError", "WeightError", "SegmentError", "OutOfRangeError",
           "DistributedError"]
