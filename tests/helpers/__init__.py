"""What the tests share beside the fixtures and hooks of tests/conftest.py, a module a subject:
the command line in a fresh interpreter (cli), jobs and the waits for them (jobs), profiles and
specs (profiles), the test schedulers seen from outside mmm-orch (schedulers), the test sshd
(ssh), trainings on this host (training), the Llama trainer's parallel layouts (layouts), the
bad-input corpus (bad_input), fault injection (faults), a model for the loss (loss_head), a
text corpus (text) and the manual's code blocks (manual). pytest puts tests/ on the path:
`from helpers.jobs import wait_state`."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the checkout
