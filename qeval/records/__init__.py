"""Records on the ground floor: the model source, the run store and its resume keys, provenance,
the Preflight record and the job and outcome files between processes. They import nothing above
them (docs/architecture.md, "Layers")."""
