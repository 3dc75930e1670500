"""The run: pre-flight checks, the main loop, the worker process, the run directory and its keys."""
