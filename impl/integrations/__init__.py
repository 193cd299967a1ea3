"""impl.gdpo inside real trainers, one module per framework, each opted into by the user (issue 26).

* :mod:`impl.integrations.trl`: ``GDPOTrainer`` (and ``GDPOMixin``) for TRL's ``GRPOTrainer``.
* :mod:`impl.integrations.swift`: ``GDPOGRPOTrainer`` for ms-swift, installed by the
  ``--external_plugins`` file whose path ``python3 -m impl.integrations.swift`` prints.
* :mod:`impl.integrations.verl`: loaded by verl itself (the ``verl.plugins`` entry point); it
  changes nothing until a run's config asks for it (``+algorithm.gdpo_impl=gdpo_spec``).

Nothing here is imported by ``import impl``, and each module imports its framework only when
a name that needs it is first used, so ``import impl.integrations.trl`` works (and costs
little) where TRL is not installed. How to switch each framework, and what differs from its
own numbers: docs/integrations.md.
"""
