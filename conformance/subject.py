"""The implementation under test: how the suite finds it (``--impl``), how each call shape
(``gdpo``, ``trl``, ``verl``: docs/grading.md, "Call shapes") calls it, what it declares
(``gdpo_domain``, ``gdpo_certified``, ``gdpo_convention``, ``--domain``: docs/grading.md,
"Declarations"), the precision and formula a grading found for it, and what one call did
(:class:`Outcome`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import os
import re
import sys
import threading

import numpy as np
import torch

from conformance.cases import Case
from conformance.error_cases import ERROR_BY_NAME
from conformance.strategies import DTYPES, Context, round_to
from impl.gdpo import gdpo_advantages
from spec.conventions import get_convention
from spec.errors import ERROR_CLASSES

DEFAULT_IMPL = "impl.gdpo:gdpo_advantages"
CALL_SHAPES = ("gdpo", "trl", "verl")

#: What a narrow call shape cannot express: a property needing one of these is skipped, with the reason.
_NARROW = (("distributed", "no process_group"), ("units", "one whitening unit (no segment_sizes)"),
           ("eps", "no eps argument"), ("stages", "no stage functions"))
CANNOT_EXPRESS = {
    "trl": _NARROW[:2] + (("labels", "contiguous equal groups only (no group_ids)"),) + _NARROW[2:]
    + (("dtypes", "float32 rewards and output only"),),
    "verl": _NARROW + (("dtypes", "float32 token rewards and output only"),),
}

#: T of the verl shape: responses have 1 to VERL_TOKENS tokens (right padding after them).
VERL_TOKENS = 6
#: Malformed calls (Case.variant) the verl shape expresses, and "first_token": each reward whole on
#: its response's first token (the probes' relation: a response's score is the sum of its tokens).
VERL_VARIANTS = ("", "empty", "rewards_3d", "first_token")
#: The verl shape's reward keys, column by column (a weight past the columns takes the next name):
#: their insertion order is not their sorted order, so a code that pairs weights with rewards by
#: sorted keys, or by position in another order than the other dict's, is off on any two weights.
VERL_KEYS = ("format", "accuracy", "length", "correctness", "brevity", "tool_use", "safety", "reasoning",
             "style", "judge", "coverage", "clarity")


def verl_key(j: int) -> str:
    """The verl shape's key of reward column ``j`` (:data:`VERL_KEYS`)."""
    return VERL_KEYS[j] if j < len(VERL_KEYS) else f"extra_{j}"


class ImplSpecError(ValueError):
    """An ``--impl`` spec that does not name a callable: the one-line reason."""


def resolve_impl(target: str):
    """``package.module:attr[.attr]`` -> the callable it names, or :class:`ImplSpecError` saying
    in one line why not; called before anything runs, so a bad spec stops at once."""
    mod_name, colon, attr = target.partition(":")
    if not colon or not mod_name or not attr or "" in attr.split("."):
        raise ImplSpecError(f"--impl {target!r}: expected package.module:function")
    try:
        obj = importlib.import_module(mod_name)
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the module raises on import, SystemExit included
        if isinstance(e, ModuleNotFoundError) and e.name is not None and \
                (mod_name == e.name or mod_name.startswith(e.name + ".")):
            raise ImplSpecError(f"--impl {target!r}: module {e.name!r} not found "
                                f"(not installed, or not on sys.path / PYTHONPATH)") from None
        how = "failed:" if isinstance(e, ModuleNotFoundError) else "raised"
        raise ImplSpecError(f"--impl {target!r}: importing {mod_name!r} {how} "
                            f"{type(e).__name__}: {' '.join(str(e).split())}") from None
    where = mod_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ImplSpecError(f"--impl {target!r}: {where!r} has no attribute {part!r}")
        obj = getattr(obj, part)
        where = f"{where}:{part}" if where == mod_name else f"{where}.{part}"
    if not callable(obj):
        raise ImplSpecError(f"--impl {target!r}: {where} is a {type(obj).__name__}, not callable")
    return obj


