"""``gdpo peers``: grade every installed peer and write the generated peers page, ``spec/peers.md``.

    gdpo peers [--from FILE ...] [--out spec/peers.md] [--save-json DIR] [--check]

A peer is a preset of ``spec.conventions.CONVENTIONS`` with a ``package`` (the published
implementation it describes: trl, verl, ms-swift, multireward-grpo). For each one whose
package imports in this interpreter, ``gdpo check`` grades its adapter
(``conformance.peers:<name>``, in the call shape :data:`CALL_SHAPES` names, under its own
convention, ``--single-process``: no adapter joins a process group) and its JSON
(``gdpo check --json``) is kept. A peer not installed here can be graded elsewhere, in an
environment that has it (the heavy peers' own virtual environments: see
``spec/peers_findings.md``), with the command the page prints for it, and its JSON merged
with ``--from``; a peer with no result is listed as not graded here. ``--check`` writes
nothing: it exits 1 where the committed page disagrees with the presets (package, version,
entry point) or, for the peers graded now, with their tables (``tests/test_peers_page.py``
does the same).

The page holds, per peer: ``package==version``, the entry point, the adapter and call
shape, the table (property, verdict, category, worst error in ulps of its own dtype; the
category is ``-`` where the judge gives none), one replay line per failed property
(``python -m conformance.replay ...``, from the failure's own text) and the wall time.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.verdicts import ARITHMETIC  # the verdicts another machine may not share

#: The committed page.
PAGE = Path(__file__).resolve().parent.parent / "spec" / "peers.md"
#: The call shape of each peer's adapter (``conformance/peers.py``): ms-swift and TRL take TRL's
#: arguments (rewards per function, num_generations, reward weights), verl its own.
CALL_SHAPES = {"multireward_grpo": "gdpo", "ms_swift": "trl", "verl": "verl", "trl": "trl"}
COMMAND = "gdpo peers"
_TABLE = re.compile(r"<!-- table:(\w+) -->\n(.*?)<!-- /table:\1 -->", re.S)


def peers() -> list:
    """The peer presets (those with a package), in the order of ``CONVENTIONS``."""
    from spec.conventions import CONVENTIONS

    return [c for c in CONVENTIONS.values() if c.package]


def adapter(name: str) -> str:
    return f"conformance.peers:{name}"


def module_of(conv) -> str:
    """The top-level module the preset's entry point lives in (``ms-swift``: ``swift``)."""
    return conv.entry_point.split(":")[0].split(".")[0]


def installed(conv) -> bool:
    return importlib.util.find_spec(module_of(conv)) is not None


def check_args(name: str) -> list[str]:
    """``gdpo check``'s arguments that grade the peer ``name``."""
    if name not in CALL_SHAPES:
        raise KeyError(f"peer preset {name!r} has no call shape in gdpo_tools/peers_report.py CALL_SHAPES")
    return ["--impl", adapter(name), "--convention", name, "--call-shape", CALL_SHAPES[name], "--single-process"]


def check_command(name: str) -> str:
    return "python -m gdpo_tools.cli check " + " ".join(shlex.quote(a) for a in check_args(name)) + " --json FILE"


