"""``gdpo peers``: grade every installed peer and write the generated peers page, ``spec/generated/peers.md``.

    gdpo peers [--from FILE ...] [--out spec/generated/peers.md] [--save-json DIR] [--only NAME ...] [--check]

A peer is a preset of ``spec.conventions.CONVENTIONS`` with a ``package`` (the published
implementation it describes: trl, verl, ms-swift, multireward-grpo). For each one whose
package imports in this interpreter, ``gdpo check`` grades its adapter (``conformance.peers:<name>``,
in the call shape :data:`CALL_SHAPES` names, under its own convention, ``--single-process``) and
keeps its JSON. A peer not installed here is graded elsewhere, in an environment that has it, with
the command the page prints for it, and its JSON merged with ``--from``. ``--check`` writes
nothing: it exits 1 where the committed page disagrees with the presets, where the cases a row
checked are not those drawn now, or, for the peers graded now, with their gradings
(``tests/test_peers_page.py`` does the same).

The page holds, per peer: ``package==version``, the entry point, the adapter and call shape, the
findings (one per cause, each with its replay line) and the table (property, verdict, cases
checked with their digest, failed, categories).
"""

from __future__ import annotations

import argparse
import glob
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
from gdpo_tools import markdown_table
from spec.conventions import CONVENTIONS

ROOT = Path(__file__).resolve().parent.parent  # the checkout, or site-packages
#: The committed page, with the other generated pages in spec/generated/.
PAGE = ROOT / "spec" / "generated" / "peers.md"
#: Where the heavy peers' gradings made in their own environments are kept (``--save-json``).
GRADED = PAGE.parent / "peers_graded"
#: The call shape of each peer's adapter (``conformance/peers.py``).
CALL_SHAPES = {"multireward_grpo": "gdpo", "ms_swift": "trl", "verl": "verl", "trl": "trl"}
COMMAND = "gdpo peers"
_TABLE = re.compile(r"<!-- table:(\w+) -->\n(.*?)<!-- /table:\1 -->", re.S)


def peers() -> list:
    """The peer presets (those with a package), in the order of ``CONVENTIONS``."""
    return [c for c in CONVENTIONS.values() if c.package]


def adapter(name: str) -> str:
    return f"conformance.peers:{name}"


def installed(conv) -> bool:
    return importlib.util.find_spec(conv.entry_point.split(":")[0].split(".")[0]) is not None


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
                              capture_output=True, text=True, timeout=timeout, cwd=str(ROOT))
        if not Path(path).exists():
            raise RuntimeError(f"gdpo check of {name} wrote no JSON (exit {proc.returncode}):\n"
                               + proc.stdout[-3000:] + proc.stderr[-3000:])
        data = json.loads(Path(path).read_text())
    data["wall_s"] = round(time.monotonic() - t0, 1)
    return data


def load(paths) -> dict:
    """{peer name: grading JSON} of files made by ``gdpo check --json`` (globs expanded)."""
    out = {}
    for pattern in paths:
        for path in sorted(glob.glob(pattern)) or [pattern]:
            data = json.loads(Path(path).read_text())
            name = data.get("convention")
            if name not in CALL_SHAPES or data.get("impl") != adapter(name):
                raise SystemExit(f"gdpo peers: {path} is no grading of a peer's adapter "
                                 f"(impl {data.get('impl')!r}, convention {data.get('convention')!r})")
            data["_source"] = f"merged from `{os.path.relpath(path)}`"
            out[name] = data
    return out


# ------------------------------------------------------------------------------ the page


def rows_of(data: dict) -> list[tuple]:
    """(row, verdict, categories) of each graded row of a grading (skipped rows apart)."""
    return [(r["name"], r["verdict"], ", ".join(r["categories"]) or "-") for r in data["properties"]
            if r["verdict"] != "skipped"]


def render_table(data: dict) -> str:
    return markdown_table(["property", "verdict", "categories", "cases checked", "failed"],
                          [[f"`{r['name']}`", r["verdict"], ", ".join(r["categories"]) or "-",
                            f"{r['cases']} `{r['digest']}`", str(r["failed"])]
                           for r in data["properties"] if r["verdict"] != "skipped"])


