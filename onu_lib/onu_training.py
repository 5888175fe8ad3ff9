"""What the training scripts share around their graphs: data on demand, the run's start, summaries, the hooks and
the monitored session, all from one TrainingOptions (every training setting, read from the flags by onu_flags).

A library module: explicit arguments only; it declares the training flags (TrainingOptions) but reads none.
"""
import contextlib
import dataclasses
import math
import os
import signal
import socket
import threading
import time
import zlib
from datetime import datetime

import tensorflow as tf

from onu_lib import onu_checkpoint
from onu_lib import onu_cli
from onu_lib import onu_cluster
from onu_lib import onu_data_service
from onu_lib import onu_converter
from onu_lib import onu_dataset
from onu_lib import onu_decoded_cache
from onu_lib import onu_errors
from onu_lib import onu_hparams
import onu_input
import onu_model
from onu_lib import onu_precision
from onu_lib import onu_run_config
from onu_lib import onu_run_folder
from onu_lib import onu_sample_data
from onu_lib import onu_serving
from onu_lib import onu_settings
from onu_lib.onu_settings import setting


DEPRECATED_CACHE_CHOICES = {'on': 'memory'}  # --cache_decoded_epoch: the old spelling and its new one


def cache_mode(value):
    """Returns the --cache_decoded_epoch mode value names; a deprecated spelling says its new one in one line."""
    if value in DEPRECATED_CACHE_CHOICES:
        print(f'--cache_decoded_epoch={value} is now spelled --cache_decoded_epoch={DEPRECATED_CACHE_CHOICES[value]}.',
              flush=True)
    return DEPRECATED_CACHE_CHOICES.get(value, value)


def parse_profile_steps(value):
    """Returns (start, stop) of a --profile_steps value START,STOP with 1 <= START <= STOP, or None if it is not one."""
    parts = value.split(',')
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        return None
    start, stop = (int(part) for part in parts)
    return (start, stop) if 1 <= start <= stop else None


def _is_service_address(value):
    """Returns whether value is None or an address of a tf.data service (onu_data_service.service_address)."""
    try:
        return value is None or bool(onu_data_service.service_address(value))
    except onu_data_service.ServiceError:
        return False


def _model_defaults(field):
    """Returns each registered model's ModelSpec field for a help text: 'inception_resnet_v2 299, small 64'."""
    return ', '.join(f'{name} {getattr(spec, field):g}' for name, spec in onu_model.MODELS.items())