def grade(name: str, timeout: float = 1800.0) -> dict:
    """Grade the peer ``name`` with ``gdpo check`` in this interpreter; its JSON, with the wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.json")
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "gdpo_tools.cli", "check", *check_args(name), "--json", path],
                              capture_output=True, text=True, timeout=timeout,
                              cwd=str(Path(__file__).resolve().parent.parent))
        wall = time.monotonic() - t0
        if not Path(path).exists():
            raise RuntimeError(f"gdpo check of {name} wrote no JSON (exit {proc.returncode}):\n"
                               + proc.stdout[-3000:] + proc.stderr[-3000:])
        data = json.loads(Path(path).read_text())
    data["wall_s"] = round(wall, 1)
    return data


def peer_name(data: dict) -> str | None:
    """The peer a grading JSON is of (its convention, graded through the peer's adapter), or None."""
    name = data.get("convention")
    return name if name in CALL_SHAPES and data.get("impl") == adapter(name) else None


def load(paths) -> dict:
    """{peer name: grading JSON} of files made by ``gdpo check --json`` (globs expanded)."""
    out = {}
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            data = json.loads(Path(path).read_text())
            name = peer_name(data)
            if name is None:
                raise SystemExit(f"gdpo peers: {path} is no grading of a peer's adapter "
                                 f"(impl {data.get('impl')!r}, convention {data.get('convention')!r})")
            data["_source"] = f"merged from `{os.path.relpath(path)}`"
            out[name] = data
    return out


# ------------------------------------------------------------------------------ the page


def _graded_rows(data: dict) -> list[dict]:
    """A grading's rows that called the peer (the suite's own checks never do)."""
    return [r for r in data["properties"] if r.get("calls_impl", True)]


def rows_of(data: dict) -> list[tuple[str, str, str, str]]:
    """The table of one grading: (property, verdict, category, worst error), rows of one verdict
    merged as ``conformance.plugins.table_groups`` merges them, their members named."""
    from conformance.plugins import table_rows

    return table_rows(_graded_rows(data), list_names=True)


def combined_digest(digests: list[str]) -> str:
    """One digest for a merged row's members' digests (the members' own, in order; one member:
    its digest)."""
    if len(digests) == 1:
        return digests[0]
    return hashlib.sha256(" ".join(digests).encode()).hexdigest()[:16]


def digests_of(data: dict) -> dict:
    """{table row: (number of cases checked, their digest)} of a grading whose cases were drawn
    first (``conformance/runner.py``): the same on any machine, whatever the peer returns. A merged
    row has its members' total and :func:`combined_digest` where every member has one."""
    from conformance.plugins import table_groups

    out = {}
    for cells, group in table_groups(_graded_rows(data), list_names=True):
        if group and all(r.get("cases_digest") for r in group):
            out[cells[0]] = (sum(r["cases"] for r in group), combined_digest([r["cases_digest"] for r in group]))
    return out


def _md(cell: str) -> str:
    return cell.replace("|", "\\|")


def render_table(rows, digests: dict | None = None) -> str:
    digests = digests or {}
    lines = ["| property | verdict | category | worst error | cases checked |", "|---|---|---|---|---|"]
    for p, v, c, w in rows:
        n, d = digests.get(p, (None, None))
        cases = f"{n} `{d}`" if d else "-"
        lines.append(f"| `{_md(p)}` | {_md(v)} | {_md(c)} | {_md(w)} | {cases} |")
    return "\n".join(lines) + "\n"


def _section(conv, data: dict | None) -> list[str]:
    name = conv.name
    out = [f"## {conv.package} {conv.version} (`{name}`)", ""]
    out.append(f"- package: `{conv.package}=={conv.version}`")
    out.append(f"- entry point: `{conv.entry_point}` (read from `{conv.read_from}`)")
    out.append(f"- adapter: `{adapter(name)}`, call shape `{CALL_SHAPES[name]}`, convention `{name}`")
    out.append(f"- graded by: `{check_command(name)}`")
    if data is None:
        out += ["- result: **not graded here (not installed)**: run the command above where "
                f"`{conv.package}=={conv.version}` is installed, then `{COMMAND} --from FILE`", ""]
        return out
    peer = data.get("peer") or {}
    got = peer.get("installed_version")
    if got and got != conv.version:
        out.append(f"- **graded with {conv.package} {got}, not the preset's {conv.version}**")
    c = data["counts"]
    wall = data.get("wall_s")
    took = f"{wall:.0f} s wall" if wall is not None else f"{data.get('seconds', 0):.0f} s in pytest"
    out.append(f"- graded: {data.get('_source', 'live, by the command that wrote this page')}")
    out.append(f"- result: {c['failed']} failed, {c['passed']} passed of the {c['called_impl']} properties that "
               f"called it ({c['skipped']} skipped, {c.get('error', 0)} errors); profile `{data.get('profile')}`, "
               f"hypothesis {data.get('hypothesis')}; {took}")
    found = data.get("findings") or []
    if found:
        from conformance.findings import cause

        out += ["", "Findings (one per cause: the category, where it shows, the properties it failed, the "
                "smallest example, and the line that replays it with the judge's full report):", ""]
        for i, f in enumerate(found, 1):
            out.append(f"{i}. **{f['category']}**: {cause(f)} ({', '.join(f'`{p}`' for p in f['properties'])}): "
                       f"{f['example']}")
            if f.get("repro"):
                out += ["", "   ```", f"   {f['repro']}", "   ```"]
            out.append("")
    errored = [r for r in _graded_rows(data) if r["verdict"] == "error"]
    for r in errored:  # a crash, not a verdict: its first line, and its repro where it has one
        out.append(f"- `{r['name']}` errored: {_short(r['headline'] or '')}")
    out += ["", f"<!-- table:{name} -->", render_table(rows_of(data), digests_of(data)).rstrip("\n"),
            f"<!-- /table:{name} -->", ""]
    return out


def _short(headline: str) -> str:
    """A failure's first line without its prefix (``[prop] Eq. .. of impl (call shape .., convention ..): ``)."""
    m = re.match(r"\[[^\]]+\](?: \[[^\]]+\])? .*? \(call shape \w+, convention '\w+'\): (.*)", headline)
    return m.group(1) if m else headline


#: Where the heavy peers' gradings made in their own environments are kept (``--save-json``,
#: ``gdpo check --json``), so that the page is regenerated here with ``--from``.
GRADED = PAGE.parent / "peers_graded"


def render(results: dict, command: str = COMMAND) -> str:
    """The page, from {peer name: grading JSON} (a peer without one: not graded here);
    ``command``: the command line that wrote it, printed in its header."""
    from spec.conventions import CONVENTIONS  # noqa: F401 - peers() reads it

    head = [
        "# Peers graded (generated)",
        "",
        f"<!-- Generated by `{COMMAND}` (gdpo_tools/peers_report.py); do not edit. -->",
        "",
        f"**Generated by `{COMMAND}`; do not edit.** Each published GDPO implementation with a preset in "
        "`spec/conventions.py` (`package`, `version`, `entry_point`) is called unchanged through its adapter in "
        "`conformance/peers.py` and graded by `gdpo check` against its own convention. Peers installed where the "
        f"command runs are graded live; the others are merged from `gdpo check --json` files (`{COMMAND} --from "
        "FILE ...`), made in an environment that has them (see `spec/peers_findings.md` for the environments and "
        "a hand classification of the failures). `tests/test_peers_page.py` fails when this page disagrees with "
        "the presets, when the cases a property checked (drawn first from its seed: the same on any machine, "
        "whatever the peer returns) are not those drawn now, or, for multireward-grpo, installed in CI, when a "
        "failure's replay line no longer fails in its category or a live grading differs otherwise than by the "
        "peer's own arithmetic: a property passed here may fail on a machine whose float arithmetic differs "
        "(another SIMD width reorders a peer's sums), in a category of arithmetic (precision, non_finite, "
        "silent_zero, exact_zero); `gdpo peers --check` says so as a note.",
        "",
        "Columns: the verdict of each property that called the peer (skipped: what its call shape or convention "
        "cannot express); the category of the failure (`conformance/verdicts.py`; `-` where the judge gives "
        "none); the worst error in ulps of the dtype the peer is judged at (`-` where the failure is no distance "
        "or the judge gives none); the cases checked, with the digest of their exact inputs. Verdicts are of the "
        "`grade` profile (`conformance/profiles.py`: the cases drawn first, every case checked, a failure "
        "reduced by the judge), `--single-process`.",
        "",
        f"This page was written by `{command}`. The peers in `spec/peers_graded/` were graded in their own "
        "virtual environments (torch 2.13.0, this checkout importable first), each by the `graded by` command "
        "of its section with `--json spec/peers_graded/NAME.json`; the hypothesis version of each grading is "
        "in its result line (generation depends on it).",
        "",
    ]
    body = []
    for conv in peers():
        body += _section(conv, results.get(conv.name))
    return "\n".join(head + body).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------ staleness


def parse(text: str) -> dict:
    """{peer name: {"package", "version", "entry_point", "rows": [(property, verdict, category)] or None}}."""
    out = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        m = re.match(r"(\S+) (\S+) \(`(\w+)`\)", block)
        if not m:
            continue
        entry = re.search(r"^- entry point: `([^`]+)`", block, re.M)
        pkg = re.search(r"^- package: `([^`=]+)==([^`]+)`", block, re.M)
        table = _TABLE.search(block)
        rows, digests = None, {}
        if table:
            rows = []
            for ln in table.group(2).splitlines()[2:]:
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]
                if len(cells) in (4, 5):
                    rows.append((cells[0].strip("`").replace("\\|", "|"), cells[1].replace("\\|", "|"),
                                 cells[2].replace("\\|", "|")))
                    d = re.fullmatch(r"(\d+) `([0-9a-f]+)`", cells[4]) if len(cells) == 5 else None
                    if d:
                        digests[rows[-1][0]] = (int(d.group(1)), d.group(2))
        out[m.group(3)] = {"package": pkg.group(1) if pkg else None, "version": pkg.group(2) if pkg else None,
                           "heading": (m.group(1), m.group(2)), "entry_point": entry.group(1) if entry else None,
                           "rows": rows, "digests": digests, "findings": _findings(block)}
    return out


