"""Multi-machine training on TensorFlow's own distributed runtime (between-graph replication).

Every machine runs the same training script as one task of a cluster. Parameter servers (job `ps`) hold the
variables; each worker (job `worker`) builds the whole graph, reads its own input and updates the shared variables;
worker 0, the chief, initialises or restores the variables and alone writes checkpoints and summaries. The cluster
comes from the --ps_hosts/--worker_hosts/--job_name/--task_index flags or from the TF_CONFIG environment variable:

    TF_CONFIG='{"cluster": {"ps": ["ps0:2222"], "worker": ["w0:2222", "w1:2222"]},
                "task": {"type": "worker", "index": 0}}'

Updates are asynchronous, or with SyncReplicas the average of one gradient from every worker. The known traps:
- A worker's session sees only the ps tasks and itself (device filters): it never waits for a finished peer.
- Non-chief workers poll for the chief's initialisation every CHIEF_POLL_SECS, not in TensorFlow's 30-second sleeps.
- A ps would serve forever: each worker that ends puts its index in a "done queue" on every ps, and a ps returns
  once every worker has done so.
- Synchronous training: the chief hands out spare tokens when it stops, so no worker waits for a step that will
  not come, and its own end-of-run wait is STOP_GRACE_PERIOD_SECS.
- A lost ps: a worker's step, or its new session, waits for it without end inside gRPC. Each worker watches the ps
  tasks' ports (PsWatch): one line when one stops answering, one when it is back (the chief then restores the newest
  checkpoint into it), and after --ps_wait_secs one line naming the ps and the checkpoint to resume from, exit 1.

A library module: explicit arguments only, no flags.
"""
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time

from absl import logging
import tensorflow as tf

from onu_lib import onu_checkpoint
from onu_lib import onu_launch
import onu_model

PS_JOB = 'ps'
WORKER_JOB = 'worker'
JOB_NAMES = (PS_JOB, WORKER_JOB)
CHIEF_JOB = 'chief'  # TF_CONFIG's name for a chief kept apart from the workers: it becomes worker 0
CHIEF_INDEX = 0
TF_CONFIG_EXAMPLE = ('{"cluster": {"ps": ["host:port"], "worker": ["host:port", ...]}, '
                     '"task": {"type": "worker", "index": 0}}')

CHIEF_POLL_SECS = 0.5
CHIEF_WAIT_SECS = 7200  # as long as MonitoredTrainingSession lets a worker wait
STOP_GRACE_PERIOD_SECS = 3
DONE_QUEUE_NAME = 'onu_workers_done'
DONE_SIGNAL_TIMEOUT_SECS = 60
# Spare tokens per worker when a synchronous run ends: a worker may be waiting in one step and,
# having read an older global step, start one more before it sees that training is over.
RELEASE_TOKENS_PER_WORKER = 2
PS_WAIT_SECS = 300  # --ps_wait_secs: time for a supervisor to restart a lost ps
PS_PROBE_SECS = 1  # how often a worker checks that each ps still answers
LOST_PS_EXIT_STATUS = 1


class ClusterConfigError(Exception):
    """The cluster description is unusable; str(e) is one line naming the setting and the fix."""


@dataclasses.dataclass(frozen=True)
class ClusterTask:
    """This process's place in a cluster: the hosts of each job, its job and its index."""
    ps_hosts: tuple
    worker_hosts: tuple
    job_name: str
    task_index: int

    @property
    def is_chief(self):
        """True for worker 0, which initialises the variables and writes checkpoints and summaries."""
        return self.job_name == WORKER_JOB and self.task_index == CHIEF_INDEX

    @property
    def num_workers(self):
        """Returns the number of workers."""
        return len(self.worker_hosts)

    @property
    def num_ps(self):
        """Returns the number of parameter servers."""
        return len(self.ps_hosts)

    @property
    def name(self):
        """Returns e.g. 'worker 1' or 'ps 0', for messages."""
        return f'{self.job_name} {self.task_index}'

    @property
    def device(self):
        """Returns this task's device prefix, e.g. /job:worker/task:1."""
        return f'/job:{self.job_name}/task:{self.task_index}'

    def cluster_spec(self):
        """Returns the tf.train.ClusterSpec of the ps and worker jobs."""
        return tf.train.ClusterSpec({PS_JOB: list(self.ps_hosts), WORKER_JOB: list(self.worker_hosts)})


