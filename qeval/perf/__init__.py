"""The performance phase (docs/performance.md): per setup, after scoring and in the same
worker, serving speed on a synthetic workload (throughput, latency, prefill and decode
rates), the device's physical limits measured once per run (`ceilings`), and each setup's
achieved share of its limit.

    stats.py      a repeated measurement: median, spread, repeats and source
    phase.py      the worker's phase: levels, measurement, stored figures
    ceilings.py   copy bandwidth and matmul peak, measured once per run
    block.py      a setup's performance block at assembly: figures and shares of the ceilings
    rank.py       the recommendation's ranking by a performance figure
    serving.py    `qeval goodput`: each setup served and tuned by its backend's serving engine
    slo.py        goodput and the SLO verdict from per-request figures
    tune.py       the search over engine settings and rates

Elsewhere, by layer: the config piece in qeval/config/performance.py, the typed blocks of
results.json in qeval/results/performance.py, the workload in qeval/backends/workload.py, each
engine's measurement in qeval/backends/hf/perf.py and qeval/backends/vllm/perf.py, vLLM's
serving engine for `qeval goodput` in qeval/backends/vllm/serve.py, and the
report's tables and plot in qeval/report/performance.py and qeval/report/performance_plot.py.
"""