#: The arguments every call of each shape passes (only names and positions are bound; gdpo's group
#: argument is either of two)
_SHAPE_CALLS = {
    "gdpo": [((None,), {"group_size": 2, "out_dtype": None}), ((None,), {"group_ids": None, "out_dtype": None})],
    "trl": [((None, 2, None), {})],
    "verl": [((), {"token_level_rewards": {}, "response_mask": None, "index": None, "weights": None})],
}
SHAPE_SIGNATURES = {
    "gdpo": "fn(rewards, *, group_size=... or group_ids=..., weights=..., segment_sizes=..., eps=..., "
            "out_dtype=...)",
    "trl": "fn(rewards, num_generations, reward_weights)",
    "verl": "fn(token_level_rewards={name: (B, T)}, response_mask=(B, T), index=(B,), weights=...)",
}
#: the keywords a gdpo-shape call may pass besides those of every call (a parameter the function
#: requires among them is passed by the cases that need it)
_GDPO_KEYWORDS = frozenset({"group_ids", "group_size", "weights", "segment_sizes", "eps", "out_dtype", "missing",
                            "process_group"})


def _binds(sig, shape: str) -> str | None:
    """None where ``sig`` takes the arguments every call of ``shape`` passes and requires none that
    the shape never passes, else why not."""
    why = None
    for args, kw in _SHAPE_CALLS[shape]:
        try:
            bound = sig.bind_partial(*args, **kw)
        except TypeError as e:
            why = why or str(e)
            continue
        never = [name for name, p in sig.parameters.items()
                 if name not in bound.arguments and p.default is inspect.Parameter.empty
                 and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                 and not (shape == "gdpo" and name in _GDPO_KEYWORDS)]
        if not never:
            return None
        why = why or f"it requires {', '.join(repr(n) for n in never)}, which the shape never passes"
    return why


def shape_mismatch(fn, shape: str) -> str | None:
    """Why ``fn``'s signature cannot take the calls of call shape ``shape`` (every call would
    raise a TypeError, read as a refusal), naming a shape whose calls it takes; None where it
    can, or has no signature to read."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    why = _binds(sig, shape)
    if why is None:
        return None
    fits = [other for other in ("verl", "gdpo", "trl") if other != shape and _binds(sig, other) is None]
    hint = f"; it takes the {fits[0]} shape's arguments: --call-shape {fits[0]}" if fits else ""
    return (f"{getattr(fn, '__qualname__', fn)}{sig} cannot be called as call shape {shape!r} calls it, "
            f"{SHAPE_SIGNATURES[shape]} ({why}){hint}")


class CallShapeViolation(Exception):
    """The implementation's output breaks its call shape (a verl result that is not one value per
    sample on its response tokens and 0 on padding)."""


class NonFiniteOutput(CallShapeViolation):
    """A NaN or infinity where the shape reads one value per sample (NaN on a verl padding token):
    graded as a non-finite output, not as a breach of the call shape."""


class InputModified(CallShapeViolation):
    """The implementation wrote into a tensor the caller passed."""


def _bits_of(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t``'s bits (NaN compares equal to itself, -0.0 differs from 0.0)."""
    t = t.detach().clone()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]) \
        if not t.is_complex() and t.dtype != torch.bool else t


def _unchanged(fn, tensors: dict):
    """Call ``fn()``; raise InputModified if it changed any of ``tensors`` (name -> tensor)."""
    before = {k: _bits_of(v) for k, v in tensors.items()}
    out = fn()
    for k, v in tensors.items():
        if not torch.equal(_bits_of(v), before[k]):
            raise InputModified(f"the implementation modified its input {k} in place; the contract reads its "
                                "inputs and never writes them")
    return out


def verl_lengths(n: int) -> np.ndarray:
    """Response lengths of the verl shape: 3, 2, 1, 6, 5, 4, 3, ... (every length in 1..T occurs
    within T samples; sample 0 is padded)."""
    return 1 + (5 * np.arange(n, dtype=np.int64) + 2) % VERL_TOKENS


