"""Several models in one run (a sweep): the config (`config.py`), the run (`run.py`), the
cross-model summary `RUN_DIR/sweep.json` (`schema.py`) and the one report (`report.py`).
Each model is an ordinary run in RUN_DIR/models/<model>/, compared with its own baseline
(docs/cluster.md)."""
