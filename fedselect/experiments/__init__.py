"""Experiments: comparisons of selection schemes over seeds, from the plan to the statistics.

A comparison is a grid of independent (scheme, seed) runs. Its parts, each a module of its own:

* :mod:`~fedselect.experiments.plan`: the cells of the grid, their keys, which are finished,
  failed or still to run, and every check made before any training;
* :mod:`~fedselect.experiments.provenance`: what identifies a run (its settings and key, a
  trainer checkpoint's fingerprint, the parameters added after runs were recorded), where it
  was made (commit, machine) and the result files' format;
* :mod:`~fedselect.experiments.executors`: how the cells run (one after another, seeds batched,
  worker processes, Ray tasks) behind one interface;
* :mod:`~fedselect.experiments.results`: :class:`~fedselect.experiments.results.Comparison`, the
  result files and the reports written from them;
* :mod:`~fedselect.experiments.stats`: paired tests and Holm's adjustment;
* :mod:`~fedselect.experiments.flower_records`: a Flower run's records files read into a
  :class:`~fedselect.experiments.results.Comparison`;
* :mod:`~fedselect.experiments.run`: :func:`~fedselect.experiments.run.run_comparison`, which
  puts them together.

:mod:`fedselect.compare` re-exports the public names. This package's ``__init__`` imports
none of its modules: the trainer and the selectors import
:mod:`~fedselect.experiments.provenance` alone, without the rest.
"""
