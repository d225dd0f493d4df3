"""What a job is doing: its state from the scheduler and its own files (refresh.py), its log read
over any host (logs.py), and the markers it printed, read with the protocol's definitions
(startup.py)."""
