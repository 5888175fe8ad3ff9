"""Starts TensorFlow's tf.data service on this machine: a dispatcher and preprocessing workers for --data_service.

    python run_data_service.py --num_workers=2        # dispatcher on port 5050 + 2 workers, here
    python onu_train.py --data_service=grpc://127.0.0.1:5050        # in another terminal

On real machines, one dispatcher and workers on the CPU machines (HOST: a name the trainers can reach):

    python run_data_service.py --num_workers=0 --host=HOST                       # the dispatcher machine
    python run_data_service.py --dispatcher=HOST:5050 --num_workers=8 --host=$(hostname)   # each CPU machine
    python onu_train.py --data_service=grpc://HOST:5050                          # the GPU machine

The dispatcher is fault tolerant: it journals its state in --work_dir, and restarted there (the same command)
it resumes, and the trainers go on. Every dispatcher and worker is a process of its own, its output prefixed
with [dispatcher], [worker 1], ...; a worker that dies is reported and the others go on. Ctrl-C or SIGTERM stops
them all. The servers have no authentication or encryption and listen on every interface of the machine
(TensorFlow's servers take a port, not an address): run them only on a trusted network or behind a firewall.
"""
import os
import signal
import sys
import time

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags

from onu_lib import onu_data_service
from onu_lib import onu_launch

FLAGS = flags.FLAGS

flags.DEFINE_integer('num_workers', 1, 'Preprocessing workers to start on this machine.', lower_bound=0)
flags.DEFINE_integer('port', onu_data_service.DEFAULT_PORT, 'Port of the dispatcher started here (0: a free one).',
                     lower_bound=0)
flags.DEFINE_string('dispatcher', None, 'HOST:PORT of a dispatcher running elsewhere: start only workers here, '
                    'for it (--port and --work_dir are then unused).')
flags.DEFINE_string('host', '127.0.0.1', 'The name or address of this machine that the trainers and the workers '
                    'reach its servers at.')
flags.DEFINE_string('work_dir', '/tmp/onu_data_service', 'Where the dispatcher journals its state, to resume '
                    'after a restart.')
flags.DEFINE_float('timeout_secs', None, 'Stop everything after this many seconds (default: until stopped).',
                   lower_bound=0)
flags.DEFINE_enum('serve', None, ('dispatcher', 'worker'), 'Internal: run one server in this process.')

REPO_DIR = os.path.dirname(os.path.abspath(__file__))
POLL_SECS = 0.5
START_TIMEOUT_SECS = 120


def serve():
    """Runs one dispatcher or worker (--serve) in this process until it is stopped."""
    if FLAGS.serve == 'dispatcher':
        server = onu_data_service.start_dispatcher(FLAGS.port, FLAGS.work_dir)
    else:
        server = onu_data_service.start_worker(FLAGS.dispatcher, FLAGS.host)
    print(f'{FLAGS.serve} serving', flush=True)
    server.join()


def server_commands(dispatcher, port):
    """Returns [(name, command line)]: the dispatcher's when it runs here (port), then the workers'."""
    base = [sys.executable, os.path.join(REPO_DIR, 'run_data_service.py'), f'--host={FLAGS.host}']
    commands = [] if FLAGS.dispatcher else [
        ('dispatcher', base + ['--serve=dispatcher', f'--port={port}', f'--work_dir={FLAGS.work_dir}'])]
    commands += [(f'worker {index}', base + ['--serve=worker', f'--dispatcher={dispatcher}'])
                 for index in range(FLAGS.num_workers)]
    return commands


def supervise(processes, deadline):
    """Waits until the deadline or until every process has ended; reports each one that ends. Returns the status."""
    reported = set()
    while deadline is None or time.time() < deadline:
        for name, process in processes:
            if process.poll() is not None and name not in reported:
                reported.add(name)
                alive = sum(process.poll() is None for name, process in processes if name.startswith('worker'))
                print(f'{name} (pid {process.pid}) exited with status {process.returncode}; '
                      f'{alive} worker(s) still serving', flush=True)
        if len(reported) == len(processes):
            return 1
        time.sleep(POLL_SECS)
    print(f'--timeout_secs={FLAGS.timeout_secs:g} ran out: stopping the service.', flush=True)
    return 0


def run_service():
    """Starts the dispatcher (unless --dispatcher) and the workers, prints the trainers' flag, and supervises them."""
    if FLAGS.serve:
        return serve()
    port = FLAGS.port or onu_launch.free_ports(FLAGS.host, 1)[0]
    dispatcher = FLAGS.dispatcher or f'{FLAGS.host}:{port}'
    address = onu_data_service.service_address(dispatcher)
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))  # to stop the servers below
    try:
        with onu_launch.Launched(REPO_DIR).running(server_commands(dispatcher, port)) as processes:
            onu_data_service.wait_for_workers(address, FLAGS.num_workers, START_TIMEOUT_SECS)
            print(f'tf.data service ready: {FLAGS.num_workers} worker(s) here for the dispatcher at {address}; '
                  f'train with --data_service={address}', flush=True)
            return supervise(processes, time.time() + FLAGS.timeout_secs if FLAGS.timeout_secs is not None else None)
    except KeyboardInterrupt:
        print('interrupted: stopping the service.', flush=True)
        return 130


def main(argv):
    return onu_cli.run_script(run_service, argv, user_errors=(onu_data_service.ServiceError, TimeoutError))


if __name__ == '__main__':
    app.run(main)
