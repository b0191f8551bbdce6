"""Throughput benchmarks and the one-shot accelerator check, run from the repository root as modules
(``python -m bench.<name>``); their shared measuring helpers are in `bench.harness`."""
