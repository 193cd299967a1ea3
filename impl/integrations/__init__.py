"""impl.gdpo inside real trainers, one module per framework (issue 26).

* :mod:`impl.integrations.trl`: ``GDPOTrainer`` (and ``GDPOMixin``) for TRL's ``GRPOTrainer``.
* :mod:`impl.integrations.swift`: ``GDPOGRPOTrainer`` for ms-swift, installed by the
  ``--external_plugins`` file whose path ``python3 -m impl.integrations.swift`` prints.

Nothing here is imported by ``import impl``, and each module imports its framework only when
a name that needs it is first used, so ``import impl.integrations.trl`` works (and costs
little) where TRL is not installed. How to switch each framework, and what differs from its
own numbers: docs/integrations.md.
"""
