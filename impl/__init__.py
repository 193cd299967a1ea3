"""The vetted torch implementation of GDPO advantages (see :mod:`impl.gdpo`)."""

from impl.gdpo import (DistributedError, GDPOError, GroupError, InputDtypeError, NonFiniteError,  # noqa: F401
                       OutOfRangeError, SegmentError, ShapeError, WeightError, gdpo_advantages,
                       group_has_signal, normalize_rewards, whiten)