@dataclasses.dataclass(frozen=True)
class TrainingOptions(onu_settings.SharedSettings):
    """Every training setting, each declared once as its flag and its typed field (onu_settings.setting).

    None means the default where it is one: model and image_size (the model's own), data_format (the data's),
    learning_rate and weight_decay (the model's), cache_dir (onu_decoded_cache.default_root()).
    """
    train_dir: str = setting('string', onu_settings.DEFAULT_TRAIN_DIR,
                             'Where checkpoints, event files and run_config.json go; training resumes from it.')
    data_format: str | None = setting(
        'enum', None, 'How images are fed: the original files (images), TFRecords of decoded pixels (raw) or of the '
        'original file bytes (encoded); default: encoded for photos (converted on demand), the records\' own format '
        'for records.', enum_values=onu_dataset.DATA_FORMATS)
    model: str | None = setting(
        'enum', None, f'Network to train; default {onu_model.DEFAULT_MODEL_WITH_GPU} when a GPU is visible, else '
        f'{onu_model.DEFAULT_MODEL_WITHOUT_GPU}.', enum_values=onu_model.MODEL_NAMES)
    image_size: int | None = setting('integer', None, 'Side of the square model input; default: the model\'s own '
                                     f'({_model_defaults("image_size")}).', lower_bound=16)
    batch_size: int = setting('integer', 32, 'Images per batch.', lower_bound=1)  # per tower and per worker
    max_steps: int = setting('integer', 2000, 'Global step at which training stops (counted across restarts).',
                             lower_bound=1)
    log_frequency: int = setting('integer', 10, 'Print loss, speed and what input costs (waiting, work) every this '
                                 'many steps.', lower_bound=1)
    save_checkpoint_secs: int = setting(
        'integer', 120, 'Save a checkpoint every this many seconds (0: none by time; a checkpoint is still saved at '
        'the start, at the end and when stopped by a signal).', lower_bound=0)
    save_checkpoint_steps: int | None = setting(
        'integer', None, 'Save a checkpoint every this many steps (replaces --save_checkpoint_secs).')
    keep_checkpoint_max: int = setting('integer', 5, 'How many recent checkpoints to keep.', lower_bound=1)
    export_every_n_epochs: int = setting(
        'integer', 0, 'Every this many epochs, export a SavedModel to <train_dir>/export/<step>/ from the first '
        'checkpoint at or after the boundary (0: never; see onu_export.py).', lower_bound=0)
    save_summaries_steps: int = setting('integer', 100, 'Write TensorBoard summaries every this many steps.')
    histograms: bool = setting('boolean', False, 'Also write weight and activation histograms.')
    fine_tune_checkpoint: str | None = setting(
        'string', None, 'Checkpoint (or folder) to fine-tune from when train_dir has no checkpoint yet, e.g. '
        'inception_resnet_v2_2016_08_30.ckpt.')
    checkpoint_exclude_scopes: tuple = setting(
        'list', [], 'Variable scopes not restored from --fine_tune_checkpoint; to fine-tune to other classes, the '
        'classifier\'s: ' + '; '.join(f'{name}: {",".join(spec.classifier_scopes)}'
                                     for name, spec in onu_model.MODELS.items()) + '.')
    trainable_scopes: tuple = setting('list', [], 'Train only variables in these scopes (default: all).')
    optimizer: str = setting('enum', 'momentum', 'Optimizer.', enum_values=onu_model.OPTIMIZER_NAMES)
    learning_rate: float | None = setting('float', None, 'Initial learning rate; default: the model\'s own '
                                          f'({_model_defaults("learning_rate")}).')
    learning_rate_schedule: str = setting('enum', 'exponential',
                                          'fixed, or exponential decay every --num_epochs_per_decay epochs.',
                                          enum_values=onu_model.LR_SCHEDULES)
    num_epochs_per_decay: float = setting('float', 2.0, 'Epochs between learning-rate decays.')
    learning_rate_decay_factor: float = setting('float', 0.94, 'Learning-rate decay factor.')
    moving_average_decay: float = setting('float', onu_model.DEFAULT_MOVING_AVERAGE_DECAY,
                                          'Decay of the moving averages of the weights that eval restores (0: none).')
    weight_decay: float | None = setting('float', None, 'L2 weight decay; default: the model\'s own '
                                         f'({_model_defaults("weight_decay")}).')
    label_smoothing: float = setting('float', 0.0, 'Label smoothing of the cross-entropy.')
    augmentations: onu_input.AugmentOptions = setting(
        'list', list(onu_input.default_augmentation_names()),
        'Training augmentations to apply (empty: none); the choices: '
        + ', '.join(onu_input.augmentation_names()) + '.', read=onu_input.AugmentOptions,
        validator=(lambda names: set(names) <= set(onu_input.augmentation_names()),
                   '--augmentations takes a comma-separated subset of ' + ','.join(onu_input.augmentation_names())))
    cache_decoded_epoch: str = setting(
        'enum', 'auto', 'Where one epoch of decoded, resized training images is kept, so that later epochs train from '
        'it instead of decoding again: memory (the first epoch is decoded before step 1), disk (in --cache_dir, '
        'written while the first epoch trains), or off (every epoch decoded); auto: memory when the epoch fits '
        f'{onu_input.DECODED_CACHE_BYTES // 2**30} GiB, else disk when --cache_dir\'s disk has room, else off. on: '
        'the old spelling of memory.', read=cache_mode,
        enum_values=onu_decoded_cache.MODES + tuple(DEPRECATED_CACHE_CHOICES))
    cache_dir: str | None = setting(
        'string', None, 'Where --cache_decoded_epoch=disk keeps decoded epochs, one folder per data, image size and '
        'decode options (reused by later runs); default: $ONU_CACHE_DIR/decoded, else ~/.cache/onu-classifier/decoded. '
        'A local disk: it is read every epoch.')
    profile_steps: tuple | None = setting(
        'string', None, 'START,STOP: write a TensorBoard profile of global steps START to STOP into --train_dir, with '
        'step markers, for the Profile tab (overview, input pipeline analyzer, trace viewer); on a cluster the chief '
        'profiles.', read=parse_profile_steps,
        validator=(lambda value: value is None or parse_profile_steps(value) is not None,
                   '--profile_steps takes START,STOP: two global steps with 1 <= START <= STOP, e.g. '
                   '--profile_steps=100,110'))
    augment_on: str = setting(
        'enum', 'input', 'Where training augmentation runs: in the input pipeline on the CPU (input), or in the '
        'training graph on the model\'s device, each GPU tower its own share (model); the pipeline then only reads, '
        'decodes and resizes. Same augmentations either way.', enum_values=onu_input.AUGMENT_PLACEMENTS)
    reduced_decode: bool = setting(
        'boolean', False, 'Decode training JPEGs at a reduced DCT scale (1/2, 1/4 or 1/8, as --image_size allows): '
        'less CPU per photo, but smoother pixels than evaluation\'s exact decode; on the sample data at 64x64 it cost '
        '5-7 points of precision (BENCHMARKS.md).')
    data_service: str | None = setting(
        'string', None, f'{onu_data_service.ADDRESS_FORM} of a tf.data service\'s dispatcher (run_data_service.py): '
        'its workers read, decode and resize (and, with --augment_on=input, augment) the training batches instead of '
        'this machine\'s CPU; each example once per epoch. No decoded-epoch cache then.',
        read=onu_data_service.service_address,
        validator=(_is_service_address, f'--data_service takes {onu_data_service.ADDRESS_FORM}, e.g. '
                                        f'--data_service=grpc://localhost:{onu_data_service.DEFAULT_PORT}'))
    precision: str = setting(
        'enum', 'auto', 'float32; mixed: bfloat16 compute through oneDNN on the CPU, float16 with dynamic loss scaling '
        'on a GPU (variables and checkpoints stay float32); auto: mixed where the hardware has a fast path (a CPU with '
        'AMX or AVX512_BF16, a GPU of compute capability 7.0+), else float32.',
        enum_values=('auto',) + onu_precision.PRECISIONS)  # as asked; resolved by onu_precision.resolve_precision
    xla: bool = setting('boolean', False, 'Compile the training graph with XLA auto-clustering.')
    ps_hosts: tuple = setting('list', [], 'Multi-machine training: host:port of each parameter server (or set '
                              'TF_CONFIG).')
    worker_hosts: tuple = setting('list', [], 'Multi-machine training: host:port of each worker; worker 0 is the '
                                  'chief, which alone writes checkpoints and summaries.')
    job_name: str | None = setting('enum', None, 'Multi-machine training: this task\'s job.',
                                   enum_values=onu_cluster.JOB_NAMES)
    task_index: int = setting('integer', 0, 'Multi-machine training: this task\'s index within its job.',
                              lower_bound=0)
    sync_replicas: bool = setting('boolean', False, 'Multi-machine training: each step averages one batch from every '
                                  'worker (SyncReplicasOptimizer) instead of asynchronous updates.')
    ps_wait_secs: float = setting(
        'float', onu_cluster.PS_WAIT_SECS, 'Multi-machine training: how long a worker waits for a parameter server '
        'that stopped answering (for a supervisor to restart it) before it exits with one line.', lower_bound=0)
    flag_values: dict  # not a setting: every flag's value, as run_config.json records them


