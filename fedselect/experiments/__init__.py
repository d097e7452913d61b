"""Experiments: comparisons of selection schemes over seeds, from the plan to the statistics.

A comparison is a grid of independent (scheme, seed) runs. Its parts, each a module of its own:

* :mod:`~fedselect.experiments.plan`: the cells of the grid, their keys, which are finished,
  failed or still to run, and every check made before any training;
* :mod:`~fedselect.experiments.provenance`: what identifies a run (its settings and key, a
  trainer checkpoint's fingerprint, the parameters added after runs were recorded), where it
  was made (commit, machine) and the result files' format;
* :mod:`~fedselect.experiments.executors`: how the cells run (one after another, seeds batched,
  worker processes, Ray tasks) behind one interface;
* :mod:`~fedselect.experiments.results`: :class:`~fedselect.experiments.results.Comparison` and
  :func:`~fedselect.experiments.results.load_comparison`; a comparison answers through
  :mod:`~fedselect.experiments.horizon` (simulated time and the horizon every scheme is judged
  at), :mod:`~fedselect.experiments.tables` (the table), :mod:`~fedselect.experiments.paired`
  (paired tests, misses censored at the horizon) and :mod:`~fedselect.experiments.report` (the
  report's files in its folder);
* :mod:`~fedselect.experiments.result_files`: one run's result file, written as the run finishes
  and read back, bounded and checked;
* :mod:`~fedselect.experiments.stats`: paired tests and Holm's adjustment;
* :mod:`~fedselect.experiments.flower_records`: a Flower run's records files read into a
  :class:`~fedselect.experiments.results.Comparison`;
* :mod:`~fedselect.experiments.run`: :func:`~fedselect.experiments.run.run_comparison`, which
  puts them together.

:mod:`fedselect.compare` re-exports the public names. This package's ``__init__`` imports
none of its modules: the trainer and the selectors import
:mod:`~fedselect.experiments.provenance` alone, without the rest.
"""
