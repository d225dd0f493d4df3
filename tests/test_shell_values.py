"""Every shell line mmm-orch writes, fed hostile values: the login side's bash of `env check` and
`env create` (here and over SSH), the command lines of the SSH runner, and the job scripts, with
hostile fields in a user's own profile and workload spec (data: only setup lines, launcher lines
and double-quoted preset and env values are the author's shell). A value is refused (exit 2, one
line `mmm-orch: error:` naming the field) or reaches the program verbatim as one argument, and a
canary file that any expansion, command or redirection in it would create never appears. Real
bash, a real sshd, real virtual environments; nothing is mocked."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import REPO
from helpers.jobs import assert_nothing_recorded
from helpers.ssh import ssh_config

# {c} is the canary's path: every way a word turns into a command, a redirection or other words.
HOSTILE = ["$(touch {c})", "`touch {c}`", "a;touch {c}", "a && touch {c}", "a|touch {c}",
           "a\ntouch {c}", "'$(touch {c})'", '"$(touch {c})"', "\\\"$(touch {c})\\\"",
           "${IFS}touch${IFS}{c}", "-x$(touch {c})", "--help", "a}$(touch {c}){", ">{c}",
           "<(touch {c})", "$((1))$(touch {c})", "* ? [a-z] ~root !! # {c}",
           "é 中文 \u00a0$(touch {c})", "a\rtouch {c}", "x\x00$(touch {c})"]
# Generated: shell syntax in any order around a command that creates the canary.
FRAGMENTS = st.lists(st.sampled_from(list("$`;&|(){}<>'\"\\\n *?!#~=-") + ["{c}", "touch ", "a"]),
                     min_size=1, max_size=14).map("".join)
GENERATED = settings(max_examples=40, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


def canary_in(value: str, canary: Path) -> str:
    return value.replace("{c}", str(canary))


def under(root: Path, value: str) -> Path:
    """A path below `root` named by `value` (a leading '/' would replace root; no NUL fits)."""
    return root / value.replace("\x00", "").lstrip("/")


def assert_refused(result, *field: str) -> None:
    lines = result.err.strip().splitlines()
    assert result.code == 2 and len(lines) == 1, result.err
    assert lines[0].startswith("mmm-orch: error: "), lines
    assert all(f in lines[0] for f in field), (field, lines[0])


def controls(value: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in value)


# -- env check and env create: the login side's bash -----------------------------------------------

@pytest.fixture
def login_side(isolated, tmp_path):
    """A Slurm machine (jobs submitted here) whose job environment is remembered at a directory
    the test names: its bin/activate records the path bash sourced it by, and makes this
    checkout's mmm_orch importable by the profile's python."""
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)

    def profile(python: str = "python3") -> None:
        (machines / "proj.yaml").write_text(
            f"extends: slurm-local\nname: proj\npython: {json.dumps(python)}\n"
            f"environment: {{path: {json.dumps(str(tmp_path / 'default-env'))}}}\n")

    def remember(env_dir: Path) -> Path:
        (env_dir / "bin").mkdir(parents=True, exist_ok=True)
        seen = tmp_path / "sourced-as"
        (env_dir / "bin" / "activate").write_text(
            f"printf %s \"$BASH_SOURCE\" > {shlex.quote(str(seen))}\n"
            f"export PYTHONPATH={shlex.quote(str(REPO))} MMM_ORCH_CHECK_QUICK=1\n")
        config = Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch"
        config.mkdir(parents=True, exist_ok=True)
        (config / "environments.json").write_text(json.dumps({"proj": {"path": str(env_dir)}}))
        return seen

    profile()
    return profile, remember


def check_env_dir(cli, tmp_path, login_side, value: str, host: tuple[str, ...] = ()) -> None:
    """`env check` of an environment remembered at a directory named `value`."""
    _, remember = login_side
    canary = tmp_path / "canary"
    env_dir = under(tmp_path / "envs", canary_in(value, canary))
    seen = remember(env_dir)
    result = cli("env", "check", "proj", *host)
    assert not canary.exists(), f"{value!r} ran a command"
    if controls(str(env_dir)):
        assert_refused(result, "environment path", repr(str(env_dir)))
        return
    assert result.code == 0, result.err
    assert seen.read_text() == f"{env_dir}/bin/activate"  # one word, verbatim


@pytest.mark.parametrize("value", HOSTILE)
def test_env_check_sources_a_remembered_environment_by_its_exact_path(cli, tmp_path, login_side,
                                                                        value):
    check_env_dir(cli, tmp_path, login_side, value)


@pytest.mark.slow
@GENERATED
@given(value=FRAGMENTS)
def test_env_check_of_generated_environment_paths(cli, tmp_path, login_side, value):
    check_env_dir(cli, tmp_path, login_side, value)


@pytest.mark.parametrize("value", HOSTILE)
def test_env_check_runs_the_profile_s_python_by_its_exact_path(cli, tmp_path, login_side, value):
    profile, remember = login_side
    canary = tmp_path / "canary"
    python = under(tmp_path / "bin", canary_in(value, canary)) / "python3"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    profile(str(python))
    remember(tmp_path / "env")
    result = cli("env", "check", "proj")
    assert not canary.exists(), f"{value!r} ran a command"
    if controls(str(python)):
        assert_refused(result, "python", repr(str(python)))
        return
    assert result.code == 0, result.err
    assert f"  python:   {python}\n" in result.out  # the program bash ran is that very file


@pytest.mark.slow
def test_env_create_makes_the_environment_at_the_exact_path(cli, tmp_path, login_side):
    """A real virtual environment with mmm-orch installed, at a --path holding every kind of shell
    syntax at once (any of it interpreted, and the path differs or the canary appears)."""
    canary = tmp_path / "canary"
    path = tmp_path / canary_in("e n v/$(touch {c})`touch {c}`;a&&b|c'q\"${IFS}*?[x]~!#é-x",
                                canary)
    result = cli("env", "create", "proj", "--path", str(path))
    assert result.code == 0, result.err
    assert f"job environment of proj: {path}\n" in result.out
    assert (path / "bin" / "python").exists() and not canary.exists()
    remembered = json.loads((Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch" /
                             "environments.json").read_text())
    assert remembered["proj"]["path"] == str(path)


@pytest.mark.parametrize("value", HOSTILE)
def test_env_create_refuses_a_path_it_cannot_carry(cli, tmp_path, login_side, value):
    canary = tmp_path / "canary"
    path = canary_in(value, canary)  # relative, or a line break: refused before any shell runs
    result = cli("env", "create", "proj", f"--path={path}")
    assert_refused(result, "--path", repr(path))
    assert not canary.exists() and not (Path(os.environ["XDG_CONFIG_HOME"]) / "mmm-orch").exists()


def test_an_environment_path_with_an_unknown_placeholder_is_refused(cli, isolated):
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    for template in ("/p/{account.__class__}/env", "/p/{0}/env", "/p/{home}/env"):
        (machines / "proj.yaml").write_text(
            "extends: slurm-local\nname: proj\npython: python3\n"
            f"environment: {{path: {json.dumps(template)}}}\n")
        for words in (["env", "check", "proj", "-A", "P1"], ["render", "proj", "fsdp", "-A", "P1"]):
            assert_refused(cli(*words), "environment.path", "unknown placeholder")


# -- login hosts: --host and the profile's login_hosts ---------------------------------------------

HOSTS = ["log$(touch {c})in", "login;touch {c}", "`touch {c}`", "-oProxyCommand=touch {c}",
         "user@-x", "a b", "login\ntouch {c}", "us'er@login", "login:22$(touch {c})",
         "login:port", "@login", "login|touch {c}", "%h$(touch {c})", "é@login"]


@pytest.mark.parametrize("host", HOSTS)
def test_a_login_host_with_shell_syntax_is_refused_before_anything_runs(cli, isolated, tmp_path,
                                                                       host):
    canary = tmp_path / "canary"
    host = canary_in(host, canary)
    machines = isolated / ".mmm-orch" / "machines"
    machines.mkdir(parents=True)
    (machines / "far.yaml").write_text(  # submitted from afar: its login host is the profile's
        "extends: slurm-local\nname: far\npython: python3\nscheduler: {commands: {submit: "
        f"no-such-sbatch}}}}\nlogin_hosts: [{json.dumps(host)}]\n"
        f"environment: {{path: {json.dumps(str(tmp_path / 'e'))}}}\n")
    for words in (["env", "check", "far", "--host", host], ["env", "check", "far"],
                  ["env", "create", "far", "--host", host], ["env", "create", "far"],
                  ["submit", "far", "dist_check", "--host", host], ["submit", "far", "dist_check"],
                  ["submit", "slurm-local", "dist_check", "--host", host]):
        # A line break in the profile's is refused as it is loaded, as in any of its texts.
        field = "login_hosts[0]" if "\n" in host and "far" in words else "login host"
        assert_refused(cli(*words), field, repr(host))
    assert not canary.exists() and not (tmp_path / "e").exists()
    assert_nothing_recorded()


# -- over SSH: the remote bash -lc line ------------------------------------------------------

PRINT = "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), os.environ.get('V')]))"


@pytest.fixture
def login(isolated, sshd):
    from mmm_orch.hosts.ssh import SshHost

    ssh_config(Path(os.environ["HOME"]), sshd)
    host = SshHost("login")
    yield host
    host.close()


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(words=st.lists(st.one_of(st.sampled_from(HOSTILE), FRAGMENTS,
                                st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)),
                      min_size=1, max_size=4),
       directory=st.one_of(st.sampled_from(HOSTILE), FRAGMENTS), variable=FRAGMENTS)
def test_ssh_command_lines_carry_every_word_verbatim(login, tmp_path, words, directory, variable):
    canary = tmp_path / "canary"
    words = [canary_in(w, canary) for w in words]
    cwd = under(tmp_path / "dirs", canary_in(directory, canary))
    cwd.mkdir(parents=True, exist_ok=True)
    value = canary_in(variable, canary)
    argv = [sys.executable, "-c", PRINT, *words]
    if any("\x00" in w for w in words):  # no process can receive it: refused, nothing runs
        with pytest.raises(ValueError):
            login.run(argv, cwd=str(cwd), env={"V": value})
        return
    result = login.run(argv, cwd=str(cwd), env={"V": value})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [words, str(cwd), value]
    assert not canary.exists()


@pytest.mark.parametrize("name", ["A\n", "A;touch x", "1A", "é", "A B", "$(touch x)"])
def test_ssh_refuses_what_is_not_a_variable_name(login, name):
    with pytest.raises(ValueError):
        login.run(["true"], env={name: "x"})


@pytest.mark.parametrize("value", [v for v in HOSTILE if not controls(v)][::3])
def test_env_check_over_ssh_sources_the_exact_path(cli, tmp_path, login_side, login, value):
    check_env_dir(cli, tmp_path, login_side, value, ("--host", "login"))


def test_env_create_over_ssh_makes_the_environment_at_the_exact_path(cli, tmp_path, login_side,
                                                                      login):
    canary = tmp_path / "canary"
    path = tmp_path / canary_in("r e/$(touch {c})`touch {c}`;a|b'q\"${IFS}*-x", canary)
    result = cli("env", "create", "proj", "--host", "login", "--path", str(path))
    assert result.code == 0, result.err
    assert f"job environment of proj on login: {path}\n" in result.out
    assert (path / "bin" / "python").exists() and not canary.exists()


# -- job scripts: hostile fields in a user's own profile and spec ----------------------------------

# (label the refusal names, base profile, the YAML that carries the value)
PROFILE_FIELDS = {
    "facility": ("local", lambda v: {"facility": v}),
    "queue name": ("slurm-local", lambda v: {"queues": [
        {"name": v, "max_nodes": 3, "max_walltime": "01:00:00"}]}),
    "tier name": ("pbs-local", lambda v: {"queues": [
        {"name": "workq", "max_nodes": 3, "max_walltime": "01:00:00", "tiers": [
            {"name": v, "min_nodes": 1, "max_nodes": 3, "max_walltime": "01:00:00"}]}]}),
    "queue workq directive": ("pbs-local", lambda v: {"queues": [
        {"name": "workq", "max_nodes": 3, "max_walltime": "01:00:00", "directives": [v]}]}),
    "directive": ("slurm-local", lambda v: {"directives": [f"--comment={v}"]}),
    "scheduler.queue_directive": ("slurm-local", lambda v: {"scheduler": {
        "queue_directive": "--partition={queue} " + v.replace("{", "{{").replace("}", "}}")}}),
    "preset name": ("local", lambda v: {"presets": [{"name": v, "default": True,
                                                      "set": {"A": "1"}}]}),
    "description": ("local", lambda v: {"presets": [{"name": "p", "default": True,
                                                      "description": v, "set": {"A": "1"}}]}),
    "preset p source": ("local", lambda v: {"presets": [{"name": "p", "default": True,
                                                          "source": v, "set": {"A": "1"}}]}),
    "preset p A source": ("local", lambda v: {"presets": [
        {"name": "p", "default": True, "set": {"A": {"value": "1", "source": v}}}]}),
    "devices.source": ("local", lambda v: {"devices": {"source": v}}),
    "rendezvous.source": ("local", lambda v: {"rendezvous": {"source": v}}),
    "visible_env": ("local", lambda v: {"devices": {"visible_env": v, "visible": [0]}}),
    "submit_dir_var": ("pbs-local", lambda v: {"scheduler": {"submit_dir_var": v}}),
}
SPEC_FIELDS = {
    "env W": lambda v: {"env": {"W": v}},
    "env variable": lambda v: {"env": {v: "1"}},
}


def write_yaml(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False))  # JSON is YAML


def run_head(script: str, cwd: Path) -> dict[str, str]:
    """The script up to its launch (directives, preamble, setup, activation, environment) run in
    bash as the scheduler would, with the variables it starts a job with; the environment then."""
    assert "\n# Launch\n" in script, script
    head = cwd / "head.sh"
    head.write_text(script.split("\n# Launch\n")[0] + "\nenv -0\n")
    nodefile = cwd / "nodefile"
    nodefile.write_text("vm0\n")
    proc = subprocess.run(["bash", str(head)], cwd=cwd, capture_output=True, timeout=60,
                          env={**os.environ, "PBS_O_WORKDIR": str(cwd), "PBS_JOBID": "1.pbs",
                               "SLURM_SUBMIT_DIR": str(cwd), "PBS_NODEFILE": str(nodefile)})
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return dict(item.split("=", 1) for item in proc.stdout.decode(errors="replace").split("\0")
                if "=" in item)


def render_checked(cli, isolated: Path, machine: str, workload: str, label: str, value: str,
                   canary: Path) -> None:
    (isolated / "job.sh").unlink(missing_ok=True)
    result = cli("render", machine, workload, "--out", "job.sh")
    assert not canary.exists(), f"{value!r} ran a command while rendering"
    if result.code != 0:  # refused: by the profile's own validation, or here
        assert_refused(result, label.split()[-1])
        assert (controls(value) or label in ("visible_env", "submit_dir_var")
                or "placeholder" in result.err or "format string" in result.err), result.err
        assert not (isolated / "job.sh").exists()
        return
    script = (isolated / "job.sh").read_text()
    assert subprocess.run(["bash", "-n", str(isolated / "job.sh")]).returncode == 0, script
    env = run_head(script, isolated)
    assert not canary.exists(), f"{value!r} ran a command in the job script"
    if label == "visible_env":
        assert env[value] == "0"
    if label in ("description", "preset p source", "preset p A source"):
        assert env["A"] == "1"  # the line after the hostile comment is still its own


@pytest.mark.parametrize("label", list(PROFILE_FIELDS))
@pytest.mark.parametrize("value", HOSTILE)
def test_profile_fields_in_job_scripts(cli, isolated, label, value):
    profile_field_checked(cli, isolated, label, value)


@pytest.mark.slow  # 40 scripts' heads run in bash, those of the test servers' profiles loading Lmod
@GENERATED
@given(label=st.sampled_from(list(PROFILE_FIELDS)), value=FRAGMENTS)
def test_generated_profile_fields_in_job_scripts(cli, isolated, label, value):
    profile_field_checked(cli, isolated, label, value)


def profile_field_checked(cli, isolated, label: str, value: str) -> None:
    """A profile whose field `label` holds `value` renders a script in which nothing of it runs,
    or is refused with one line naming the field."""
    canary = isolated / "canary"
    base, carry = PROFILE_FIELDS[label]
    value = canary_in(value, canary)
    write_yaml(isolated / ".mmm-orch" / "machines" / "mine.yaml",
               {"extends": base, "name": "mine", **carry(value)})
    render_checked(cli, isolated, "mine", "dist_check", label, value, canary)


@pytest.mark.parametrize("label,value", [(label, value) for label in SPEC_FIELDS
                                         for value in HOSTILE])
def test_spec_env_in_job_scripts(cli, isolated, label, value):
    """A workload's env values are double-quoted so that $VARS expand: quotes and backticks that
    would end or nest that word are refused, as in a profile's presets."""
    canary = isolated / "canary"
    value = canary_in(value, canary)
    write_yaml(isolated / ".mmm-orch" / "workloads" / "mine.yaml",
               {"name": "mine", "trainer": "mmm_orch.trainers.dist_check",
                **SPEC_FIELDS[label](value)})
    result = cli("render", "local", "mine", "--out", "job.sh")
    if result.code != 0:
        assert_refused(result, "env")
        return
    assert label == "env W" and not ({'"', "`"} & set(value)) and not controls(value)
    if "$(" not in value:  # `$(...)` in a double-quoted env value is the author's shell
        run_head((isolated / "job.sh").read_text(), isolated)
        assert not canary.exists()


