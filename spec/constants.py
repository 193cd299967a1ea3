"""Constants of the specification. Every other module imports them from here."""

import math

#: eps of Eq. 4 and Eq. 6 under this project's convention, added to the std.
#: The float64 nearest 1e-4 is the value meant: implementations hold it as a
#: double, so the oracle uses that exact dyadic rational, not the decimal 1/10000.
DEFAULT_EPS: float = 1e-4

#: Eq. 4 needs an unbiased std, which a group of one sample does not have.
MIN_GROUP_SIZE: int = 2

#: The dtype results are cast to once, at the end, unless the caller asks otherwise.
DEFAULT_OUT_DTYPE: str = "float32"

#: Under a process group a refusing rank's own message reaches its peers in one more
#: all-reduce on the refusal path (section 5, item 6): at most this many UTF-8 bytes of it.
REFUSAL_WORDS_BYTES: int = 2048

#: Largest finite float32 (0x1.fffffep+127).
FLOAT32_MAX: float = float.fromhex("0x1.fffffep+127")

#: Unit roundoff u = 2^-53 (float64) and 2^-24 (float32): the relative error
#: of one correctly rounded operation.
FLOAT64_UNIT_ROUNDOFF: float = math.ldexp(1.0, -53)
FLOAT32_UNIT_ROUNDOFF: float = math.ldexp(1.0, -24)