def verl_token_rewards(rewards: np.ndarray, lengths: np.ndarray, dtype: str, first: bool = False) -> np.ndarray:
    """(N, K) rewards -> (N, T, K) token rewards summing to each reward exactly over the response:
    on its last token, or, where (i + k) is odd and it has two tokens or more, in two exact halves
    (first and last token) where ``dtype`` holds the half, whole on the first token where the
    reward is not finite (``first``: every reward whole on its first token). Padding tokens hold 0."""
    n, k = rewards.shape
    out = np.zeros((n, VERL_TOKENS, k), dtype=np.float64)
    if first:
        out[:, 0, :] = rewards
        return out
    for i in range(n):
        last = int(lengths[i]) - 1
        for j in range(k):
            r = float(rewards[i, j])
            half, odd = r / 2.0, last >= 1 and (i + j) % 2 == 1
            if odd and not math.isfinite(r):
                out[i, 0, j] = r
            elif odd and dtype in DTYPES and float(round_to([half], dtype)[0]) == half:
                out[i, 0, j] = out[i, last, j] = half
            else:
                out[i, last, j] = r
    return out


#: Exceptions that are the code's own failure, never a refusal of its input: a bug, or a call its
#: signature does not take (a TypeError that says so).
CRASHES = frozenset({"AttributeError", "IndexError", "KeyError", "ZeroDivisionError", "NameError",
                     "UnboundLocalError", "RecursionError", "NotImplementedError"})
_SIGNATURE = re.compile(r"unexpected keyword argument|takes \d+ positional argument|missing \d+ required")
_UNTAKEN = re.compile(r"unexpected keyword argument '(\w+)'")


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

    @classmethod
    def from_output(cls, out) -> "Outcome":
        if not isinstance(out, torch.Tensor):
            return cls(False, error_type="NotATensor", message=f"returned {type(out).__name__}, not a tensor")
        t = out.detach()
        vals = t.to("cpu").to(torch.float64).numpy().copy() if t.is_floating_point() else \
            t.to("cpu").numpy().astype(np.float64)
        return cls(True, vals, str(t.dtype).replace("torch.", ""), tuple(t.shape), t.device.type)

    @classmethod
    def from_exception(cls, e: BaseException) -> "Outcome":
        names = tuple(n for n, c in ERROR_CLASSES.items() if isinstance(e, c))
        return cls(False, error_type=type(e).__name__, error_classes=names, message=str(e)[:2000])

    def is_error(self, *classes) -> bool:
        return (not self.ok) and any(c.__name__ in self.error_classes for c in classes)

    def refuses(self) -> bool:
        """A clear refusal: an exception with a message, not a crash (:data:`CRASHES`)."""
        return not self.ok and bool(self.message.strip()) and self.error_type not in CRASHES and not (
            self.error_type == "TypeError" and _SIGNATURE.search(self.message))

    def untaken(self) -> str:
        """The keyword the code's signature did not take (its TypeError says so), else ""."""
        found = _UNTAKEN.search(self.message) if self.error_type == "TypeError" else None
        return found[1] if found else ""

    def describe(self) -> str:
        """What the call did: its result, its exception, or what the grader's own check of the call
        found (the call shape's exceptions below: the code raised nothing, its output broke the shape)."""
        if self.ok:
            return f"returned {self.dtype} {self.shape} on {self.device}"
        if self.error_type == "NonFiniteOutput":
            return f"returned non-finite values ({self.message})"
        if self.error_type == "CallShapeViolation":  # verl_per_sample's messages begin "call shape 'verl': "
            return "returned an output that breaks " + (self.message if self.message.startswith("call shape ")
                                                        else f"the call shape: {self.message}")
        if self.error_type == "InputModified":
            return self.message.removeprefix("the implementation ")
        if self.error_type == "NotATensor":
            return f"{self.message} (the call shape reads a tensor)"
        return f"raised {self.error_type}: {self.message}"