NAMES = ["$(touch canary)", "`touch canary`", "a;touch canary", "a&&touch canary",
         "a|touch canary", "a\ntouch canary", "'$(touch canary)'", '"$(touch canary)"',
         "${IFS}touch${IFS}canary", "x>canary", "* ?", "é 中文", "a\rb"]


@pytest.mark.parametrize("kind", ["machine", "workload"])
@pytest.mark.parametrize("name", NAMES)
def test_profile_and_spec_file_names_in_job_scripts(cli, isolated, kind, name):
    """A profile's name is its file's: any text a file name can hold."""
    machine, workload = (name, "dist_check") if kind == "machine" else ("local", name)
    if kind == "machine":
        write_yaml(isolated / ".mmm-orch" / "machines" / f"{name}.yaml",
                   {"extends": "local", "name": name})
    else:
        write_yaml(isolated / ".mmm-orch" / "workloads" / f"{name}.yaml",
                   {"name": name, "trainer": "mmm_orch.trainers.dist_check"})
    result = cli("render", machine, workload, "--name", "probe", "--out", "job.sh")
    if controls(name):  # (a line break: refused as the file is read, as in any of its texts)
        assert_refused(result, "name" if "\n" in name or "\r" in name else f"{kind} name",
                       repr(name))
        return
    assert result.code == 0, result.err
    run_head((isolated / "job.sh").read_text(), isolated)
    assert not list(isolated.rglob("canary"))


