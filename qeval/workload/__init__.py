"""The workload: the traffic a deployment will serve, read from a trace file or drawn from a
described distribution (`trace.py`, `draw.py`), and what its lengths imply before any engine
starts (`stats.py`: percentiles, max-model-len, the refused share, KV blocks, prefix sharing).
docs/performance.md, "The workload and the plan"."""
