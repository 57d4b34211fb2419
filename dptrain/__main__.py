"""``python -m dptrain``: first the light check of the command line
(:func:`dptrain.settings.launch.check_before_tasks`: the config composed, its keys and types
checked, a mistake refused with exit 2 before torch, pandas and the tasks are imported), then the
command line (:func:`dptrain.tasks.cli.main`), ended by :func:`dptrain.tasks.cli.exit_now`, which
skips the interpreter's teardown (DPTRAIN_FULL_EXIT=1 keeps it). The tasks are imported at module
level, after the check (docs/performance.md, "A refusal")."""

import sys

from dptrain.settings.launch import check_before_tasks

if __name__ == "__main__":
    check_before_tasks(sys.argv[1:])

from dptrain.tasks.cli import main, main_and_exit  # noqa: E402, F401 - main: the entry point, as before

if __name__ == "__main__":
    main_and_exit()
