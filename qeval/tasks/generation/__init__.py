"""Divergence along the generation: the baseline's generations teacher-forced through each
setup (teacher.py), paired by position bucket and answer length at assembly (results.py), and
the report's section (report.py). On while the config has `generation_divergence:`."""
