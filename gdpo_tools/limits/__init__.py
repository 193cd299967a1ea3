"""The known-limit tables (spec/generated/known_limits.md), measured against the exact oracle:
the command (:mod:`.generate`), the tables, their input families, the implementations they run
and the plots."""
