"""Write the generated reference pages into a directory, or check that they are up to date."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from mmm_orch.reference import COMMAND, PAGES, maker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write (or check) the generated reference pages.")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is out of date")
    options = parser.parse_args(argv)
    directory = options.directory.resolve()
    with tempfile.TemporaryDirectory() as nowhere:
        return _write_or_check(directory, options.check, nowhere)


def _write_or_check(directory: Path, check: bool, nowhere: str) -> int:
    # The packaged profiles only: none of this user's own (./.mmm-orch, ~/.config/mmm-orch,
    # $MMM_ORCH_PATH) and no default from their environment may reach the pages.
    os.chdir(nowhere)
    os.environ["XDG_CONFIG_HOME"] = nowhere
    for name in [n for n in os.environ if n.startswith("MMM_ORCH_")]:
        del os.environ[name]
    stale = []
    for page in PAGES:
        path = directory / page
        made = maker(page)()
        if check:
            if not path.exists() or path.read_text() != made:
                stale.append(str(path))
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(made)
    if stale:
        print(
            f"out of date with the code: {', '.join(stale)}; regenerate with `{COMMAND}`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
