"""Pinned examples, hex-encoded: replayed first by every run of their property.

Two kinds, both permanent (the hypothesis database is only a cache):

* the traps of GDPO_BRIEF section 5 and spec/gdpo.md sections 2, 4 and 8, written once in hex;
* every case the suite found failing (an implementation, the controls' common base,
  the oracle), with a line saying what it caught.

They live in ``regressions.json`` beside this module, by property, each entry ``{"why", "case"}``.
Each case is the JSON a failure's repro line prints (``Case.dumps()`` or ``DistCase.dumps()``);
floats are ``float.hex`` strings, so a replay is bit-exact. ``EXAMPLES`` holds each case as that
text.
"""

from __future__ import annotations

import json
import pathlib

from conformance.cases import loads as load  # noqa: F401 - a pinned example from its text

EXAMPLES: dict[str, tuple[str, ...]] = {
    name: tuple(json.dumps(e["case"], separators=(",", ":")) for e in entries)
    for name, entries in json.loads(pathlib.Path(__file__).with_name("regressions.json").read_text()).items()}
