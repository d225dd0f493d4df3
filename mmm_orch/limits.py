"""Sizes no study needs, refused by the command line and the Python API alike."""

# A chain's links are all queued at once: 200 links of a day's walltime is half a year of
# training, past every facility's limit on queued jobs per user (a typo must not queue 10^20).
MAX_LINKS = 200

# SQLite's largest integer: no job id, count or number of seconds recorded is larger.
MAX_INT = 2**63 - 1

# 9999-12-31T23:59:59Z: time.localtime ends there, so no recorded or printed time is later.
MAX_EPOCH = 253402300799.0
