"""What a run writes and reads back: the run store and its resume keys, the chunk spools,
provenance, the Preflight record and the job and outcome files between processes (what
describes a model apart from any run is qeval/model/). They import nothing above them
(docs/architecture.md, "Layers")."""