#: The limits a domain may declare beyond what a call shape expresses (``Subject.inside``; group
#: sizes: the allowed ones, or an int, the smallest).
LIMITS = ("min_columns", "max_columns", "group_sizes", "max_abs_reward", "max_abs_weight", "equal_groups")
#: Declarations of what the code does on purpose, not narrowings of the search: the error cases its
#: framework checks before calling it, integer and bool rewards computed as values, certified rounding.
DECLARATIONS = ("validated", "int_rewards", "certified")
#: The reward dtypes a narrow call shape (trl, verl) passes where ``input_dtypes`` declares them.
NARROW_SHAPE_DTYPES = ("float32", "float64", "float16", "bfloat16")
#: the numeric --domain fields: how each value is read, and what it takes (for the error message)
_DOMAIN_NUMBERS = {
    "min_columns": (int, "an integer, like 2"), "max_columns": (int, "an integer, like 8"),
    "group_sizes": (lambda v: int(v[:-1]) if v.endswith("+") else tuple(int(x) for x in v.split(",")),
                    "sizes like 4,8 (these alone) or a minimum like 4+"),
    "max_abs_reward": (float, "a number, like 1e6"), "max_abs_weight": (float, "a number, like 1e3")}


def parse_domain(items) -> dict:
    """``KEY=VALUE`` strings (``gdpo check --domain``) as a domain dict: ``min_columns=2``,
    ``group_sizes=4,8`` or ``4+``, ``max_abs_reward=1e6``, ``input_dtypes=float32,float64``,
    ``labels=false``, ``certified=true`` or the formats certified."""
    out: dict = {}
    for item in items or ():
        key, sep, value = (x.strip() for x in item.partition("="))
        if not sep or not key:
            raise ValueError(f"--domain takes KEY=VALUE, got {item!r}")
        if key in _DOMAIN_NUMBERS:
            read, form = _DOMAIN_NUMBERS[key]
            try:
                out[key] = read(value)
            except ValueError:
                raise ValueError(f"--domain {key}={value!r}: expected {form}") from None
            continue
        listed = tuple(v.strip() for v in value.split(",") if v.strip())
        if key in ("input_dtypes", "out_dtypes"):
            out[key] = listed
        elif key == "validated" or (key == "certified" and value.lower() not in ("true", "false")):
            known, what = (tuple(ERROR_BY_NAME), "error case names") if key == "validated" else \
                (("float64", "float32", "bfloat16", "float16"), "true, false or formats")
            if not listed or any(x not in known for x in listed):
                raise ValueError(f"--domain {key} takes {what} among {', '.join(known)} (comma-separated), "
                                 f"got {value!r}")
            out[key] = listed
        elif key in ("labels", "units", "eps", "certified", "equal_groups", "int_rewards"):
            if value.lower() not in ("true", "false"):
                raise ValueError(f"--domain {key} takes true or false, got {value!r}")
            out[key] = value.lower() == "true"
        elif key == "why":
            out[key] = value
        else:
            known = sorted(LIMITS + DECLARATIONS + ("input_dtypes", "out_dtypes", "labels", "units", "eps", "why"))
            raise ValueError(f"--domain: unknown field {key!r}; known: {known}")
    return out


def _nothing_to_draw(d: dict) -> str | None:
    """Why the declared limits (:data:`LIMITS`) leave no case to draw, or None."""
    low, high, sizes = d.get("min_columns", 1), d.get("max_columns"), d.get("group_sizes")
    if high is not None and high < max(low, 1):
        return f"max_columns={high} is below " + (f"min_columns={low}" if low > 1 else "one reward column")
    if isinstance(sizes, tuple) and not any(size >= 2 for size in sizes):
        return f"group_sizes={','.join(map(str, sizes))}: a group needs two samples (one is an error case)"
    for key in ("max_abs_reward", "max_abs_weight"):
        if key in d and not d[key] > 0:
            return f"{key}={d[key]!r}: every value would be 0"
    return None