class NanLossError(Exception):
    """The loss became NaN or infinite; training stopped before saving those weights."""


class RunComplete(Exception):
    """The run in --train_dir has reached --max_steps: nothing to train. The message says how to go on."""


# How a training script's main (onu_cli.run_script) ends on each: user errors, failures, a run already complete.
SCRIPT_ERRORS = {'user_errors': (onu_cluster.ClusterConfigError, onu_data_service.ServiceError),
                 'failures': (NanLossError, onu_run_folder.WriteFailed), 'completions': (RunComplete,)}


def default_model_name():
    """Returns onu_model.DEFAULT_MODEL_WITH_GPU when TensorFlow sees a GPU, else DEFAULT_MODEL_WITHOUT_GPU."""
    if onu_precision.visible_gpus():
        return onu_model.DEFAULT_MODEL_WITH_GPU
    return onu_model.DEFAULT_MODEL_WITHOUT_GPU


def prepare_data(data_dir, data_format, validation_percent, labels_offset):
    """Returns (data_dir's onu_dataset.DataDir, the data format to read), making the built-in sample data (only in
    the default --data_dir) and this repo's records on demand; DataError when no data is found."""
    try:
        data = onu_dataset.describe(data_dir, validation_percent, labels_offset)
    except onu_errors.DataError:
        if os.path.abspath(data_dir) != os.path.abspath(onu_dataset.DEFAULT_DATA_DIR):
            raise
        print(f'{data_dir} has no data: generating the built-in sample dataset there.', flush=True)
        onu_sample_data.generate_dataset(data_dir)
        data = onu_dataset.describe(data_dir, validation_percent, labels_offset)
    data_format = data_format or data.default_format()
    if data.layout == onu_dataset.CLASS_FOLDERS:
        print(f'{data_dir} has class folders without a train/val split: holding out {validation_percent:g}% of the '
              f'photos for val by a hash of each file\'s path (--validation_percent; the same on every run).',
              flush=True)
    converting = data_format != 'images' and not data.has_records(data_format)
    if (converting or data.reads_other_tools_records(data_format)) and data.labels_line():
        print(data.labels_line(), flush=True)
    if converting:
        print(f'{data_dir} has no {data_format} records: converting them now ({data.convert_command(data_format)}).',
              flush=True)
        onu_converter.convert(data, formats=(data_format,))
        data = onu_dataset.describe(data_dir, validation_percent, labels_offset)  # with the records just written
    return data, data_format


def start_run(train_dir, run_config, is_chief):
    """Checks that train_dir's saved run can be resumed as run_config; the chief saves it; prints the run."""
    onu_checkpoint.check_resumable(train_dir, run_config, onu_run_config.RunConfig.load(train_dir))
    if is_chief:
        with onu_run_folder.stop_on_write_failure(train_dir, 'writing run_config.json', train_dir):
            run_config.save(train_dir)
    size = run_config.image_size
    examples = 'photos' if run_config.data_format == 'images' else f'{run_config.data_format} records'
    print(f'Training {run_config.model} at {size}x{size} on {run_config.num_examples_per_epoch} {examples} of '
          f'{run_config.num_classes} classes ({", ".join(run_config.class_names)}) into {train_dir}', flush=True)
    if run_config.cache_decoded_epoch == 'memory':
        epoch_bytes = onu_input.decoded_epoch_bytes(run_config.num_examples_per_epoch, size)
        memory = f'{epoch_bytes / 2**20:.1f} MB' if epoch_bytes >= 2**20 else f'{epoch_bytes / 2**10:.0f} KB'
        print(f'Decoding the first epoch into memory before step 1: {run_config.num_examples_per_epoch} photos, '
              f'{memory} at {size}x{size}; later epochs train from it (--cache_decoded_epoch=off reads and '
              f'decodes every step instead).', flush=True)


def _complete_message(train_dir, step, max_steps):
    """The line that says a run has reached --max_steps and how to go on."""
    return (f'{train_dir}: the run is complete at step {step} (--max_steps={max_steps}); to train on, run it again '
            f'with a larger --max_steps')


