"""Trains an ONU photo classifier (the CIFAR-10 tutorial's cifar10_train.py role).

    python onu_train.py                  # built-in sample data, encoded records, resumes if it can
    python onu_train.py --data_dir=DATA --data_format=raw --model=inception_resnet_v2

Training never deletes --train_dir: it resumes from the latest checkpoint there. The run's
configuration is saved as train_dir/run_config.json so onu_eval.py and onu_export.py rebuild the
same model without repeating flags.

Across machines, every machine runs this script as one task of a cluster (TensorFlow's
between-graph replication, see onu_cluster.py), described by TF_CONFIG or the cluster flags:

    CLUSTER="--ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --model=small"
    python onu_train.py $CLUSTER --job_name=ps --task_index=0       # on h0: holds the variables
    python onu_train.py $CLUSTER --job_name=worker --task_index=0   # on h1: the chief
    python onu_train.py $CLUSTER --job_name=worker --task_index=1   # on h2
    python run_local_cluster.py --num_workers=2    # or all of them on this machine, to try it

Updates are asynchronous; --sync_replicas averages one batch of every worker per step.
"""
import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
from datetime import datetime

from absl import app
from absl import flags
import tensorflow as tf

import convert_to_tfrecord
import make_sample_data
import onu_checkpoint
import onu_dataset
import onu_export
import onu_flags
import onu_input
import onu_cluster
import onu_model

FLAGS = flags.FLAGS

flags.DEFINE_string('train_dir', onu_flags.DEFAULT_TRAIN_DIR,
                    'Where checkpoints, event files and run_config.json go; training resumes from it.')
flags.DEFINE_integer('max_steps', 2000, 'Global step at which training stops (counted across restarts).',
                     lower_bound=1)
flags.DEFINE_integer('log_frequency', 10, 'Print loss and speed every this many steps.', lower_bound=1)
flags.DEFINE_integer('save_checkpoint_secs', 120, 'Save a checkpoint every this many seconds.')
flags.DEFINE_integer('save_checkpoint_steps', None,
                     'Save a checkpoint every this many steps (replaces --save_checkpoint_secs).')
flags.DEFINE_integer('keep_checkpoint_max', 5, 'How many recent checkpoints to keep.', lower_bound=1)
flags.DEFINE_integer('export_every_n_epochs', 0,
                     'Every this many epochs, export a SavedModel to <train_dir>/export/<step>/ from the '
                     'first checkpoint at or after the boundary (0: never; see onu_export.py).',
                     lower_bound=0)
flags.DEFINE_integer('save_summaries_steps', 100, 'Write TensorBoard summaries every this many steps.')
flags.DEFINE_boolean('histograms', False, 'Also write weight and activation histograms.')
flags.DEFINE_integer('seed', None, 'Seed for shuffling, augmentation and initialisation.')
flags.DEFINE_string('checkpoint_path', None,
                    'Checkpoint (or folder) to fine-tune from when train_dir has no checkpoint yet, '
                    'e.g. inception_resnet_v2_2016_08_30.ckpt.')
flags.DEFINE_list('checkpoint_exclude_scopes', [],
                  'Variable scopes not restored from --checkpoint_path, e.g. '
                  'InceptionResnetV2/Logits,InceptionResnetV2/AuxLogits.')
flags.DEFINE_list('trainable_scopes', [], 'Train only variables in these scopes (default: all).')
flags.DEFINE_enum('optimizer', 'momentum', onu_model.OPTIMIZER_NAMES, 'Optimizer.')
flags.DEFINE_float('learning_rate', None, 'Initial learning rate; default: the model\'s own '
                   f'({onu_model.DEFAULT_LEARNING_RATE}).')
flags.DEFINE_enum('learning_rate_schedule', 'exponential', onu_model.LR_SCHEDULES,
                  'fixed, or exponential decay every --num_epochs_per_decay epochs.')
flags.DEFINE_float('num_epochs_per_decay', 2.0, 'Epochs between learning-rate decays.')
flags.DEFINE_float('learning_rate_decay_factor', 0.94, 'Learning-rate decay factor.')
flags.DEFINE_float('moving_average_decay', onu_model.DEFAULT_MOVING_AVERAGE_DECAY,
                   'Decay of the moving averages of the weights that eval restores (0: none).')
