"""Drop-in call shapes of TRL, verl and a labelled mapping, each one call of impl.gdpo that
imports no framework; what each reads and refuses, with an example: docs/adopting.md."""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Hashable, Mapping, Sequence, Set

import torch

from impl import _distributed
from impl import _problems as P
from impl._inputs import (_INT64_MAX, _INT64_MIN, _holds_bool, _integral, _is_int, _is_row, numpy_view, read_tensor,
                          unreadable)
from impl._pipeline import reads_free
from impl._problems import GroupLengthError
from impl.gdpo import (DistributedError, GDPOError, GroupError, InputDtypeError, NonFiniteError, OutOfRangeError,
                       ShapeError, WeightError, _opaque_to_dynamo, gdpo_advantages)
from spec.constants import DEFAULT_EPS

__all__ = ["trl_advantages", "verl_advantages", "labelled_advantages"]


def _numpy(x, kind: str = "ndarray") -> bool:
    """Is ``x`` a NumPy ``kind`` (an ndarray, or a "generic" scalar)?"""
    np = sys.modules.get("numpy")  # a caller who passes a NumPy array has imported NumPy
    return np is not None and isinstance(x, getattr(np, kind))


# ------------------------------------------------------------------ rewards
def _unreadable_error(x, where: str, overflow: bool, column: str) -> InputDtypeError:
    """A sequence torch cannot read as real numbers, refused as impl.gdpo refuses ``rewards``."""
    p = unreadable(x, P.P_REWARDS_TYPE, overflow)
    if p.code == P.P_REWARDS_ENTRY:
        return InputDtypeError(P.entry_message(where, p.a, p.b, p.c, p.detail, row="sample", column=column))
    if p.code == P.P_REWARDS_RAGGED:
        return InputDtypeError(P.ragged_message(where, p.a, p.b, p.c, p.detail, row="sample"))
    return InputDtypeError(P.type_words(where)(p.a, p.b, p.c, p.detail))


def _float_tensor(x, where: str, device: torch.device | None, column: str = "column") -> torch.Tensor:
    """``x`` as a real floating tensor on CPU or CUDA (a sequence: float64, placed on ``device``),
    or a refusal naming ``where``."""
    try:
        t = read_tensor(x)
    except (TypeError, ValueError, RuntimeError, OverflowError) as exc:
        raise _unreadable_error(x, where, isinstance(exc, OverflowError), column) from None
    if t is not x and _holds_bool(x):  # torch reads [1.0, True] as floats
        place, v = next((f"[{i}]" + (f"[{j}]" if _is_row(row) else ""), w) for i, row in enumerate(x)
                        for j, w in enumerate(row if _is_row(row) else (row,)) if _holds_bool([w]))
        raise InputDtypeError(f"{where}{place} is a bool ({bool(v)!r}), not a number: pass its float value")
    if t is not x and device is not None:
        t = t.to(device)
    if P.layout_code(t):
        raise InputDtypeError(P.layout_words(where)(P.layout_code(t), 0, 0))
    if not t.is_floating_point():
        raise InputDtypeError(P.dtype_words(where, "Eq. 4")(P.dtype_code(t.dtype), 0, 0))
    if t.device.type not in ("cpu", "cuda"):
        raise InputDtypeError(f"{where} is on a device of type {t.device.type}; impl.gdpo computes on CPU or "
                              "CUDA tensors")
    return t


def _keys(mapping, arg: str, entries: str, key: str) -> list:
    """The keys of the mapping argument ``arg`` ({``entries``}), at least one ``key``."""
    if not isinstance(mapping, Mapping):
        raise InputDtypeError(f"{arg} must be a mapping {{{entries}}}; got {type(mapping).__name__}")
    if not mapping:
        raise ShapeError(f"{arg} is empty: GDPO needs at least one {key}")
    return list(mapping)


def _first_tensor_device(*candidates) -> torch.device | None:
    return next((x.device for x in candidates if isinstance(x, torch.Tensor)), None)


def _widest(dtypes: list[torch.dtype]) -> torch.dtype:
    """The dtype all ``dtypes`` convert to exactly, never float8 (impl.gdpo reads none): float64
    holds every float, float32 every float16, bfloat16 and float8 (torch's promotion may round)."""
    if len(set(dtypes)) == 1 and dtypes[0].itemsize > 1:
        return dtypes[0]
    return torch.float64 if torch.float64 in dtypes else torch.float32  # float8 alone too: impl reads no float8