def check_not_complete(train_dir, max_steps, role):
    """On one machine: RunComplete when train_dir's newest readable checkpoint is at max_steps or past it (else
    StopAtStepHook would train one more step); on a cluster ClusterSessionHook stops the workers instead."""
    if role.task is not None:
        return
    newest, _ = onu_checkpoint.newest_readable(train_dir)
    step = onu_checkpoint.listed_step(newest) if newest else 0
    if step >= max_steps:
        raise RunComplete(_complete_message(train_dir, step, max_steps))


def resume_point(train_dir, is_chief):
    """Returns the checkpoint training resumes from (None: a new run); the chief first sets damaged ones aside."""
    if is_chief:  # damaged checkpoints set aside, the state file made relative to this folder
        return onu_checkpoint.prepare_resume(train_dir)
    return (onu_checkpoint.list_checkpoints(train_dir) or [None])[-1]


def input_seed(seed, task_index, resume_from):
    """Returns the seed of this process's shuffling and augmentation: each cluster worker, and each restart from a
    checkpoint, gets its own, so that none reads another's batches or repeats those already trained on."""
    start_step = onu_checkpoint.listed_step(resume_from) if resume_from else 0
    return (seed * 1000003 + task_index * 7919 + start_step) % (2 ** 31 - 1)


def input_pipeline(options, run_config, info, role, seed, batch_size):
    """Returns the dataset of options' training batches of info (onu_input.training_batches'): made here with the
    decoded-epoch cache run_config chose (on a terminal, a progress bar while memory's first epoch is decoded), or
    by the tf.data service, where a cluster's workers share one job, all from task 0's seed at step 0, so that the
    cluster's epoch holds each example once.
    """
    augment = options.augmentations if options.augment_on == 'input' else None
    if not options.data_service:
        cache = onu_decoded_cache.open_cache(run_config.cache_decoded_epoch, info, run_config.image_size,
                                             options.cache_dir or onu_decoded_cache.default_root(),
                                             options.reduced_decode, seed, onu_cli.show_progress())
        return onu_input.training_batches(info, batch_size, run_config.image_size, cache, seed, options.reduced_decode,
                                          augment)
    job = onu_input.ServiceJob(options.data_service)
    if role.num_replicas > 1:
        seed = input_seed(options.seed, 0, None)
        job = onu_input.ServiceJob(options.data_service,
                                   f'onu_train-{zlib.crc32(options.train_dir.encode()):08x}-{options.seed}')
    return onu_input.service_batches(info, batch_size, run_config.image_size, job, seed, options.reduced_decode,
                                     augment)


def add_training_summaries(logits, labels, end_points, total_loss, losses=None, histograms=False):
    """Adds training-batch precision, averaged losses (losses besides total_loss; default: the LOSSES collection)
    and optional histograms; returns the averaging op."""
    precision = tf.reduce_mean(tf.cast(tf.nn.in_top_k(labels, logits, 1), tf.float32))
    tf.compat.v1.summary.scalar('training_batch/precision_at_1', precision)
    # Single-batch losses are noisy: also show their moving averages, as the CIFAR-10 tutorial did.
    if losses is None:
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
    losses = list(losses) + [total_loss]
    averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, name='avg')
    average_op = averages.apply(losses)
    for part in losses:  # named as loss() names them under losses/
        tf.compat.v1.summary.scalar(f'losses_averaged/{onu_model.loss_name(part)}', averages.average(part))
    if histograms:
        for name, activation in end_points.items():
            tf.compat.v1.summary.histogram(f'activations/{name}', activation)
        for var in tf.compat.v1.trainable_variables():
            tf.compat.v1.summary.histogram(var.op.name, var)
    return average_op


# The op a step waits in when its input pipeline has no batch ready (the iterator's get_next).
INPUT_WAIT_OP = 'IteratorGetNext'


def input_wait_fraction(run_metadata):
    """Returns the share of a step traced with SOFTWARE_TRACE (run_metadata) spent waiting for input, in [0, 1]: its
    get_next ops' time (one ends when its batch is there) over the time from its first op's start to its last's end."""
    waited_micros, starts, ends = 0, [], []
    for device in run_metadata.step_stats.dev_stats:
        for node in device.node_stats:
            if node.node_name.rsplit('/', 1)[-1].startswith(INPUT_WAIT_OP):
                waited_micros += node.all_end_rel_micros
            starts.append(node.all_start_micros)
            ends.append(node.all_start_micros + node.all_end_rel_micros)
    step_micros = max(ends) - min(starts) if starts else 0
    return min(1.0, max(0.0, waited_micros / max(step_micros, 1e-3)))


def traced_run_options():
    """Returns the RunOptions of a step traced for its input wait: a software trace (no device trace, cheap)."""
    return tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.SOFTWARE_TRACE)