flags.DEFINE_float('weight_decay', None, 'L2 weight decay; default: the model\'s own.')
flags.DEFINE_float('label_smoothing', 0.0, 'Label smoothing of the cross-entropy.')
flags.DEFINE_list('augmentations', [f.name for f in dataclasses.fields(onu_input.AugmentOptions)],
                  'Training augmentations to apply (empty: none).')
flags.register_validator(
    'augmentations',
    lambda names: set(names) <= {f.name for f in dataclasses.fields(onu_input.AugmentOptions)},
    message='--augmentations takes a comma-separated subset of '
            + ','.join(f.name for f in dataclasses.fields(onu_input.AugmentOptions)))
flags.DEFINE_enum('augment_on', 'input', onu_input.AUGMENT_PLACEMENTS,
                  'Where training augmentation runs: in the input pipeline on the CPU (input), or in '
                  'the training graph on the model\'s device, each GPU tower its own share (model); the '
                  'pipeline then only reads, decodes and resizes. Same augmentations either way.')
flags.DEFINE_boolean('reduced_decode', False,
                     'Decode training JPEGs at a reduced DCT scale (1/2, 1/4 or 1/8, as --image_size '
                     'allows): less CPU per photo, but smoother pixels than evaluation\'s exact decode; on '
                     'the sample data at 64x64 it cost 5 points of precision (README).')
onu_flags.define_precision_flag(
    'auto', 'float32; mixed: bfloat16 compute through oneDNN on the CPU, float16 with dynamic loss '
    'scaling on a GPU (variables and checkpoints stay float32); auto: mixed where the hardware has a '
    'fast path (a CPU with AMX or AVX512_BF16, a GPU of compute capability 7.0+), else float32.')
flags.DEFINE_boolean('xla', False, 'Compile the training graph with XLA auto-clustering.')
flags.DEFINE_list('ps_hosts', [], 'Multi-machine training: host:port of each parameter server '
                  '(or set TF_CONFIG).')
flags.DEFINE_list('worker_hosts', [], 'Multi-machine training: host:port of each worker; worker 0 is '
                  'the chief, which alone writes checkpoints and summaries.')
flags.DEFINE_enum('job_name', None, onu_cluster.JOB_NAMES, 'Multi-machine training: this task\'s job.')
flags.DEFINE_integer('task_index', 0, 'Multi-machine training: this task\'s index within its job.',
                     lower_bound=0)
flags.DEFINE_boolean('sync_replicas', False,
                     'Multi-machine training: each step averages one batch from every worker '
                     '(SyncReplicasOptimizer) instead of asynchronous updates.')


class NanLossError(Exception):
    """The loss became NaN or infinite; training stopped before saving those weights."""


def default_model_name():
    """Returns inception_resnet_v2 when TensorFlow sees a GPU, else small."""
    return 'inception_resnet_v2' if tf.config.list_physical_devices('GPU') else 'small'


def prepare_data(data_dir, data_format):
    """Makes sure data_dir holds what data_format reads: sample data and records are made on demand."""
    if not os.path.isdir(os.path.join(data_dir, 'train')):
        if os.path.abspath(data_dir) != os.path.abspath(onu_flags.DEFAULT_DATA_DIR):
            raise onu_dataset.DataError(
                f'{data_dir}: no train/ folder; put photos in {data_dir}/train/<class>/ and '
                f'{data_dir}/val/<class>/, or run python make_sample_data.py --output_dir={data_dir}')
        print(f'{data_dir} has no data: generating the built-in sample dataset there.', flush=True)
        make_sample_data.generate_dataset(data_dir)
    if data_format != 'images' and not onu_input.has_records(data_dir, data_format):
        print(f'{data_dir} has no {data_format} records: converting them now '
              f'(python convert_to_tfrecord.py --data_dir={data_dir} --format={data_format}).', flush=True)
        convert_to_tfrecord.convert(data_dir, formats=(data_format,))