def resolve_task(ps_hosts, worker_hosts, job_name, task_index, tf_config=None, sync_replicas=False,
                 model_given=True):
    """Returns this process's ClusterTask from the flags' values when any is given, else from tf_config (TF_CONFIG's
    JSON), or None for one machine; sync_replicas needs a cluster, a worker model_given (every one the same model)."""
    if ps_hosts or worker_hosts or job_name:
        task = ClusterTask(tuple(ps_hosts), tuple(worker_hosts), job_name, task_index)
        _check_task(task, '--ps_hosts, --worker_hosts, --job_name and --task_index')
    else:
        task = _task_from_tf_config(tf_config) if tf_config and tf_config.strip() else None
        if task is not None:
            _check_task(task, 'TF_CONFIG')
    if task is None and sync_replicas:
        raise ClusterConfigError(
            '--sync_replicas needs a cluster (--ps_hosts and --worker_hosts, or TF_CONFIG); on one '
            'machine onu_multi_gpu_train.py trains synchronously on several GPUs')
    if task and task.job_name == WORKER_JOB and not model_given:
        raise ClusterConfigError(
            f'{task.name}: give --model on a cluster; every worker must build the same model and the '
            f'default depends on the machine\'s GPUs')
    return task


def _task_from_tf_config(tf_config):
    """Returns the ClusterTask TF_CONFIG describes (None when it is a one-machine cluster)."""
    try:
        parsed = json.loads(tf_config)
        cluster = parsed.get('cluster') or {}
        task = parsed.get('task') or {}
        task_type, index = task.get('type'), int(task.get('index', 0))
        chief_hosts = tuple(cluster.get(CHIEF_JOB, ()))
        ps_hosts = tuple(cluster.get(PS_JOB, ()))
        worker_hosts = chief_hosts + tuple(cluster.get(WORKER_JOB, ()))
    except (ValueError, AttributeError, TypeError) as e:
        raise ClusterConfigError(f'TF_CONFIG is not a cluster description ({e}); expected JSON like '
                                 f'{TF_CONFIG_EXAMPLE}') from None
    if not ps_hosts and len(worker_hosts) <= 1:
        return None
    if task_type == CHIEF_JOB:
        return ClusterTask(ps_hosts, worker_hosts, WORKER_JOB, index)
    if task_type == WORKER_JOB:
        return ClusterTask(ps_hosts, worker_hosts, WORKER_JOB, index + len(chief_hosts))
    if task_type == PS_JOB:
        return ClusterTask(ps_hosts, worker_hosts, PS_JOB, index)
    if task_type == 'evaluator':
        raise ClusterConfigError('TF_CONFIG task type evaluator: run onu_eval.py on that machine '
                                 'instead of a training script')
    raise ClusterConfigError(f'TF_CONFIG task type {task_type!r} is not one of ps, worker, chief; '
                             f'expected JSON like {TF_CONFIG_EXAMPLE}')


def _check_task(task, source):
    """Raises ClusterConfigError when the task cannot run (missing jobs, bad index or host)."""
    if task.job_name not in JOB_NAMES:
        raise ClusterConfigError(f'{source}: job {task.job_name!r} is not one of {", ".join(JOB_NAMES)}; '
                                 f'set --job_name=ps or --job_name=worker')
    if not task.worker_hosts:
        raise ClusterConfigError(f'{source}: no workers; list them as --worker_hosts=host:port,... '
                                 f'(worker 0 is the chief)')
    if not task.ps_hosts:
        raise ClusterConfigError(f'{source}: no parameter servers; between-graph training keeps the '
                                 f'variables on at least one, e.g. --ps_hosts=host:port')
    hosts = task.ps_hosts if task.job_name == PS_JOB else task.worker_hosts
    if not 0 <= task.task_index < len(hosts):
        raise ClusterConfigError(f'{source}: task index {task.task_index} but the {task.job_name} job '
                                 f'has {len(hosts)} task(s); use an index from 0 to {len(hosts) - 1}')
    every_host = task.ps_hosts + task.worker_hosts
    for host in every_host:
        name, _, port = str(host).rpartition(':')
        if not name or not port.isdigit():
            raise ClusterConfigError(f'{source}: {host!r} is not host:port, e.g. 10.0.0.2:2222')
    repeated = sorted({host for host in every_host if every_host.count(host) > 1})
    if repeated:
        raise ClusterConfigError(f'{source}: {", ".join(repeated)} listed twice; every task needs '
                                 f'its own host:port')


def task_session_config(base_config, task):
    """Returns base_config restricted to the devices this task talks to: a worker sees the parameter servers and
    itself, never its peers, so it neither waits for one that has not started nor hangs on one that has finished."""
    config = tf.compat.v1.ConfigProto()
    config.CopyFrom(base_config)
    if task.job_name == PS_JOB:
        config.device_filters[:] = [task.device]
    else:
        config.device_filters[:] = [f'/job:{PS_JOB}', task.device]
    return config