class LoggerHook(tf.compat.v1.train.SessionRunHook):
    """Prints loss, speed and what input costs every log_frequency steps, writes them to TensorBoard, counts steps.

    The last step of each interval runs traced: its share waiting for input (input_wait_fraction), and tf.data's
    own account of the pipelines' work (onu_input.PIPELINE_MODEL_OPS) per batch since the last line, which shows
    input's cost on the model's cores where the input keeps ahead and nothing waits.
    """

    def __init__(self, loss, global_step, examples_per_step, log_frequency, summary_dir=None):
        self._fetches = {'loss': loss, 'step': global_step}
        self._pipelines = tf.compat.v1.get_collection(onu_input.PIPELINE_MODEL_OPS)
        self._examples_per_step = examples_per_step
        self._log_frequency = log_frequency
        self._summary_dir = summary_dir
        self.steps_run = 0
        self.wait_fractions = []  # every measured input wait, in order

    def begin(self):
        self._last_step = None
        self._last_time = None
        self._trace_next = False
        self._wait_fraction = None  # measured since the last line (on a cluster the step to trace is a guess)
        self._pipeline_work = None  # onu_input.PipelineWork of the input pipelines at the last traced step
        self._work_per_batch = None

    def before_run(self, run_context):
        if not self._trace_next:
            return tf.compat.v1.train.SessionRunArgs(self._fetches)
        return tf.compat.v1.train.SessionRunArgs(dict(self._fetches, pipelines=self._pipelines),
                                                 options=traced_run_options())

    def after_run(self, run_context, run_values):
        if self._trace_next:
            self.wait_fractions.append(input_wait_fraction(run_values.run_metadata))
            self._wait_fraction = self.wait_fractions[-1]
            self._measure_pipeline_work(run_values.results['pipelines'])
        self.steps_run += 1
        step = int(run_values.results['step']) + 1  # the fetched value was read before the update
        self._log(step, run_values.results['loss'])
        # A log line is due at the next step: its step is traced.
        self._trace_next = (step + 1) % self._log_frequency == 0 or step + 1 - self._last_step >= self._log_frequency

    def _measure_pipeline_work(self, serialized_models):
        """Keeps the input pipelines' seconds of work per batch since the last traced step (None at the first)."""
        work = onu_input.pipeline_work(serialized_models)
        if self._pipeline_work is not None:
            seconds, batches = onu_input.work_between(self._pipeline_work, work)
            if batches > 0:
                self._work_per_batch = seconds / batches
        self._pipeline_work = work

    def _log(self, step, loss):
        """Prints and writes the log line of step when one is due (the first step only starts the clock)."""
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
        input_text, scalars = '', {onu_hparams.EXAMPLES_PER_SEC_TAG: examples_per_sec}
        if self._wait_fraction is not None:
            input_text = f'; {self._wait_fraction:.0%} waiting for input'
            scalars[onu_hparams.WAIT_FRACTION_TAG] = self._wait_fraction
            self._wait_fraction = None
        if self._work_per_batch is not None:
            input_text += f'; input work {1000 * self._work_per_batch:.0f} ms per batch'
            scalars[onu_hparams.WORK_TAG] = 1000 * self._work_per_batch
            self._work_per_batch = None
        print(f'{datetime.now()}: step {step}, loss = {loss:.4f} '
              f'({examples_per_sec:.1f} examples/sec; {sec_per_batch:.3f} sec/batch{input_text})', flush=True)
        if self._summary_dir:
            tf.compat.v1.summary.FileWriterCache.get(self._summary_dir).add_summary(tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()]), step)
        self._last_step, self._last_time = step, now


class ProfileHook(tf.compat.v1.train.SessionRunHook):
    """Writes a TensorBoard profile of global steps start..stop into logdir, each step marked for the Profile tab.

    Each session.run in the range is a 'train' Trace with its step number, which the input pipeline analyzer needs;
    a run that ends or fails inside the range stops the profiler (close()).
    """

    def __init__(self, logdir, start, stop, global_step):
        self._logdir = logdir
        self._start, self._stop = start, stop
        self._global_step = global_step
        self._next_step = None
        self._trace = None
        self._first = None  # the first step profiled, once the profiler runs

    def after_create_session(self, session, coord):
        self._next_step = int(session.run(self._global_step)) + 1
        if self._next_step > self._stop:
            print(f'--profile_steps={self._start},{self._stop}: this run starts at step {self._next_step}, past '
                  f'them; nothing is profiled.', flush=True)

    def before_run(self, run_context):
        step = self._next_step
        if self._first is None and self._start <= step <= self._stop:
            tf.profiler.experimental.start(self._logdir)
            self._first = step
        if self._first is not None and step <= self._stop:
            self._trace = tf.profiler.experimental.Trace('train', step_num=step, _r=1)
            self._trace.__enter__()
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        self._end_trace()
        # The global step read in the same run may come before or after the update: never go back.
        step, self._next_step = self._next_step, max(self._next_step + 1, int(run_values.results) + 1)
        if self._first is not None and step >= self._stop:
            self.close(step)

    def end(self, session):
        self.close(self._next_step - 1)

    def _end_trace(self):
        """Ends the current step's trace, if one is open."""
        if self._trace is not None:
            self._trace.__exit__(None, None, None)
            self._trace = None

    def close(self, last_step=None):
        """Stops the profiler if it runs and says where the profile is (called as well when training fails)."""
        if self._first is None:
            return
        self._end_trace()
        tf.profiler.experimental.stop()
        last = min(last_step or self._next_step - 1, self._stop)
        print(f'Profiled steps {self._first}-{last} into {self._logdir} (TensorBoard\'s Profile tab).', flush=True)
        self._first = None
        self._start = self._stop + 1  # once