def _findings(block: str) -> list[dict]:
    """[{"category", "properties", "repro"}] of a peer's section, in order."""
    out = []
    for m in re.finditer(r"^\d+\. \*\*(\w+)\*\*: (.*?)(?=^\d+\. \*\*|^<!-- table:|\Z)", block, re.M | re.S):
        head = m.group(2).split("\n", 1)[0]
        props = re.findall(r"`([^`]+)`", head.split("): ", 1)[0]) if "): " in head else []
        repro = re.search(r"^\s*(python -m conformance\.replay [^\n]+)$", m.group(2), re.M)
        out.append({"category": m.group(1), "properties": props, "repro": repro.group(1).strip() if repro else None})
    return out


def preset_problems(text: str) -> list[str]:
    """Where the page disagrees with the presets (a peer missing or extra, a package, version or
    entry point not the preset's)."""
    page = parse(text)
    problems = []
    names = {c.name for c in peers()}
    for extra in sorted(set(page) - names):
        problems.append(f"{extra}: on the page, but no peer preset has that name")
    for conv in peers():
        got = page.get(conv.name)
        if got is None:
            problems.append(f"{conv.name}: no section on the page")
            continue
        for what, want, have in (("package", conv.package, got["package"]), ("version", conv.version, got["version"]),
                                 ("entry point", conv.entry_point, got["entry_point"]),
                                 ("heading", (conv.package, conv.version), got["heading"])):
            if want != have:
                problems.append(f"{conv.name}: {what} on the page is {have!r}, the preset says {want!r}")
    return problems



