"""``python -m conformance.replay``: replay one failing case, as a failure's repro line says::

    python -m conformance.replay --impl M:F --convention C --call-shape S --property P --case '<hex JSON>'

The case (a Case or DistCase, hex JSON) runs under the check of the property P that found it and
prints the same report; exit 0 when it conforms, 1 on a failure.
"""

from __future__ import annotations

import argparse
import math
import sys

from conformance import probes, properties
from conformance.cases import DistCase, loads
from conformance.compare import describe_inputs
from conformance.subject import DEFAULT_IMPL, ImplSpecError, Subject, resolve_impl


def replayed(argv) -> tuple:
    """(the property whose check to run, the Subject, the case) of a repro line's arguments."""
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
    resolve_impl(args.impl)  # a module not found is a usage error, not the code's refusal
    subject = Subject(args.impl, args.call_shape, args.convention, device=args.device, backend=args.backend)
    if args.precision:
        subject.profile = probes.profile(subject)
        subject.precision = args.precision
    return args.property or _default_property(case), subject, case


def main(argv=None) -> int:
    try:
        name, subject, case = replayed(argv)
        properties.CHECKS[name](subject, case, name)
    except AssertionError as e:
        print(e)
        return 1
    except ImplSpecError as e:  # run from another folder than gdpo check was: the module is not found
        print(f"replay: error: {e}", file=sys.stderr)
        return 2
    print(f"[{name}] conforms: {describe_inputs(case, subject.shape)}")
    return 0


def _default_property(case) -> str:
    """The check of a case replayed without --property: an error case (noted ``error:<name>``),
    a malformed call or a non-finite reward goes to the error contract."""
    broken = case.note.startswith("error:")
    if isinstance(case, DistCase):
        return "dist_errors" if broken else "dist_values"
    nonfinite = any(not math.isfinite(v) for row in case.rewards for v in row)
    return "errors" if broken or case.variant or nonfinite else "values"


if __name__ == "__main__":
    sys.exit(main())
