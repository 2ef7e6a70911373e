"""Benchmarks of ``transformer_lib`` (not part of the test suite); see ``benchmarks/README.md``.

Run each one from the repository root as a module, e.g. ``python -m benchmarks.cpu_throughput``.
"""
