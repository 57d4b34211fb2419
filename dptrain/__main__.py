"""``python -m dptrain``: the command line (:func:`dptrain.tasks.cli.main`), ended by
:func:`dptrain.tasks.cli.exit_now`, which skips the interpreter's teardown (DPTRAIN_FULL_EXIT=1 keeps it)."""

from dptrain.tasks.cli import main, main_and_exit  # noqa: F401 - main: the entry point, as before

if __name__ == "__main__":
    main_and_exit()