# ------------------------------------------------------------------ labels
class _Labels:
    """The caller's labels as impl.gdpo group_ids (``ids``), each sample's (``items``; None: an
    integer tensor's, read on demand) and each internal id's (``by_id``; None: ids are the caller's)."""

    def __init__(self, ids, items: list | None, by_id: list | None):
        self.ids, self.items, self.by_id = ids, items, by_id
        # uint64 labels travel through impl.gdpo as their int64 bits: 2**64 - 1 may come back as -1
        self.uint64 = isinstance(ids, torch.Tensor) and ids.dtype == getattr(torch, "uint64", None)

    def name(self, internal: int) -> str:
        """The caller's label of a group label impl.gdpo printed."""
        if self.by_id is None:
            return str(internal % (1 << 64) if self.uint64 else internal)
        return repr(self.by_id[internal]) if 0 <= internal < len(self.by_id) else str(internal)


def _one_label(x, arg: str, i: int):
    if isinstance(x, torch.Tensor) or _numpy(x):
        if x.ndim != 0:
            raise GroupError(f"{arg}[{i}] is a {x.ndim}-D {type(x).__name__} of shape {tuple(x.shape)}, "
                             "not one label")
        x = x.item()  # a 0-d tensor hashes by identity: read its value
    elif _numpy(x, "generic"):
        x = x.item()
    try:
        hash(x)
    except TypeError:
        raise GroupError(f"{arg}[{i}] = {x!r} is unhashable ({type(x).__name__}); a label must be hashable "
                         "(an int, str, tuple, ...)") from None
    if isinstance(x, (float, complex)) and x != x:
        raise GroupError(f"{arg}[{i}] is {x!r}: a NaN label equals no label, not even itself, so it names no "
                         "group")
    return x


def _labels(labels, n: int, arg: str, samples: str) -> _Labels:
    """One label per sample, checked (``arg``: the caller's argument, ``samples``: what holds the
    n samples). A NaN or unhashable label, or no ordered sequence: GroupError; the wrong number
    or shape: GroupLengthError."""
    array = isinstance(labels, torch.Tensor) or _numpy(labels)
    if array and labels.ndim != 1:
        raise GroupLengthError(f"{arg} must be 1-D (one label per sample); got a {labels.ndim}-D "
                               f"{type(labels).__name__} of shape {tuple(labels.shape)}")
    if not array and (labels is None or isinstance(labels, (str, bytes, Mapping, Set))
                      or not isinstance(labels, Sequence) and not hasattr(labels, "__iter__")):
        raise GroupError(f"{arg} must hold one hashable label per sample, in order (a list, tuple, NumPy array "
                         f"or tensor); got {type(labels).__name__}")
    items = labels if array else list(labels)
    if len(items) != n:
        raise GroupLengthError(f"{arg} has length {len(items)} but {samples} has {n} samples: one label per sample")
    if isinstance(labels, torch.Tensor) and _integral(labels):
        return _Labels(labels, None, None)  # the caller's own integers: no host read
    if array:
        items = labels.tolist()  # Python scalars: a float or bool tensor's 0-d items hash by identity
    items = [_one_label(x, arg, i) for i, x in enumerate(items)]
    if all(_is_int(x) and _INT64_MIN <= x <= _INT64_MAX for x in items):
        items = [int(x) for x in items]
        return _Labels(items, items, None)  # the caller's own integers, as impl.gdpo prints them
    by_label: dict = {}
    ids = [by_label.setdefault(x, len(by_label)) for x in items]
    return _Labels(torch.tensor(ids, dtype=torch.int64, device="cpu"), items, list(by_label))


# ------------------------------------------------------------------ weights
def _weights_in_order(weights, keys: list):
    """Weights by key in the reward columns' order (a missing key is an error, never 0); a
    sequence as it is (impl.gdpo checks it)."""
    if not isinstance(weights, Mapping):
        return weights
    missing = [k for k in keys if k not in weights]
    extra = [k for k in weights if k not in keys]
    if missing or extra:
        raise WeightError(f"weights names the keys {list(weights)!r} but the reward keys are {keys!r} "
                          f"(missing {missing!r}, unknown {extra!r})")
    return [weights[k] for k in keys]


# ------------------------------------------------------------------ messages in the caller's terms
def _raise_renamed(e: GDPOError, msg: str, cause: BaseException | None = None):
    """Raise impl.gdpo's ``e`` again (its class) in the caller's names ``msg``, chained on
    ``cause`` (default ``e``)."""
    if msg == str(e) and cause is None:
        raise e
    raise (e if msg == str(e) else type(e)(msg)) from (cause or e)


