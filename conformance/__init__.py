"""Conformance suite and command line of gdpo-spec (reads spec, oracle and impl)."""
