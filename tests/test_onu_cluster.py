"""Tests of multi-machine training (onu_cluster.py, the cluster path of onu_train.py, run_local_cluster.py).

Loopback only: cluster descriptions in-process, an in-process cluster for the done queue and the
chief wait, then 1 ps + 2 workers as real processes on 127.0.0.1, asynchronous (through the
launcher) and synchronous (configured by TF_CONFIG). Every process has a timeout and is killed
in a finally block.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from conftest import ProcessOutput, run_script, start_script, session_events
from test_onu_eval import event_summaries
from test_onu_run_folder import _checkpoint
from test_onu_train import assert_logged_speeds_count, checkpoint_step

from onu_lib import onu_sample_data
from onu_lib import onu_cluster
from onu_lib import onu_launch
from onu_lib import onu_precision
from onu_lib import onu_run_config

PROCESS_TIMEOUT_SECS = 300
SYNC_RUN_TIMEOUT_SECS = 150  # the synchronous run takes 30 s alone, about twice that beside other tests
CLUSTER_FLAGS = ['--model=small', '--image_size=32', '--batch_size=2', '--log_frequency=1',
                 '--save_checkpoint_secs=600']
# The learning rate halves after each epoch of examples, written at every step.
SYNC_DECAY_FLAGS = ['--learning_rate=0.01', '--num_epochs_per_decay=1', '--learning_rate_decay_factor=0.5',
                    '--save_summaries_steps=1']


# ---------------------------------------------------------------------------------------------
# Cluster descriptions

def test_flags_describe_the_task_and_worker_0_is_the_chief():
    task = onu_cluster.resolve_task(['h0:2222'], ['h1:2222', 'h2:2222'], 'worker', 1)
    assert task == onu_cluster.ClusterTask(('h0:2222',), ('h1:2222', 'h2:2222'), 'worker', 1)
    assert (task.is_chief, task.num_workers, task.num_ps, task.device) == (False, 2, 1, '/job:worker/task:1')
    assert task.cluster_spec().as_dict() == {'ps': ['h0:2222'], 'worker': ['h1:2222', 'h2:2222']}
    assert onu_cluster.resolve_task(['h0:1'], ['h1:1'], 'worker', 0).is_chief
    assert not onu_cluster.resolve_task(['h0:1'], ['h1:1'], 'ps', 0).is_chief
    assert onu_cluster.resolve_task([], [], None, 0) is None  # one machine


def test_tf_config_describes_the_task_a_separate_chief_becomes_worker_0():
    cluster = {'ps': ['p:1'], 'worker': ['w0:1', 'w1:1']}
    as_json = lambda task: json.dumps({'cluster': cluster, 'task': task})  # noqa: E731
    task = onu_cluster.resolve_task([], [], None, 0, as_json({'type': 'worker', 'index': 1}))
    assert (task.worker_hosts, task.job_name, task.task_index) == (('w0:1', 'w1:1'), 'worker', 1)
    assert onu_cluster.resolve_task([], [], None, 0, as_json({'type': 'ps', 'index': 0})).job_name == 'ps'
    cluster['chief'] = ['c:1']
    chief = onu_cluster.resolve_task([], [], None, 0, as_json({'type': 'chief', 'index': 0}))
    assert chief.worker_hosts == ('c:1', 'w0:1', 'w1:1') and chief.is_chief
    worker = onu_cluster.resolve_task([], [], None, 0, as_json({'type': 'worker', 'index': 0}))
    assert worker.task_index == 1 and not worker.is_chief
    # The flags win over TF_CONFIG; a one-task TF_CONFIG (as some platforms set) means one machine.
    assert onu_cluster.resolve_task(['x:1'], ['y:1'], 'ps', 0, as_json({'type': 'chief'})).ps_hosts == ('x:1',)
    single = json.dumps({'cluster': {'chief': ['c:1']}, 'task': {'type': 'chief', 'index': 0}})
    assert onu_cluster.resolve_task([], [], None, 0, single) is None
    del cluster['chief']
    assert onu_cluster.resolve_task([], [], None, 0, as_json({'type': 'worker'})).task_index == 0  # no index: 0
    ipv6 = onu_cluster.resolve_task(['[::1]:2222'], ['[::1]:2223'], 'ps', 0)
    assert ipv6.ps_hosts == ('[::1]:2222',)


@pytest.mark.parametrize('args, message', [
    ((['p:1'], ['w:1'], 'worker', 1), 'task index 1 but the worker job has 1 task(s)'),
    (([], ['w:1'], 'worker', 0), 'no parameter servers'),
    ((['p:1'], [], 'ps', 0), 'no workers'),
    ((['p:1'], ['w:1'], None, 0), 'set --job_name=ps or --job_name=worker'),
    ((['p:1'], ['w'], 'worker', 0), "'w' is not host:port"),
    ((['p:1'], ['p:1'], 'worker', 0), 'p:1 listed twice'),
    ((['p:1'], ['w:1', 'w:2'], 'ps', 1), 'task index 1 but the ps job has 1 task(s)'),
    ((['p:1'], ['w:port'], 'worker', 0), "'w:port' is not host:port"),
    (([], ['w:1', 'w:2'], None, 0), 'set --job_name'),  # not one machine: the flags describe a cluster
    (([], [], None, 0, '{"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker"}}'), 'no parameter servers'),
    (([], [], None, 0, '{"cluster": '), 'TF_CONFIG is not a cluster description'),
    (([], [], None, 0, '{"cluster": {"ps": ["p:1"], "worker": ["w:1"]}, "task": {"type": "evaluator"}}'),
     'run onu_eval.py'),
])
def test_unusable_cluster_descriptions_are_one_line_errors(args, message):
    with pytest.raises(onu_cluster.ClusterConfigError) as error:
        onu_cluster.resolve_task(*args)
    assert message in str(error.value) and '\n' not in str(error.value)


def test_session_config_filters_devices_and_keeps_the_base_config():
    base = onu_precision.session_config()
    worker = onu_cluster.ClusterTask(('p:1', 'p:2'), ('w:1', 'w:2'), 'worker', 1)
    config = onu_cluster.task_session_config(base, worker)
    assert list(config.device_filters) == ['/job:ps', '/job:worker/task:1']
    assert config.allow_soft_placement and not base.device_filters
    ps = onu_cluster.ClusterTask(('p:1', 'p:2'), ('w:1', 'w:2'), 'ps', 1)
    assert list(onu_cluster.task_session_config(base, ps).device_filters) == ['/job:ps/task:1']


def test_training_refuses_sync_without_a_cluster_and_a_worker_without_model():
    with pytest.raises(onu_cluster.ClusterConfigError, match='--sync_replicas needs a cluster'):
        onu_cluster.resolve_task([], [], None, 0, None, sync_replicas=True)
    with pytest.raises(onu_cluster.ClusterConfigError, match='give --model on a cluster'):
        onu_cluster.resolve_task(['p:1'], ['w:1'], 'worker', 0, None, model_given=False)
    assert onu_cluster.resolve_task(['p:1'], ['w:1'], 'worker', 0, None, model_given=True).is_chief
    assert onu_cluster.resolve_task(['p:1'], ['w:1'], 'ps', 0, None, model_given=False).job_name == 'ps'
    assert onu_cluster.resolve_task([], [], None, 0, None) is None


# ---------------------------------------------------------------------------------------------
# The ps watch, in-process: a real port that answers or not, the process exit caught

def _listener():
    """A socket listening on a free loopback port: a ps that answers (close it: a lost ps)."""
    return socket.create_server(('127.0.0.1', 0))


def _watch(monkeypatch, hosts, wait_secs):
    """Starts a worker's PsWatch over ps hosts, probing every 20 ms; returns (watch, exits: the statuses it would
    have ended the process with, each with the seconds since the start)."""
    started, exits = time.monotonic(), []
    task = onu_cluster.ClusterTask(tuple(hosts), ('127.0.0.1:1',), 'worker', 0)
    watch = onu_cluster.PsWatch(task, wait_secs, None, probe_secs=0.02)

    def exit_process(status):
        exits.append((status, time.monotonic() - started))
        watch.stop()  # the watch ends, as the exit would end the process
    monkeypatch.setattr(onu_cluster.os, '_exit', exit_process)
    return watch.start(), exits


def test_a_worker_exits_only_when_a_ps_that_answered_stays_away_its_wait(monkeypatch, capsys):
    wait_secs = 2.0  # seconds, not tenths: a loaded machine's sleeps overrun by that much
    never = _listener()
    never_host = f'127.0.0.1:{never.getsockname()[1]}'
    never.close()  # a ps not started yet: waited for without end, as before the watch
    ps = _listener()
    host = f'127.0.0.1:{ps.getsockname()[1]}'
    watch, exits = _watch(monkeypatch, [never_host, host], wait_secs=wait_secs)
    try:
        time.sleep(0.2)
        assert watch.lost() == [onu_cluster.ps_name(0, never_host)]
        port = ps.getsockname()[1]
        ps.close()  # lost, then back within its wait: training goes on
        time.sleep(0.3)
        assert watch.lost() == [onu_cluster.ps_name(0, never_host), onu_cluster.ps_name(1, host)]
        ps = socket.create_server(('127.0.0.1', port))
        time.sleep(wait_secs)  # past the wait since the first loss: it came back, so it is not lost
        assert exits == []
        lost_at = time.monotonic()
        ps.close()  # lost for good
        deadline = time.monotonic() + 4 * wait_secs
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        watch.stop()
    assert [status for status, _ in exits] == [onu_cluster.LOST_PS_EXIT_STATUS], capsys.readouterr()
    assert wait_secs <= time.monotonic() - lost_at < 4 * wait_secs
    lost_line = rf'lost {re.escape(onu_cluster.ps_name(1, host))}: it did not answer for (\d+) s'
    waited = re.search(lost_line, capsys.readouterr().err)
    assert waited and wait_secs <= int(waited.group(1)) < 4 * wait_secs  # the time it waited, said in the line


def test_a_lost_ps_names_the_newest_checkpoint_to_resume_from(tmp_path):
    train_dir = str(tmp_path / 'train')
    assert onu_cluster.newest_checkpoint_line(train_dir) == f'no checkpoint in {train_dir} yet'
    for step in (2, 4, 6):
        newest = _checkpoint(train_dir, step)
    assert onu_cluster.newest_checkpoint_line(train_dir) == f'{newest} (step 6)'


def test_a_stopped_watch_lets_the_ps_go(monkeypatch):
    ps = _listener()
    watch, exits = _watch(monkeypatch, [f'127.0.0.1:{ps.getsockname()[1]}'], wait_secs=0.1)
    time.sleep(0.1)
    watch.stop()  # the worker is done: the ps stops once every worker said so
    ps.close()
    time.sleep(0.4)
    assert exits == []


def test_a_ps_answers_at_an_ipv4_or_ipv6_address():
    for family, host in ((socket.AF_INET, '127.0.0.1'), (socket.AF_INET6, '::1')):
        try:
            listener = socket.create_server((host, 0), family=family)
        except OSError:
            continue  # no IPv6 on this machine
        address = f'[{host}]' if ':' in host else host
        port = listener.getsockname()[1]
        assert onu_launch.answers(f'{address}:{port}')
        listener.close()
        assert not onu_launch.answers(f'{address}:{port}')


# ---------------------------------------------------------------------------------------------
# An in-process cluster: the done queue and the chief wait

def test_ps_stops_once_every_worker_signalled_and_a_worker_starts_soon_after_the_chief(capsys):
    hosts = [f'127.0.0.1:{port}' for port in onu_launch.free_ports('127.0.0.1', 3)]
    task = lambda job, index: onu_cluster.ClusterTask(hosts[:1], hosts[1:], job, index)  # noqa: E731
    config = lambda t: onu_cluster.task_session_config(tf.compat.v1.ConfigProto(), t)  # noqa: E731
    parameter_servers = [onu_cluster.start_server(task('ps', 0), config(task('ps', 0)))]
    workers = [onu_cluster.start_server(task('worker', index), config(task('worker', index)))
               for index in range(2)]

    # A worker waits for the chief by polling, not by TensorFlow's 30 s sleeps.
    with tf.Graph().as_default() as graph:
        with tf.compat.v1.device(onu_cluster.device_setter(task('worker', 1))):
            variable = tf.compat.v1.get_variable('shared', [3])
        chief_delay_secs = 1.5

        def chief_initialises():
            time.sleep(chief_delay_secs)
            with tf.compat.v1.Session(workers[0].target, graph=graph,
                                      config=config(task('worker', 0))) as sess:
                sess.run(variable.initializer)
        chief = threading.Thread(target=chief_initialises, daemon=True)
        started = time.time()
        chief.start()
        onu_cluster.wait_for_chief(workers[1].target, config(task('worker', 1)), timeout_secs=60)
        waited = time.time() - started
        chief.join(timeout=60)
    assert chief_delay_secs <= waited < 20, waited
    assert 'Waiting for the chief (worker 0) to initialise the variables...' in capsys.readouterr().out

    ps_task = task('ps', 0)
    serving = threading.Thread(target=onu_cluster.serve_until_workers_done,
                               args=(ps_task, parameter_servers[0].target, config(ps_task)), daemon=True)
    serving.start()
    onu_cluster.signal_worker_done(task('worker', 1), workers[1].target, config(task('worker', 1)))
    time.sleep(0.5)
    assert serving.is_alive()  # worker 0 has not finished yet
    onu_cluster.signal_worker_done(task('worker', 0), workers[0].target, config(task('worker', 0)))
    serving.join(timeout=60)
    assert not serving.is_alive()
    out = capsys.readouterr().out
    assert 'ps 0: worker 1 finished (1 of 2).' in out and 'ps 0: every worker finished; stopping.' in out


# ---------------------------------------------------------------------------------------------
# 1 ps + 2 workers as processes on 127.0.0.1

@pytest.fixture(scope='module')
def cluster_data_dir(tmp_path_factory):
    """16 tiny training photos (8 per class) and 4 validation ones."""
    data_dir = str(tmp_path_factory.mktemp('cluster') / 'data')
    onu_sample_data.generate_dataset(data_dir, 8, 2, (96, 72), seed=0, processes=1)
    return data_dir


def steps_run_by_workers(output):
    """Returns {worker index: training steps it ran} from the workers' closing lines."""
    return {int(index): int(steps) for index, steps in re.findall(r'worker (\d+) ran (\d+) training steps', output)}


