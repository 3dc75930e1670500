"""The mixed-precision advisor (`qeval advise`, docs/advisor.md): per-unit sensitivity, a
greedy search under a budget, and the advised setup with its `keep:` list."""
