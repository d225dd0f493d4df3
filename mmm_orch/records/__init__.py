"""What mmm-orch remembers: the job database (db.py; its file, found to be mmm-orch's own before
anything is written: dbfile.py), the record of one job (record.py), groups of jobs (chains,
sweeps, packs) and the nodes remembered as bad, each a table of its own, the rebuild from the
jobs' own copies (recover.py), the node-hours they were charged (usage.py), and what the
project's allocation has left, from the facility's own tool (balance.py)."""
