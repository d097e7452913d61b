"""fedselect's benchmarks: speed measurements, paper reproductions and studies (see README.md).

An importable package so that tests and scripts import benchmark code as modules
(``from benchmarks.reproductions.ldcs import ldcs_table``); it is not installed with fedselect.
Run a script from the repository root as a module: ``python -m benchmarks.speed.bench_engine``.
"""
