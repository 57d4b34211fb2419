"""The quick subset a newcomer runs first, ``python -m pytest -m smoke`` (under 2 minutes on 2
cores, README "Tests"): the tests below carry the ``smoke`` marker, given here so that the test
files stay as they are. They cover the install (the package and its shipped presets), a typo
refused before the heavy imports, a training run, a release, a one-shot table, predict, verify
and publish. The whole fast suite (``python -m pytest``, what CI runs) includes them;
tests/test_smoke_subset.py checks that every id below still names a collected, fast test."""

from __future__ import annotations

import sys

import pytest

#: node ids (file::test, a parametrised test with its [id]) of the quick subset
SMOKE = (
    "tests/test_front_door.py::test_import_dptrain_loads_nothing_heavy",
    "tests/test_cli.py::test_presets_exist",
    "tests/test_light_check.py::test_every_mistake_is_refused_before_the_tasks_torch_and_pandas_load",
    "tests/test_cli.py::test_readme_main_command_meets_its_promise",
    "tests/test_release_cli.py::test_user_table_release",
    "tests/test_tabulate.py::test_adult_marginals_are_consistent_nonnegative_integers_over_the_declared_domain",
    "tests/test_predict.py::test_cli_predictions_equal_the_api_predictions",
    "tests/test_run_folder.py::test_verify_reports_ok_changed_and_missing",
    "tests/test_publication.py::test_publish_refuses_what_it_cannot_vouch_for_and_writes_nothing",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "smoke: the quick subset a newcomer runs first (python -m pytest -m smoke; "
                            "tests/conftest.py lists it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of SMOKE (before ``-m`` selects)."""
    smoke = set(SMOKE)
    for item in items:
        if item.nodeid in smoke:
            item.add_marker(pytest.mark.smoke)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """absl's log handler (absl-py, imported by some dependencies during a test) keeps the stderr of
    the moment it was created: pytest's capture of the whole session. When a later in-process
    ``cli.main()`` lets Hydra configure logging, logging closes every handler, and absl's close()
    closes a stream that is not the current sys.stderr: pytest's capture then fails on a closed
    file. Pointed at the process's own stderr (which absl never closes), it stays harmless. A real
    ``python -m dptrain`` does not import absl before Hydra configures its logging."""
    absl_logging = sys.modules.get("absl.logging")
    if absl_logging is not None:
        absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__