def build_run_config(model_name, image_size, info, precision):
    """Returns the run configuration that eval and export read back."""
    return {
        'model': model_name,
        'precision': precision.name,
        'compute_dtype': precision.compute_dtype,
        'image_size': image_size,
        'data_dir': os.path.abspath(FLAGS.data_dir),
        'data_format': FLAGS.data_format,
        'class_names': list(info.class_names),
        'num_classes': len(info.class_names),
        'num_examples_per_epoch': info.num_examples,
        'max_steps': FLAGS.max_steps,
        'moving_average_decay': FLAGS.moving_average_decay,
        'flags': onu_flags.project_flag_values(),
    }


class LoggerHook(tf.compat.v1.train.SessionRunHook):
    """Prints loss and speed every log_frequency steps and writes examples/sec to TensorBoard."""

    def __init__(self, loss, global_step, examples_per_step, log_frequency, summary_dir=None):
        self._fetches = {'loss': loss, 'step': global_step}
        self._examples_per_step = examples_per_step
        self._log_frequency = log_frequency
        self._summary_dir = summary_dir

    def begin(self):
        self._last_step = None
        self._last_time = None

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        step = int(run_values.results['step']) + 1  # the fetched value was read before the update
        now = time.time()
        if self._last_step is None:
            self._last_step, self._last_time = step, now
            return
        steps = step - self._last_step
        if steps <= 0:  # on a cluster, the global step moved on without this run (synchronous)
            return
        if step % self._log_frequency and steps < self._log_frequency:
            return
        sec_per_batch = (now - self._last_time) / max(steps, 1)
        examples_per_sec = self._examples_per_step / sec_per_batch
        print(f'{datetime.now()}: step {step}, loss = {run_values.results["loss"]:.4f} '
              f'({examples_per_sec:.1f} examples/sec; {sec_per_batch:.3f} sec/batch)', flush=True)
        if self._summary_dir:
            summary = tf.compat.v1.Summary(
                value=[tf.compat.v1.Summary.Value(tag='examples/sec', simple_value=examples_per_sec)])
            tf.compat.v1.summary.FileWriterCache.get(self._summary_dir).add_summary(summary, step)
        self._last_step, self._last_time = step, now


class NanLossHook(tf.compat.v1.train.SessionRunHook):
    """Stops training with the step and learning rate when the loss is not finite.

    It raises instead of requesting a stop: a requested stop would save the broken weights.
    """

    def __init__(self, loss, global_step, learning_rate):
        self._fetches = {'loss': loss, 'step': global_step, 'lr': learning_rate}

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        loss = float(run_values.results['loss'])
        if not math.isfinite(loss):
            raise NanLossError(
                f'loss is {loss} at step {int(run_values.results["step"]) + 1} with learning rate '
                f'{float(run_values.results["lr"]):.3g}; the last finite checkpoint is kept; '
                f'lower --learning_rate and rerun to resume from it')


def augment_options():
    """Returns the onu_input.AugmentOptions selected by --augmentations."""
    names = set(FLAGS.augmentations)
    return onu_input.AugmentOptions(
        **{f.name: f.name in names for f in dataclasses.fields(onu_input.AugmentOptions)})


def add_training_summaries(logits, labels, end_points, total_loss, losses=None):
    """Adds training-batch precision, averaged losses and optional histograms; returns the averaging op.

    losses: the loss terms to average besides total_loss (default: the LOSSES collection).
    """
    precision = tf.reduce_mean(tf.cast(tf.nn.in_top_k(labels, logits, 1), tf.float32))
    tf.compat.v1.summary.scalar('training_batch/precision_at_1', precision)
    # Single-batch losses are noisy: also show their moving averages, as the CIFAR-10 tutorial did.
    if losses is None:
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
    losses = list(losses) + [total_loss]
    averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, name='avg')
    average_op = averages.apply(losses)
    for part in losses:
        tf.compat.v1.summary.scalar(f'losses_averaged/{part.op.name}', averages.average(part))
    if FLAGS.histograms:
        for name, activation in end_points.items():
            tf.compat.v1.summary.histogram(f'activations/{name}', activation)
        for var in tf.compat.v1.trainable_variables():
            tf.compat.v1.summary.histogram(var.op.name, var)
    return average_op


