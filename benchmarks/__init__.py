"""Benchmarks (separate from the tests): side-by-side timings, medians over repeats, ratios."""
