"""``python -m conformance.replay``: replay one failing case, as a failure's repro line says::

    python -m conformance.replay --impl M:F --convention C --call-shape S --property P --case '<hex JSON>'

The case (a single-process Case or a DistCase, hex JSON) is run under the check of the
property P that found it (``stage_normalize`` judges ``normalize_rewards``'s c, not the
advantages; ``errors`` the refusal the case's note names) and the same report is printed;
exit 0 when it conforms, 1 on a failure. A subject on
another device or rank backend adds ``--device`` / ``--backend``.
"""

from __future__ import annotations

import argparse
import math
import sys

from conformance import probes, properties
from conformance.cases import Case, DistCase, loads
from conformance.compare import describe_inputs
from conformance.subject import DEFAULT_IMPL, Subject


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.replay", description=__doc__.split("\n")[0])
    ap.add_argument("--impl", default=DEFAULT_IMPL)
    ap.add_argument("--convention", default="spec")
    ap.add_argument("--call-shape", default="gdpo")
    ap.add_argument("--device", default="cpu", help="device of the input tensors (default: cpu)")
    ap.add_argument("--backend", default="gloo", help="process-group backend of the spawned ranks (default: gloo)")
    ap.add_argument("--property", default=None, choices=sorted(properties.CHECKS), metavar="PROPERTY",
                    help="property whose check to run, as named in the failure (default: by case kind)")
    ap.add_argument("--precision", default=None, choices=("float32", "float64"),
                    help="judge at this working precision, with the formula the probes tell, as gdpo check does "
                         "(default: the convention's own precision)")
    ap.add_argument("--case", required=True, help="hex JSON of a Case or DistCase")
    args = ap.parse_args(argv)
    case = loads(args.case)
    subject = Subject(args.impl, args.call_shape, args.convention, device=args.device, backend=args.backend)
    if args.precision:  # judged as gdpo check judged it: at that precision, the probes' formula known
        subject.profile = probes.profile(subject)
        subject.precision = args.precision
    name = args.property or _default_property(case)
    check = properties.CHECKS[name]
    try:
        check(subject, case, name)  # the failure then names the property the repro line came from
    except AssertionError as e:
        print(e)
        return 1
    print(f"[{name}] conforms: {describe_inputs(case)}")
    return 0


def _default_property(case) -> str:
    """The check for a case replayed without --property (a repro line older than --property):
    an error case (noted ``error:<name>`` by the suite's generators) goes to the error contract."""
    broken = case.note.startswith("error:")
    if isinstance(case, DistCase):
        return "dist_errors" if broken else "dist_values"
    return "errors" if broken or case.variant or _has_nonfinite(case) else "values"


def _has_nonfinite(case: Case) -> bool:
    return any(not math.isfinite(v) for row in case.rewards for v in row)


if __name__ == "__main__":
    sys.exit(main())