def _across_ranks(msg: str, arg: str, score: str, nan_note: str = "") -> str:
    """A DistributedError's groups named by the failing rank's sample, which every rank prints
    alike (a label, or the adapter's number for one, is each rank's own). ``score`` names a
    sample's value in one reward column; ``nan_note`` (``{i}``: the sample) follows a NaN."""
    msg = re.sub(r"\brewards\[(\d+), (\d+)\] \(row \1, reward column \2, group label -?\d+\) is (nan|-?inf)\b",
                 lambda m: f"{score} of sample {m[1]} in reward column {m[2]} (the group of {arg}[{m[1]}]) is {m[3]}"
                           + (nan_note.format(i=m[1]) if m[3] == "nan" else ""), msg)
    msg = re.sub(r"\bgroup label -?\d+ \(first row (\d+)\)", lambda m: f"the group of {arg}[{m[1]}] (sample {m[1]})",
                 msg)
    msg = re.sub(r"\bat row (\d+) \(group label -?\d+\)", lambda m: f"at sample {m[1]} (the group of {arg}[{m[1]}])",
                 msg)
    return msg


def _in_callers_terms(e: GDPOError, keys: list, labels: _Labels, weights_by_key: bool, rewards: str,
                      arg: str, score: str, nan_note: str = "") -> str:
    """impl.gdpo's message with the reward keys, the caller's group labels and samples
    (``rewards`` names the reward argument in the NaN message, ``arg`` the labels); a
    DistributedError's as :func:`_across_ranks` words it."""
    msg = re.sub(r"\bgroup_ids\b", arg, str(e))
    if isinstance(e, DistributedError):
        return _across_ranks(msg, arg, score, nan_note)

    def key(j: str) -> str:
        j = int(j)
        return repr(keys[j]) if 0 <= j < len(keys) else f"column {j}"

    def weight(m):
        j = int(m.group(1))
        if weights_by_key and 0 <= j < len(keys):
            return f"weights[{keys[j]!r}]"
        return f"weights[{j}] (reward {key(m.group(1))})"

    msg = re.sub(r"\brewards\[(\d+), (\d+)\] \(row \1, reward column \2, ",
                 lambda m: f"{rewards.format(key=key(m.group(2)), i=m.group(1))} (sample {m.group(1)}, ", msg)
    msg = re.sub(r"\bweights\[(\d+)\] \(reward column \1\)", weight, msg)
    msg = re.sub(r"\breward column (\d+)", lambda m: f"reward {key(m.group(1))}", msg)
    msg = re.sub(r"\bgroup label (-?\d+)", lambda m: f"group label {labels.name(int(m.group(1)))}", msg)
    return re.sub(r"\b(first |at )?row (\d+)\b", lambda m: f"{m.group(1) or ''}sample {m.group(2)}", msg)


def _refuse_with_peers(process_group, refusal: Exception, arg: str, eps, out_dtype, *candidates):
    """The adapter refused this rank's input: raised at once without a process group; under one
    the rank joins the agreement refused (its peers must not wait until the timeout), and every
    rank raises the same DistributedError, chained here on ``refusal``."""
    if process_group is None:
        raise refusal
    try:  # where the peers' agreement tables most likely are (gloo); no tensor: the CPU
        device = next((t.device for x in candidates for t in (x.values() if isinstance(x, Mapping) else (x,))
                       if isinstance(t, torch.Tensor) and t.device.type in ("cpu", "cuda")), None)
    except Exception:  # noqa: BLE001 - a mapping that cannot even be read: the CPU
        device = None
    hint = None if device is None else torch.empty(0, dtype=torch.float32, device=device)
    try:
        _distributed.run_distributed(P.API_GDPO, process_group, rewards=hint, eps=eps, out_dtype=out_dtype,
                                     refused=refusal)
    except DistributedError as e:
        _raise_renamed(e, re.sub(r"\bgroup_ids\b", arg, str(e)))
    raise refusal  # not reached: a refused rank makes every rank raise


_TRL_NAMES = ((r"\bgroup_size\b", "num_generations"),
              (r"\bweights(?=\[| has | must )", "reward_weights"),
              (r"\brewards(?=\[| has | must | is empty|\.to_dense\(\)|\.float\(\))", "rewards_per_func"))