# pragma: no mutate start (servers and sessions of a cluster: its process tests, not mutation testing, reach them)
def start_server(task, config):
    """Starts this task's server; a port in use or an unknown host is a ClusterConfigError."""
    host = (task.ps_hosts if task.job_name == PS_JOB else task.worker_hosts)[task.task_index]
    try:
        return tf.compat.v1.train.Server(task.cluster_spec(), job_name=task.job_name,
                                         task_index=task.task_index, config=config, start=True)
    except (tf.errors.OpError, ValueError) as e:
        message = getattr(e, 'message', str(e)).strip().splitlines()
        raise ClusterConfigError(f'{task.name}: cannot serve on {host} ({message[-1] if message else e}); '
                                 f'check that the port is free and the host is this machine') from None


def device_setter(task):
    """Returns the device function of a worker's graph: variables on the ps tasks, the rest here."""
    return tf.compat.v1.train.replica_device_setter(cluster=task.cluster_spec(),
                                                    worker_device=task.device)


def _done_queue(ps_index):
    """Returns the queue on ps ps_index where workers put their index when their training ends."""
    with tf.device(f'/job:{PS_JOB}/task:{ps_index}'):
        # capacity -1: unbounded, so that a restarted worker's second signal never blocks.
        return tf.queue.FIFOQueue(-1, tf.int32, shapes=[[]], shared_name=DONE_QUEUE_NAME,
                                  name=DONE_QUEUE_NAME)


def serve_until_workers_done(task, target, config):
    """Serves this ps task's variables until every worker has signalled the end of its training."""
    with tf.Graph().as_default():
        finished_worker = _done_queue(task.task_index).dequeue()
        with tf.compat.v1.Session(target, config=config) as sess:
            finished = set()
            while len(finished) < task.num_workers:
                worker = int(sess.run(finished_worker))
                finished.add(worker)
                print(f'{task.name}: worker {worker} finished ({len(finished)} of {task.num_workers}).',
                      flush=True)
    print(f'{task.name}: every worker finished; stopping.', flush=True)


def signal_worker_done(task, target, config):
    """Tells every parameter server that this worker's training has ended; warns if one is gone."""
    with tf.Graph().as_default():
        signals = [_done_queue(ps_index).enqueue(task.task_index) for ps_index in range(task.num_ps)]
        try:
            with tf.compat.v1.Session(target, config=config) as sess:
                sess.run(signals, options=tf.compat.v1.RunOptions(timeout_in_ms=int(DONE_SIGNAL_TIMEOUT_SECS * 1000)))
        except tf.errors.OpError as e:
            logging.warning('%s could not tell the parameter servers that it finished (%s); '
                            'stop them yourself', task.name, e.message.strip().splitlines()[0])


def wait_for_chief(target, config, timeout_secs=CHIEF_WAIT_SECS):
    """Returns once the chief has initialised the graph's shared variables; ClusterConfigError after timeout_secs."""
    with tf.name_scope('wait_for_chief'):
        # Global variables only: local ones (e.g. a synchronous worker's step) are each worker's own.
        uninitialized = tf.compat.v1.report_uninitialized_variables(tf.compat.v1.global_variables())
    started, announced = time.time(), False
    with tf.compat.v1.Session(target, config=config) as sess:
        while sess.run(uninitialized).size:
            if time.time() - started > timeout_secs:
                raise ClusterConfigError(
                    f'the chief (worker {CHIEF_INDEX}) did not initialise the variables within '
                    f'{timeout_secs:g} s; check that it runs, with the same --model and --image_size')
            if not announced:
                print(f'Waiting for the chief (worker {CHIEF_INDEX}) to initialise the variables...',
                      flush=True)
                announced = True
            time.sleep(CHIEF_POLL_SECS)
    if announced:
        print(f'The chief is ready (waited {time.time() - started:.1f} s).', flush=True)


# pragma: no mutate end
def newest_checkpoint_line(train_dir):
    """Returns where a run in train_dir resumes from, for a line: 'PATH (step N)' or that there is none yet."""
    listed = onu_checkpoint.list_checkpoints(train_dir) if train_dir else []
    if not listed:
        return f'no checkpoint in {train_dir} yet'
    return f'{listed[-1]} (step {onu_checkpoint.listed_step(listed[-1])})'