def prepare_run(precision, save_config=True):
    """Resolves model and data, saves the run configuration (if save_config); returns it."""
    model_name = FLAGS.model or default_model_name()
    if not FLAGS.model:
        print(f'--model not given: using {model_name} '
              f'({"a GPU is visible" if model_name != "small" else "no GPU visible"}).', flush=True)
    image_size = FLAGS.image_size or onu_model.DEFAULT_IMAGE_SIZE[model_name]
    prepare_data(FLAGS.data_dir, FLAGS.data_format)
    info = onu_input.dataset_info(FLAGS.data_dir, FLAGS.data_format, 'train')
    config = build_run_config(model_name, image_size, info, precision)
    onu_checkpoint.check_resumable(FLAGS.train_dir, config, onu_flags.load_run_config(FLAGS.train_dir))
    if save_config:
        onu_flags.save_run_config(FLAGS.train_dir, config)
    return config


def build_training_graph(config, examples_per_step=None, replicas=None):
    """Builds input, model, loss and train op; returns (train_op, total_loss, global_step, learning_rate).

    examples_per_step: what one global step trains on, for the learning-rate schedule (default
    --batch_size); replicas: an onu_cluster.SyncReplicas when workers update synchronously.
    """
    if FLAGS.seed is not None:
        tf.compat.v1.set_random_seed(FLAGS.seed)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    images, labels = onu_input.distorted_inputs(
        FLAGS.data_dir, FLAGS.data_format, FLAGS.batch_size, config['image_size'],
        augment=augment_options(), seed=FLAGS.seed, augment_on=FLAGS.augment_on,
        reduced_decode=FLAGS.reduced_decode)
    logits, end_points = onu_model.inference(images, config['num_classes'], config['model'],
                                             is_training=True, weight_decay=FLAGS.weight_decay)
    total_loss = onu_model.loss(logits, labels, end_points, FLAGS.label_smoothing)
    average_op = add_training_summaries(logits, labels, end_points, total_loss)
    optimizer = make_optimizer(config, global_step, examples_per_step or FLAGS.batch_size)
    grads_and_vars = optimizer.compute_gradients(
        total_loss, var_list=onu_model.variables_to_train(FLAGS.trainable_scopes))
    step_op = apply_gradients(optimizer, grads_and_vars, global_step, replicas=replicas)
    train_op = tf.group(step_op, average_op)
    return train_op, total_loss, global_step, onu_model.get_learning_rate()


def make_optimizer(config, global_step, examples_per_step):
    """Returns the --optimizer with its learning-rate schedule, counting examples_per_step per step."""
    rate = onu_model.make_learning_rate(
        global_step, initial_learning_rate(config), FLAGS.learning_rate_schedule,
        config['num_examples_per_epoch'], examples_per_step, FLAGS.num_epochs_per_decay,
        FLAGS.learning_rate_decay_factor)
    return onu_model.loss_scaled(onu_model.make_optimizer(FLAGS.optimizer, rate), config['compute_dtype'])


def apply_gradients(optimizer, grads_and_vars, global_step, update_ops=None, replicas=None):
    """Returns the op applying grads_and_vars, then the moving averages (synchronised by replicas)."""
    if replicas:
        return replicas.apply_gradients(optimizer, grads_and_vars, global_step,
                                        FLAGS.moving_average_decay, update_ops)
    return onu_model.apply_gradients(optimizer, grads_and_vars, global_step,
                                     FLAGS.moving_average_decay, update_ops)


def initial_learning_rate(config):
    """Returns --learning_rate, or the model's default."""
    return FLAGS.learning_rate or onu_model.DEFAULT_LEARNING_RATE[config['model']]


def make_scaffold(train_dir, resume_from):
    """Returns the Scaffold: a Saver keeping --keep_checkpoint_max, and the fine-tune restore if due."""
    init_fn = None
    if FLAGS.checkpoint_path and not resume_from:
        saver, path = onu_checkpoint.warm_start_saver(FLAGS.checkpoint_path, FLAGS.checkpoint_exclude_scopes)
        init_fn = lambda scaffold, sess: saver.restore(sess, path)  # noqa: E731
    elif FLAGS.checkpoint_path:
        print(f'{train_dir} already has a checkpoint: resuming from it, not from '
              f'--checkpoint_path.', flush=True)
    return tf.compat.v1.train.Scaffold(init_fn=init_fn,
                                       saver=onu_checkpoint.training_saver(FLAGS.keep_checkpoint_max))


