"""Tests of onu_training: the hooks that measure the input wait and profile steps, and the checkpoint saver's
period, in real monitored sessions; the data made ready on demand; the examples a step trains on (the learning
rate's epoch)."""
import glob
import io
import os
import shlex
import signal
import sys
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from onu_lib import onu_checkpoint
from onu_lib import onu_cluster
from onu_lib import onu_training


def _train(tmp_path, pipeline_sleep_secs, steps=12, log_frequency=3, more_hooks=lambda global_step: []):
    """Runs steps of a small matmul model fed by a pipeline that sleeps per batch; returns its LoggerHook.

    more_hooks(global_step) -> further hooks of the session.
    """
    with tf.Graph().as_default():
        def slow(value):
            time.sleep(pipeline_sleep_secs)  # stands for decoding: the batch is late by this much
            return value
        dataset = tf.data.Dataset.range(1000).map(lambda index: tf.cast(index, tf.float32))
        if pipeline_sleep_secs:
            dataset = dataset.map(lambda value: tf.numpy_function(slow, [value], tf.float32))
        # Fed: plain TensorFlow ops with a deep buffer, ahead however busy the machine (no Python to wait for).
        dataset = dataset.batch(1).prefetch(8)
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.get_variable('weights', [1200, 1200])  # a step of tens of ms: time to prefetch
        work = tf.reduce_sum(tf.linalg.matmul(weights, weights) * tf.reduce_mean(batch))
        loss = work * 0.0 + tf.reduce_mean(batch)
        with tf.control_dependencies([work]):  # as apply_gradients: the step counts up once the work is done
            train_op = global_step.assign_add(1)
        logger = onu_training.LoggerHook(loss, global_step, 1, log_frequency, str(tmp_path))
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[logger, *more_hooks(global_step)], checkpoint_dir=None,
                                                         save_summaries_steps=None) as session:
            for _ in range(steps):
                session.run(train_op)
    return logger


def test_the_logged_wait_is_the_share_of_the_step_in_the_iterator(tmp_path, capsys):
    starved = _train(tmp_path / 'starved', pipeline_sleep_secs=0.25)
    fed = _train(tmp_path / 'fed', pipeline_sleep_secs=0.0)
    for logger in (starved, fed):  # about one traced step per log line (3 steps), the first at step 3
        assert 3 <= len(logger.wait_fractions) <= 6
        assert all(0.0 <= value <= 1.0 for value in logger.wait_fractions)
    assert min(starved.wait_fractions) > 0.6  # the 250 ms sleep, against a step of tens of ms
    assert np.median(fed.wait_fractions) < 0.3  # prefetched: only the first steps may wait
    lines = [line for line in capsys.readouterr().out.splitlines() if ', loss = ' in line]
    assert len(lines) >= 4 and all(line.endswith('% waiting for input)') for line in lines)  # no pipeline's work


def _profiles(logdir):
    """The xplane files a profiler wrote into logdir."""
    return glob.glob(os.path.join(str(logdir), 'plugins', 'profile', '*', '*.xplane.pb'))


def test_the_profile_covers_the_steps_asked_and_only_those(tmp_path, capsys):
    _train(tmp_path / 'run', 0.0, steps=8,
           more_hooks=lambda global_step: [onu_training.ProfileHook(str(tmp_path / 'a'), 3, 5, global_step)])
    assert len(_profiles(tmp_path / 'a')) == 1 and os.path.getsize(_profiles(tmp_path / 'a')[0]) > 0
    assert f'Profiled steps 3-5 into {tmp_path / "a"}' in capsys.readouterr().out
    # A run that ends inside the range stops the profiler with it; one past the range profiles nothing.
    _train(tmp_path / 'run', 0.0, steps=4,
           more_hooks=lambda global_step: [onu_training.ProfileHook(str(tmp_path / 'b'), 3, 50, global_step)])
    assert len(_profiles(tmp_path / 'b')) == 1 and 'Profiled steps 3-4' in capsys.readouterr().out
    _train(tmp_path / 'run', 0.0, steps=4,
           more_hooks=lambda global_step: [onu_training.ProfileHook(str(tmp_path / 'c'), 6, 9, global_step)])
    assert _profiles(tmp_path / 'c') == [] and 'Profiled' not in capsys.readouterr().out


