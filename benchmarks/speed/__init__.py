"""Speed benchmarks: each ``bench_<name>.py`` beside its recorded result ``bench_<name>.txt`` (or ``.md``)."""
