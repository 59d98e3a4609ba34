"""Running a test's body in a fresh process: for checks whose imports change the whole process."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor


def in_child(check: Callable[..., None], *args: object) -> None:
    """Runs ``check(*args)`` in a spawned process (a module-level function of a test module, found
    there by the parent's ``sys.path``); its exception, an assertion's too, is raised here."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(check, *args).result()