class Subject:
    """The implementation under test behind one call shape."""

    def __init__(self, target: str = DEFAULT_IMPL, shape: str = "gdpo", convention: str = "spec",
                 device: str = "cpu", backend: str = "gloo", domain: dict | None = None):
        if shape not in CALL_SHAPES:
            raise ValueError(f"--call-shape must be one of {CALL_SHAPES}, got {shape!r}")
        self.target = target
        self.declared = dict(domain or {})  # gdpo check --domain KEY=VALUE: over the function's gdpo_domain
        self.shape = shape
        self.convention = get_convention(convention).name
        self.device = device
        self.backend = backend  # of the spawned ranks' process groups
        #: the working precision the code is judged at, told by the probes (conformance.probes);
        #: None: the convention's own (spec: the prescribed float64 algorithm, exact zeros bit for bit)
        self.precision: str | None = None
        self.profile = None  # what the grading's probes told (conformance.probes.Profile)
        self._fn = None

    def __repr__(self) -> str:
        return f"Subject({self.target!r}, shape={self.shape!r}, convention={self.convention!r})"

    @property
    def fn(self):
        if self._fn is None:
            self._fn = resolve_impl(self.target)
        return self._fn

    def stage(self, name: str):
        """``normalize_rewards`` / ``whiten`` next to the function, or None."""
        if self.shape != "gdpo":
            return None
        f = getattr(self.fn, name, None)
        if f is None:
            f = getattr(importlib.import_module(self.target.partition(":")[0]), name, None)
        return f if callable(f) else None

    def domain(self) -> dict:
        """The declared domain: the function's ``gdpo_domain`` with ``--domain`` over it, of
        :class:`conformance.strategies.Context` fields it narrows, :data:`LIMITS`,
        :data:`DECLARATIONS` and ``why``; the search stays inside it (:meth:`inside`)."""
        d = getattr(self.fn, "gdpo_domain", None) or {}
        if not isinstance(d, dict):
            raise ValueError(f"{self.target}.gdpo_domain must be a dict, got {type(d).__name__}")
        d = {**d, **{k: v for k, v in self.declared.items() if k != "certified"}}  # a claim, said apart
        fields = {f.name for f in dataclasses.fields(Context)}
        unknown = set(d) - fields - set(LIMITS) - set(DECLARATIONS) - {"why"}
        if unknown:
            raise ValueError(f"{self.target}: unknown domain field(s) {sorted(unknown)}; known: "
                             f"{sorted(fields | set(LIMITS))}")
        return d

    def inside(self, case) -> bool:
        """Is ``case`` inside the declared limits (:data:`LIMITS`)? An error case is judged by its
        number of columns only: its other breaks are what it tests."""
        d = self.domain()
        if not any(k in d for k in LIMITS):
            return True
        for c in (case if isinstance(case, tuple) else getattr(case, "shards", None) or (case,)):
            if not c.rewards:
                continue
            if not (d.get("min_columns", 1) <= c.k <= d.get("max_columns", c.k)):
                return False
            if c.note.startswith("error:") or c.variant:
                continue
            counts, sizes = np.unique(c.labels(), return_counts=True)[1], d.get("group_sizes", 1)
            if (d.get("equal_groups") and len(set(counts.tolist())) > 1
                    or not np.all(counts >= sizes if isinstance(sizes, int) else np.isin(counts, list(sizes)))
                    or max((abs(v) for r in c.rewards for v in r), default=0.0) > d.get("max_abs_reward", math.inf)
                    or c.weights is not None and max(abs(w) for w in c.weights) > d.get("max_abs_weight", math.inf)):
                return False
        return True

    def judged(self):
        """The convention every case is judged under: the named one, or, at the code's own
        :attr:`precision`, the paper's with the error model of a mean-then-subtract code there."""
        conv = get_convention(self.convention)
        if self.precision is None or self.convention != "spec":
            return conv
        return dataclasses.replace(conv, algorithm="mean_then_subtract", native_dtype=self.precision)

    def own_convention(self) -> str | None:
        """The preset the implementation declares it computes (``gdpo_convention``), or None."""
        name = getattr(self.fn, "gdpo_convention", None)
        return None if name is None else get_convention(name).name

    def domain_statement(self) -> str:
        """One line: the declared domain, or that none is declared."""
        d = self.domain()
        cert = "; certified rounding declared (gdpo_certified): graded bit for bit by 'certified'" \
            if self.shape == "gdpo" and self.certifies() else ""
        if not d:
            return "no domain declared: graded on every input its call shape expresses" + cert
        parts = [f"{k}={v!r}" for k, v in d.items() if k != "why"]
        return "declared domain " + ", ".join(parts) + (f" ({d['why']})" if d.get("why") else "") + cert

    def context(self) -> Context:
        ctx = Context() if self.shape == "gdpo" else Context(
            labels=self.shape == "verl", units=False, eps=False, input_dtypes=("float32",), out_dtypes=("float32",),
            weights_dtype="float32" if self.shape == "trl" else "float64")
        narrowed = {}
        for key, value in self.domain().items():
            if key == "why" or key in LIMITS or key in DECLARATIONS:
                continue
            have = getattr(ctx, key)
            if key == "input_dtypes" and self.shape != "gdpo":
                have = NARROW_SHAPE_DTYPES  # the shape can pass these too, where declared
            if isinstance(have, tuple):  # a domain narrows what the shape expresses, never widens it
                value = tuple(v for v in value if v in have)
                if not value:
                    raise ValueError(f"{self.target}: the declared {key} leave nothing to draw: call shape "
                                     f"{self.shape!r} passes {', '.join(have)}")
            elif isinstance(have, bool):
                value = bool(value) and have
            narrowed[key] = value
        why = _nothing_to_draw(self.domain())
        if why:
            raise ValueError(f"{self.target}: the declared domain leaves nothing to draw: {why}")
        return dataclasses.replace(ctx, **narrowed)

    def unsupported(self, needs: frozenset) -> str | None:
        """Why a property with these needs cannot run here (None: it can)."""
        conv = get_convention(self.convention)
        if "spec_convention" in needs and self.convention != "spec":
            return (f"the error contract and the distributed protocol are convention 'spec''s; "
                    f"--convention {self.convention} grades values only")
        if conv.whiten == "per_token" and "values" in needs and self.shape != "verl":
            return f"convention {conv.name!r} whitens per token; call shape {self.shape!r} passes no token counts"
        if conv.group_eps != conv.whiten_eps and "eps" in needs:
            return f"convention {conv.name!r} has two eps; the eps argument sets one"
        for need, why in CANNOT_EXPRESS.get(self.shape, ()):
            if need in needs:
                return f"call shape {self.shape!r} cannot express this: {why}"
        for need in ("units", "eps", "labels"):
            if need in needs and self.domain().get(need, True) is False:
                return f"outside the declared domain ({need}): {self.domain_statement()}"
        if "stages" in needs and (self.stage("normalize_rewards") is None or self.stage("whiten") is None):
            return f"{self.target} has no normalize_rewards/whiten beside it"
        if "certified" in needs and self.convention != "spec":
            return (f"certified rounding is a claim about convention 'spec''s exact values; --convention "
                    f"{self.convention} grades within the error model only")
        if "certified" in needs and not self.certifies():
            return (f"{self.target} does not declare certified rounding (gdpo_certified): graded within the "
                    "error model only")
        if "missing" in needs and not self.takes_missing():
            who = f"{self.target} takes" if self.shape == "gdpo" else f"call shape {self.shape!r} passes"
            return (f"{who} no missing= keyword: rewards its reward functions did not score "
                    "(missing=\"unscored\", spec/gdpo.md section 2) are an option of the gdpo call shape")
        return None

    def unasked(self, ec) -> str | None:
        """Why error case ``ec`` (conformance.error_cases) is not asked of this code (None: it is)."""
        if self.shape not in ec.shapes:
            return f"call shape {self.shape!r} cannot express this"
        off = [need for need in ec.needs if self.domain().get(need, True) is False]
        if off:
            return f"outside the declared domain ({', '.join(off)}): {self.domain_statement()}"
        if ec.name in self.validated():
            return "validated elsewhere (declared: the framework checks it before calling the function)"
        return None

    def validated(self) -> tuple:
        """The error cases the code's framework checks before calling it (not asked of it)."""
        return tuple(self.domain().get("validated", ()))

    def takes_integers(self) -> bool:
        """Does the code declare that it computes integer and bool rewards as their values?"""
        return bool(self.domain().get("int_rewards", False))

    def certifies(self) -> bool:
        return bool(self.certified_formats())

    def certified_formats(self) -> frozenset:
        """The output formats whose certified rounding (``gdpo_certified`` or ``--domain
        certified=``) is declared: every one for True, the named ones for a tuple of names."""
        every = frozenset({"float64", "float32", "bfloat16", "float16"})
        value = self.declared["certified"] if "certified" in self.declared else getattr(self.fn, "gdpo_certified", False)
        if isinstance(value, (tuple, list, frozenset, set)):
            return frozenset(str(v) for v in value) & every
        return every if value else frozenset()

    def takes_missing(self) -> bool:
        """Does a gdpo-shape code take ``missing=`` (its signature, or ``gdpo_missing``)?"""
        if self.shape != "gdpo":
            return False
        declared = getattr(self.fn, "gdpo_missing", None)
        if declared is not None:
            return bool(declared)
        try:
            return "missing" in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return False

    def token_counts(self, case: Case) -> np.ndarray | None:
        """The response lengths the verl shape passes, for a per-token convention's oracle; else None."""
        if get_convention(self.convention).whiten != "per_token" or self.shape != "verl" or not case.rewards:
            return None
        return verl_lengths(case.n)

    def tensor(self, case: Case) -> torch.Tensor:
        r = case.rewards_array()
        if case.variant == "rewards_3d":
            r = r.reshape(r.shape[0], r.shape[1], 1)
        if case.variant == "empty":
            r = np.zeros((0, max(case.k, 1)))
        dt = getattr(torch, case.dtype)
        t = torch.from_numpy(r)
        return ((t != 0) if dt == torch.bool else t.to(dt)).to(self.device)

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
        kw["out_dtype"] = torch.int64 if v == "int_out_dtype" else getattr(torch, case.out_dtype)
        if case.missing:
            kw["missing"] = case.missing
        return kw

    def call(self, case: Case, process_group=None):
        """Call the implementation on one case; returns its output or raises what it raises."""
        rewards = self.tensor(case)
        if self.shape == "trl":
            w = case.weights if case.weights is not None else (1.0,) * max(case.k, 1)
            rw = torch.tensor([float(x) for x in w], dtype=torch.float32, device=self.device)
            return _unchanged(lambda: self.fn(rewards, case.group_size, rw),
                              {"rewards_per_func": rewards, "reward_weights": rw})
        if self.shape == "verl":  # its (B, T) result as the (B,) per-sample advantages
            kw = self.verl_arguments(case)
            lengths = verl_lengths(kw["response_mask"].shape[0])  # before the call: the mask is the callee's
            watched = {f"token_level_rewards[{k!r}]": v for k, v in kw["token_level_rewards"].items()}
            out = _unchanged(lambda: self.fn(**kw), {**watched, "response_mask": kw["response_mask"]})
            if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
                out = out[0]  # verl's estimators return (advantages, returns)
            return verl_per_sample(out, lengths) if isinstance(out, torch.Tensor) else out  # "not a tensor"
        kw = self.kwargs(case)
        if process_group is not None:
            kw["process_group"] = process_group
        watched = {"rewards": rewards, **{k: v for k, v in kw.items() if isinstance(v, torch.Tensor)}}
        return _unchanged(lambda: self.fn(rewards, **kw), watched)

    def verl_arguments(self, case: Case) -> dict:
        """The verl-shape keyword arguments of a case."""
        if case.variant not in VERL_VARIANTS or not case.rewards:
            raise ValueError(f"call shape 'verl' cannot express a malformed call ({case.variant or 'no rows'}): "
                             f"a suite bug, such cases are skipped for it")
        r = case.rewards_array()
        if case.variant == "empty":
            r = np.zeros((0, case.k))
        lengths = verl_lengths(r.shape[0])
        tok = verl_token_rewards(r, lengths, case.dtype, first=case.variant == "first_token")
        dt = getattr(torch, case.dtype)
        rewards = {}
        for j in range(case.k):
            t = torch.from_numpy(np.ascontiguousarray(tok[:, :, j]))
            t = (t != 0) if dt == torch.bool else t.to(dt)
            rewards[verl_key(j)] = (t.unsqueeze(-1) if case.variant == "rewards_3d" else t).to(self.device)
        mask = torch.from_numpy(np.arange(VERL_TOKENS)[None, :] < lengths[:, None]).to(torch.int64).to(self.device)
        labels = case.labels() if case.variant != "empty" else np.zeros(0, np.int64)
        index = np.array([f"uid{int(g)}" for g in labels], dtype=object)
        # weight j names column j's key, also past the columns: a wrong count is a name mismatch, never dropped
        weights = None if case.weights is None else {verl_key(j): float(w) for j, w in enumerate(case.weights)}
        return {"token_level_rewards": rewards, "response_mask": mask, "index": index, "weights": weights}

    def call_normalize(self, case: Case):
        """``normalize_rewards`` (Eq. 4 + 7) on the case."""
        kw = {k: v for k, v in self.kwargs(case).items() if k not in ("segment_sizes", "out_dtype")}
        return self.stage("normalize_rewards")(self.tensor(case), **kw)

    def call_whiten(self, case: Case):
        """``whiten`` (Eq. 6 alone) on the case's first column."""
        kw = {k: v for k, v in self.kwargs(case).items() if k in ("segment_sizes", "eps", "out_dtype")}
        return self.stage("whiten")(self.tensor(case)[:, 0].contiguous(), **kw)

    def outcome(self, fn, *args, **kwargs) -> Outcome:
        """The call's result or exception. In the grader's own process (no ``process_group``: the
        ranks of a pool have their parent's deadline), a call not back within DEADLINE seconds
        stops the grading with exit code 1: a hang, which one process cannot take back."""
        watchdog = None
        if "process_group" not in kwargs:
            watchdog = threading.Timer(DEADLINE, _stop_at_a_hang, (self.target,))
            watchdog.daemon = True
            watchdog.start()
        try:
            out = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every exception is graded, not only GDPOError
            return Outcome.from_exception(e)
        finally:
            if watchdog is not None:
                watchdog.cancel()
        if self.device != "cpu" and torch.cuda.is_available():
            torch.cuda.synchronize()
        return Outcome.from_output(out)


