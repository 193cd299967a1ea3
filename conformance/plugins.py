"""The implementation under test: how the suite finds it and how it calls it.

Pointing the suite at any implementation, without editing it::

    pytest conformance/ --impl package.module:function [--convention NAME] [--call-shape gdpo|trl]

Defaults: ``--impl impl.gdpo:gdpo_advantages --convention spec --call-shape gdpo``.
``--convention`` names a preset of ``spec/conventions.py``; the oracle computes
that convention's mathematics exactly, so a peer is graded against its own
intended formula (the error contract and the distributed protocol are graded
under ``spec`` only).

Call shapes
-----------
``gdpo`` (this project's API)::

    fn(rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
       process_group=None, eps=..., out_dtype=torch.float32) -> tensor (N,)

  ``rewards`` is a (N, K) tensor of float64/float32/float16/bfloat16; exactly one of
  ``group_ids`` (an int64 tensor of labels, ragged groups) and ``group_size``;
  ``weights`` a list of K Python floats; ``segment_sizes`` a list of ints (this
  rank's consecutive counts per whitening unit); ``eps`` only passed when a
  property varies it; errors are ``spec.errors.GDPOError`` subclasses. If the
  function's module (or the function, as attributes) also has
  ``normalize_rewards(rewards, *, group_ids, group_size, weights, eps)`` (Eq. 4 and
  7, float64 (N,)) and ``whiten(values, *, segment_sizes, process_group, eps,
  out_dtype)`` (Eq. 6), the stage properties test them too.

``trl`` (an (N, K) rewards + group size shape like TRL's ``normalize_then_sum``)::

    fn(rewards, num_generations, reward_weights) -> tensor (N,)

  ``rewards`` a float32 (N, K) tensor, contiguous groups of ``num_generations``
  rows, ``reward_weights`` a float32 (K,) tensor, one whitening unit, float32
  output. Properties this shape cannot express (labels, units, eps, stages,
  out_dtype float64, several ranks) are skipped for it, with that reason.
  ``conformance.plugins:impl_trl_shape`` wraps ``impl.gdpo`` in this shape.
"""

from __future__ import annotations

import dataclasses
import importlib
import math

import numpy as np
import torch

from conformance.cases import Case
from conformance.strategies import Context
from spec.conventions import get_convention
from spec.errors import ERROR_CLASSES

DEFAULT_IMPL = "impl.gdpo:gdpo_advantages"
CALL_SHAPES = ("gdpo", "trl")

TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool,
                "complex64": torch.complex64}


