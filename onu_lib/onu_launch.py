"""Processes of one machine that the launchers (run_local_cluster.py, run_data_service.py) start and stop: free
ports, output prefixed with the process's name, and stopping what is left.

A library module: explicit arguments only, no flags.
"""
import contextlib
import os
import socket
import subprocess
import threading
import time

TERMINATE_WAIT_SECS = 10


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


@contextlib.contextmanager
def running(commands, cwd, processes):
    """Starts each (name, command) of commands in cwd (start_process), appending (name, process) to the list
    processes; on the way out, whatever happened, stops those still running (stop)."""
    printers = []
    try:
        for name, command in commands:
            process, printer = start_process(name, command, cwd)
            processes.append((name, process))
            printers.append(printer)
        yield processes
    finally:
        stop(processes, printers)
