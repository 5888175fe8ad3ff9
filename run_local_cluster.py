"""Starts a training cluster on this machine, to try multi-machine training: parameter servers and workers.

    python run_local_cluster.py --num_workers=2 --model=small --max_steps=200
    python run_local_cluster.py --num_workers=2 --sync_replicas --train_dir=/tmp/onu_cluster
    python run_local_cluster.py --num_workers=2 --num_gpus=2      # each worker: onu_multi_gpu_train.py

Every other flag is a training flag (see python onu_train.py --help): it is passed on to each task.
The launcher checks the flags and prepares the data once, picks free ports on --host, starts
--num_ps parameter servers and --num_workers workers of onu_train.py (onu_multi_gpu_train.py when
--num_gpus is given) with --ps_hosts, --worker_hosts, --job_name and --task_index, prints their
output prefixed with [ps 0], [worker 1], ..., and watches every task. A lost ps is restarted on its
port (the workers reconnect; the chief restores the newest checkpoint into it), and so is a lost
worker other than the chief, at most --max_restarts times each within 10 minutes. The parameter
servers stop by themselves once every worker has finished; one still running --ps_grace_secs
later, or when the chief fails, a task is lost too often, the --timeout_secs run out or Ctrl-C is
pressed, is stopped by the launcher. Exit status: 0 when every worker succeeded, else the failing
task's (1 on a timeout).

On a real cluster run the printed command lines on the machines instead, with their host names
(see the README).
"""
import os
import sys
import time

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags

from onu_lib import onu_cluster
from onu_lib import onu_flags
from onu_lib import onu_launch
from onu_lib import onu_training

FLAGS = flags.FLAGS

onu_flags.define_training_flags()  # passed on to every task
onu_flags.define_num_gpus_flag()

flags.DEFINE_integer('num_workers', 2, 'How many workers to start (worker 0 is the chief).', lower_bound=1)
flags.DEFINE_integer('num_ps', 1, 'How many parameter servers to start.', lower_bound=1)
flags.DEFINE_string('host', '127.0.0.1', 'Address the tasks serve on.')
flags.DEFINE_float('ps_grace_secs', 30, 'After the workers finish, how long the parameter servers may '
                   'take to stop by themselves before they are stopped.', lower_bound=0)
flags.DEFINE_float('timeout_secs', None, 'Stop every task after this many seconds (default: no limit).',
                   lower_bound=0)
flags.DEFINE_integer('max_restarts', 2, 'How many times the launcher restarts one lost task (a ps, or a worker '
                     'other than the chief) within 10 minutes; one more loss stops the cluster.', lower_bound=0)

REPO_DIR = os.path.dirname(os.path.abspath(__file__))
LAUNCHER_FLAGS = ('num_workers', 'num_ps', 'host', 'ps_grace_secs', 'timeout_secs', 'max_restarts')
CLUSTER_FLAGS = ('ps_hosts', 'worker_hosts', 'job_name', 'task_index')
POLL_SECS = 0.2


def training_script():
    """Returns the script each worker runs: onu_multi_gpu_train.py when --num_gpus is given."""
    return 'onu_multi_gpu_train.py' if FLAGS['num_gpus'].present else 'onu_train.py'


def training_args():
    """Returns the training flags given to the launcher, as command-line arguments for every task."""
    args = [FLAGS[name].serialize() for name in sorted(FLAGS)
            if FLAGS[name].present and name not in LAUNCHER_FLAGS + CLUSTER_FLAGS]
    if not FLAGS.model:  # every task must build the same model, whatever GPUs it sees
        args.append(f'--model={onu_training.default_model_name()}')
    return args


def task_commands(ps_hosts, worker_hosts):
    """Returns [(task name, command line)]: the parameter servers first, then the workers."""
    base = [sys.executable, os.path.join(REPO_DIR, training_script())] + training_args() + [
        f'--ps_hosts={",".join(ps_hosts)}', f'--worker_hosts={",".join(worker_hosts)}']
    commands = [(f'ps {index}', base + [f'--job_name={onu_cluster.PS_JOB}', f'--task_index={index}'])
                for index in range(len(ps_hosts))]
    commands += [(f'worker {index}', base + [f'--job_name={onu_cluster.WORKER_JOB}', f'--task_index={index}'])
                 for index in range(len(worker_hosts))]
    return commands


def wait_for_ps(parameter_servers, grace_secs):
    """Gives the parameter servers grace_secs to stop by themselves; reports each one's end."""
    deadline = time.time() + grace_secs
    while any(process.poll() is None for _, process in parameter_servers) and time.time() < deadline:
        time.sleep(POLL_SECS)
    for name, process in parameter_servers:
        code = process.poll()
        if code is None:
            print(f'{name} still running {grace_secs:g} s after the workers: stopping it.', flush=True)
        else:
            print(f'{name} stopped by itself (exit status {code}).', flush=True)


def run_cluster():
    """Starts the cluster, waits for the workers and stops what is left; returns the exit status."""
    given = [name for name in CLUSTER_FLAGS if FLAGS[name].present]
    if given:
        raise onu_cluster.ClusterConfigError(
            f'--{given[0]} is the launcher\'s to set; give --num_workers and --num_ps instead')
    onu_training.prepare_data(FLAGS.data_dir, FLAGS.data_format, FLAGS.validation_percent, FLAGS.labels_offset)
    ports = onu_launch.free_ports(FLAGS.host, FLAGS.num_ps + FLAGS.num_workers)
    ps_hosts = [f'{FLAGS.host}:{port}' for port in ports[:FLAGS.num_ps]]
    worker_hosts = [f'{FLAGS.host}:{port}' for port in ports[FLAGS.num_ps:]]
    deadline = time.time() + FLAGS.timeout_secs if FLAGS.timeout_secs is not None else None
    commands = task_commands(ps_hosts, worker_hosts)
    launched = onu_launch.Launched(REPO_DIR)
    try:
        with launched.running(commands):
            chief = f'{onu_cluster.WORKER_JOB} {onu_cluster.CHIEF_INDEX}'
            status = onu_launch.Supervisor(launched, commands, chief, FLAGS.max_restarts).wait_for_workers(deadline)
            if status is None:
                print(f'--timeout_secs={FLAGS.timeout_secs:g} ran out: stopping the cluster.', flush=True)
                status = 1
            if status == 0:
                wait_for_ps(launched.processes[:FLAGS.num_ps], FLAGS.ps_grace_secs)
    except KeyboardInterrupt:
        print('interrupted: stopping the cluster.', flush=True)
        status = 130
    for name, process in launched.processes:
        print(f'{name} (pid {process.pid}): exit status {process.returncode}', flush=True)
    return status


def main(argv):
    return onu_cli.run_script(run_cluster, argv, user_errors=(onu_cluster.ClusterConfigError,))


if __name__ == '__main__':
    app.run(main)
