"""Reports of a run: the folder of files (CSV, JSON, Markdown, JUnit), tables, and compare."""