def _section(conv, data: dict | None) -> list[str]:
    name = conv.name
    out = [f"## {conv.package} {conv.version} (`{name}`)", "",
           f"- package: `{conv.package}=={conv.version}`",
           f"- entry point: `{conv.entry_point}` (read from `{conv.read_from}`)",
           f"- adapter: `{adapter(name)}`, call shape `{CALL_SHAPES[name]}`, convention `{name}`",
           f"- graded by: `{check_command(name)}`"]
    if data is None:
        return out + ["- result: **not graded here (not installed)**: run the command above where "
                      f"`{conv.package}=={conv.version}` is installed, then `{COMMAND} --from FILE`", ""]
    wall = data.get("wall_s")
    out.append(f"- graded: {data.get('_source', 'live, by the command that wrote this page')}; hypothesis "
               f"{data.get('hypothesis')}; {f'{wall:.0f} s wall' if wall is not None else ''}")
    out.append(f"- verdict: {data['verdict'].split(': ', 1)[-1]}")
    found = data.get("findings") or []
    if found:
        out += ["", "Findings (one per cause: what, where it shows, the rows it failed, the smallest example, the "
                "line that replays it):", ""]
        for i, f in enumerate(found, 1):
            rows = ", ".join(f"`{p}`" for p in f["properties"])
            where = f["regime"] + (f", from |{f['input']}| of about {f['threshold']:.3g}" if f.get("threshold") else "")
            what = f["category_label"] if f["regime"] == "bad input" else f"{f['category_label']} ({where})"
            out.append(f"{i}. **{f['category']}**: {what}: {f['cause']}. Rows: {rows}. Example: {f['example']}")
            if f.get("repro"):
                out += ["", "   ```", f"   {f['repro']}", "   ```"]
            out.append("")
    skipped = [r for r in data["properties"] if r["verdict"] == "skipped"]
    out += ["", f"<!-- table:{name} -->", render_table(data), f"<!-- /table:{name} -->", "",
            f"Not graded: {len(skipped)} rows its call shape, convention or declared domain leaves out.", ""]
    return out


def render(results: dict, command: str = COMMAND) -> str:
    """The page, from {peer name: grading JSON} (a peer without one: not graded here)."""
    head = [
        "# Peers graded (generated)", "",
        f"<!-- Generated by `{COMMAND}` (gdpo_tools/peers_report.py); do not edit. -->", "",
        f"**Generated by `{command}`; do not edit.** Each published GDPO implementation with a preset in "
        "`spec/conventions.py` is called unchanged through its adapter in `conformance/peers.py` and graded by "
        "`gdpo check` against its own convention, at that convention's own working precision, "
        "`--single-process`. The cases of each row are drawn first from the row's seed: the same on any machine, "
        "whatever the peer returns (their digest beside them); a property passed here may fail on a machine whose "
        "float arithmetic differs (another SIMD width reorders a peer's sums), in a category of arithmetic "
        "(precision, non_finite, silent_zero, exact_zero). `tests/test_peers_page.py` fails when this page "
        "disagrees with the presets or with the cases drawn now. `docs/peers_findings.md` classifies the findings "
        "by hand.", ""]
    body = []
    for conv in peers():
        body += _section(conv, results.get(conv.name))
    return "\n".join(head + body).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------ staleness


def parse(text: str) -> dict:
    """{peer name: {"package", "version", "entry_point", "heading", "rows", "digests", "findings"}}."""
    out = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        m = re.match(r"(\S+) (\S+) \(`(\w+)`\)", block)
        if not m:
            continue
        entry = re.search(r"^- entry point: `([^`]+)`", block, re.M)
        pkg = re.search(r"^- package: `([^`=]+)==([^`]+)`", block, re.M)
        table = _TABLE.search(block)
        rows, digests = (None if table is None else []), {}
        if table:
            for ln in table.group(2).splitlines()[2:]:
                cells = [c.strip() for c in re.split(r"(?<!\\)\|", ln.strip())[1:-1]]
                row = cells[0].strip("`").replace("\\|", "|")
                rows.append((row, cells[1], cells[2].replace("\\|", "|")))
                d = re.fullmatch(r"(\d+) `([0-9a-f]+)`", cells[3])
                if d:
                    digests[row] = (int(d.group(1)), d.group(2))
        found = []
        for f in re.finditer(r"^\d+\. \*\*(\w+)\*\*: (.*?)(?=^\d+\. \*\*|^<!-- table:|\Z)", block, re.M | re.S):
            repro = re.search(r"^\s*(python -m conformance\.replay [^\n]+)$", f.group(2), re.M)
            rows_of_f = re.search(r"Rows: ((?:`[^`]+`(?:, )?)+)\. Example", f.group(2))
            found.append({"category": f.group(1), "repro": repro.group(1).strip() if repro else None,
                          "properties": re.findall(r"`([^`]+)`", rows_of_f.group(1)) if rows_of_f else []})
        out[m.group(3)] = {"package": pkg.group(1) if pkg else None, "version": pkg.group(2) if pkg else None,
                           "heading": (m.group(1), m.group(2)), "entry_point": entry.group(1) if entry else None,
                           "rows": rows, "digests": digests, "findings": found}
    return out