def digest_problems(text: str, name: str) -> list[str]:
    """Where the cases the page says a row of peer ``name`` checked are not those drawn now (the
    same on any machine, whatever the peer returns: its package is not needed)."""
    from conformance import plugins, profiles, runner
    from conformance.subject import Subject

    page = parse(text).get(name) or {}
    subject = Subject(adapter(name), CALL_SHAPES[name], name)
    problems = []
    for row, (n, d) in page.get("digests", {}).items():
        drawn = [runner.row_cases(m, subject, profiles.GRADE_MAX_EXAMPLES) for m in plugins.members(row)]
        now = (sum(len(c) for c in drawn), combined_digest([runner.digest(c) for c in drawn]))
        if now != (n, d):
            problems.append(f"{name} {row}: the page checked {n} cases `{d}`, drawn now: {now[0]} `{now[1]}`")
    return problems


def finding_problems(text: str, name: str) -> list[str]:
    """Where the findings of peer ``name`` on the page do not account for its table: a failed row
    that no finding lists, a finding without a replay line (needs no package)."""
    page = parse(text).get(name) or {}
    found = page.get("findings") or []
    listed = {p for f in found for p in f["properties"]}
    problems = [f"{name} {row}: failed on the page, and no finding lists it"
                for row, verdict, _ in page.get("rows") or () if verdict == "failed" and row not in listed]
    problems += [f"{name} finding {i} ({f['category']}): no replay line" for i, f in enumerate(found, 1)
                 if not f["repro"]]
    return problems


