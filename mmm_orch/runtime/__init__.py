"""What every trainer shares: who am I (launch_env), which device (device), process group (dist),
metrics (metrics), stop signals (stop) and checkpoints (checkpoint). Only device, dist and
checkpoint import torch."""