def preset_problems(text: str) -> list[str]:
    """Where the page disagrees with the presets (a peer missing or extra, a package, version or
    entry point not the preset's)."""
    page = parse(text)
    problems = [f"{extra}: on the page, but no peer preset has that name"
                for extra in sorted(set(page) - {c.name for c in peers()})]
    for conv in peers():
        got = page.get(conv.name)
        if got is None:
            problems.append(f"{conv.name}: no section on the page")
            continue
        for what, want in (("package", conv.package), ("version", conv.version), ("entry point", conv.entry_point),
                           ("heading", (conv.package, conv.version))):
            if want != got[what.replace(" ", "_")]:
                problems.append(f"{conv.name}: {what} on the page is {got[what.replace(' ', '_')]!r}, the preset "
                                f"says {want!r}")
    return problems


def digest_problems(text: str, name: str) -> list[str]:
    """Where the cases the page says a row of peer ``name`` checked are not those drawn now (the
    same on any machine, whatever the peer returns: its package is not needed)."""
    from conformance import profiles, runner
    from conformance.subject import Subject

    profiles.load("grade")
    subject = Subject(adapter(name), CALL_SHAPES[name], name)
    problems = []
    for row, (n, d) in (parse(text).get(name) or {}).get("digests", {}).items():
        cases = runner.row_cases(row, subject, profiles.GRADE_MAX_EXAMPLES)
        if (len(cases), runner.digest(cases)) != (n, d):
            problems.append(f"{name} {row}: the page checked {n} cases `{d}`, drawn now: {len(cases)} "
                            f"`{runner.digest(cases)}`")
    return problems


def finding_problems(text: str, name: str) -> list[str]:
    """Where the findings of peer ``name`` do not account for its table: a failed row that no finding
    lists, a finding without a replay line (needs no package)."""
    page = parse(text).get(name) or {}
    found = page.get("findings") or []
    listed = {p for f in found for p in f["properties"]}
    problems = [f"{name} {row}: failed on the page, and no finding lists it"
                for row, verdict, _ in page.get("rows") or () if verdict == "failed" and row not in listed]
    return problems + [f"{name} finding {i} ({f['category']}): no replay line" for i, f in enumerate(found, 1)
                       if not f["repro"]]


def replay_problems(text: str, name: str) -> list[str]:
    """Where a finding on the page of peer ``name`` no longer fails, replayed from its repro line, in
    the finding's category (the peer must be installed). A finding without a repro line is
    :func:`finding_problems`' to report."""
    from conformance import judge as J
    from conformance import properties
    from conformance.replay import replayed

    problems = []
    for i, f in enumerate((parse(text).get(name) or {}).get("findings") or (), 1):
        if f["repro"] is None:
            continue
        prop, subject, case = replayed(shlex.split(f["repro"])[3:])
        try:
            properties.CHECKS[prop](subject, case, prop)
        except J.ConformanceFailure as exc:
            if str(exc.category or "-") != f["category"]:
                problems.append(f"{name} finding {i} ({prop}): replayed, it fails as {exc.category}, the page "
                                f"says {f['category']}")
            continue
        problems.append(f"{name} finding {i} ({prop}): fails on the page ({f['category']}); its replay now passes")
    return problems