def replay_problems(text: str, name: str) -> list[str]:
    """Where a finding on the page of peer ``name`` no longer fails, replayed from its repro line, in
    the finding's category (the peer must be installed)."""
    import shlex

    from conformance import judge as J
    from conformance import properties
    from conformance.cases import Case, DistCase
    from conformance.subject import Subject

    page = parse(text).get(name) or {}
    problems = []
    for i, f in enumerate(page.get("findings") or (), 1):
        line, cat = f["repro"], f["category"]
        if line is None:
            problems.append(f"{name} finding {i} ({cat}): no replay line")
            continue
        argv = shlex.split(line)[3:]
        opts = dict(zip(argv[::2], argv[1::2]))
        data = json.loads(opts["--case"])
        case = DistCase.from_json(data) if "shards" in data else Case.from_json(data)
        subject = Subject(opts["--impl"], opts["--call-shape"], opts["--convention"])
        prop = opts.get("--property", "values")
        try:
            properties.CHECKS[prop](subject, case, prop)
        except J.ConformanceFailure as exc:
            if (exc.category or "-") != cat:
                problems.append(f"{name} finding {i} ({prop}): replayed, it fails as {exc.category}, the page "
                                f"says {cat}")
            continue
        problems.append(f"{name} finding {i} ({prop}): fails on the page ({cat}); its replay line now passes")
    return problems


def live_problems(text: str, name: str, data: dict) -> tuple[list[str], list[str]]:
    """A live grading against the page: (problems, differences of arithmetic). The cases are the
    same on any machine (:func:`digest_problems`), but a peer's own float arithmetic on one case
    need not be: a property the page passed that fails here in a category of :data:`ARITHMETIC`
    is such a difference, said but not a problem; any other difference is a stale page."""
    got = parse(text).get(name, {}).get("rows")
    want = [r[:3] for r in rows_of(data)]
    if got is None:
        return [f"{name}: the page has no table (not graded), a live grading has {len(want)} rows"], []
    problems, arithmetic = [], []
    if [r[0] for r in got] != [r[0] for r in want]:
        return row_problems(name, got, want), []
    for g, w in zip(got, want):
        if g == w:
            continue
        if g[1] == "passed" and w[1] == "failed" and w[2] in ARITHMETIC:
            arithmetic.append(f"{name} {w[0]}: fails here ({w[2]}) on a case the page's machine passed: the "
                              "peer's own arithmetic differs between the two machines")
        else:
            problems.append(f"{name} {g[0]}: page {g[1:]}, live {w[1:]}")
    return problems, arithmetic


def table_problems(text: str, name: str, data: dict) -> list[str]:
    """Where the page's table of peer ``name`` differs from a grading's (property, verdict and
    category; the worst error and the times vary with the shrinking, not the verdict)."""
    got = parse(text).get(name, {}).get("rows")
    want = [r[:3] for r in rows_of(data)]
    if got is None:
        return [f"{name}: the page has no table (not graded), a live grading has {len(want)} rows"]
    return row_problems(name, got, want)


def row_problems(name: str, got: list, want: list) -> list[str]:
    """The rows that differ, one line each (``got``: the page's, ``want``: the grading's)."""
    problems = []
    for i in range(max(len(got), len(want))):
        g = tuple(got[i]) if i < len(got) else None
        w = tuple(want[i]) if i < len(want) else None
        if g != w:
            problems.append(f"{name} row {i + 1}: page {g}, live {w}")
    return problems


