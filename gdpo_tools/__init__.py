"""The tools built on spec, oracle, impl and conformance (nothing there imports them): the ``gdpo``
command, ``gdpo audit``, the known-limit tables, the spec document's generator and the peers'
float formulas (docs/layout.md lists the modules)."""

#: The version of ``gdpo audit --json``'s schema (docs/audit.md); here, so that the command can
#: say it even where the audit itself fails to import.
AUDIT_SCHEMA = "gdpo-audit/3"
