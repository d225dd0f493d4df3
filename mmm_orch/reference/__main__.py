"""Write the generated reference pages into a directory, or check that they are up to date."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from mmm_orch.errors import MmmError
from mmm_orch.paths import NotReadable, open_regular
from mmm_orch.reference import COMMAND, PAGES, maker

PROG = "python -m mmm_orch.reference"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Write (or check) the generated reference pages."
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is out of date")
    options = parser.parse_args(argv)
    # Absolute before the chdir below; not resolved, so that a symlink loop is met (and
    # reported) where the pages are opened.
    directory = Path(os.path.abspath(options.directory))
    try:
        with tempfile.TemporaryDirectory() as nowhere:
            return _write_or_check(directory, options.check, nowhere)
    except (MmmError, NotReadable) as exc:
        print(f"{PROG}: error: {MmmError(str(exc))}", file=sys.stderr)
        return MmmError.exit_code


def _write_or_check(directory: Path, check: bool, nowhere: str) -> int:
    # The packaged profiles only: none of this user's own (./.mmm-orch, ~/.config/mmm-orch,
    # $MMM_ORCH_PATH) and no default from their environment may reach the pages.
    os.chdir(nowhere)
    os.environ["XDG_CONFIG_HOME"] = nowhere
    for name in [n for n in os.environ if n.startswith("MMM_ORCH_")]:
        del os.environ[name]
    if check:
        stale = [str(directory / page) for page in PAGES if not _current(directory / page)]
        if stale:
            print(
                f"out of date with the code: {', '.join(stale)}; regenerate with `{COMMAND}`",
                file=sys.stderr,
            )
            return 1
        return 0
    _write(directory)
    return 0


def _current(path: Path) -> bool:
    """Whether the page at `path` is what the code makes today; read only as a regular file
    (a FIFO there would block the check forever): NotReadable for anything else."""
    made = maker(path.name)().encode("utf-8")
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise MmmError(f"{path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as page:
        return os.fstat(page.fileno()).st_size == len(made) and page.read(len(made) + 1) == made


def _write(directory: Path) -> None:
    """Every page, or none: each is written beside its place and renamed onto it once all are
    written, so that a full or read-only disk leaves the directory as it was. A page that is a
    symlink, a FIFO or a directory is refused, never written through (a link's target may be
    anyone's file)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MmmError(f"{directory}: cannot make the directory: {exc.strerror}") from None
    for page in PAGES:
        try:
            mode = (directory / page).lstat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise MmmError(f"{directory / page}: cannot look at it: {exc.strerror}") from None
        if not stat.S_ISREG(mode):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise MmmError(
                f"{directory / page} is {kind}: a page is written only as a regular file "
                "(remove it, or write the pages elsewhere)"
            )
    made = {page: maker(page)() for page in PAGES}
    written: dict[str, Path] = {}
    try:
        for page, text in made.items():
            with tempfile.NamedTemporaryFile(
                "w",
                encoding="utf-8",
                dir=directory,
                prefix=f".{page}.",
                suffix=".tmp",
                delete=False,
            ) as temporary:
                written[page] = Path(temporary.name)
                temporary.write(text)
            written[page].chmod(0o644)
        for page, temporary_path in written.items():
            temporary_path.replace(directory / page)
    except OSError as exc:
        for temporary_path in written.values():
            with contextlib.suppress(OSError):
                temporary_path.unlink(missing_ok=True)
        raise MmmError(f"{directory}: cannot write the pages: {exc.strerror}") from None


if __name__ == "__main__":
    raise SystemExit(main())
