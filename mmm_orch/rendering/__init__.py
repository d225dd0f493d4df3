"""Render a plan into the job script with Jinja (StrictUndefined: a typo is an error, not a blank)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

from mmm_orch.errors import ConfigError
from mmm_orch.injob import protocol
from mmm_orch.paths import NotReadable, cache_home, read_regular, search_dirs
from mmm_orch.planning import Plan, cost
from mmm_orch.schedulers import template_dirs

MAX_BYTECODE = 16 << 20  # a compiled job script template is tens of kilobytes


def _bytecode_cache():
    """Compiled templates keyed by source checksum: a stale entry can never be used. The
    directory is the sandbox's own: code compiled without its rewriting is never loaded."""
    import jinja2  # only to render: see render()

    class Cache(jinja2.FileSystemBytecodeCache):
        """It only saves time: an entry is read only from a regular file (a FIFO there would
        block), and one that cannot be read or written (a full disk, a file in the directory's
        place) is compiled again, never fatal."""

        def load_bytecode(self, bucket) -> None:
            try:
                data = read_regular(self._get_cache_filename(bucket), MAX_BYTECODE)
            except (OSError, NotReadable):
                return
            bucket.bytecode_from_string(data)

        def dump_bytecode(self, bucket) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    directory = os.path.join(cache_home(), "jinja-sandbox-1")
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return Cache(directory) if os.access(directory, os.W_OK) else None


def _environment(extra_dir: Path | None):
    """Templates from `extra_dir`, the template directories (the user's first), then each
    scheduler kind's folder, which holds its own script (<kind>.sh.j2)."""
    dirs = [str(extra_dir)] if extra_dir else []
    dirs += [str(d) for d in [*search_dirs("templates"), *template_dirs()]]
    return _environment_for(tuple(dirs))


@functools.cache
def _environment_for(dirs: tuple[str, ...]):
    """One sandboxed environment per search path (the user's template directory can change)."""
    from mmm_orch.rendering.sandbox import Sandbox  # only to render: see render()

    return Sandbox(
        dirs,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        bytecode_cache=_bytecode_cache(),
    )


def _moved(error: Exception) -> str:
    """Where a name a template read from the plan went when the plan took sections, if it did."""
    # A template error only (planning.store is ~0.2 ms of a start-up, 2-core host, 2026-11-26).
    from mmm_orch.planning.store import FLAT_NAMES, MOVED_PROPERTIES

    found = re.search(r"Plan object' has no attribute '(\w+)'", str(error))
    name = found[1] if found else ""
    where = {**{old: ".".join(new) for old, new in FLAT_NAMES.items()}, **MOVED_PROPERTIES}.get(
        name
    )
    return f" (the plan has sections: plan.{name} is plan.{where})" if where else ""


def render(plan: Plan, template: str | None = None) -> str:
    """The job script for `plan`; `template` is a file path overriding the scheduler's template.
    Every template renders in mmm_orch.rendering.sandbox: data, never code."""
    # Jinja and the sandbox cost ~23 ms of a start-up (2-core host, 2026-11-26): imported here,
    # only by the commands that render (this module is imported by every use case).
    import jinja2

    from mmm_orch.rendering.sandbox import TemplateLimit, read_template

    if template:
        path = Path(template)
        try:
            read_template(str(path))  # a FIFO, a directory or a huge file is refused unread
        except FileNotFoundError:
            raise ConfigError(f"--template {template!r}: no such file") from None
        except OSError as exc:
            raise ConfigError(f"--template {template!r}: cannot read: {exc.strerror}") from None
        except TemplateLimit as exc:
            raise ConfigError(f"--template {template!r}: {exc}") from None
        except UnicodeDecodeError:
            pass  # said below, with the byte
        env, name = _environment(path.resolve().parent), path.name
    else:
        env, name = _environment(None), f"{plan.scheduler}.sh.j2"
    try:
        return env.render_bounded(
            env.get_template(name),
            plan=plan,
            job=protocol.FOR_TEMPLATES,
            cost=cost.lines(plan, max(plan.chain.links, 1)),
        )
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"template {template or name}: not UTF-8 text (byte {exc.start}: "
            f"{exc.object[exc.start : exc.start + 1]!r})"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(
            f"{exc.filename or name}:{exc.lineno}: template error: {exc.message}"
        ) from None
    except jinja2.sandbox.SecurityError as exc:
        raise ConfigError(f"template {template or name}: refused by the sandbox: {exc}") from None
    except jinja2.TemplateError as exc:
        where = _line(exc)
        raise ConfigError(
            f"{where}: template error: {exc}{_moved(exc)}"
            if where
            else f"template {name}: {exc}{_moved(exc)}"
        ) from None
    except RecursionError:
        raise ConfigError(
            f"template {template or name}: includes or macros nest without end"
        ) from None
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        # What an expression can raise: 1 / 0, 'a' + 1, '%d' % 'a', a float past its range.
        where = _line(exc)
        if where is None:  # raised outside any template: mmm-orch's own
            raise
        raise ConfigError(f"{where}: template error: {exc} ({type(exc).__name__})") from None


def _line(exc: BaseException) -> str | None:
    """'FILE:LINE' of the template line that raised `exc` (the innermost, where one includes
    another), from the frames Jinja puts in the traceback for template code; None if none."""
    where = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__jinja_exception__") is exc:
            where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where