def main(argv=None, prog: str = COMMAND) -> int:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0].split(": ", 1)[1],
                                 epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="from_files", nargs="+", action="extend", default=[], metavar="FILE",
                    help="grading JSON files (gdpo check --json) of peers graded elsewhere; globs are expanded")
    ap.add_argument("--out", default=None,
                    help=f"the page to write (default, in a checkout: {PAGE.relative_to(PAGE.parents[1])})")
    ap.add_argument("--save-json", default=None, metavar="DIR", help="also keep each live grading's JSON in DIR")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="grade only these peers live")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 where the committed page is stale (presets; tables of the peers "
                         "graded now)")
    args = ap.parse_args(argv)
    if args.out is None:
        if not (PAGE.parents[1] / "pyproject.toml").is_file():  # an installed package: never into site-packages
            ap.error("--out PAGE is needed outside a checkout of gdpo-spec")
        args.out = str(PAGE)
    results = load(args.from_files)
    for conv in peers():
        if args.only is not None and conv.name not in args.only:
            continue
        if not installed(conv):
            if conv.name not in results:
                print(f"{conv.name}: {module_of(conv)} is not importable here: not graded", flush=True)
            continue
        print(f"{conv.name}: grading ({check_command(conv.name)}) ...", flush=True)
        results[conv.name] = grade(conv.name)
        results[conv.name]["_source"] = f"live, by `{COMMAND}` in Python {sys.version.split()[0]}"
        c = results[conv.name]["counts"]
        print(f"{conv.name}: {c['failed']} failed, {c['passed']} passed, {c['skipped']} skipped, "
              f"{results[conv.name]['wall_s']:.0f} s", flush=True)
        if args.save_json:
            Path(args.save_json).mkdir(parents=True, exist_ok=True)
            kept = {k: v for k, v in results[conv.name].items() if k != "_source"}
            (Path(args.save_json) / f"{conv.name}.json").write_text(json.dumps(kept, indent=1) + "\n")
    if args.check:
        text = Path(args.out).read_text()
        problems = preset_problems(text)
        for conv in peers():
            problems += digest_problems(text, conv.name)
        notes, by_name = [], {conv.name: conv for conv in peers()}
        for name, data in results.items():
            found, arithmetic = live_problems(text, name, data)
            problems += found
            notes += arithmetic
            if name in by_name and installed(by_name[name]):
                problems += replay_problems(text, name)
            else:  # (a replay would fail to import the peer: that says nothing of the page)
                notes.append(f"{name}: not importable here: its findings' replay lines were not replayed")
        for conv in peers():
            problems += finding_problems(text, conv.name)
        for a in notes:
            print(f"note: {a}")
        for p in problems:
            print(f"stale: {p}")
        print(f"{args.out}: {'stale' if problems else 'up to date'}")
        return 1 if problems else 0
    dropped = _dropped(args.out, results)
    if dropped:
        graded = " ".join(f"--from {os.path.relpath(GRADED / (n + '.json'))}" for n in dropped
                          if (GRADED / (n + ".json")).is_file())
        print(f"gdpo peers: {args.out} grades {', '.join(dropped)}, neither installed here nor given with --from: "
              f"writing would mark {'it' if len(dropped) == 1 else 'them'} not graded; nothing written. Add "
              f"{graded or '--from FILE (their gdpo check --json gradings)'}, or write elsewhere with --out",
              file=sys.stderr)
        return 2
    command = COMMAND + "".join(f" --from {shlex.quote(os.path.relpath(f) if os.path.exists(f) else f)}"
                                for f in args.from_files)
    Path(args.out).write_text(render(results, command))
    print(f"wrote {args.out} ({len(results)} of {len(peers())} peers graded)")
    return 0


def _dropped(out: str, results: dict) -> list[str]:
    """The peers the page at ``out`` grades (a table of theirs) that ``results`` lacks: writing it
    would turn their sections into "not graded"."""
    path = Path(out)
    if not path.is_file():
        return []
    return [name for name, sec in parse(path.read_text()).items() if sec.get("rows") and name not in results]


if __name__ == "__main__":
    raise SystemExit(main())