# ------------------------------------------------------------------ the adapters
@contextlib.contextmanager
def _named_columns(names: list):
    """The reward names travel with the weights in the agreement (impl._distributed.COLUMN_NAMES)."""
    token = _distributed.COLUMN_NAMES.set(list(names))
    try:
        yield
    finally:
        _distributed.COLUMN_NAMES.reset(token)


@_opaque_to_dynamo
def trl_advantages(rewards_per_func: torch.Tensor, num_generations: int, reward_weights=None, *,
                   segment_sizes=None, process_group=None, eps: float = DEFAULT_EPS,
                   out_dtype: torch.dtype = torch.float32, missing: str = "refuse",
                   diagnostics=None) -> torch.Tensor:
    """TRL's shape: (N, K) rewards, contiguous groups of ``num_generations``, weights (K,);
    ``missing`` and ``diagnostics`` as in impl.gdpo. Refusals in TRL's argument names."""
    if num_generations is None:  # impl.gdpo would read it as "no group_size" (neither groups nor labels)
        refusal = P.host_error(P.P_GROUP_SIZE_TYPE, P.K_NONE)  # the words of impl.gdpo's group_size refusal
        refusal = type(refusal)(re.sub(r"\bgroup_size\b", "num_generations", str(refusal)))
        _refuse_with_peers(process_group, refusal, "num_generations", eps, out_dtype, rewards_per_func)
    try:
        return gdpo_advantages(rewards_per_func, group_size=num_generations, weights=reward_weights,
                               segment_sizes=segment_sizes, process_group=process_group, eps=eps,
                               out_dtype=out_dtype, missing=missing, diagnostics=diagnostics)
    except GDPOError as e:
        msg = str(e)
        for pattern, name in _TRL_NAMES:  # text only: a DistributedError still reads the same on every rank
            msg = re.sub(pattern, name, msg)
        _raise_renamed(e, msg)


def _not_zero_one(m: torch.Tensor) -> torch.Tensor | None:
    """(B, T) bool: the entries other than 0 and 1 (NaN included); None for a bool mask."""
    if m.dtype == torch.bool:
        return None
    if m.is_floating_point() and m.element_size() == 1:
        m = m.float()  # float8: compared in float32, exactly
    return (m != 0) & (m != 1)


def _mask_error(m: torch.Tensor, bad: torch.Tensor, expected: str = "0 or 1 (or a bool mask)"
                ) -> OutOfRangeError | None:
    """The first (row-major) entry of ``m`` marked in ``bad``, named; a host read."""
    at = bad.nonzero()
    if at.shape[0] == 0:
        return None
    i, t = at[0].tolist()
    return OutOfRangeError(f"response_mask[{i}, {t}] (sample {i}, token {t}) is {m[i, t].item()!r}; "
                           f"expected {expected}")