@pytest.mark.parametrize('save_checkpoint_secs, save_checkpoint_steps, saved_steps', [
    (0, None, [0, 5]),      # no saves by time: the first and the last only
    (600, None, [0, 5]),
    (600, 2, [0, 2, 4, 5]),  # steps replace seconds
])
def test_the_checkpoint_saver_saves_by_time_or_steps_and_never_by_time_at_0(tmp_path, save_checkpoint_secs,
                                                                           save_checkpoint_steps, saved_steps):
    save_secs, save_steps = onu_training.checkpoint_period(save_checkpoint_secs, save_checkpoint_steps)
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = global_step.assign_add(1)
        saver = tf.compat.v1.train.CheckpointSaverHook(str(tmp_path), save_secs=save_secs, save_steps=save_steps)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[saver], checkpoint_dir=None,
                                                         save_summaries_steps=None) as session:
            for _ in range(5):
                session.run(train_op)
    assert [onu_checkpoint.listed_step(path) for path in onu_checkpoint.list_checkpoints(str(tmp_path))] == saved_steps


class _CtrlC(tf.compat.v1.train.SessionRunHook):
    """Presses Ctrl-C (SIGINT to this process) `times` times when the at_step-th step of the run ends."""

    def __init__(self, at_step, times):
        self._at_step, self._times = at_step, times
        self._steps_ended = 0  # counted here: a global step fetched beside its own update may be read before or after

    def after_run(self, run_context, run_values):
        self._steps_ended += 1
        if self._steps_ended == self._at_step:
            for _ in range(self._times):
                signal.raise_signal(signal.SIGINT)


def _train_until_stopped(checkpoint_dir, ctrl_c_at_step, times):
    """Trains a one-variable model until it stops (at most 20 steps), saving at its start and end, with Ctrl-C
    pressed at ctrl_c_at_step; returns (steps run, the StopOnSignalHook)."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = global_step.assign_add(1)
        stop = onu_training.StopOnSignalHook()
        hooks = [_CtrlC(ctrl_c_at_step, times), stop,
                 tf.compat.v1.train.CheckpointSaverHook(checkpoint_dir, save_secs=600)]
        steps = 0
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks, checkpoint_dir=None,
                                                         save_summaries_steps=None) as session:
            while not session.should_stop() and steps < 20:
                session.run(train_op)
                steps += 1
    return steps, stop


def test_ctrl_c_stops_after_the_step_and_a_second_one_stops_at_once(tmp_path, capsys):
    handler, sigterm_handler = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        steps, stop = _train_until_stopped(str(tmp_path / 'once'), ctrl_c_at_step=3, times=1)
    except KeyboardInterrupt:  # caught, or it would end the whole test session
        pytest.fail('one Ctrl-C stopped training at once, without ending its step and saving it')
    assert (steps, stop.received) == (3, signal.SIGINT)  # the step ran to its end, and no further one
    assert [onu_checkpoint.listed_step(path) for path in onu_checkpoint.list_checkpoints(str(tmp_path / 'once'))] == [
        0, 3]  # saved at the step it stopped at
    assert 'SIGINT received: stopping after this step.' in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) is handler  # put back once training ended
    try:
        with pytest.raises(KeyboardInterrupt):  # pressed twice: Python's own Ctrl-C, at once
            _train_until_stopped(str(tmp_path / 'twice'), ctrl_c_at_step=3, times=2)
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        signal.signal(signal.SIGTERM, sigterm_handler)  # the hook's, left as a process ending at once would leave it


class _SignalledInsideAWrite(io.RawIOBase):
    """A standard output whose first write is interrupted by a SIGTERM to this process: as a signal can land while
    the main thread prints a log line, inside the output's buffer."""

    def __init__(self):
        super().__init__()
        self.written = b''
        self.signalled = False

    def writable(self):
        return True

    def write(self, data):
        if not self.signalled:
            self.signalled = True
            os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler here, the buffer still held by this write
        self.written += bytes(data)
        return len(data)


