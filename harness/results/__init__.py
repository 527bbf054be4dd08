"""Reports built from case results: JSON, a self-contained HTML matrix, run diffs."""
