"""A training run's settings and results as a session of TensorBoard's HParams dashboard: one row per run.

    write_session_start(train_dir, options, run_config, num_replicas)   # the chief, when a run starts afresh
    write_session_end(train_dir, status)                                  # 'success' or 'failure'
    write_measured_session(run_dir, settings, metrics)                    # a benchmark row: settings and figures

SETTINGS are the columns (a fixed set of values gives the dashboard a filter); METRICS are ordinary scalars written
into train_dir by the training run (group '') and into RUN/eval by onu_eval.py (group 'eval'). Every run writes the
same experiment config, so runs of one --logdir share one table.

A library module: explicit arguments only, no flags.
"""
import dataclasses
import os
import time
from typing import Callable

import tensorflow as tf
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import summary as hparams_summary
from tensorboard.plugins.hparams import summary_v2 as hparams

from onu_lib import onu_dataset
from onu_lib import onu_errors
import onu_input
import onu_model

EVAL_GROUP = 'eval'  # the metrics of an evaluator writing into RUN/eval
STATUSES = {'success': api_pb2.STATUS_SUCCESS, 'failure': api_pb2.STATUS_FAILURE}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One column of settings: its name, its values where they are a fixed set, and how a run gives its value."""
    name: str
    value: Callable  # (options, run_config, num_replicas) -> bool, number or string
    choices: tuple = None


SETTINGS = (
    Setting('model', lambda o, r, n: r.model, tuple(onu_model.MODEL_NAMES)),
    Setting('image_size', lambda o, r, n: r.image_size),
    Setting('data_format', lambda o, r, n: r.data_format, tuple(onu_dataset.DATA_FORMATS)),
    Setting('layout', lambda o, r, n: r.layout),
    Setting('batch_size', lambda o, r, n: o.batch_size * n),  # examples per step, all towers or workers together
    Setting('replicas', lambda o, r, n: n),  # towers or workers
    Setting('learning_rate', lambda o, r, n: o.learning_rate or onu_model.model_spec(r.model).learning_rate),
    Setting('learning_rate_schedule', lambda o, r, n: o.learning_rate_schedule),
    Setting('optimizer', lambda o, r, n: o.optimizer),
    Setting('precision', lambda o, r, n: r.compute_dtype),
    Setting('xla', lambda o, r, n: bool(o.xla), (False, True)),
    Setting('augmentations', lambda o, r, n: ','.join(name for name in onu_input.augmentation_names()
                                                      if name in o.augmentations.names) or 'none'),
    Setting('augment_on', lambda o, r, n: o.augment_on, tuple(onu_input.AUGMENT_PLACEMENTS)),
    Setting('decoded_epoch_cache', lambda o, r, n: r.cache_decoded_epoch or 'off'),
    Setting('data_service', lambda o, r, n: bool(o.data_service), (False, True)),
    Setting('label_smoothing', lambda o, r, n: o.label_smoothing),
    Setting('weight_decay', lambda o, r, n: o.weight_decay if o.weight_decay is not None
            else onu_model.model_spec(r.model).weight_decay),
    Setting('seed', lambda o, r, n: 'none' if o.seed is None else str(o.seed)),
)

# The scalars of the table, written by onu_training (the trainer's log lines) and onu_eval.py.
EXAMPLES_PER_SEC_TAG = 'examples/sec'
WAIT_FRACTION_TAG = 'input/wait_fraction'
WORK_TAG = 'input/work_ms_per_batch'
PRECISION_TAG = 'Precision @ 1'
BEST_PRECISION_TAG = 'Best precision @ 1'  # the best so far on the same eval data, beside the current one
LOSS_TAG = 'eval/loss'
# (group, tag, what it shows): the training run's own scalars, then the evaluator's in RUN/eval.
METRICS = (
    ('', EXAMPLES_PER_SEC_TAG, 'training examples/sec'),
    ('', WAIT_FRACTION_TAG, 'share of a step waiting for input'),
    ('', WORK_TAG, 'input work, ms per batch'),
    (EVAL_GROUP, PRECISION_TAG, 'eval precision @ 1'),
    (EVAL_GROUP, BEST_PRECISION_TAG, 'eval best precision @ 1 so far'),
    (EVAL_GROUP, LOSS_TAG, 'eval loss'),
)


def row_eval_dir(train_dir):
    """The --eval_dir whose figures join train_dir's row (the METRICS of EVAL_GROUP): RUN/eval."""
    return os.path.join(train_dir, EVAL_GROUP)


