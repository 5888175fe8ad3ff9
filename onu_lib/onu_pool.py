"""Worker processes of the data tools (conversion, sample data): how many, a spawned pool, and an ordered map over it
that never runs far ahead of its consumer. Pure Python: workers never import TensorFlow.
"""
import collections
import contextlib
import itertools
import multiprocessing
import os
import sys


def worker_count(processes=None):
    """The number of worker processes to use: processes, or every usable CPU core if None or 0."""
    if processes:
        return processes
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1


@contextlib.contextmanager
def _main_script_not_reimported():
    """Within it, spawned processes do not import the main script (as __mp_main__), and so neither its TensorFlow:
    the work functions live in library modules, which the worker imports itself."""
    main = sys.modules.get('__main__')
    main_file = getattr(main, '__file__', None)
    if main_file is None or getattr(main, '__spec__', None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = main_file


@contextlib.contextmanager
def process_pool(processes, initializer=None):
    """A pool of worker processes, or None when a single process is asked for (work runs in the caller)."""
    if processes <= 1:
        yield None
        return
    # 'spawn', not 'fork': callers may already run TensorFlow threads, which do not survive a fork.
    with _main_script_not_reimported():
        pool = multiprocessing.get_context('spawn').Pool(processes, initializer=initializer)
    try:
        yield pool
    finally:
        pool.terminate()  # callers collect every result first; this also stops workers still starting up


def parallel_map(fn, items, pool, window=8):
    """Yields fn(item) for items in order, computed by pool's workers (in this process if pool is None), at most
    `window` items ahead of the consumer, so that a slow one never makes the workers fill the RAM."""
    if pool is None:
        yield from map(fn, items)
        return
    items = iter(items)
    pending = collections.deque(pool.apply_async(fn, (item,)) for item in itertools.islice(items, window))
    while pending:
        result = pending.popleft().get()
        for item in itertools.islice(items, 1):
            pending.append(pool.apply_async(fn, (item,)))
        yield result
