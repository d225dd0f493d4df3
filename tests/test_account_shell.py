"""Values that reach the login side's shell: `env check` and `env create` run bash there with the
job environment's directory in it, filled from the account (`-A` or $MMM_ORCH_ACCOUNT). Generated
accounts full of shell syntax must be refused (exit 2, one line naming --account) or arrive as
plain text; a canary file that any expansion would create never appears. Real bash, here."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

CANARY = "/tmp/mmm-orch-canary-{}"
# Every way a word turns into a command or another word in bash, with a canary to create.
INJECTIONS = ["$(touch {c})", "`touch {c}`", "a;touch {c}", "a&&touch {c}", "a|touch {c}",
              "a\ntouch {c}", "\"$(touch {c})\"", "'$(touch {c})'", "${{IFS}}touch${{IFS}}{c}",
              "-A$(touch {c})", "a}}$(touch {c}){{", "$((1))$(touch {c})", "<(touch {c})",
              "a\x00b", "proj\r$(touch {c})"]


@pytest.fixture
def login_side(isolated, tmp_path):
    """A machine whose jobs are submitted here (sbatch is on PATH) and whose job environment
    lives under the project, as on every facility profile."""
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "proj.yaml").write_text(
        "extends: slurm-local\nname: proj\npython: python3\n"
        f"environment: {{path: {json.dumps(str(tmp_path / 'envs' / '{account}' / 'env'))}}}\n")
    return "proj"


def _refused_or_plain(cli, tmp_path, monkeypatch, command: str, account: str, via: str) -> None:
    canary = Path(CANARY.format(tmp_path.name))
    canary.unlink(missing_ok=True)
    account = account.replace("{c}", str(canary))
    if via == "env":
        if "\x00" in account:
            return  # no environment variable can hold a NUL
        monkeypatch.setenv("MMM_ORCH_ACCOUNT", account)
        result = cli("env", command, "proj")
    else:
        result = cli("env", command, "proj", "-A", account)
    assert not canary.exists(), f"{account!r} ran a command"
    if result.code == 2 and "--account" in result.err:
        assert len(result.err.strip().splitlines()) == 1, result.err
        return
    # Accepted: then it was a plain word, and the directory bash was told about is under it.
    assert all(ch in string.ascii_letters + string.digits + "_.+-" for ch in account), account


@pytest.mark.parametrize("via", ["-A", "env"])
@pytest.mark.parametrize("command", ["check", "create"])
@pytest.mark.parametrize("account", INJECTIONS)
def test_an_account_never_runs_on_the_login_side(cli, tmp_path, monkeypatch, login_side,
                                                 command, account, via):
    _refused_or_plain(cli, tmp_path, monkeypatch, command, account, via)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(account="proj\n")  # once accepted: "$" in the account's pattern let a trailing newline by
@given(st.lists(st.sampled_from(list("$`;&|(){}<>'\"\\\n *?!#~=") + ["{c}", "touch ", "proj"]),
                min_size=1, max_size=12).map("".join))
def test_generated_accounts_never_run_on_the_login_side(cli, tmp_path, monkeypatch, login_side,
                                                        account):
    _refused_or_plain(cli, tmp_path, monkeypatch, "check", account, "-A")


def test_a_plain_account_reaches_bash_as_the_environment_s_directory(cli, tmp_path, login_side):
    result = cli("env", "check", "proj", "-A", "P.r+o_j-1")
    # No environment was made there yet: the check says so, naming the directory it looked in.
    assert result.code == 2 and "env create proj" in result.err, result.err
    assert not (tmp_path / "envs").exists()