#: Seconds one call may take (on a pool of ranks: after the job started; in one process: at all).
DEADLINE = float(os.environ.get("GDPO_CONFORMANCE_DEADLINE", "60"))


def _stop_at_a_hang(target: str) -> None:
    """Said on standard error when a call in the grader's process has not returned: the test that
    made it is pytest's current one."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    sys.stderr.write(f"\ngdpo check: {target} did not return within {DEADLINE:g} s{f' ({test})' if test else ''}: "
                     f"a hang. In one "
                     f"process the grader cannot take the call back, so it stops here, with no report "
                     f"(exit code 1). A slow call on a loaded machine: allow more seconds with "
                     f"GDPO_CONFORMANCE_DEADLINE.\n")
    sys.stderr.flush()
    os._exit(1)


def verl_per_sample(out: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
    """(B, T) token advantages -> (B,) per-sample advantages (the first response token), after
    checking that each sample's response tokens carry one value and its padding exactly 0."""
    n, t = len(lengths), VERL_TOKENS
    if tuple(out.shape) != (n, t):
        raise CallShapeViolation(f"call shape 'verl': returned shape {tuple(out.shape)}; token advantages are "
                                 f"(B, T) = ({n}, {t}), the shape of response_mask")
    vals = out.detach().to("cpu").to(torch.float64).numpy()
    for i in range(n):
        length = int(lengths[i])
        pad = vals[i, length:]
        bad = np.flatnonzero(~(pad == 0.0))  # NaN is not 0
        if bad.size:
            j = length + int(bad[0])
            kind = CallShapeViolation if np.isfinite(vals[i, j]) else NonFiniteOutput
            raise kind(
                f"call shape 'verl': sample {i} has {length} response token(s) of {t}; its padding token {j} "
                f"(response_mask 0) carries {float(vals[i, j])!r}: masked tokens must be exactly 0 "
                f"(token row {vals[i].tolist()})")
        resp = vals[i, :length]
        if not np.array_equal(resp, np.full_like(resp, resp[0]), equal_nan=True):
            raise CallShapeViolation(
                f"call shape 'verl': sample {i}'s {length} response tokens carry different values "
                f"{resp.tolist()}: GDPO gives one advantage per sample, the same on each of its response tokens")
    return out[:, 0]  # every response has at least one token


def impl_trl_shape(rewards, num_generations, reward_weights):
    """``impl.gdpo`` in the TRL-like call shape (self-test of the ``trl`` shape)."""
    return gdpo_advantages(rewards, group_size=int(num_generations),
                           weights=[float(w) for w in reward_weights.tolist()], out_dtype=torch.float32)
