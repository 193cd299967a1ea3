"""The tools built on spec, oracle, impl and conformance (nothing there imports them): the ``gdpo``
command, ``gdpo audit``, the known-limit tables, the spec document's generator and the peers'
float formulas (docs/layout.md lists the modules)."""

#: The version of ``gdpo audit --json``'s schema (docs/audit.md); here, so that the command can
#: say it even where the audit itself fails to import.
AUDIT_SCHEMA = "gdpo-audit/3"


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of the generated pages, a "|" in a cell escaped."""
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(head), "|" + "---|" * len(head), *map(line, rows)])


def version(dist: str, missing: str = "not installed") -> str:
    """The installed version of the distribution ``dist``, or ``missing``."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return missing
