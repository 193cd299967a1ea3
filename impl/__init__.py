"""The vetted torch implementation of GDPO advantages (see :mod:`impl.gdpo`)."""

from impl.gdpo import (  # noqa: F401
    DistributedError,
    GDPOError,
    GroupError,
    InputDtypeError,
    NonFiniteError,
    OutOfRangeError,
    SegmentError,
    ShapeError,
    WeightError,
    gdpo_advantages,
    group_has_signal,
    normalize_rewards,
    whiten,
)