class _Mask:
    """The response mask as bool, and what is left to check of it (entries 0 or 1, a response
    token per sample): on CPU at once; on CUDA a failing sample's scores are NaN, which
    impl.gdpo's own host read refuses, and :meth:`error` then names it."""

    def __init__(self, response_mask, device):
        if isinstance(response_mask, torch.Tensor):
            m = response_mask
        else:
            try:
                m = torch.as_tensor(numpy_view(response_mask), device="cpu")
            except (TypeError, ValueError, RuntimeError, OverflowError):
                raise InputDtypeError(f"response_mask must be a (B, T) tensor of 0/1 (or bool); got "
                                      f"{type(response_mask).__name__}") from None
        if P.layout_code(m):
            raise InputDtypeError(P.layout_words("response_mask")(P.layout_code(m), 0, 0))
        if m.is_complex():
            raise InputDtypeError(f"response_mask has dtype {P.dtype_name(P.dtype_code(m.dtype))}; a mask is "
                                  "bool, integer 0/1 or real 0/1")
        if m.dim() != 2:
            raise ShapeError(f"response_mask must be (B, T), one row of tokens per sample; got shape "
                             f"{tuple(m.shape)}")
        self.raw, self.bad = m, _not_zero_one(m)  # bad: None once checked, or for a bool mask
        self.empty = ~m.to(torch.bool).any(dim=-1)  # NaN is true: a NaN entry is refused as a value, not here
        if reads_free(m.device):  # a host sequence is checked here, on the CPU
            error = self.error()
            if error is not None:
                raise error
            self.bad = self.empty = None
        if m is not response_mask and device is not None:
            self.raw = m = m.to(device)
        self.bool = m.to(torch.bool)

    def poison(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` with NaN on every sample whose mask is not yet checked and fails."""
        if self.empty is None:
            return scores
        failing = self.empty if self.bad is None else self.empty | self.bad.any(dim=-1)
        return torch.where(failing.to(scores.device).unsqueeze(-1), torch.nan, scores)

    def error(self) -> GDPOError | None:
        """On refusal: the first unchecked entry other than 0 and 1, else the first sample
        without a response token (host reads)."""
        if self.empty is None:
            return None
        own = None if self.bad is None else _mask_error(self.raw, self.bad)
        if own is None and bool(self.empty.any()):
            i = int(self.empty.nonzero()[0, 0])
            own = ShapeError(f"response_mask[{i}] (sample {i}) has no response token: its score would be a sum "
                             "over nothing, a 0 that no reward gave; drop the sample or fix the mask")
        return own


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _on_response_tokens(a: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) advantages broadcast to (B, T), +0.0 on padding: selected on the bits (no float8
    kernel needed; a * 0 would give -0.0)."""
    bits = _BITS[a.element_size()]
    return torch.where(mask, a.view(bits).unsqueeze(-1), torch.zeros((), dtype=bits, device=a.device)).view(a.dtype)


def _locate_nonfinite(tokens: dict, keys: list, mask: torch.Tensor, scores: torch.Tensor, labels: _Labels):
    """On refusal: the first non-finite score's first non-finite token, or its sum beyond float64."""
    bad = (~torch.isfinite(scores)).nonzero().tolist()
    if not bad:
        return None
    i, j = bad[0]
    key = keys[j]
    row = tokens[key][i]
    found = (~torch.isfinite(row) & mask[i]).nonzero().flatten().tolist()
    label = repr(labels.items[i] if labels.items is not None else labels.ids[i].item())
    if found:
        tok = found[0]
        return NonFiniteError(f"token_level_rewards[{key!r}][{i}, {tok}] (sample {i}, response token {tok}, "
                              f"group label {label}) is {row[tok].item()!r}")
    return OutOfRangeError(f"the score of sample {i} under token_level_rewards[{key!r}] (group label {label}), "
                           f"the sum of its response tokens' finite rewards, is beyond float64 "
                           f"({scores[i, j].item()!r})")


def _verl_inputs(token_level_rewards, response_mask, index, weights, distributed: bool):
    """verl's arguments checked: (keys, the mask, token rewards by key, labels, (B, K) float64
    scores, weights in key order)."""
    keys = _keys(token_level_rewards, "token_level_rewards", "reward key: (B, T) tensor", "reward key")
    device = _first_tensor_device(response_mask, *token_level_rewards.values())
    checked = _Mask(response_mask, device)
    mask = checked.bool
    tokens = {}
    for key in keys:
        where = f"token_level_rewards[{key!r}]"
        t = _float_tensor(token_level_rewards[key], where, mask.device, column="response token")
        if t.shape != mask.shape:
            raise ShapeError(f"{where} has shape {tuple(t.shape)}, response_mask {tuple(mask.shape)}: token "
                             "rewards are (B, T), like the mask")
        if t.device != mask.device:
            raise InputDtypeError(f"{where} is on {t.device} but response_mask on {mask.device}: pass them on "
                                  "one device")
        tokens[key] = t
    b = mask.shape[0]
    if b == 0 and not distributed:  # with a process group a rank may hold no samples
        raise ShapeError(f"token_level_rewards and response_mask hold no samples (B=0, shape "
                         f"{tuple(mask.shape)})")
    ids = _labels(index, b, "index", "response_mask")
    # Padding must not matter: inf * 0 would be NaN, so select, never multiply.
    scores = torch.stack([torch.where(mask, tokens[k].to(torch.float64), 0.0).sum(dim=-1) for k in keys], dim=1)
    return keys, checked, tokens, ids, checked.poison(scores), _weights_in_order(weights, keys)


#: After a NaN score in a DistributedError: on CUDA the mask's values are checked through that
#: NaN (see _Mask), which every rank must print alike whatever its own device or mask.
_MASK_NAN = (" (a NaN token reward, or on CUDA a response_mask row {i} with an entry other than 0 and 1 or no "
             "response token; that rank chains its own error)")


@_opaque_to_dynamo
def verl_advantages(token_level_rewards: Mapping[str, torch.Tensor], response_mask: torch.Tensor,
                    index: Sequence[Hashable] | torch.Tensor, weights: Mapping[str, float] | None = None, *,
                    segment_sizes=None, process_group=None, eps: float = DEFAULT_EPS,
                    out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """verl's shape: {key: (B, T) token-level rewards}, (B, T) mask, (B,) group labels -> (B, T)
    (docs/adopting.md)."""
    try:
        keys, mask, tokens, ids, scores, w = _verl_inputs(token_level_rewards, response_mask, index, weights,
                                                          process_group is not None)
    except Exception as e:  # noqa: BLE001 - under a process group the peers must hear of it
        _refuse_with_peers(process_group, e, "index", eps, out_dtype, response_mask, token_level_rewards)
    try:
        with _named_columns(keys):
            a = gdpo_advantages(scores, group_ids=ids.ids, weights=w, segment_sizes=segment_sizes,
                                process_group=process_group, eps=eps, out_dtype=out_dtype)
    except GDPOError as e:
        own = mask.error()
        if own is None and isinstance(e, (NonFiniteError, DistributedError)):
            own = _locate_nonfinite(tokens, keys, mask.bool, scores, ids)
        if own is not None and process_group is None:
            raise own from e
        better = _in_callers_terms(e, keys, ids, isinstance(weights, Mapping),
                                   "the score (sum of response tokens) of token_level_rewards[{key}][{i}]", "index",
                                   "the score (sum of response tokens)", _MASK_NAN)
        if own is not None:  # under a process group: the same error on every rank, this rank's own chained
            own.__context__ = e  # (and impl.gdpo's, with whatever it chained, behind it)
        _raise_renamed(e, better, own)
    return _on_response_tokens(a, mask.bool)


def _labelled_inputs(rewards, labels, weights):
    """The labelled arguments checked: (names, (N, K) rewards, labels, weights in name order)."""
    names = _keys(rewards, "rewards", "name: (N,) rewards", "reward component")
    device = _first_tensor_device(*rewards.values())
    comps = {}
    for name in names:
        where = f"rewards[{name!r}]"
        t = _float_tensor(rewards[name], where, device)
        if t.dim() != 1:
            raise ShapeError(f"{where} must be 1-D (N,), one reward per sample; got shape {tuple(t.shape)}")
        comps[name] = t
    lengths = {k: v.shape[0] for k, v in comps.items()}
    if len(set(lengths.values())) != 1:
        raise ShapeError("every reward component must be a (N,) tensor of one length; got lengths "
                         + "{" + ", ".join(f"{k!r}: {n}" for k, n in lengths.items()) + "}")
    first = names[0]
    for name in names[1:]:
        if comps[name].device != comps[first].device:
            raise InputDtypeError(f"rewards[{name!r}] is on {comps[name].device} but rewards[{first!r}] on "
                                  f"{comps[first].device}: pass every component on one device")
    dtype = _widest([c.dtype for c in comps.values()])
    r = torch.stack([comps[k].to(dtype) for k in names], dim=1)
    ids = _labels(labels, r.shape[0], "labels", "each reward component")
    return names, r, ids, _weights_in_order(weights, names)


@_opaque_to_dynamo
def labelled_advantages(rewards: Mapping[str, torch.Tensor], labels: Sequence[Hashable] | torch.Tensor,
                        weights: Mapping[str, float] | None = None, *, segment_sizes=None, process_group=None,
                        eps: float = DEFAULT_EPS, out_dtype: torch.dtype = torch.float32,
                        missing: str = "refuse", diagnostics=None) -> torch.Tensor:
    """{name: (N,) rewards}, one label per sample -> (N,) advantages (columns in mapping order);
    ``missing`` and ``diagnostics`` as in impl.gdpo."""
    try:
        names, r, ids, w = _labelled_inputs(rewards, labels, weights)
    except Exception as e:  # noqa: BLE001 - under a process group the peers must hear of it
        _refuse_with_peers(process_group, e, "labels", eps, out_dtype, rewards)
    try:
        with _named_columns(names):
            return gdpo_advantages(r, group_ids=ids.ids, weights=w, segment_sizes=segment_sizes,
                                   process_group=process_group, eps=eps, out_dtype=out_dtype, missing=missing,
                                   diagnostics=diagnostics)
    except GDPOError as e:
        _raise_renamed(e, _in_callers_terms(e, names, ids, isinstance(weights, Mapping), "rewards[{key}][{i}]",
                                            "labels", "the reward"))
