"""The pytest plugin: hooks only, a few lines each. Imports nothing heavy at import time: the
engine (and torch, transformers, llama_cpp behind it) loads only when --ref-model is given.

    pytest --ref-model path/to/hf_model --cand-model model-q8_0.gguf [--cand-model ...]

session.py holds the run (options -> engine, results), items.py the built-in check items,
fixtures.py the ``modeldiff`` fixture and marker, summary.py the end-of-run summary and reports.
"""
from __future__ import annotations

import pytest

from .. import options
from .fixtures import marker_thresholds, modeldiff, modeldiff_candidate  # noqa: F401 (registered fixtures)
from .session import SESSION, Session


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("modeldiff", "model conversion checks (pytest-modeldiff)")
    options.add_to(group.addoption)
    for option in options.OPTIONS:
        if option.ini:
            parser.addini(option.ini, f"default for {option.flag}", default="")
    parser.addini(options.THRESHOLDS_INI, "KEY=VALUE thresholds, one per line", type="linelist", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "modeldiff(**thresholds): thresholds for this test's modeldiff assertions, "
                   "e.g. @pytest.mark.modeldiff(kld=0.01, top10=0.9)")
    # each candidate's items carry it (plugin/items.py); registered here too, so --strict-markers
    # runs without pytest-xdist installed do not stop on it
    config.addinivalue_line("markers", "xdist_group(name): pytest-xdist runs items of one group on one worker")
    session = Session.from_config(config)
    if session is not None:
        config.stash[SESSION] = session


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION, None)
    if session is not None:
        session.close()


@pytest.hookimpl(tryfirst=True)  # pytest prints header lines in reverse call order: after rootdir and plugins
def pytest_report_header(config: pytest.Config) -> list[str] | None:
    """Before pytest's "collected N items": what the plugin adds to it, and which gate judges."""
    run = config.stash.get(SESSION, None)
    if run is None:
        return None
    from .items import describe

    return describe(run)


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselection sees the item list
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    run = config.stash.get(SESSION, None)
    if run is not None:
        from .items import check_items

        items.extend(check_items(session, run))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = metafunc.config.stash.get(SESSION, None)
    if "modeldiff" in metafunc.fixturenames and run is not None:
        keys = list(run.engine.candidates)
        metafunc.parametrize("modeldiff_candidate", keys, ids=keys, indirect=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("modeldiff") is None:
        return
    marker_thresholds(item)  # a typo fails here, with or without --ref-model
    if SESSION not in item.config.stash:
        pytest.skip("pytest-modeldiff: no --ref-model given")


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    run = config.stash.get(SESSION, None)
    if run is not None and (run.engine.computed() or run.engine.computed_weights() or run.errors):
        from .summary import write_summary

        write_summary(terminalreporter, run)
