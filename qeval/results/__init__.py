"""The results schema (results.json and sample records) and its one reader."""
