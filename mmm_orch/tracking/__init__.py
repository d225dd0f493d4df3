"""What a job is doing: its state from the scheduler and its own files (track.py), its log read
over any host (logs.py), and the markers it printed, read with the protocol's definitions
(startup.py)."""