class NanLossHook(tf.compat.v1.train.SessionRunHook):
    """Stops training with the step and learning rate when the loss is not finite: it raises, as a requested stop
    would save the broken weights."""

    def __init__(self, loss, global_step, learning_rate, session_dir=None):
        self._fetches = {'loss': loss, 'step': global_step, 'lr': learning_rate}
        self._session_dir = session_dir  # the chief's train_dir: its HParams session ends as a failure

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        loss = float(run_values.results['loss'])
        if not math.isfinite(loss):
            if self._session_dir:
                onu_hparams.write_session_end(self._session_dir, 'failure')
            raise NanLossError(
                f'loss is {loss} at step {int(run_values.results["step"]) + 1} with learning rate '
                f'{float(run_values.results["lr"]):.3g}; the last finite checkpoint is kept; '
                f'lower --learning_rate and rerun to resume from it')


class StopOnSignalHook(tf.compat.v1.train.SessionRunHook):
    """SIGTERM or SIGINT asks training to stop after the current step (the chief then saves it); a second, at once.

    On a cluster task (blocked_exit_secs given), if no step has ended blocked_exit_secs after the signal and
    ps_watch finds a ps lost, the process ends with one line naming it. received: the signal, or None.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, blocked_exit_secs=None, train_dir=None, ps_watch=None):
        self.received = None
        self._previous = {}
        self._blocked_exit_secs, self._train_dir, self._ps_watch = blocked_exit_secs, train_dir, ps_watch
        self._steps_since_signal = 0
        self._ended = False
        self._wakeup = None
        self._unsaid = False

    def begin(self):
        self._previous = {number: signal.signal(number, self._handle) for number in self.SIGNALS}
        if self._blocked_exit_secs is not None:
            self._watch_for_blocked_stop()

    def _handle(self, number, frame):
        if self.received is not None:  # asked twice: stop now
            signal.signal(number, self._previous[number])
            signal.raise_signal(number)
            return
        self.received = number
        try:
            self._say_received()
        except RuntimeError:  # it came while the main thread was printing: Python refuses a print inside a print
            self._unsaid = True

    def _say_received(self):
        self._unsaid = False
        print(f'{signal.Signals(self.received).name} received: stopping after this step.', flush=True)

    def _watch_for_blocked_stop(self):
        """Hears a signal in a thread of its own: Python runs _handle only once the main thread's step returns."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        # The C-level handler writes the signal's number here at once, even while the main thread waits in C++.
        self._wakeup = (reader, writer, signal.set_wakeup_fd(writer.fileno()))
        threading.Thread(target=self._stop_if_blocked, args=(reader,), name='stop-if-blocked', daemon=True).start()

    def _stop_if_blocked(self, reader):
        """After a signal, waits blocked_exit_secs; ends the process if no step ended meanwhile."""
        number = None
        while number is None:
            try:
                received = reader.recv(64)
            except OSError:  # closed by restore(): training ended
                return
            if not received:
                return
            number = next((byte for byte in received if byte in self.SIGNALS), None)
        time.sleep(self._blocked_exit_secs)
        # A slow step, or the final checkpoint being written, is waited for; a step waiting for a lost ps is not.
        while not (self._ended or self._steps_since_signal):
            lost = self._ps_watch.lost() if self._ps_watch else []
            if lost:
                print(f'Stopped by {signal.Signals(number).name}: no step ended within {self._blocked_exit_secs:g} s '
                      f'of it ({", ".join(lost)} does not answer), so no checkpoint could be written; resume from '
                      f'{onu_cluster.newest_checkpoint_line(self._train_dir)}.', flush=True)
                os._exit(128 + number)  # pylint: disable=protected-access  (the step waits inside gRPC)
            time.sleep(1)

    def after_run(self, run_context, run_values):
        if self.received is not None:
            if self._unsaid:
                self._say_received()
            self._steps_since_signal += 1
            run_context.request_stop()

    def end(self, session):
        self.restore()

    def restore(self):
        """Puts back the signal handlers there were before."""
        self._ended = True
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}
        if self._wakeup:
            reader, writer, previous_fd = self._wakeup
            signal.set_wakeup_fd(previous_fd)
            writer.close()
            reader.close()
            self._wakeup = None


class ClusterSessionHook(tf.compat.v1.train.SessionRunHook):
    """On a cluster worker: stops before the first step when the restored global step has reached max_steps (the
    chief restores it, the others read it from the parameter servers); one line when MonitoredTrainingSession makes a
    new session after a lost task (a restarted ps) came back, the chief's saying which checkpoint it restored and how
    many steps that lost."""

    def __init__(self, global_step, task, train_dir, max_steps):
        self._global_step, self._task, self._train_dir, self._max_steps = global_step, task, train_dir, max_steps
        self._sessions = 0
        self._last_step = None
        self.complete_at = None

    def after_create_session(self, session, coord):
        self._sessions += 1
        step = int(session.run(self._global_step))
        if step >= self._max_steps:
            self.complete_at = step
            coord.request_stop()
        if self._sessions == 1:
            return
        if self._task.is_chief:
            lost = (f'{max(0, self._last_step - step)} step(s) lost (the last step here was {self._last_step})'
                    if self._last_step is not None else 'no step had run here')
            restored = onu_cluster.newest_checkpoint_line(self._train_dir)
            print(f'{self._task.name}: the cluster is back: restored {restored} into the parameter servers; {lost}.',
                  flush=True)
        else:
            print(f'{self._task.name}: the cluster is back: training goes on from step {step}.', flush=True)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        self._last_step = int(run_values.results) + 1


