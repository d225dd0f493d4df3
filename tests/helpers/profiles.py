"""Machine profiles and workload specs for the tests: the facilities among the packaged profiles,
and a user's own profiles, specs and throwaway trainers written in a test's directory, among them
the paced Llama workload (tests/paced_llama3.py)."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from helpers import REPO


@functools.cache
def facility_profiles() -> tuple[str, ...]:
    """The packaged profiles of a facility's machines (mmm_orch/machines), sorted by name: those
    with login hosts to reach them by; not this computer's (local) or its test schedulers'
    (slurm-local, pbs-local)."""
    profiles = (yaml.safe_load(path.read_text())
                for path in (REPO / "mmm_orch" / "machines").glob("*.yaml"))
    return tuple(sorted(profile["name"] for profile in profiles if profile.get("login_hosts")))


def write_machine(directory: Path, name: str, text: str) -> None:
    """A user machine profile `name` (YAML `text`) in the directory's .mmm-orch/machines."""
    profiles = directory / ".mmm-orch" / "machines"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / f"{name}.yaml").write_text(text)


# A workload of tiny Llama 3 (llama_chain unless named) with every step lasting PACED_STEP_S
# (tests/paced_llama3.py): the tiny model's steps take about 0.03 s on a quiet host, so even ten
# times slower a step still lasts PACED_STEP_S. A fixed number of steps then needs the same
# walltime however loaded the host is, and a run waiting for its stop waits rather than computes.
PACED_STEP_S = 0.5


def paced_spec(name: str = "llama_chain", args: str = "",
               watchdog: str = 'walltime_margin: "00:00:20"', step_s: float = PACED_STEP_S) -> str:
    """The paced Llama workload `name`, with more trainer `args` and its `watchdog` settings
    (each YAML mapping items, comma-separated), each step lasting `step_s`."""
    return f"""extends: llama3_debug
name: {name}
trainer: paced_llama3
args: {{config: debug, tiny: true, warmup_steps: 20{", " + args if args else ""}}}
watchdog: {{{watchdog}}}
env: {{PYTHONUNBUFFERED: "1", PYTHONPATH: "{REPO / "tests"}",
       MMM_TEST_STEP_S: "{step_s}"}}
"""


PACED_SPEC = paced_spec()


def write_spec(directory: Path, name: str, text: str) -> None:
    """A user workload spec `name` (YAML `text`) in the directory's .mmm-orch/workloads."""
    specs = directory / ".mmm-orch" / "workloads"
    specs.mkdir(parents=True, exist_ok=True)
    (specs / f"{name}.yaml").write_text(text)


def write_probe(directory: Path, name: str, body: str, trainer_options: str = "",
                extra: str = "") -> None:
    """A throwaway workload `name` whose trainer is the Python `body` (module on PYTHONPATH);
    `extra` is more YAML for the spec."""
    (directory / f"{name}_probe.py").write_text(body)
    write_spec(directory, name, f"name: {name}\ntrainer: {name}_probe\n"
               + (f"options:\n{trainer_options}" if trainer_options else "") + extra)
