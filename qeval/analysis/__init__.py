"""Analysis: paired statistics, comparison with the baseline, the recommendation, results assembly."""