def test_a_signal_that_lands_inside_a_print_stops_training_and_is_said_once_the_step_ends(monkeypatch):
    output = _SignalledInsideAWrite()
    monkeypatch.setattr(sys, 'stdout', io.TextIOWrapper(io.BufferedWriter(output), write_through=True))
    sigterm_handler = signal.getsignal(signal.SIGTERM)
    stop = onu_training.StopOnSignalHook()
    stop.begin()
    try:
        print('step 1, loss = 0.5', flush=True)  # before the fix: RuntimeError, reentrant call, and the run died
        run_context = tf.compat.v1.train.SessionRunContext(original_args=None, session=None)
        stop.after_run(run_context, None)
    finally:
        stop.restore()
    assert stop.received == signal.SIGTERM and run_context.stop_requested
    assert output.written.decode() == 'step 1, loss = 0.5\nSIGTERM received: stopping after this step.\n'
    assert signal.getsignal(signal.SIGTERM) is sigterm_handler


def test_the_conversion_line_names_a_command_the_shell_takes_back(make_tiny_dataset, capsys):
    data_dir = make_tiny_dataset('photos with spaces', train_per_class=2, val_per_class=1)
    data, data_format = onu_training.prepare_data(data_dir, None, 10.0, None)
    assert data_format == 'encoded' and data.has_records('encoded')  # converted on demand, described again
    line = next(line for line in capsys.readouterr().out.splitlines() if 'converting them now' in line)
    command = line[line.index('(') + 1:line.rindex(')')]
    assert shlex.split(command) == ['python', 'convert_to_tfrecord.py', f'--data_dir={data_dir}', '--format=encoded']


def worker_role(workers, sync_replicas):
    """The Role of worker 1 of a cluster of 1 ps and that many workers (no server started); one machine's for 1."""
    task = onu_cluster.resolve_task(['ps:1'], [f'w{index}:1' for index in range(workers)], 'worker', 1) \
        if workers > 1 else None
    return onu_cluster.Role(None, task, replicas=onu_cluster.SyncReplicas(task) if sync_replicas else None)


@pytest.mark.parametrize('workers, sync_replicas, towers, steps_per_epoch', [
    (1, False, 1, 24),  # one machine: a step is a batch of 2 of the 48 examples
    (3, False, 1, 24),  # asynchronous workers: each step is one worker's batch
    (3, True, 1, 8),    # synchronous: each step averages the 3 workers' batches
    (3, True, 2, 4),    # ... of 2 towers each
])
def test_the_learning_rate_decays_per_epoch_of_the_examples_every_step_trains_on(workers, sync_replicas, towers,
                                                                                 steps_per_epoch):
    options = types.SimpleNamespace(batch_size=2, learning_rate=0.1, learning_rate_schedule='exponential',
                                    num_epochs_per_decay=1.0, learning_rate_decay_factor=0.5)
    run_config = types.SimpleNamespace(model='small', num_examples_per_epoch=48)
    examples_per_step = onu_training.examples_per_step(options, worker_role(workers, sync_replicas), towers)
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = onu_training.learning_rate(options, step, run_config, examples_per_step)
        with tf.compat.v1.Session() as session:
            rates = [session.run(rate, {step: value}) for value in (steps_per_epoch - 1, steps_per_epoch,
                                                                     2 * steps_per_epoch)]
    np.testing.assert_allclose(rates, [0.1, 0.05, 0.025], rtol=1e-6)
    assert examples_per_step * steps_per_epoch == 48  # what examples/sec counts