def live_problems(text: str, name: str, data: dict) -> tuple[list[str], list[str]]:
    """A live grading against the page: (problems, differences of arithmetic). A row the page passed
    that fails here only in categories of :data:`ARITHMETIC` is the peer's own arithmetic on another
    machine, said but not a problem; any other difference is a stale page."""
    got = (parse(text).get(name) or {}).get("rows")
    want = rows_of(data)
    if got is None:
        return [f"{name}: the page has no table (not graded), a live grading has {len(want)} rows"], []
    if [r[0] for r in got] != [r[0] for r in want]:
        return [f"{name}: the page's rows {[r[0] for r in got]}, live {[r[0] for r in want]}"], []
    problems, arithmetic = [], []
    for g, w in zip(got, want):
        if tuple(g) == tuple(w):
            continue
        cats = [c for c in w[2].split(", ") if c != "-"]
        if g[1] == "passed" and cats and all(c in ARITHMETIC for c in cats):
            arithmetic.append(f"{name} {w[0]}: fails here ({w[2]}) on cases the page's machine passed: the peer's "
                              "own arithmetic differs between the two machines")
        else:
            problems.append(f"{name} {g[0]}: page {tuple(g[1:])}, live {tuple(w[1:])}")
    return problems, arithmetic


def main(argv=None, prog: str = COMMAND) -> int:
    plain = re.sub(r":\w+:`([^`]+)`", r"\1", __doc__).replace("``", "")  # no reST markup on a terminal
    ap = argparse.ArgumentParser(prog=prog, description=plain.split("\n\n")[0].split(": ", 1)[1],
                                 epilog=plain.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="from_files", nargs="+", action="extend", default=[], metavar="FILE",
                    help="grading JSON files (gdpo check --json) of peers graded elsewhere; globs are expanded")
    ap.add_argument("--out", default=None, help="the page to write (default, in a checkout: spec/generated/peers.md)")
    ap.add_argument("--save-json", default=None, metavar="DIR", help="also keep each live grading's JSON in DIR")
    ap.add_argument("--only", nargs="+", default=None, metavar="NAME", help="grade only these peers live")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 where the committed page is stale")
    args = ap.parse_args(argv)
    if args.out is None:
        if not (ROOT / "pyproject.toml").is_file():  # an installed package: never into site-packages
            ap.error("--out PAGE is needed outside a checkout of gdpo-spec")
        args.out = str(PAGE)
    results = load(args.from_files)
    for conv in peers():
        if (args.only is not None and conv.name not in args.only) or not installed(conv):
            continue
        print(f"{conv.name}: grading ({check_command(conv.name)}) ...", flush=True)
        results[conv.name] = grade(conv.name)
        results[conv.name]["_source"] = f"live, by `{COMMAND}` in Python {sys.version.split()[0]}"
        print(f"{conv.name}: {results[conv.name]['verdict']} ({results[conv.name]['wall_s']:.0f} s)", flush=True)
        if args.save_json:
            Path(args.save_json).mkdir(parents=True, exist_ok=True)
            kept = {k: v for k, v in results[conv.name].items() if k != "_source"}
            (Path(args.save_json) / f"{conv.name}.json").write_text(json.dumps(kept, indent=1) + "\n")
    if args.check:
        text = Path(args.out).read_text()
        problems, notes = preset_problems(text), []
        for conv in peers():
            problems += digest_problems(text, conv.name)
        by_name = {conv.name: conv for conv in peers()}
        for name, data in results.items():
            found, arithmetic = live_problems(text, name, data)
            problems += found
            notes += arithmetic
            if name in by_name and installed(by_name[name]):
                problems += replay_problems(text, name)
        for conv in peers():
            problems += finding_problems(text, conv.name)
        print("".join(f"note: {a}\n" for a in notes) + "".join(f"stale: {p}\n" for p in problems), end="")
        print(f"{args.out}: {'stale' if problems else 'up to date'}")
        return 1 if problems else 0
    page = Path(args.out)
    dropped = [n for n, sec in (parse(page.read_text()).items() if page.is_file() else ())
               if sec.get("rows") and n not in results]
    if dropped:
        print(f"gdpo peers: {args.out} grades {', '.join(dropped)}, neither installed here nor given with --from: "
              "nothing written. Add --from FILE (their gdpo check --json gradings), or write elsewhere with --out",
              file=sys.stderr)
        return 2
    command = COMMAND + "".join(f" --from {shlex.quote(os.path.relpath(f) if os.path.exists(f) else f)}"
                                for f in args.from_files)
    page.write_text(render(results, command))
    print(f"wrote {args.out} ({len(results)} of {len(peers())} peers graded)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