def assert_all_exited(pids):
    """Asserts that none of the processes is running any more."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def wait_for_checkpoint(train_dir, min_step, timeout_secs=PROCESS_TIMEOUT_SECS):
    """Returns once train_dir lists a checkpoint of min_step or later."""
    deadline = time.monotonic() + timeout_secs
    while not any(int(step) >= min_step for step in re.findall(r'model\.ckpt-(\d+)\.index', ' '.join(
            os.listdir(train_dir) if os.path.isdir(train_dir) else []))):
        assert time.monotonic() < deadline, f'no checkpoint of step {min_step} or later in {train_dir}'
        time.sleep(0.2)


def test_launcher_trains_asynchronously_through_a_lost_ps_and_worker_and_the_chief_checkpoint_evaluates(
        cluster_data_dir, tmp_path):
    train_dir = str(tmp_path / 'train')
    launcher = start_script(
        'run_local_cluster.py', '--num_workers=2', *CLUSTER_FLAGS, f'--data_dir={cluster_data_dir}',
        f'--train_dir={train_dir}', '--max_steps=600', '--save_checkpoint_steps=20', '--timeout_secs=240',
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        watched = ProcessOutput(launcher)
        ps_pid = int(watched.wait_for(r'started ps 0 \(pid (\d+)\)', PROCESS_TIMEOUT_SECS).group(1))
        wait_for_checkpoint(train_dir, 20)
        os.kill(ps_pid, signal.SIGKILL)  # a lost machine: the launcher restarts the ps, the chief restores into it
        restored = watched.wait_for(r'worker 0: the cluster is back: restored \S+model\.ckpt-(\d+) \(step (\d+)\) into '
                                    r'the parameter servers; (\d+) step\(s\) lost', PROCESS_TIMEOUT_SECS)
        os.kill(int(re.findall(r'started worker 1 \(pid (\d+)\)', watched.text)[-1]), signal.SIGKILL)  # still training
        launcher.wait(timeout=PROCESS_TIMEOUT_SECS)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    output = watched.finish()
    assert launcher.returncode == 0, output[-4000:]
    assert output.count('ps 0 exited with status -9: restarting it (restart 1 of 2 within 10 minutes); the workers '
                        'reconnect and the chief restores the newest checkpoint into it.') == 1
    assert restored.group(1) == restored.group(2) and int(restored.group(2)) >= 20  # the newest checkpoint, by then
    assert output.count('the cluster is back: restored') == 1
    assert 'worker 1 exited with status -9: restarting it (restart 1 of 2 within 10 minutes)' in output
    assert 'Traceback' not in output
    steps = steps_run_by_workers(output)
    assert set(steps) == {0, 1} and steps[0] >= 1, steps  # the restarted worker 1 may find the run complete
    waiting = {int(worker) for worker in re.findall(r'\[worker (\d+)\] [^\n]*% waiting for input', output)}
    assert waiting == {0, 1}  # every worker logs its own input wait
    assert 'ps 0: every worker finished; stopping.' in output
    assert 'ps 0 stopped by itself (exit status 0).' in output
    assert_all_exited(int(pid) for pid in re.findall(r'started \w+ \d+ \(pid (\d+)\)', output))
    assert checkpoint_step(train_dir) >= 600
    # The chief alone writes summaries, the HParams session and the run configuration.
    assert len([name for name in os.listdir(train_dir)
                if name.startswith('events.out.tfevents') and '.hparams-' not in name]) == 1
    assert [kind for kind, _ in session_events(train_dir)] == ['start', 'end']
    run_config = onu_run_config.RunConfig.load(train_dir)
    assert (run_config.flags['job_name'], run_config.flags['task_index']) == ('worker', 0)

    eval_dir = str(tmp_path / 'eval')
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', '--run_once', f'--eval_dir={eval_dir}',
                           timeout=PROCESS_TIMEOUT_SECS)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f'step {checkpoint_step(train_dir)}, precision @ 1 = ' in evaluated.stdout

    # The finished run started again: no worker trains, each says so, and the parameter servers stop.
    final = checkpoint_step(train_dir)
    again = run_script('run_local_cluster.py', '--num_workers=2', *CLUSTER_FLAGS, f'--data_dir={cluster_data_dir}',
                       f'--train_dir={train_dir}', f'--max_steps={final}', '--timeout_secs=240',
                       timeout=PROCESS_TIMEOUT_SECS)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-2000:]
    assert again.stdout.count(f'{train_dir}: the run is complete at step {final} (--max_steps={final})') == 2
    assert steps_run_by_workers(again.stdout) == {0: 0, 1: 0} and 'ps 0 stopped by itself' in again.stdout
    assert checkpoint_step(train_dir) == final


def test_synchronous_workers_configured_by_tf_config_all_exit_promptly(cluster_data_dir, tmp_path):
    train_dir = str(tmp_path / 'train')
    ps_port, *worker_ports = onu_launch.free_ports('127.0.0.1', 3)
    cluster = {'ps': [f'127.0.0.1:{ps_port}'], 'worker': [f'127.0.0.1:{port}' for port in worker_ports]}
    tasks = [('ps', 0), ('worker', 0), ('worker', 1)]
    processes, logs = [], []
    try:
        for job, index in tasks:
            # PYTHONFAULTHANDLER: a task still running at the deadline prints its threads' stacks on SIGABRT.
            env = dict(os.environ, PYTHONFAULTHANDLER='1',
                       TF_CONFIG=json.dumps({'cluster': cluster, 'task': {'type': job, 'index': index}}))
            log = open(tmp_path / f'{job}{index}.log', 'w+')
            logs.append(log)
            processes.append(start_script(
                'onu_train.py', *CLUSTER_FLAGS, '--sync_replicas', f'--data_dir={cluster_data_dir}',
                f'--train_dir={train_dir}', '--max_steps=12', *SYNC_DECAY_FLAGS,
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        deadline = time.time() + SYNC_RUN_TIMEOUT_SECS
        exit_times = {}
        while len(exit_times) < len(processes) and time.time() < deadline:
            for task, process in zip(tasks, processes):
                if task not in exit_times and process.poll() is not None:
                    exit_times[task] = time.time()
            time.sleep(0.2)
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGABRT)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
    outputs = {}
    for task, log in zip(tasks, logs):
        log.seek(0)
        outputs[task] = re.sub(r'\nExtension modules: [^\n]*', '', log.read())  # faulthandler's long list
        log.close()
    report = '\n'.join(f'--- {job} {index} (exit {process.returncode}):\n{outputs[(job, index)][-4000:]}'
                       for (job, index), process in zip(tasks, processes))
    assert all(process.returncode == 0 for process in processes), report
    steps = steps_run_by_workers(outputs[('worker', 0)] + outputs[('worker', 1)])
    assert set(steps) == {0, 1} and min(steps.values()) >= 1, steps
    assert 'ps 0: every worker finished; stopping.' in outputs[('ps', 0)]
    # The chief's end-of-run wait is short (TensorFlow's default stop grace period is 120 s).
    last_checkpoint = os.path.getmtime(tf.train.latest_checkpoint(train_dir) + '.index')
    assert exit_times[('worker', 0)] - last_checkpoint < 60
    assert checkpoint_step(train_dir) >= 12
    # The moving averages of the weights were kept (by the chief, after each averaged update).
    reader = tf.train.load_checkpoint(train_dir)
    shadow = reader.get_tensor('SmallNet/Logits/biases/ExponentialMovingAverage')
    assert np.any(shadow != 0)  # the biases start at 0: the averages moved
    # A step trains on both workers' batches, 2 x 2 examples: the 16 photos' epoch is 4 steps, after each of which
    # the learning rate halves; examples/sec counts both batches; the HParams row says 4 examples of 2 replicas.
    # (A summary goes under the step it was computed at or up to two after: the other worker's update can land
    # between the computation and the summary's reading of the step, on a busy machine.)
    rates = {step: value for (tag, step), value in event_summaries(train_dir)[0].items() if tag == 'learning_rate'}
    computed = {step: {round(0.01 * 0.5 ** (at // 4), 6) for at in range(step - 2, step + 1)} for step in rates}
    assert max(rates) >= 9 and all(round(value, 6) in computed[step] for step, value in rates.items()), rates
    assert_logged_speeds_count(outputs[('worker', 0)] + outputs[('worker', 1)], 4)
    (kind, settings), _ = session_events(train_dir)
    assert (kind, settings['batch_size'], settings['replicas']) == ('start', '4', '2')


def test_workers_started_by_hand_stop_with_one_line_when_their_ps_is_lost_and_sigterm_ends_a_blocked_one(
        cluster_data_dir, tmp_path):
    train_dir = str(tmp_path / 'train')
    hosts = [f'127.0.0.1:{port}' for port in onu_launch.free_ports('127.0.0.1', 3)]
    cluster = [f'--ps_hosts={hosts[0]}', f'--worker_hosts={hosts[1]},{hosts[2]}']
    tasks = [('ps', 0), ('worker', 0), ('worker', 1)]
    processes, watched = [], []
    try:
        for job, index in tasks:
            processes.append(start_script(
                'onu_train.py', *CLUSTER_FLAGS, *cluster, f'--job_name={job}', f'--task_index={index}',
                f'--data_dir={cluster_data_dir}', f'--train_dir={train_dir}', '--max_steps=100000',
                # worker 1 would wait longer than its SIGTERM takes to end it
                '--save_checkpoint_steps=20', f'--ps_wait_secs={60 if index == 1 else 8}',
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
            watched.append(ProcessOutput(processes[-1]))
        wait_for_checkpoint(train_dir, 20)
        processes[0].kill()  # the ps's machine is lost, and nothing restarts it
        lost_at = time.monotonic()
        # Worker 1 notices, and its step (or new session) now waits for the ps inside gRPC: SIGTERM still ends it.
        watched[2].wait_for(rf'worker 1: ps 0 at {hosts[0]} does not answer: waiting up to 60 s for it to come back',
                            timeout_secs=30)
        processes[2].send_signal(signal.SIGTERM)
        termed_at = time.monotonic()
        processes[2].wait(timeout=30)
        term_secs = time.monotonic() - termed_at
        processes[1].wait(timeout=60)
        lost_secs = time.monotonic() - lost_at
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    chief, worker = watched[1].finish(), watched[2].finish()
    newest = tf.train.latest_checkpoint(train_dir)
    assert processes[2].returncode == 128 + signal.SIGTERM and term_secs < 15, (term_secs, worker[-3000:])
    assert (f'Stopped by SIGTERM: no step ended within 10 s of it (ps 0 at {hosts[0]} does not answer), so no '
            f'checkpoint could be written; resume from {newest} (step {newest.rsplit("-", 1)[1]}).') in worker
    assert processes[1].returncode == 1 and lost_secs < 8 + 30, (lost_secs, chief[-3000:])
    assert re.search(rf'error: worker 0 lost ps 0 at {hosts[0]}: it did not answer for (8|9|10|11) s \(--ps_wait_secs\); '
                     rf'restart it, then this worker, to resume from {re.escape(newest)} \(step \d+\)\.', chief), chief
    assert 'Traceback' not in chief + worker


def test_the_supervisor_restarts_lost_tasks_up_to_its_limit_within_the_window_and_a_lost_chief_stops_the_cluster(
        tmp_path, capsys, monkeypatch):
    sleeping = [sys.executable, '-c', 'import time; time.sleep(120)']
    commands = [('ps 0', sleeping), ('worker 0', sleeping), ('worker 1', sleeping)]
    # The supervisor's clock, moved on by hand: the restart window passes without waiting 10 minutes.
    ahead = {'secs': 0.0}
    monkeypatch.setattr(onu_launch, 'time', types.SimpleNamespace(
        time=time.time, sleep=time.sleep, monotonic=lambda: time.monotonic() + ahead['secs']))
    result = {}

    def restarted(launched, index, before):
        """Waits until the process at index is no longer before (the supervisor started it again)."""
        deadline = time.monotonic() + 30
        while launched.processes[index][1] is before:
            assert time.monotonic() < deadline and not result, (result, capsys.readouterr().out)
            time.sleep(0.1)

    def lose(launched, index):
        """Kills the task at index, then waits until the supervisor has started it again."""
        lost = launched.processes[index][1]
        lost.kill()
        restarted(launched, index, lost)

    launched = onu_launch.Launched(str(tmp_path))
    with launched.running(commands):
        supervisor = onu_launch.Supervisor(launched, commands, 'worker 0', max_restarts=1)
        waiting = threading.Thread(target=lambda: result.update(status=supervisor.wait_for_workers(time.time() + 60)))
        waiting.start()
        for index in (0, 2):  # the ps, then worker 1: each restarted once
            lose(launched, index)
        ahead['secs'] = onu_launch.RESTART_WINDOW_SECS + 1  # those losses are now older than the window
        lose(launched, 0)  # the ps again: restarted, its earlier loss no longer counts
        launched.processes[0][1].kill()  # and once more within the window: over the limit of 1
        waiting.join(timeout=30)
        pids = [process.pid for _, process in launched.processes]
    out = capsys.readouterr().out
    assert result == {'status': -9}, out
    assert out.count('ps 0 exited with status -9: restarting it (restart 1 of 1 within 10 minutes); the workers '
                     'reconnect') == 2, out
    assert 'worker 1 exited with status -9: restarting it (restart 1 of 1 within 10 minutes); it rejoins' in out
    assert 'ps 0 exited with status -9, lost 2 time(s) within 10 minutes (--max_restarts=1): stopping the cluster.' in out
    assert_all_exited(pids)

    launched = onu_launch.Launched(str(tmp_path))
    with launched.running(commands):
        launched.processes[1][1].kill()
        status = onu_launch.Supervisor(launched, commands, 'worker 0', max_restarts=1).wait_for_workers()
    assert status == -9
    assert 'worker 0 (the chief) failed with exit status -9: stopping the cluster' in capsys.readouterr().out
