"""Files and untrusted input: bounded YAML, JSON Lines, atomic writes, safe names."""
