"""Templates are data: whatever a template holds, `render`, `submit --dry-run` and `sweep --dry-run`
run no code, stop within a bound on time and size, and say so in one line with exit 2. Every way
a template reaches mmm-orch is covered: `--template FILE`, a directory on $MMM_ORCH_PATH, and the
implicit `./.mmm-orch/templates` of the directory the user stands in."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.cli import run_cli

from mmm_orch.rendering import sandbox

# Known ways out of a Jinja template into Python, each trying to create the canary file.
ESCAPES = [
    "{{ cycler.__init__.__globals__.os.system('touch CANARY') }}",
    "{{ joiner.__init__.__globals__.os.system('touch CANARY') }}",
    "{{ lipsum.__globals__['os'].popen('touch CANARY').read() }}",
    "{{ namespace.__init__.__globals__.os.system('touch CANARY') }}",
    "{{ range.__self__.__class__.__init__.__globals__['os'].system('touch CANARY') }}",
    "{{ plan.__class__.__init__.__globals__['os'].system('touch CANARY') }}",
    "{{ plan.placed.__func__.__globals__['os'].system('touch CANARY') }}",
    "{{ plan|attr('__class__')|attr('__mro__') }}",
    "{{ plan|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ '{0.__class__.__init__.__globals__}'.format(plan) }}",
    "{{ self._TemplateReference__context.cycler.__init__.__globals__.os.system('touch CANARY') }}",
    "{{ _mmm_bounded_iter([1]).gi_frame.f_globals['os'].system('touch CANARY') }}",
    "{{ _mmm_concat.__func__.__globals__['os'].system('touch CANARY') }}",
    "{{ plan.scheduler_commands.update({'submit': 'touch CANARY'}) }}",
    "{{ plan.__reduce_ex__(2) }}",
    "{% set ns = namespace(x=1) %}{{ ns }}",
    "{{ undefined_name.__class__.__init__.__globals__ }}",
]

# Templates that would run for hours or take the machine's memory.
BOMBS = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(99999) %}{% for j in range(99999) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "{{ 'x' * 1000000000 }}",
    "{{ ['x'] * 1000000000 }}",
    "{{ 'x'|center(1000000000) }}",
    "{{ 'x'.ljust(1000000000) }}",
    "{{ 'x'.zfill(1000000000) }}",
    "{{ 'a\\tb'.expandtabs(1000000000) }}",
    "{{ 'x'|indent(1000000000) }}",
    "{{ 'x'|wordwrap(1000000000) }}",
    "{{ range(10)|slice(1000000000)|list }}",
    "{{ 10 ** 100000000 }}",
    "{% set n = 100000 %}{{ n ** n ** n }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ '%*d' % (999999999, 1) }}",
    "{{ '{:{}}'.format(1, 999999999) }}",
    "{{ '%.9999999f' % 1.5 }}",
    "{{ '%*d'|format(999999999, 1) }}",
    "{{ ('x' * 100000)|replace('x', 'x' * 100000) }}",
    "{{ ('x' * 100000).replace('x', 'x' * 100000) }}",
    "{% macro grow(s) %}{{ grow(s ~ s) }}{% endmacro %}{{ grow('x') }}",
    "{% macro loop_forever() %}{{ loop_forever() }}{% endmacro %}{{ loop_forever() }}",
    "{% set a = 'x' * 1000000 %}{% set b = a ~ a %}{{ b }}",
    "{% include 'job.sh.j2' %}",
    "{{ lipsum(n=1000000000) }}",
    "{{ range(100001)|list }}",
]

COMMANDS = {
    "render": ["render", "local", "fsdp"],
    "submit --dry-run": ["submit", "local", "fsdp", "--dry-run"],
    "sweep --dry-run": ["sweep", "local", "fsdp", "--nodes", "1", "--dry-run"],
}


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "cache" not in p.parts}


def _assert_refused(result, started: float, root: Path, before: set[str]) -> str:
    assert result.code == 2, (result.code, result.out[:300], result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: "), result.err
    assert "Traceback" not in result.err and "internal error" not in result.err
    assert time.thread_time() - started < 15, "the render was not bounded in CPU time"
    assert not list(root.rglob("CANARY")), "a template ran a command"
    assert _tree(root) == before, "something was written"
    return lines[0]


@pytest.fixture(params=["--template", "MMM_ORCH_PATH", "./.mmm-orch"])
def place(request, isolated, tmp_path, monkeypatch):
    """Put a template where mmm-orch finds it; returns (write(text), extra arguments)."""
    if request.param == "--template":
        path = isolated / "job.sh.j2"
        return (path.write_text, ["--template", str(path)])
    if request.param == "MMM_ORCH_PATH":
        root = tmp_path / "colleague"
        monkeypatch.setenv("MMM_ORCH_PATH", str(root))
    else:  # picked up from the directory the user stands in
        root = isolated / ".mmm-orch"
    (root / "templates").mkdir(parents=True)
    path = root / "templates" / "local.sh.j2"
    (root / "templates" / "job.sh.j2").write_text("{% include 'local.sh.j2' %}")
    return (path.write_text, [])


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("text", ESCAPES)
def test_a_template_cannot_reach_python(cli, tmp_path, place, command, text):
    write, extra = place
    write(text.replace("CANARY", str(tmp_path / "CANARY")))
    before = _tree(tmp_path)
    started = time.thread_time()
    line = _assert_refused(cli(*COMMANDS[command], *extra), started, tmp_path, before)
    assert "template" in line


@pytest.mark.parametrize("text", BOMBS)
def test_a_template_is_bounded_in_time_and_size(cli, tmp_path, place, text, monkeypatch):
    # The bound on time at a tenth of its 5 CPU-seconds: the loops reach it as they would the
    # real one, and six cases of them cost the suite 3 CPU-seconds, not 30.
    monkeypatch.setattr(sandbox, "RENDER_SECONDS", 0.5)
    write, extra = place
    write(text)
    before = _tree(tmp_path)
    started = time.thread_time()
    line = _assert_refused(cli(*COMMANDS["render"], *extra), started, tmp_path, before)
    assert "template" in line


def test_the_packaged_templates_render_as_before(cli):
    """The sandbox changes nothing for a template that stays within bounds."""
    result = cli("render", "slurm-local", "fsdp", "-N", "2")
    assert result.code == 0, result.err
    assert "#SBATCH --nodes=2" in result.out and "srun" in result.out


def test_a_bounded_template_may_loop_and_join(cli, place):
    write, extra = place
    write("{% for i in range(3) %}{{ i ~ '-' }}{% endfor %}{{ [plan.layout.nodes, plan.workload]|join(',') }}"
          "{{ ('ab' * 3)|replace('a', 'x') }}{{ '%05d' % 7 }} {{ '{}s'.format(604800) }} "
          "{{ '%d'|format(86400 * 7) }} {{ '%d %s' % (1234567, 'id 1234567') }}")
    result = cli(*COMMANDS["render"], *extra)
    assert result.code == 0, result.err
    assert result.out == "0-1-2-1,fsdpxbxbxb00007 604800s 604800 1234567 id 1234567"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "directory", "huge"])
@pytest.mark.parametrize("where", ["--template", "./.mmm-orch"])
def test_a_template_that_is_not_a_small_regular_file_is_refused_unread(isolated, tmp_path, kind,
                                                                       where):
    """A FIFO would block the render forever; in a fresh interpreter, with a timeout."""
    directory = isolated / ".mmm-orch" / "templates" if where == "./.mmm-orch" else isolated
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "local.sh.j2"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text("#" * (300 << 10))
    extra = ["--template", str(path)] if where == "--template" else []
    started = time.monotonic()
    proc = run_cli("render", "local", "fsdp", *extra, cwd=isolated, timeout=30)
    assert time.monotonic() - started < 20
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmm-orch: error: ") and "local.sh.j2" in lines[0]
