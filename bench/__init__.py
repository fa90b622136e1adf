"""Tensorwire's benchmark suite: ``python -m bench`` (see ``bench/README.md``).

Every figure is a ratio to a ceiling or a reference measured in the same run on the same
machine (a plain TCP transfer, a bare websockets ping-pong, local numpy), so that a shared,
noisy machine still gives comparable numbers. Not a timed test: ``tests/test_bench.py`` runs
``--quick`` and checks that the suite works and writes valid JSON, never that it is fast.
"""
