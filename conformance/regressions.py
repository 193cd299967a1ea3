"""Pinned examples, by property, replayed first by every run of it (the database is a cache).

``regressions.json`` holds the traps of GDPO_BRIEF section 5 and spec/gdpo.md, and every case the
suite found failing, each ``{"why", "case"}``; a case is a failure's repro JSON, floats in hex.
"""

from __future__ import annotations

import json
import pathlib

from conformance.cases import loads as load  # noqa: F401 - a pinned example from its text

EXAMPLES: dict[str, tuple[str, ...]] = {
    name: tuple(json.dumps(e["case"], separators=(",", ":")) for e in entries)
    for name, entries in json.loads(pathlib.Path(__file__).with_name("regressions.json").read_text()).items()}