def make_scaffold(options, resume_from):
    """Returns the run's Scaffold: its Saver, and the fine-tune restore when it starts afresh (resume_from None)."""
    init_fn = None
    if options.fine_tune_checkpoint and not resume_from:
        saver, path = onu_checkpoint.warm_start_saver(options.fine_tune_checkpoint,
                                                      list(options.checkpoint_exclude_scopes))
        init_fn = lambda scaffold, sess: saver.restore(sess, path)  # noqa: E731
    elif options.fine_tune_checkpoint:
        print(f'{options.train_dir} already has a checkpoint: resuming from it, not from '
              f'--fine_tune_checkpoint.', flush=True)
    return tf.compat.v1.train.Scaffold(init_fn=init_fn,
                                       saver=onu_checkpoint.training_saver(options.keep_checkpoint_max))


# On a cluster, how long after SIGTERM or SIGINT a task whose step has not ended stops without one.
BLOCKED_STOP_SECS = 10


# CheckpointSaverHook needs a period; --save_checkpoint_secs=0 (no saves by time) gets one of ~32 years.
NO_PERIODIC_SAVE_SECS = 10 ** 9


def checkpoint_period(save_checkpoint_secs, save_checkpoint_steps):
    """Returns CheckpointSaverHook's (save_secs, save_steps): the steps if given, else the seconds (0: never)."""
    if save_checkpoint_steps:
        return None, save_checkpoint_steps
    return save_checkpoint_secs or NO_PERIODIC_SAVE_SECS, None


def training_hooks(options, run_config, role, scaffold, total_loss, learning_rate, examples_per_step):
    """Returns the session hooks of a training run of options (role: an onu_cluster.Role) in the default graph.

    The chief's CheckpointSaverHook goes first, where MonitoredTrainingSession's own would; it also saves when the
    session closes, so that a stop by signal keeps the current step.
    """
    train_dir, global_step = options.train_dir, tf.compat.v1.train.get_global_step()
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=options.max_steps),
             NanLossHook(total_loss, global_step, learning_rate, train_dir if role.is_chief else None)] + role.hooks()
    if role.task is not None:
        hooks.append(ClusterSessionHook(global_step, role.task, train_dir, options.max_steps))
    if role.is_chief:
        listeners = []
        if options.export_every_n_epochs:
            listeners.append(onu_serving.PeriodicExportListener(
                train_dir, run_config, onu_serving.default_export_dir(train_dir), options.export_every_n_epochs,
                examples_per_step))
        save_secs, save_steps = checkpoint_period(options.save_checkpoint_secs, options.save_checkpoint_steps)
        hooks.insert(0, tf.compat.v1.train.CheckpointSaverHook(
            train_dir, save_secs=save_secs, save_steps=save_steps, scaffold=scaffold, listeners=listeners))
    hooks.append(LoggerHook(total_loss, global_step, examples_per_step, options.log_frequency,
                            train_dir if role.is_chief else None))
    if options.profile_steps and role.is_chief:
        hooks.append(ProfileHook(train_dir, *options.profile_steps, global_step))
    if options.data_service:
        hooks.append(onu_data_service.WorkerWatchHook(options.data_service))
    hooks.append(StopOnSignalHook(BLOCKED_STOP_SECS, train_dir, role.ps_watch) if role.task else StopOnSignalHook())
    return hooks


@contextlib.contextmanager
def monitored_training_session(options, role, scaffold, hooks, info):
    """Opens the MonitoredTrainingSession of a training run of options reading info; a damaged record becomes a
    DataError, a write that fails for lack of space or rights a WriteFailed."""
    train_dir = options.train_dir
    stop_hook, profile = _hook(hooks, StopOnSignalHook), _hook(hooks, ProfileHook)
    try:
        with onu_run_folder.stop_on_write_failure(train_dir, 'training', train_dir), \
                onu_dataset.read_errors_as_data_error(info):
            with tf.compat.v1.train.MonitoredTrainingSession(
                    master=role.master, is_chief=role.is_chief, checkpoint_dir=train_dir,
                    scaffold=scaffold, hooks=hooks, save_checkpoint_secs=None, save_checkpoint_steps=None,
                    save_summaries_steps=options.save_summaries_steps, log_step_count_steps=None,
                    config=role.session_config,
                    stop_grace_period_secs=role.stop_grace_period_secs) as session:
                yield session
    finally:
        stop_hook.restore()
        if profile is not None:  # a failed step never reaches the hook's end(): the profile of it is kept
            profile.close()


