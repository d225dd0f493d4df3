"""Scaling reports: what a sweep's (or any jobs') metrics files and logs say, as a table
(`table`), figures (`figures`, matplotlib with the Agg backend, imported only to draw) and one
self-contained HTML page (`html`). `data` reads the jobs."""
