"""The known-limit tables (spec/generated/known_limits.md), measured against the exact oracle:
:mod:`.generate` (the command, ``gdpo limits`` / ``python -m gdpo_tools.limits``),
:mod:`.tables` (the six table groups), :mod:`.families` (the constructed input
families), :mod:`.peers` (the implementations tabulated and how an output is graded),
:mod:`.plots` (the PNG figures)."""
