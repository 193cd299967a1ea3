"""The tools built on the specification, the oracle and the grader: the ``gdpo``
command (:mod:`gdpo_tools.cli`), ``gdpo audit`` (:mod:`gdpo_tools.audit`), the
known-limit tables (:mod:`gdpo_tools.limits`), the specification document's generator
(:mod:`gdpo_tools.spec_document`) and the peers' float formulas that all of them time
or tabulate (:mod:`gdpo_tools.peer_formulas`). Nothing in spec/, oracle/, impl/ or
conformance/ imports this package."""
