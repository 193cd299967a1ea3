"""Named conventions: this project's specification and presets for the peers.

A convention fixes every choice the paper leaves open; the oracle computes a convention's
mathematics exactly, so a peer can be judged against its own intended formula. Presets are
never silent options of the production implementation. spec/gdpo.md section 9 says what each
field's values (:data:`_ALLOWED`) mean.
"""

from __future__ import annotations

import dataclasses

from spec.constants import DEFAULT_EPS, FLOAT32_UNIT_ROUNDOFF, FLOAT64_UNIT_ROUNDOFF

_EPS_PLACEMENT = ("std", "var", "std_if_positive", "skip_if_zero")
_ALLOWED = {
    "group_ddof": (0, 1), "whiten_ddof": (0, 1),
    "group_eps_placement": _EPS_PLACEMENT, "whiten_eps_placement": _EPS_PLACEMENT,
    "collapse": ("exact_equality", "std_positive", "none"),
    "singleton": ("error", "zero", "raw"),
    "nan": ("error", "propagate", "zero_first", "nan_aware", "nan_aware_unscored"),
    "whiten": ("per_sample", "per_token", "none"),
    "native_dtype": ("float32", "float64"),
    "algorithm": ("shift_invariant", "mean_then_subtract"),
}
#: unit roundoff of each working precision
_UNIT_ROUNDOFF = {"float32": FLOAT32_UNIT_ROUNDOFF, "float64": FLOAT64_UNIT_ROUNDOFF}


@dataclasses.dataclass(frozen=True)
class Convention:
    name: str
    title: str
    source: str
    group_ddof: int
    group_eps: float
    group_eps_placement: str
    whiten: str
    whiten_ddof: int
    whiten_eps: float
    whiten_eps_placement: str
    collapse: str
    singleton: str
    nan: str
    native_dtype: str
    notes: str = ""
    algorithm: str = "mean_then_subtract"
    #: Provenance of a peer preset: the distribution (as pip names it), its version, the entry
    #: point (``module:function``) whose code path was read and the file that holds it; empty
    #: where the code is not installable (``read_from`` then says what the preset rests on).
    package: str = ""
    version: str = ""
    entry_point: str = ""
    read_from: str = ""

    def __post_init__(self) -> None:
        for field, allowed in _ALLOWED.items():
            value = getattr(self, field)
            if value not in allowed:
                raise ValueError(f"convention {self.name!r}: {field}={value!r} is not one of {allowed}")
        for field in ("group_eps", "whiten_eps"):
            value = getattr(self, field)
            if not (value >= 0.0 and value < float("inf")):
                raise ValueError(f"convention {self.name!r}: {field}={value!r} must be finite and >= 0")

    @property
    def unit_roundoff(self) -> float:
        """The unit roundoff of the working precision (2^-24 for float32, 2^-53 for float64)."""
        return _UNIT_ROUNDOFF[self.native_dtype]


SPEC = Convention(
    name="spec", title="gdpo-spec (this project)", source="GDPO_BRIEF section 1; arXiv 2601.05242 Eq. 4, 7, 6",
    group_ddof=1, group_eps=DEFAULT_EPS, group_eps_placement="std",
    whiten="per_sample", whiten_ddof=1, whiten_eps=DEFAULT_EPS, whiten_eps_placement="std",
    collapse="exact_equality", singleton="error", nan="error", native_dtype="float64", algorithm="shift_invariant",
    notes="float64 internals, one final cast; Eq. 6 per training batch (unit) across ranks",
)

