"""Reports, generated only from a run directory's stored results (never edited by hand):
report.md (markdown.py), report.html with plots (html.py, plots.py), both written by write.py.
Each task kind may add its own section (sections.py); the one table helper and escape are in
tables.py. This package's own module imports none of them: its modules import each other by
name (`from qeval.report import plots`), and a package that imported them back would make a
circle."""