def ps_name(index, host):
    """Returns how lines name a parameter server: 'ps 0 at host:port'."""
    return f'{PS_JOB} {index} at {host}'


class PsWatch:
    """A worker's watch over the parameter servers, in a thread of its own (a step may be blocked by a lost ps): says
    when one stops answering and when it is back, and ends the process when one stays away wait_secs."""

    def __init__(self, task, wait_secs, train_dir, probe_secs=PS_PROBE_SECS):
        self._task, self._wait_secs, self._train_dir, self._probe_secs = task, wait_secs, train_dir, probe_secs
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name='ps-watch', daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        """Stops watching (before this worker tells the ps it is done: the ps then stops)."""
        self._stopped.set()

    def lost(self):
        """Returns the names of the ps tasks not answering now."""
        return [ps_name(index, host) for index, host in enumerate(self._task.ps_hosts) if not onu_launch.answers(host)]

    def _watch(self):
        gone_since, answered = {}, set()  # a ps not started yet is waited for as before, without end
        while not self._stopped.wait(self._probe_secs):
            now = time.monotonic()
            for index, host in enumerate(self._task.ps_hosts):
                name = ps_name(index, host)
                if onu_launch.answers(host):
                    answered.add(index)
                    if index in gone_since:
                        print(f'{self._task.name}: {name} is back after {now - gone_since.pop(index):.0f} s; '
                              f'training goes on.', flush=True)
                elif self._stopped.is_set():
                    return
                elif index not in answered:
                    continue
                elif index not in gone_since:
                    gone_since[index] = now
                    print(f'{self._task.name}: {name} does not answer: waiting up to {self._wait_secs:g} s for it '
                          f'to come back (--ps_wait_secs).', flush=True)
                elif now - gone_since[index] > self._wait_secs:
                    self._give_up(name, now - gone_since[index])

    def _give_up(self, name, waited_secs):
        """Ends the process: its step or session waits for the lost ps inside gRPC, beyond Python's reach."""
        print(f'error: {self._task.name} lost {name}: it did not answer for {waited_secs:.0f} s (--ps_wait_secs); '
              f'restart it, then this worker, to resume from {newest_checkpoint_line(self._train_dir)}.',
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(LOST_PS_EXIT_STATUS)  # pylint: disable=protected-access


# pragma: no mutate block (the role of a process in a cluster, its servers and sessions: the process tests)
class Role:
    """This process's part in training, as one machine's only worker or a cluster task: the same methods either way
    (on one machine they do nothing)."""

    def __init__(self, session_config, task=None, server=None, replicas=None, ps_watch=None):
        self.session_config = session_config
        self.task = task
        self._server = server
        self._replicas = replicas
        self.ps_watch = ps_watch

    @property
    def is_ps(self):
        """True for a parameter server, which only serves variables."""
        return bool(self.task) and self.task.job_name == PS_JOB

    @property
    def is_chief(self):
        """True where checkpoints and summaries are written: one machine, or the cluster's worker 0."""
        return not self.task or self.task.is_chief

    @property
    def task_index(self):
        """Returns the worker's index in its job (0 on one machine)."""
        return self.task.task_index if self.task else 0

    @property
    def master(self):
        """Returns the session target: '' (in-process) on one machine, else this task's server."""
        return self._server.target if self._server else ''

    @property
    def num_replicas(self):
        """Returns how many worker batches one global step trains on (1 unless synchronous)."""
        return self._replicas.num_replicas if self._replicas else 1

    @property
    def stop_grace_period_secs(self):
        """Returns how long the session waits for its threads at the end (short on a cluster)."""
        return STOP_GRACE_PERIOD_SECS if self.task else 120

    def device_scope(self):
        """Returns the device context of the training graph: variables on the ps tasks on a cluster."""
        return tf.compat.v1.device(device_setter(self.task)) if self.task else contextlib.nullcontext()

    def synchronous(self, optimizer, global_step, moving_average_decay):
        """Returns optimizer, made synchronous across the workers with --sync_replicas."""
        if not self._replicas:
            return optimizer
        return self._replicas.wrap(optimizer, global_step, moving_average_decay)

    def hooks(self):
        """Returns the session hooks the role needs (those driving synchronous updates)."""
        return self._replicas.hooks() if self._replicas else []

    def wait_for_chief(self):
        """On a non-chief worker: returns once the chief has initialised the default graph's variables."""
        if not self.is_chief:
            wait_for_chief(self.master, self.session_config)

    def serve(self):
        """On a parameter server: serves the variables until every worker is done."""
        serve_until_workers_done(self.task, self.master, self.session_config)

    def finish(self, steps_run):
        """On a cluster: reports the steps this worker ran and tells the parameter servers it is done."""
        if self.task:
            lost = self.ps_watch.lost() if self.ps_watch else []
            if self.ps_watch:
                self.ps_watch.stop()
            print(f'{self.task.name} ran {steps_run} training steps.', flush=True)
            if lost:  # the done signal would wait for it
                print(f'{self.task.name}: {", ".join(lost)} does not answer: not telling it this worker finished.',
                      flush=True)
            else:
                signal_worker_done(self.task, self.master, self.session_config)


def join(task, session_config, sync_replicas, ps_wait_secs, train_dir):
    """Returns this process's Role: for a cluster task (see resolve_task) its server is started, and a worker
    watches the parameter servers (PsWatch, ps_wait_secs) from then on."""
    if task is None:
        return Role(session_config)
    session_config = task_session_config(session_config, task)
    server = start_server(task, session_config)
    print(f'{task.name} of a cluster of {task.num_ps} ps and {task.num_workers} worker(s): '
          f'serving at {server.target}', flush=True)
    watch = PsWatch(task, ps_wait_secs, train_dir).start() if task.job_name == WORKER_JOB else None
    return Role(session_config, task, server, SyncReplicas(task) if sync_replicas else None, watch)


class SyncReplicas:
    """Synchronous updates (SyncReplicasOptimizer): each global step applies the average of one gradient per worker,
    and the chief then updates the moving averages of the weights."""

    def __init__(self, task):
        self._task = task
        self._optimizer = None

    @property
    def num_replicas(self):
        """Returns how many worker batches one global step averages."""
        return self._task.num_workers

    def wrap(self, optimizer, global_step, moving_average_decay):
        """Returns optimizer made synchronous; onu_model.build_train_op then leaves the averages to it."""
        averages = None
        if moving_average_decay:
            # The averages onu_model.build_train_op keeps (same shadow names), updated by the chief.
            averages = tf.compat.v1.train.ExponentialMovingAverage(moving_average_decay,
                                                                   num_updates=global_step)
        self._optimizer = tf.compat.v1.train.SyncReplicasOptimizer(
            optimizer, replicas_to_aggregate=self.num_replicas, total_num_replicas=self.num_replicas,
            variable_averages=averages,
            variables_to_average=onu_model.averaged_variables() if averages else None)
        return self._optimizer

    def hooks(self):
        """Returns the session hooks that initialise and drive the synchronous updates."""
        if self._optimizer is None:
            raise ValueError('SyncReplicas.hooks() needs wrap() first')
        if self._task.is_chief:
            start = _SyncChiefHook(self._optimizer)
        else:
            start = self._optimizer.make_session_run_hook(is_chief=False)
        return [start, _ReleaseTokensAtEnd(self._optimizer, RELEASE_TOKENS_PER_WORKER * self.num_replicas)]


class _SyncChiefHook(tf.compat.v1.train.SessionRunHook):
    """SyncReplicasOptimizer's own chief hook, except that its thread applying the averaged gradients, cancelled at
    the end while waiting for gradients that will not come, stops quietly instead of with a traceback."""

    def __init__(self, optimizer):
        runner = optimizer.get_chief_queue_runner()
        self._runner = tf.compat.v1.train.QueueRunner(
            runner.queue, runner.enqueue_ops,
            queue_closed_exception_types=(tf.errors.OutOfRangeError, tf.errors.CancelledError))
        self._uninitialized = optimizer.ready_for_local_init_op  # the global variables not ready
        self._init_op = optimizer.chief_init_op
        self._init_tokens_op = optimizer.get_init_tokens_op()

    def after_create_session(self, session, coord):
        uninitialized = session.run(self._uninitialized)
        if uninitialized.size:
            raise RuntimeError(f'the chief\'s session left variables uninitialised: '
                               f'{", ".join(name.decode() for name in uninitialized[:5])}')
        session.run(self._init_op)
        session.run(self._init_tokens_op)
        self._runner.create_threads(session, coord=coord, daemon=True, start=True)


class _ReleaseTokensAtEnd(tf.compat.v1.train.SessionRunHook):
    """Hands out spare step tokens when this worker stops, chief or not: the others, one gradient short for good,
    may already wait for the token of a step that will never be applied."""

    def __init__(self, optimizer, num_tokens):
        self._release_op = optimizer.get_init_tokens_op(num_tokens)

    def end(self, session):
        try:
            session.run(self._release_op)
        except tf.errors.CancelledError:  # the chief has stopped and closed the token queue: no one is waiting
            pass
