"""``python -m dptrain``: the command line (:func:`dptrain.cli.main`), ended by
:func:`dptrain.cli.exit_now`, which skips the interpreter's teardown (DPTRAIN_FULL_EXIT=1 keeps it)."""

from dptrain.cli import main, main_and_exit  # noqa: F401 - main: the entry point, as before

if __name__ == "__main__":
    main_and_exit()
