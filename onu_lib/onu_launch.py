"""Processes of one machine that the launchers (run_local_cluster.py, run_data_service.py) start and stop: free
ports and whether one answers, output prefixed with the process's name, stopping what is left, and restarting a
cluster's lost tasks.

A library module: explicit arguments only, no flags.
"""
import contextlib
import os
import socket
import subprocess
import threading
import time

TERMINATE_WAIT_SECS = 10
POLL_SECS = 0.2
RESTART_WINDOW_SECS = 600


def free_ports(host, count):
    """Returns count distinct ports on host that are free now (the OS picks them)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def answers(host_port, timeout_secs=1.0):
    """Returns whether something accepts TCP connections at HOST:PORT ([::1]:PORT for IPv6)."""
    host, port = host_port.rsplit(':', 1)
    try:
        with socket.create_connection((host.strip('[]'), int(port)), timeout=timeout_secs):
            return True
    except OSError:
        return False


def _copy_output(name, stream):
    """Prints each line of stream prefixed with [name]."""
    for line in stream:
        print(f'[{name}] {line}', end='', flush=True)


def start_process(name, command, cwd):
    """Starts command in cwd (without TF_CONFIG: flags describe the task); returns (process, the thread printing
    its output prefixed with [name])."""
    env = dict(os.environ)
    env.pop('TF_CONFIG', None)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors='replace', bufsize=1, env=env, cwd=cwd)
    printer = threading.Thread(target=_copy_output, args=(name, process.stdout), daemon=True)
    printer.start()
    print(f'started {name} (pid {process.pid}): {" ".join(command)}', flush=True)
    return process, printer


def stop(processes, printers=()):
    """Terminates the (name, process) still running, kills those that do not exit, and lets their printers finish."""
    for _, process in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.time() + TERMINATE_WAIT_SECS
    for _, process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for printer in printers:
        printer.join(timeout=TERMINATE_WAIT_SECS)


class Launched:
    """The processes a launcher started in cwd, as (name, process) in start order, with their printers."""

    def __init__(self, cwd):
        self.cwd = cwd
        self.processes = []
        self._printers = []

    @contextlib.contextmanager
    def running(self, commands):
        """Starts each (name, command); on the way out, whatever happened, stops those still running."""
        try:
            for name, command in commands:
                self.processes.append(self._start(name, command))
            yield self.processes
        finally:
            stop(self.processes, self._printers)

    def restart(self, index, command):
        """Starts command again in place of the exited process at index (same name)."""
        self.processes[index] = self._start(self.processes[index][0], command)

    def _start(self, name, command):
        """Returns (name, the process started), its printer kept for stop()."""
        process, printer = start_process(name, command, self.cwd)
        self._printers.append(printer)
        return name, process


class Supervisor:
    """Watches a cluster's tasks ('ps N', 'worker N') as a supervisor would: a lost ps or non-chief worker is restarted
    with the same command, at most max_restarts times per task within RESTART_WINDOW_SECS; a lost chief, or a task
    lost once more, stops the cluster. Exit status 0 is a worker done, or a ps stopped once every worker said so."""

    def __init__(self, launched, commands, chief, max_restarts):
        self._launched, self._commands, self._chief = launched, dict(commands), chief
        self._max_restarts = max_restarts
        self._losses = {}  # task name -> monotonic times it was lost

    def wait_for_workers(self, deadline=None):
        """Waits until every worker has exited 0, restarting lost tasks; returns 0, the status that stopped the
        cluster, or None when the deadline (a time.time()) passed."""
        while True:
            workers = [process for name, process in self._launched.processes if name.startswith('worker')]
            if all(process.poll() == 0 for process in workers):
                return 0
            for index, (name, process) in enumerate(self._launched.processes):
                if process.poll() not in (None, 0):
                    status = self._lost(index, name, process.returncode)
                    if status is not None:
                        return status
            if deadline is not None and time.time() > deadline:
                return None
            time.sleep(POLL_SECS)

    def _lost(self, index, name, code):
        """Restarts the task that exited with code, or returns the exit status that stops the cluster."""
        if name == self._chief:
            print(f'{name} (the chief) failed with exit status {code}: stopping the cluster; run the same command '
                  f'again to resume from its newest checkpoint.', flush=True)
            return code
        now = time.monotonic()
        losses = [lost for lost in self._losses.get(name, []) if now - lost < RESTART_WINDOW_SECS] + [now]
        self._losses[name] = losses
        window = f'{RESTART_WINDOW_SECS / 60:g} minutes'
        if len(losses) > self._max_restarts:
            print(f'{name} exited with status {code}, lost {len(losses)} time(s) within {window} '
                  f'(--max_restarts={self._max_restarts}): stopping the cluster.', flush=True)
            return code
        then = ('the workers reconnect and the chief restores the newest checkpoint into it' if name.startswith('ps')
                else 'it rejoins the training')
        print(f'{name} exited with status {code}: restarting it (restart {len(losses)} of {self._max_restarts} '
              f'within {window}); {then}.', flush=True)
        self._launched.restart(index, self._commands[name])
        return None
