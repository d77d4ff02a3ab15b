"""Benchmarks: prompt, trace and batch benchmarks, sweeps, timed generations, paired statistics, run speed,
per-position acceptance and the summaries of each."""
