"""Tests of onu_lib/onu_launch.py with small Python processes (no TensorFlow): ports, output, stopping, and the
supervisor's answer when the workers finish or time runs out. Its restarts of lost cluster tasks are tested with the
cluster, in test_onu_cluster.py."""
import socket
import sys
import time

from onu_lib import onu_launch

SLEEPING = [sys.executable, '-c', 'import time; time.sleep(60)']
# A process that ignores SIGTERM, as a task blocked in a call that never returns to Python would.
DEAF = [sys.executable, '-c', 'import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); '
                              'print("deaf", flush=True); time.sleep(60)']


def test_free_ports_are_distinct_and_free():
    ports = onu_launch.free_ports('127.0.0.1', 5)
    assert len(set(ports)) == 5
    for port in ports:  # nothing holds them: a task can bind each
        with socket.create_server(('127.0.0.1', port)):
            pass


def test_a_started_process_runs_in_its_folder_without_tf_config_all_its_lines_named(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('TF_CONFIG', '{"cluster": {}}')  # the launcher's own: flags describe each task
    command = [sys.executable, '-c', 'import os, sys; print(os.getcwd()); print(os.environ.get("TF_CONFIG")); '
               'sys.stdout.flush(); sys.stdout.buffer.write(b"caf\\xe9\\n"); sys.stdout.flush(); '
               'print("error: lost", file=sys.stderr)']
    launched = onu_launch.Launched(str(tmp_path))
    with launched.running([('worker 1', command)]):
        assert launched.processes[0][1].wait(timeout=30) == 0
    lines = capsys.readouterr().out.splitlines()
    # Its output and errors, even a line that is not UTF-8, each line named.
    assert lines[-4:] == [f'[worker 1] {tmp_path}', '[worker 1] None', '[worker 1] caf\ufffd', '[worker 1] error: lost']


def test_stop_ends_every_process_killing_one_that_ignores_sigterm(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(onu_launch, 'TERMINATE_WAIT_SECS', 1)
    launched = onu_launch.Launched(str(tmp_path))
    with launched.running([('ps 0', SLEEPING), ('worker 0', DEAF), ('worker 1', [sys.executable, '-c', 'pass'])]):
        out, deadline = '', time.monotonic() + 30
        # Until the deaf one has set its SIGTERM handler and worker 1 has exited by itself.
        while ('[worker 0] deaf' not in out or launched.processes[2][1].poll() is None) and time.monotonic() < deadline:
            time.sleep(0.05)
            out += capsys.readouterr().out
        started = time.monotonic()
    assert [process.returncode for _, process in launched.processes] == [-15, -9, 0]
    assert 1 <= time.monotonic() - started < 10  # the deaf one was given its time, then killed


def test_the_supervisor_returns_0_once_every_worker_is_done_and_none_at_its_deadline(tmp_path):
    done = [sys.executable, '-c', 'pass']
    commands = [('ps 0', SLEEPING), ('worker 0', done), ('worker 1', done)]
    launched = onu_launch.Launched(str(tmp_path))
    with launched.running(commands):  # the ps still serves: the workers' exits decide
        assert onu_launch.Supervisor(launched, commands, 'worker 0', max_restarts=0).wait_for_workers() == 0
    commands = [('ps 0', SLEEPING), ('worker 0', SLEEPING), ('worker 1', done)]
    launched = onu_launch.Launched(str(tmp_path))
    with launched.running(commands):
        started = time.monotonic()
        supervisor = onu_launch.Supervisor(launched, commands, 'worker 0', max_restarts=0)
        assert supervisor.wait_for_workers(deadline=time.time() + 1) is None
        assert 1 <= time.monotonic() - started < 10