NEWLINE_NAMES = ["A\n", "_\n", "A\n#"]


@pytest.mark.parametrize("name", NEWLINE_NAMES)
def test_env_names_ending_in_a_line_break_are_refused(cli, name):
    assert_refused(cli("render", "local", "fsdp", "--env", f"{name}=x"), "--env", repr(name))


@pytest.mark.parametrize("name", NEWLINE_NAMES)
def test_profile_variable_names_ending_in_a_line_break_are_refused(cli, isolated, name):
    write_yaml(isolated / ".mmm-orch" / "machines" / "mine.yaml", {
        "extends": "local", "name": "mine", "presets": [{"name": "p", "default": True,
                                                         "set": {name: "1"}, "unset": [name]}]})
    assert_refused(cli("render", "mine", "fsdp"), "variable", repr(name))


# -- the launch line: values substituted into a profile's launcher ---------------------------------

# The launcher is the profile's python itself, running this with the value as its argument.
BOOT = ("import json, os, sys; json.dump(dict(bind=sys.argv[1], python=sys.executable), "
        "open(os.environ['PROBE_OUT'], 'w'))")


def launch_probe(cli, isolated: Path, python: str, cpu_bind: str) -> dict | None:
    """A local job whose launcher is `{python} -c BOOT {cpu_bind}`, run in full: what the
    program saw, or None when the profile was refused."""
    write_yaml(isolated / ".mmm-orch" / "machines" / "direct.yaml", {
        "extends": "local", "name": "direct", "python": python,
        "launcher": {"kind": "torchrun", "command": "{python}", "python_prefix": False,
                     "args": ["-c", shlex.quote(BOOT), "{cpu_bind}"], "cpu_bind": cpu_bind}})
    write_yaml(isolated / ".mmm-orch" / "workloads" / "probe.yaml",
               {"name": "probe", "trainer": "not_run", "watchdog": {"enabled": False}})
    result = cli("render", "direct", "probe", "--out", "job.sh")
    if result.code != 0:
        assert_refused(result)
        return None
    out = isolated / "probe.json"
    proc = subprocess.run(["bash", str(isolated / "job.sh")], cwd=isolated, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PROBE_OUT": str(out)})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(value=st.one_of(st.sampled_from(HOSTILE), FRAGMENTS))
def test_launcher_values_reach_the_program_verbatim(cli, isolated, tmp_path, value):
    canary = tmp_path / "canary"
    value = canary_in(value, canary)
    python = under(tmp_path / "py", value) / "python3"
    python.parent.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        python.symlink_to("/usr/bin/python3")  # a Python of its own: the probe needs nothing else
    seen = launch_probe(cli, isolated, str(python), value)
    assert not canary.exists(), f"{value!r} ran a command"
    if seen is not None:
        assert seen == {"bind": value, "python": str(python)}
    else:  # what YAML cannot hold, or a cpu_bind list for other ranks
        assert "\x00" in value or "list:" in value or controls(value)
