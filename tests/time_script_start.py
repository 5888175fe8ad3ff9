"""Times a script run as the tests run it, forked from the tests' script server, against a fresh Python process.

    python tests/time_script_start.py [--runs=5]

The run is onu_export.py on a folder without a run: start, one-line error, exit (README "Tests"). Prints the
median, minimum and maximum seconds of each way, after one untimed run of each.
"""
import statistics
import sys
import time

import conftest


def seconds_of_a_run(fresh_process):
    """Seconds of one onu_export.py run that stops at once with its one-line error."""
    started = time.monotonic()
    result = conftest.run_script('onu_export.py', '--checkpoint_dir=/nonexistent', fresh_process=fresh_process)
    assert result.returncode == 2, result.stderr
    return time.monotonic() - started


def main(runs):
    for fresh_process, way in ((False, 'forked from the script server'), (True, 'a fresh Python process')):
        seconds_of_a_run(fresh_process)  # untimed: starts the server, warms the file cache
        times = [seconds_of_a_run(fresh_process) for _ in range(runs)]
        print(f'{way}: median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}; '
              f'{runs} runs)')


if __name__ == '__main__':
    main(int(next((arg.split('=', 1)[1] for arg in sys.argv[1:] if arg.startswith('--runs=')), 5)))
