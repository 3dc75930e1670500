"""The performance phase (docs/performance.md): per setup, after scoring and in the same
worker, serving speed on a synthetic workload (throughput, latency, prefill and decode
rates), the device's physical limits measured once per run (`ceilings`), and each setup's
achieved share of its limit.

    config.py     PerfSpec, the config piece (`performance:`)
    workload.py   the workload and its concurrency levels (from the setup's memory budget)
    stats.py      a repeated measurement: median, spread, repeats and source
    hf.py         the transformers measurement (prefill forward, greedy decode steps)
    vllm.py       the vLLM measurement (vLLM's benchmark prompts and request metrics)
    phase.py      the worker's phase: levels, measurement, stored figures
    ceilings.py   copy bandwidth and matmul peak, measured once per run
    schema.py     the typed `performance` and `ceilings` blocks of results.json
    block.py      a setup's performance block at assembly: figures and shares of the ceilings
    views.py      the three-sided Pareto front and the report's tables
"""
