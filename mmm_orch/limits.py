"""The bounds every layer shares: sizes no study needs, refused by the command line and the Python
API alike, and the shapes of the names mmm-orch writes into a shell or reads from a scheduler (an
environment variable's, a node's), which the profiles, the hosts and the schedulers all check."""

from __future__ import annotations

import re

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" lets a trailing newline by
# A node's name: host names, and PBS vnode names (`host[3]`).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\[\]-]{0,62}\Z")

# A chain's links are all queued at once: 200 links of a day's walltime is half a year of
# training, past every facility's limit on queued jobs per user (a typo must not queue 10^20).
MAX_LINKS = 200

# SQLite's largest integer: no job id, count or number of seconds recorded is larger.
MAX_INT = 2**63 - 1

# 9999-12-31T23:59:59Z: time.localtime ends there, so no recorded or printed time is later.
MAX_EPOCH = 253402300799.0

# No machine has a million nodes (Fugaku, among the largest, has 158,976): a profile's node
# count past it is a typo, and a 400-digit one would reach every plan's arithmetic.
MAX_NODES = 1_000_000

# Samples a step: the largest batches trained with are tens of thousands (BERT with LAMB, 65,536;
# Llama 3 405B, 16M tokens of 8,192 = 2,048); a step of 10^12 accumulates for ever.
MAX_GLOBAL_BATCH = 1 << 20