def load(target: str):
    """``package.module:attr[.attr]`` -> the object."""
    if ":" not in target:
        raise ValueError(f"--impl wants package.module:function, got {target!r}")
    mod_name, _, attr = target.partition(":")
    obj = importlib.import_module(mod_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@dataclasses.dataclass
class Outcome:
    """What one call did, in a form that crosses process boundaries."""

    ok: bool
    values: np.ndarray | None = None  # float64 copy of the output (exact)
    dtype: str = ""  # torch dtype name of the output
    shape: tuple = ()
    device: str = ""
    error_type: str = ""
    error_classes: tuple = ()  # names of spec.errors classes the exception is an instance of
    message: str = ""
    seconds: float = 0.0

    @classmethod
    def from_output(cls, out, seconds=0.0) -> "Outcome":
        if not isinstance(out, torch.Tensor):
            return cls(False, error_type="NotATensor", message=f"returned {type(out).__name__}, not a tensor",
                       seconds=seconds)
        t = out.detach()
        vals = t.to("cpu").to(torch.float64).numpy().copy() if t.is_floating_point() else \
            t.to("cpu").numpy().astype(np.float64)
        return cls(True, vals, str(t.dtype).replace("torch.", ""), tuple(t.shape), t.device.type,
                   seconds=seconds)

    @classmethod
    def from_exception(cls, e: BaseException, seconds=0.0) -> "Outcome":
        names = tuple(n for n, c in ERROR_CLASSES.items() if isinstance(e, c))
        return cls(False, error_type=type(e).__name__, error_classes=names, message=str(e)[:2000],
                   seconds=seconds)

    def is_error(self, *classes) -> bool:
        return (not self.ok) and any(c.__name__ in self.error_classes for c in classes)

    def describe(self) -> str:
        if self.ok:
            return f"returned {self.dtype} {self.shape} on {self.device}"
        return f"raised {self.error_type}: {self.message}"


class Subject:
    """The implementation under test behind one call shape."""

    def __init__(self, target: str = DEFAULT_IMPL, shape: str = "gdpo", convention: str = "spec",
                 device: str = "cpu", backend: str = "gloo"):
        if shape not in CALL_SHAPES:
            raise ValueError(f"--call-shape must be one of {CALL_SHAPES}, got {shape!r}")
        self.target = target
        self.shape = shape
        self.convention = get_convention(convention).name
        self.device = device
        self.backend = backend  # of the spawned ranks' process groups
        self._fn = None
        self._stages = None

    def __repr__(self) -> str:
        return f"Subject({self.target!r}, shape={self.shape!r}, convention={self.convention!r})"

    @property
    def fn(self):
        if self._fn is None:
            self._fn = load(self.target)
        return self._fn

    def stage(self, name: str):
        """``normalize_rewards`` / ``whiten`` next to the function, or None."""
        if self.shape != "gdpo":
            return None
        f = getattr(self.fn, name, None)
        if f is None:
            mod = importlib.import_module(self.target.partition(":")[0])
            f = getattr(mod, name, None)
        return f if callable(f) else None

    # -------------------------------------------------------- what it expresses
    def context(self) -> Context:
        if self.shape == "trl":
            return Context(labels=False, units=False, eps=False, input_dtypes=("float32",),
                           out_dtypes=("float32",), weights_dtype="float32")
        return Context()

    def unsupported(self, needs: frozenset) -> str | None:
        """Why a property with these needs cannot run here (None: it can)."""
        conv = get_convention(self.convention)
        if "spec_convention" in needs and self.convention != "spec":
            return (f"the error contract and the distributed protocol are convention 'spec''s; "
                    f"--convention {self.convention} grades values only")
        if conv.whiten == "per_token" and "values" in needs:
            return f"convention {conv.name!r} whitens per token; call shape {self.shape!r} passes no token counts"
        if conv.group_eps != conv.whiten_eps and "eps" in needs:
            return f"convention {conv.name!r} has two eps; the eps argument sets one"
        if self.shape == "trl":
            for need, why in (("units", "one whitening unit (no segment_sizes)"),
                              ("labels", "contiguous equal groups only (no group_ids)"),
                              ("eps", "no eps argument"),
                              ("stages", "no stage functions"),
                              ("distributed", "no process_group"),
                              ("dtypes", "float32 rewards and output only")):
                if need in needs:
                    return f"call shape 'trl' cannot express this: {why}"
        if "stages" in needs and (self.stage("normalize_rewards") is None or self.stage("whiten") is None):
            return f"{self.target} has no normalize_rewards/whiten beside it"
        return None

    # ---------------------------------------------------------------- calling
    def tensor(self, case: Case) -> torch.Tensor:
        r = case.rewards_array()
        if case.variant == "rewards_3d":
            r = r.reshape(r.shape[0], r.shape[1], 1)
        if case.variant == "empty":
            r = np.zeros((0, max(case.k, 1)))
        dt = TORCH_DTYPES[case.dtype]
        t = torch.from_numpy(r)
        if dt.is_complex:
            t = t.to(dt)
        elif dt == torch.bool:
            t = t != 0
        else:
            t = t.to(dt)
        return t.to(self.device)

    def kwargs(self, case: Case) -> dict:
        """The gdpo-shape keyword arguments of a case (process_group added by the caller)."""
        kw: dict = {}
        v = case.variant
        if case.group_ids is not None:
            kw["group_ids"] = torch.tensor(case.group_ids, dtype=torch.int64, device=self.device)
            if v == "float_labels":
                kw["group_ids"] = kw["group_ids"].to(torch.float64)
        if case.group_size is not None:
            kw["group_size"] = case.group_size
        if v == "both_groups":
            kw["group_size"] = kw.get("group_size") or 2
            kw["group_ids"] = torch.zeros(case.n, dtype=torch.int64, device=self.device)
        if v == "no_groups":
            kw.pop("group_ids", None)
            kw.pop("group_size", None)
        if case.weights is not None:
            kw["weights"] = [float(w) for w in case.weights]
        if case.segment_sizes is not None:
            kw["segment_sizes"] = [int(s) for s in case.segment_sizes]
        if case.eps is not None:
            kw["eps"] = float(case.eps)
        kw["out_dtype"] = TORCH_DTYPES[case.out_dtype]
        if v == "int_out_dtype":
            kw["out_dtype"] = torch.int64
        return kw

    def call(self, case: Case, process_group=None):
        """Call the implementation on one case; returns its output or raises what it raises."""
        rewards = self.tensor(case)
        if self.shape == "trl":
            w = case.weights if case.weights is not None else (1.0,) * max(case.k, 1)
            rw = torch.tensor([float(x) for x in w], dtype=torch.float32, device=self.device)
            return self.fn(rewards, case.group_size, rw)
        kw = self.kwargs(case)
        if process_group is not None:
            kw["process_group"] = process_group
        return self.fn(rewards, **kw)

    def call_normalize(self, case: Case):
        kw = self.kwargs(case)
        kw.pop("segment_sizes", None)
        kw.pop("out_dtype", None)
        return self.stage("normalize_rewards")(self.tensor(case), **kw)

    def call_whiten(self, values: np.ndarray, dtype: str, segment_sizes, eps, out_dtype, process_group=None):
        kw: dict = {"out_dtype": TORCH_DTYPES[out_dtype]}
        if segment_sizes is not None:
            kw["segment_sizes"] = [int(s) for s in segment_sizes]
        if eps is not None:
            kw["eps"] = float(eps)
        if process_group is not None:
            kw["process_group"] = process_group
        t = torch.from_numpy(np.asarray(values, dtype=np.float64)).to(TORCH_DTYPES[dtype]).to(self.device)
        return self.stage("whiten")(t, **kw)

    def outcome(self, fn, *args, **kwargs) -> Outcome:
        import time
        t0 = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every exception is graded, not only GDPOError
            return Outcome.from_exception(e, time.perf_counter() - t0)
        if self.device != "cpu" and torch.cuda.is_available():
            torch.cuda.synchronize()
        return Outcome.from_output(out, time.perf_counter() - t0)


def impl_trl_shape(rewards, num_generations, reward_weights):
    """``impl.gdpo`` in the TRL-like call shape (self-test of the ``trl`` shape)."""
    from impl.gdpo import gdpo_advantages

    return gdpo_advantages(rewards, group_size=int(num_generations),
                           weights=[float(w) for w in reward_weights.tolist()], out_dtype=torch.float32)


def finite(x) -> bool:
    return isinstance(x, float) and math.isfinite(x)
