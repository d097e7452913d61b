"""Paper reproductions, one folder per paper: its scripts, REPORT.md, pictures and stored runs."""
