"""The tools built on spec, oracle, impl and conformance (nothing there imports them): the ``gdpo``
command, ``gdpo audit``, the known-limit tables, the spec document's generator and the peers'
float formulas (docs/layout.md lists the modules)."""
