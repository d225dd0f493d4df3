"""Render a plan into the job script with Jinja (StrictUndefined: a typo is an error, not a blank)."""

from __future__ import annotations

import functools
import os
import shlex
from pathlib import Path

from mmm_orch.errors import ConfigError
from mmm_orch.paths import search_dirs
from mmm_orch.plan import Plan


def _bytecode_cache():
    """Compiled templates keyed by source checksum: a stale entry can never be used."""
    import jinja2

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    directory = os.path.join(root, "mmm-orch", "jinja")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(directory) if os.access(directory, os.W_OK) else None


def _environment(extra_dir: Path | None):
    dirs = [str(extra_dir)] if extra_dir else []
    dirs += [str(d) for d in search_dirs("templates")]
    return _environment_for(tuple(dirs))


@functools.lru_cache(maxsize=None)
def _environment_for(dirs: tuple[str, ...]):
    """One Jinja environment per search path (the user's template directory can change)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(dirs),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        bytecode_cache=_bytecode_cache(),
    )
    env.filters["sh"] = lambda value: shlex.quote(str(value))
    return env


def render(plan: Plan, template: str | None = None) -> str:
    """The job script for `plan`; `template` is a file path overriding the scheduler's template."""
    import jinja2

    if template:
        path = Path(template)
        if not path.is_file():
            raise ConfigError(f"--template {template!r}: no such file")
        env, name = _environment(path.resolve().parent), path.name
    else:
        env, name = _environment(None), f"{plan.scheduler}.sh.j2"
    try:
        return env.get_template(name).render(plan=plan)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"template {template or name}: not UTF-8 text (byte {exc.start}: "
                          f"{exc.object[exc.start:exc.start + 1]!r})") from None
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"{exc.filename or name}:{exc.lineno}: template error: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise ConfigError(f"template {name}: {exc}") from None
