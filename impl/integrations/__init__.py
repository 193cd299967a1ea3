"""Integrations of :mod:`impl.gdpo` into training frameworks, each opted into by the user.

Each module imports its framework only when it is used, so importing this package costs
nothing. :mod:`impl.integrations.verl` is loaded by verl itself (the ``verl.plugins``
entry point) and changes nothing until a run's config asks for it.
"""