def finish(options, hooks, role):
    """Prints how training ended, tells a cluster; returns the exit code: 0, or 128 + the stopping signal."""
    train_dir, max_steps = options.train_dir, options.max_steps
    logger, stop, cluster = _hook(hooks, LoggerHook), _hook(hooks, StopOnSignalHook), _hook(hooks, ClusterSessionHook)
    if cluster is not None and cluster.complete_at is not None:
        print(_complete_message(train_dir, cluster.complete_at, max_steps), flush=True)
    elif stop.received is None:
        print(f'Training stopped at step {max_steps}; checkpoints in {train_dir}', flush=True)
        if role.is_chief:
            onu_hparams.write_session_end(train_dir, 'success')
    elif role.is_chief:
        saved = onu_checkpoint.list_checkpoints(train_dir)[-1]
        print(f'Stopped by {signal.Signals(stop.received).name} at step {onu_checkpoint.listed_step(saved)}: '
              f'checkpoint saved as {saved}; run the same command again to resume from it.', flush=True)
    else:
        print(f'Stopped by {signal.Signals(stop.received).name}: this worker stops; the chief keeps '
              f'the checkpoints.', flush=True)
    role.finish(logger.steps_run)
    return 128 + stop.received if stop.received else 0


def _hook(hooks, hook_type):
    """Returns the hook of hook_type among hooks (training_hooks puts at most one of each there), or None."""
    return next((hook for hook in hooks if isinstance(hook, hook_type)), None)


# ----------------------------------------------------------------------------------------------
# A training run from its TrainingOptions: what onu_train.py and onu_multi_gpu_train.py call.

def training_role(options):
    """Returns (precision, this process's onu_cluster.Role) as options (or TF_CONFIG) say."""
    precision = onu_precision.resolve_precision(options.precision)
    task = onu_cluster.resolve_task(list(options.ps_hosts), list(options.worker_hosts), options.job_name,
                                    options.task_index, os.environ.get('TF_CONFIG'), options.sync_replicas,
                                    options.model is not None)
    session = onu_precision.set_precision_options(onu_precision.session_config(), precision.compute_dtype, options.xla)
    return precision, onu_cluster.join(task, session, options.sync_replicas, options.ps_wait_secs, options.train_dir)


def training_run_config(options, precision, data, info):
    """Returns the RunConfig of a run of options on data (a DataDir) and info, its train split."""
    model_name = options.model or default_model_name()
    if not options.model:
        print(f'--model not given: using {model_name} '
              f'({"a GPU is visible" if model_name == onu_model.DEFAULT_MODEL_WITH_GPU else "no GPU visible"}).',
              flush=True)
    image_size = options.image_size or onu_model.model_spec(model_name).image_size
    cache = 'off'  # on a tf.data service its workers decode
    if not options.data_service:
        cache, why = onu_decoded_cache.choose(options.cache_decoded_epoch, info.num_examples, image_size,
                                              options.cache_dir or onu_decoded_cache.default_root())
        if options.cache_decoded_epoch == 'auto' and cache != 'memory':  # memory: start_run's line says so
            print(f'Decoded-epoch cache: {why}.', flush=True)
    return onu_run_config.RunConfig(
        model=model_name, image_size=image_size,
        class_names=info.class_names, num_examples_per_epoch=info.num_examples,
        data_dir=os.path.abspath(options.data_dir), data_format=info.data_format,
        layout=data.layout,
        labels_offset=info.data_labels_offset, validation_percent=info.validation_percent,
        cache_decoded_epoch=cache,
        precision=precision.name, compute_dtype=precision.compute_dtype, max_steps=options.max_steps,
        moving_average_decay=options.moving_average_decay, flags=options.flag_values)


def check_data_service(address):
    """Prints what the tf.data service at address has; onu_data_service.ServiceError when it does not answer."""
    workers = onu_data_service.check_reachable(address)
    print(f'Input from the tf.data service at {address}: ' + (
        f'{len(workers)} worker(s) registered (' + ', '.join(workers) + ')' if workers else
        'no worker registered yet: training starts when one does') + '.', flush=True)


def begin_training_run(options, precision, role, towers=1):
    """Takes the train_dir (the chief), makes the data ready, checks and saves the run configuration; returns
    (RunConfig, the train split's DatasetInfo, checkpoint resumed from). RunComplete when max_steps is reached."""
    if role.is_chief:  # one trainer per train_dir: refused, before anything is read or written, if in use
        onu_run_folder.hold_folder(options.train_dir, 'training', 'train_dir')
    check_not_complete(options.train_dir, options.max_steps, role)
    if options.data_service:
        check_data_service(options.data_service)
    data, data_format = prepare_data(options.data_dir, options.data_format, options.validation_percent,
                                     options.labels_offset)
    info = data.split('train', data_format)
    run_config = training_run_config(options, precision, data, info)
    start_run(options.train_dir, run_config, role.is_chief)
    resume_from = resume_point(options.train_dir, role.is_chief)
    if role.is_chief and resume_from is None:  # a resumed run keeps the session it started
        onu_hparams.write_session_start(options.train_dir, options, run_config, towers * role.num_replicas)
    return run_config, info, resume_from


def examples_per_step(options, role, towers=1):
    """Returns the examples of one global step: --batch_size on each of towers, on each worker the step averages."""
    return options.batch_size * towers * role.num_replicas


def learning_rate(options, global_step, run_config, examples_per_step):
    """Returns the learning-rate tensor of options, an epoch being run_config's examples (the train split's)."""
    return onu_model.make_learning_rate(
        global_step, options.learning_rate or onu_model.model_spec(run_config.model).learning_rate,
        options.learning_rate_schedule, run_config.num_examples_per_epoch, examples_per_step,
        options.num_epochs_per_decay, options.learning_rate_decay_factor)
