"""`gdpo check` (and `pytest --impl`) stops at once where the function cannot be called the way
its call shape calls it (found by a new-user review): a TRL-shaped function graded in the default
gdpo shape raised a TypeError on every call, which the grader read as refusals, so the input
checks passed (as refusals of another class) and every valid case failed as "refused where the
contract computes", the cause buried in the details. The check reads the function's signature
(conformance.subject.shape_mismatch); every implementation this project grades passes it in its
own shape (no false stop), and a function of another shape gets the shape it fits named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import controls
from conformance.subject import resolve_impl, shape_mismatch
from gdpo_tools import peers_report

ROOT = Path(__file__).resolve().parents[1]


def trl_like(rewards, num_generations, reward_weights):
    return rewards.sum(1)


def gdpo_like(rewards, *, group_ids=None, group_size=None, weights=None, segment_sizes=None,
              process_group=None, eps=1e-6, out_dtype=None):
    return rewards.sum(1)


def verl_like(token_level_rewards, response_mask, index, weights=None):
    return token_level_rewards


def needs_weights(rewards, *, group_size, weights, out_dtype=None):  # weights: passed by the cases that have them
    return rewards.sum(1)


def needs_tokenizer(rewards, tokenizer, *, group_size=None, out_dtype=None):
    return rewards.sum(1)


def anything(*args, **kwargs):
    return None


class TrlObject:
    def __call__(self, rewards_per_func, num_generations, reward_weights):
        return rewards_per_func.sum(1)


@pytest.mark.parametrize("fn, shape, fits", [
    (trl_like, "gdpo", "trl"), (TrlObject(), "gdpo", "trl"), (gdpo_like, "trl", "gdpo"),
    (gdpo_like, "verl", "gdpo"), (verl_like, "gdpo", "verl"), (needs_tokenizer, "gdpo", None),
])
def test_a_function_of_another_shape_is_named_with_the_shape_it_fits(fn, shape, fits):
    why = shape_mismatch(fn, shape)
    assert why is not None and f"call shape {shape!r}" in why, why
    assert (f"--call-shape {fits}" in why) if fits else ("--call-shape" not in why), why


@pytest.mark.parametrize("fn, shape", [
    (trl_like, "trl"), (TrlObject(), "trl"), (gdpo_like, "gdpo"), (verl_like, "verl"), (needs_weights, "gdpo"),
    (anything, "gdpo"), (anything, "trl"), (anything, "verl"), (max, "gdpo"),  # max: no signature to read
])
def test_a_function_of_its_shape_passes(fn, shape):
    assert shape_mismatch(fn, shape) is None


def _graded_here():
    yield "impl.gdpo:gdpo_advantages", "gdpo"
    yield "conformance.subject:impl_trl_shape", "trl"
    yield "impl.adapters:trl_advantages", "trl"
    yield "impl.adapters:verl_advantages", "verl"
    for name in [*controls.CONTROLS, "baseline"]:
        yield f"conformance.controls:{name}", "gdpo"
    for name, shape in peers_report.CALL_SHAPES.items():
        yield peers_report.adapter(name), shape


@pytest.mark.parametrize("target, shape", list(_graded_here()))
def test_every_implementation_this_project_grades_takes_its_shape(target, shape):
    assert shape_mismatch(resolve_impl(target), shape) is None


def test_gdpo_check_stops_before_grading(tmp_path):
    """The command itself: a usage error (2) naming the shape to use, before any property runs."""
    (tmp_path / "mine.py").write_text("def adv(rewards, num_generations, reward_weights):\n"
                                      "    return rewards.sum(1)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", "--impl", "mine:adv"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "--call-shape trl" in p.stderr and "running" not in p.stdout, (p.stdout, p.stderr)