def row_caution(train_dir, eval_dir):
    """The line saying how eval_dir's figures would join train_dir's row, or None when they do."""
    if os.path.realpath(eval_dir) == os.path.realpath(row_eval_dir(train_dir)):
        return None
    return (f'HParams tab: these figures join the row of {train_dir} only with '
            f'{onu_errors.shell_flag("eval_dir", row_eval_dir(train_dir))}; '
            f'from {eval_dir} they show as a run of their own.')


def settings(options, run_config, num_replicas):
    """{name: value} of a run's SETTINGS."""
    return {setting.name: setting.value(options, run_config, num_replicas) for setting in SETTINGS}


def as_shown(settings):
    """settings with whole numbers as text: the dashboard prints every number to 5 digits (a batch of 32 as 32.000)."""
    return {name: str(value) if isinstance(value, int) and not isinstance(value, bool) else value
            for name, value in settings.items()}


def experiment_config():
    """The Summary declaring SETTINGS (with their fixed sets of values) and METRICS."""
    return hparams.hparams_config_pb(
        [hparams.HParam(setting.name, hparams.Discrete(list(setting.choices)) if setting.choices else None)
         for setting in SETTINGS],
        [hparams.Metric(tag, group=group, display_name=shown) for group, tag, shown in METRICS])


def _write(train_dir, kind, *summaries):
    """Writes summaries into an event file of their own in train_dir, named by kind (a FileWriter's file name has
    the time in whole seconds: a second file of the same second and name would overwrite the first)."""
    with tf.Graph().as_default():  # a v1 FileWriter needs graph mode; it writes no graph unless given one
        writer = tf.compat.v1.summary.FileWriter(train_dir, filename_suffix=f'.hparams-{kind}')
        for summary in summaries:  # TensorBoard builds its own copy of the Summary message: passed on as bytes
            writer.add_summary(tf.compat.v1.Summary.FromString(summary.SerializeToString()))
        writer.close()


def write_session_start(train_dir, options, run_config, num_replicas):
    """Writes the experiment config and this run's session start (its settings) into train_dir."""
    _write(train_dir, 'start', experiment_config(),
           hparams.hparams_pb(as_shown(settings(options, run_config, num_replicas)), start_time_secs=time.time()))


def write_session_end(train_dir, status):
    """Writes how the run's session ended: 'success' (at --max_steps) or 'failure' (NaN loss, a failed write)."""
    _write(train_dir, 'end', hparams_summary.session_end_pb(STATUSES[status], end_time_secs=time.time()))


def write_measured_session(run_dir, settings, metrics):
    """Writes a finished session into run_dir: settings {SETTINGS name: value} and the training metrics {tag: value}
    measured (the benchmark's training rows, in the same table as the training runs)."""
    unknown = ((set(settings) - {setting.name for setting in SETTINGS})
               | (set(metrics) - {tag for group, tag, _ in METRICS if group == ''}))
    if unknown:
        raise ValueError(f'not a setting or training metric of the HParams table: {", ".join(sorted(unknown))}')
    scalars = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=value)
                                          for tag, value in metrics.items()])
    _write(run_dir, 'measured', experiment_config(), hparams.hparams_pb(as_shown(settings)), scalars,
           hparams_summary.session_end_pb(STATUSES['success']))
