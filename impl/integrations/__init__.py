"""impl.gdpo inside real trainers, one module per framework, each opted into by the user:
:mod:`impl.integrations.trl`, :mod:`impl.integrations.swift`, :mod:`impl.integrations.verl`
(docs/integrations.md). ``import impl`` imports none of them, and each imports its framework only
when a name that needs it is first used.
"""