class StopSignals:
    """Within it, SIGTERM and SIGINT ask training to stop after the current step; a second one stops at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        return self

    def _handle(self, number, frame):
        if self.received is not None:  # asked twice: stop now, as without this handler
            signal.signal(number, self._previous[number])
            signal.raise_signal(number)
            return
        self.received = number
        print(f'{signal.Signals(number).name} received: stopping after this step.', flush=True)

    def __exit__(self, *exc_info):
        for number, handler in self._previous.items():
            signal.signal(number, handler)


def run_training(train_op, total_loss, global_step, learning_rate, examples_per_step, config,
                 master='', is_chief=True, extra_hooks=(), session_conf=None, checkpoint_listeners=(),
                 stop_grace_period_secs=120):
    """Runs train_op under a MonitoredTrainingSession until --max_steps, resuming from train_dir.

    Returns (how many steps this process ran, the signal that stopped it or None). In a cluster
    the steps are this process's share of the global steps. SIGTERM or SIGINT stops training after
    the current step; the chief then saves a checkpoint at that step.

    checkpoint_listeners: CheckpointSaverListeners called around each checkpoint the chief saves
    (--export_every_n_epochs adds onu_export's).
    """
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=FLAGS.max_steps),
             NanLossHook(total_loss, global_step, learning_rate),
             LoggerHook(total_loss, global_step, examples_per_step, FLAGS.log_frequency,
                        FLAGS.train_dir if is_chief else None)] + list(extra_hooks)
    save_secs = None if FLAGS.save_checkpoint_steps else FLAGS.save_checkpoint_secs
    save_steps = FLAGS.save_checkpoint_steps
    if is_chief:  # damaged checkpoints set aside, the state file made relative to this folder
        resume_from = onu_checkpoint.prepare_resume(FLAGS.train_dir)
    else:
        resume_from = (onu_checkpoint.list_checkpoints(FLAGS.train_dir) or [None])[-1]
    scaffold = make_scaffold(FLAGS.train_dir, resume_from)
    listeners = list(checkpoint_listeners)
    if FLAGS.export_every_n_epochs:
        listeners.append(onu_export.PeriodicExportListener(
            FLAGS.train_dir, config, onu_export.default_export_dir(FLAGS.train_dir),
            FLAGS.export_every_n_epochs, examples_per_step))
    # The chief saves through its own CheckpointSaverHook, which also saves when the session closes,
    # so that a stop by signal keeps the current step. It takes the listeners, which
    # MonitoredTrainingSession cannot pass on; it goes first among the hooks, where that session's own would.
    if is_chief:
        hooks.insert(0, tf.compat.v1.train.CheckpointSaverHook(
            FLAGS.train_dir, save_secs=save_secs if save_secs or save_steps else 10 ** 9,
            save_steps=save_steps, scaffold=scaffold, listeners=listeners))
    with onu_input.damaged_records_as_data_error(FLAGS.data_dir, FLAGS.data_format, 'train'), \
            StopSignals() as stop:
        with tf.compat.v1.train.MonitoredTrainingSession(
                master=master, is_chief=is_chief, checkpoint_dir=FLAGS.train_dir,
                scaffold=scaffold, hooks=hooks, save_checkpoint_secs=None, save_checkpoint_steps=None,
                save_summaries_steps=FLAGS.save_summaries_steps, log_step_count_steps=None,
                config=session_conf or onu_flags.session_config(),
                stop_grace_period_secs=stop_grace_period_secs) as sess:
            steps_run = 0
            while not sess.should_stop() and stop.received is None:
                sess.run(train_op)
                steps_run += 1
    if stop.received is None:
        print(f'Training stopped at step {FLAGS.max_steps}; checkpoints in {FLAGS.train_dir}', flush=True)
    elif is_chief:
        saved = onu_checkpoint.list_checkpoints(FLAGS.train_dir)[-1]
        print(f'Stopped by {signal.Signals(stop.received).name} at step {onu_checkpoint.listed_step(saved)}: '
              f'checkpoint saved as {saved}; run the same command again to resume from it.', flush=True)
    else:
        print(f'Stopped by {signal.Signals(stop.received).name}: this worker stops; the chief keeps '
              f'the checkpoints.', flush=True)
    return steps_run, stop.received


def cluster_task():
    """Returns this process's onu_cluster.ClusterTask (cluster flags or TF_CONFIG), None on one machine."""
    task = onu_cluster.resolve_task(FLAGS.ps_hosts, FLAGS.worker_hosts, FLAGS.job_name,
                                    FLAGS.task_index, os.environ.get('TF_CONFIG'))
    if task is None and FLAGS.sync_replicas:
        raise onu_cluster.ClusterConfigError(
            '--sync_replicas needs a cluster (--ps_hosts and --worker_hosts, or TF_CONFIG); on one '
            'machine onu_multi_gpu_train.py trains synchronously on several GPUs')
    if task and task.job_name == onu_cluster.WORKER_JOB and not FLAGS.model:
        raise onu_cluster.ClusterConfigError(
            f'{task.name}: give --model on a cluster; every worker must build the same model and the '
            f'default depends on the machine\'s GPUs')
    return task


def train_model(build_graph, examples_per_batch):
    """Trains on this machine, or runs this process's task of a cluster (ps or worker).

    build_graph(config, examples_per_step, replicas) builds the training graph and returns
    (train_op, total_loss, global_step, learning_rate); examples_per_batch is what one step of one
    worker trains on. Returns the exit code: None, or 128 + the signal that stopped training.
    """
    task = cluster_task()
    precision = onu_flags.resolve_precision(FLAGS.precision)
    conf = onu_model.set_precision_options(onu_flags.session_config(), precision.compute_dtype, FLAGS.xla)
    server = None
    if task:
        conf = onu_cluster.session_config(conf, task)
        server = onu_cluster.start_server(task, conf)
        print(f'{task.name} of a cluster of {task.num_ps} ps and {task.num_workers} worker(s): '
              f'serving at {server.target}', flush=True)
        if task.job_name == onu_cluster.PS_JOB:
            onu_cluster.serve_until_workers_done(task, server.target, conf)
            return
    config = prepare_run(precision, save_config=not task or task.is_chief)
    print(f'Training {config["model"]} at {config["image_size"]}x{config["image_size"]} on '
          f'{config["num_examples_per_epoch"]} {FLAGS.data_format} examples of '
          f'{config["num_classes"]} classes ({", ".join(config["class_names"])}) into {FLAGS.train_dir}',
          flush=True)
    replicas = onu_cluster.SyncReplicas(task) if task and FLAGS.sync_replicas else None
    examples_per_step = examples_per_batch * (replicas.num_replicas if replicas else 1)
    with tf.Graph().as_default():
        with tf.compat.v1.device(onu_cluster.device_setter(task)) if task else contextlib.nullcontext():
            train_op, total_loss, global_step, learning_rate = build_graph(
                config, examples_per_step, replicas)
        if not task:
            _, stopped_by = run_training(train_op, total_loss, global_step, learning_rate, examples_per_step,
                                         config, session_conf=conf)
            return stopped_by and 128 + stopped_by
        if not task.is_chief:
            onu_cluster.wait_for_chief(server.target, conf)
        steps_run, stopped_by = run_training(
            train_op, total_loss, global_step, learning_rate, examples_per_step, config,
            master=server.target, is_chief=task.is_chief, session_conf=conf,
            extra_hooks=replicas.hooks() if replicas else (),
            stop_grace_period_secs=onu_cluster.STOP_GRACE_PERIOD_SECS)
    print(f'{task.name} ran {steps_run} training steps.', flush=True)
    onu_cluster.signal_worker_done(task, server.target, conf)
    return stopped_by and 128 + stopped_by


def train():
    """Trains the model described by the flags; returns the exit code (see train_model)."""
    return train_model(build_training_graph, FLAGS.batch_size)


def run_main(train_fn, argv):
    """Runs train_fn for a script's main: a user error or a NaN loss becomes one `error:` line."""
    def body():
        try:
            return train_fn()
        except NanLossError as e:
            print(f'error: {e}', file=sys.stderr)
            return 1
    return onu_flags.run_script(body, argv, user_errors=(onu_cluster.ClusterConfigError,))


def main(argv):
    return run_main(train, argv)


if __name__ == '__main__':
    app.run(main)