CONVENTIONS: dict[str, Convention] = {
    c.name: c
    for c in (
        SPEC,
        Convention(
            name="trl", title="TRL normalize_then_sum (>= 0.27)",
            source="trl GRPOTrainer multi_objective_aggregation='normalize_then_sum'",
            group_ddof=1, group_eps=1e-4, group_eps_placement="std",
            whiten="per_sample", whiten_ddof=1, whiten_eps=1e-4, whiten_eps_placement="std",
            collapse="none", singleton="zero", nan="nan_aware_unscored", native_dtype="float32",
            notes="Eq. 6 over the gathered generation batch, unscored samples (every reward NaN) left out of it; "
                  "advantages nan_to_num(nan=0) at the end",
            package="trl", version="1.16.0",
            entry_point="trl.trainer.grpo_trainer:GRPOTrainer._generate_and_score_completions",
            read_from="trl/trainer/grpo_trainer.py",
        ),
        Convention(
            name="verl", title="verl adv_estimator=gdpo (>= 0.7.1)", source="verl core_algos gdpo + masked_whiten",
            group_ddof=1, group_eps=1e-6, group_eps_placement="std",
            whiten="per_token", whiten_ddof=1, whiten_eps=1e-8, whiten_eps_placement="var",
            collapse="none", singleton="raw", nan="propagate", native_dtype="float32",
            notes="Eq. 6 is token-weighted masked_whiten: rsqrt(var + 1e-8)",
            package="verl", version="0.9.1", entry_point="verl.trainer.ppo.core_algos:compute_gdpo_outcome_advantage",
            read_from="verl/trainer/ppo/core_algos.py (+ verl/utils/torch_functional.py masked_whiten)",
        ),
        Convention(
            name="nemo_rl", title="NeMo-RL GDPOAdvantageEstimator", source="nemo_rl GDPOAdvantageEstimator",
            group_ddof=1, group_eps=1e-6, group_eps_placement="std_if_positive",
            whiten="per_sample", whiten_ddof=1, whiten_eps=0.0, whiten_eps_placement="skip_if_zero",
            collapse="std_positive", singleton="zero", nan="propagate", native_dtype="float32",
            notes="group variance computed one-pass E[x^2]-E[x]^2 in float32",
            read_from="not installable from the package index (nemo-rl 0.0.0 there is a placeholder); "
                      "preset from the GDPO brief, unverified against code",
        ),
        Convention(
            name="nvlabs", title="NVlabs GDPO reference (TRL 0.18 fork)", source="NVlabs GDPO reference trainer",
            group_ddof=1, group_eps=1e-4, group_eps_placement="std",
            whiten="per_sample", whiten_ddof=1, whiten_eps=1e-4, whiten_eps_placement="std",
            collapse="none", singleton="error", nan="zero_first", native_dtype="float32",
            notes="Eq. 6 over the whole gathered batch",
            read_from="not on the package index (a TRL 0.18 fork in a repository); "
                      "preset from the GDPO brief, unverified against code",
        ),
        Convention(
            name="ms_swift", title="ms-swift scale_rewards='gdpo'",
            source="ms-swift compute_advantages scale_rewards='gdpo'",
            group_ddof=1, group_eps=1e-8, group_eps_placement="std",
            whiten="per_sample", whiten_ddof=1, whiten_eps=1e-8, whiten_eps_placement="std",
            collapse="none", singleton="zero", nan="nan_aware", native_dtype="float32",
            notes="nanmean/nanstd per group, then nan_to_num(nan=0) of z; a group of one has nanstd NaN, so z = 0",
            package="ms-swift", version="4.6.0", entry_point="swift.rl_core.advantage:compute_advantages",
            read_from="swift/rl_core/advantage.py (+ swift/utils/torch_utils.py nanstd)",
        ),
        Convention(
            name="multireward_grpo", title="multireward-grpo (PyPI)", source="multireward-grpo package",
            group_ddof=0, group_eps=1e-8, group_eps_placement="std",
            whiten="none", whiten_ddof=1, whiten_eps=0.0, whiten_eps_placement="std",
            collapse="none", singleton="zero", nan="propagate", native_dtype="float64",
            notes="biased std, no batch whitening; equal-size groups only ((P, m, R))",
            package="multireward-grpo", version="0.1.1",
            entry_point="multireward_grpo.advantage:compute_advantage_batch", read_from="multireward_grpo/advantage.py",
        ),
    )
}


def get_convention(convention: "str | Convention") -> Convention:
    """Return the named preset (or pass a Convention through), with a clear error."""
    if isinstance(convention, Convention):
        return convention
    try:
        return CONVENTIONS[convention]
    except (KeyError, TypeError):
        raise ValueError(f"unknown convention {convention!r}; known: {', '.join(sorted(CONVENTIONS))}") from None


#: How each choice reads in :func:`differences`.
_EPS_TEXT = {"std": "std + {:g}", "var": "sqrt(var + {:g})",
             "std_if_positive": "std + {:g} where std > 0, else undivided",
             "skip_if_zero": "std (no eps), the step skipped where std = 0"}
_SINGLETON_TEXT = {"zero": "z = 0", "raw": "z = r / (1 + eps)", "error": "an error"}
_WHITEN_TEXT = {"none": "no Eq. 6 (no batch whitening)", "per_token": "Eq. 6 weighted by token counts",
                "per_sample": "Eq. 6 per sample"}


def differences(convention: "str | Convention", base: "str | Convention" = "spec") -> list[str]:
    """How ``convention``'s formula differs from ``base``'s (default ``spec``), one line per
    choice, naming the equation: what a grading against ``spec`` and ``gdpo audit`` call a
    formula difference."""
    c, b = get_convention(convention), get_convention(base)
    g_eps, w_eps = (lambda x: _EPS_TEXT[x.group_eps_placement].format(x.group_eps),
                    lambda x: _EPS_TEXT[x.whiten_eps_placement].format(x.whiten_eps))
    said = [
        (c.group_ddof != b.group_ddof, f"Eq. 4: {'biased' if c.group_ddof == 0 else 'unbiased'} std "
                                       f"(ddof {c.group_ddof}), {b.name} ddof {b.group_ddof}"),
        ((c.group_eps, c.group_eps_placement) != (b.group_eps, b.group_eps_placement),
         f"Eq. 4: divides by {g_eps(c)}, {b.name} by {g_eps(b)}"),
        (c.whiten != b.whiten, f"Eq. 6: {_WHITEN_TEXT[c.whiten]}, {b.name} {b.whiten.replace('_', ' ')}"),
        (c.whiten != "none" and ((c.whiten_ddof, c.whiten_eps, c.whiten_eps_placement)
                                 != (b.whiten_ddof, b.whiten_eps, b.whiten_eps_placement)),
         f"Eq. 6: ddof {c.whiten_ddof}, divides by {w_eps(c)}; {b.name} ddof {b.whiten_ddof}, {w_eps(b)}"),
        (c.singleton != b.singleton, f"Eq. 4: a group of one gives {_SINGLETON_TEXT[c.singleton]}, {b.name}: "
                                     f"{b.singleton}"),
        (c.nan != b.nan, f"NaN rewards: {c.nan.replace('_', ' ')}, {b.name}: {b.nan}"),
        (c.algorithm != b.algorithm, f"Eq. 4 algorithm: {c.algorithm.replace('_', ' ')} (rounding relative to the "
                                     f"{'magnitude' if c.algorithm == 'mean_then_subtract' else 'range'}), "
                                     f"{b.name} {b.algorithm.replace('_', '-')}"),
        (c.native_dtype != b.native_dtype, f"arithmetic in {c.native_dtype}, {b.name} in {b.native_dtype}"),
    ]
    return [text for differs, text in said if differs]
