"""Tests of onu_train.py: the shared tiny run (conftest's tiny_run), copies of it and new runs on its data."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import (CHROMIUM_FLAGS, TINY_RUN_NOTES, TINY_RUN_STEPS, copy_train_dir, run_on_a_terminal,
                      run_script, start_script, script_tested_models, session_events)

from onu_lib import onu_dataset
import onu_model
from onu_lib import onu_precision
from onu_lib import onu_run_config
from onu_lib import onu_training

TIMEOUT_SECS = 240
# The shared run's input size and batch; checkpoints only at the start and the end of a run.
TINY_FLAGS = ['--image_size=32', '--batch_size=8', '--log_frequency=1', '--save_summaries_steps=1',
              '--save_checkpoint_secs=600']


def run_train(*args):
    """Runs onu_train.py with TINY_FLAGS and args; returns the CompletedProcess (text output)."""
    return run_script('onu_train.py', *TINY_FLAGS, *args, timeout=TIMEOUT_SECS)


def logged_steps(stdout):
    """Returns the global steps of the 'step N, loss = X' lines."""
    return [int(line.split('step ')[1].split(',')[0]) for line in stdout.splitlines() if ', loss = ' in line]


def assert_logged_speeds_count(stdout, examples_per_step):
    """Asserts that stdout has log lines and that each one's examples/sec times its sec/batch is examples_per_step."""
    speeds = re.findall(r'\(([\d.]+) examples/sec; ([\d.]+) sec/batch', stdout)
    assert speeds
    for examples_per_sec, sec_per_batch in speeds:
        examples_per_sec, sec_per_batch = float(examples_per_sec), float(sec_per_batch)
        # Both are printed rounded (0.1 examples/sec, 1 ms): allow exactly that rounding.
        rounding = examples_per_sec * 0.0005 + sec_per_batch * 0.05 + 1e-9
        assert abs(examples_per_sec * sec_per_batch - examples_per_step) <= rounding, (examples_per_sec, sec_per_batch)


def checkpoint_step(train_dir):
    """Returns the global step stored in train_dir's latest checkpoint."""
    return int(tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir)).get_tensor('global_step'))


def event_tags(train_dir):
    """Returns {tag: [values]} of the scalar and image summaries in train_dir's event files."""
    tags = {}
    for name in os.listdir(train_dir):
        if not name.startswith('events.out.tfevents'):
            continue
        for record in tf.compat.v1.io.tf_record_iterator(os.path.join(train_dir, name)):
            event = tf.compat.v1.Event.FromString(record)
            for value in event.summary.value:
                kind = value.WhichOneof('value')
                tags.setdefault(value.tag, []).append(value.simple_value if kind == 'simple_value' else kind)
    return tags


def test_training_writes_checkpoint_events_and_config(tiny_run):
    data_dir, train_dir, result = tiny_run.data_dir, tiny_run.train_dir, tiny_run.result
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'no encoded records: converting them now' in result.stdout
    assert os.path.isfile(os.path.join(data_dir, 'tfrecords', 'manifest.json'))
    assert '--model not given: using small (no GPU visible)' in result.stdout
    assert logged_steps(result.stdout) == list(range(2, 13))
    assert checkpoint_step(train_dir) == 12
    tags = event_tags(train_dir)
    for tag in ('losses/total', 'losses/cross_entropy', 'losses/regularization', 'learning_rate',
                'training_batch/precision_at_1', 'examples/sec'):
        assert tag in tags, sorted(tags)
    assert all(0.0 <= v <= 1.0 for v in tags['training_batch/precision_at_1'])
    assert all(v > 0 for v in tags['examples/sec'])
    # One name per loss: the same under losses/ and losses_averaged/ (no op names such as cross_entropy/value).
    assert {tag for tag in tags if tag.startswith('losses')} == {
        'losses/cross_entropy', 'losses/regularization', 'losses/total', 'losses_averaged/cross_entropy',
        'losses_averaged/total'}
    # The input wait, measured on a traced step per log line: in every line and as a scalar, within [0, 1].
    logged = re.findall(r'sec/batch; (\d+)% waiting for input(?:; input work (\d+) ms per batch)?\)', result.stdout)
    waits, works = [int(wait) for wait, _ in logged], [int(work) for _, work in logged if work]
    assert len(waits) == len(logged_steps(result.stdout)) and all(0 <= wait <= 100 for wait in waits)
    assert len(tags['input/wait_fraction']) == len(waits) and all(0 <= v <= 1 for v in tags['input/wait_fraction'])
    # The input pipeline's work per batch (tf.data's own account), from the second log line on, where the
    # pipeline made a batch since the last (at one step per line, with batches prefetched, not every time).
    assert len(waits) // 2 <= len(works) <= len(waits) - 1 and len(tags['input/work_ms_per_batch']) == len(works)
    assert all(v > 0 for v in tags['input/work_ms_per_batch'])
    assert 'Decoding the first epoch into memory before step 1: 16 photos, 48 KB at 32x32' in result.stdout
    assert any(tag.startswith('augmented_inputs') for tag in tags)
    run_config = onu_run_config.RunConfig.load(train_dir)
    assert run_config.model == 'small'
    assert run_config.image_size == 32
    assert run_config.class_names == ('F603', 'F663N')
    assert run_config.num_classes == 2
    assert run_config.num_examples_per_epoch == 16
    assert run_config.data_format == 'encoded'
    assert run_config.cache_decoded_epoch == 'memory' and run_config.flags['cache_decoded_epoch'] == 'auto'
    assert run_config.flags['batch_size'] == 8
    assert run_config.flags['max_steps'] == 12
    assert 'checkpoint_path' not in run_config.flags  # deprecated spellings are not saved
    with open(os.path.join(train_dir, 'notes.txt')) as f:
        assert f.read() == TINY_RUN_NOTES  # training never clears the user's train_dir


def test_the_learning_rate_decays_by_epochs_of_the_train_split(tiny_run):
    # 16 train photos at batch 8: an epoch is 2 steps, so with the defaults (x0.94 every 2 epochs) the rate
    # decays every 4 steps and 12 steps see 3 rates. Epochs of the val split's 8 photos would show 6.
    assert tiny_run.config.num_examples_per_epoch == 16
    assert {name: tiny_run.config.flags[name] for name in ('learning_rate_schedule', 'num_epochs_per_decay',
                                                           'learning_rate_decay_factor', 'batch_size')} == {
        'learning_rate_schedule': 'exponential', 'num_epochs_per_decay': 2.0, 'learning_rate_decay_factor': 0.94,
        'batch_size': 8}
    initial = onu_model.MODELS[tiny_run.config.model].learning_rate
    rates = event_tags(tiny_run.train_dir)['learning_rate']
    decays = [round(math.log(rate / initial, 0.94)) for rate in rates]
    assert rates == pytest.approx([initial * 0.94 ** decay for decay in decays], rel=1e-5)
    assert set(decays) in ({0, 1, 2}, {0, 1, 2, 3}), rates


@pytest.mark.parametrize('model_name', script_tested_models())
def test_every_model_trains_into_checkpoints_with_the_moving_averages_eval_restores(tiny_run_of, model_name):
    run = tiny_run_of(model_name)
    assert run.result.returncode == 0, run.result.stderr[-3000:]
    assert (run.config.model, run.config.image_size) == (model_name, 32)
    assert logged_steps(run.result.stdout) == list(range(2, TINY_RUN_STEPS + 1))
    assert checkpoint_step(run.train_dir) == TINY_RUN_STEPS
    scope = onu_model.MODELS[model_name].scope
    saved = {name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(run.train_dir))}
    weights = {name for name in saved
               if name.startswith(scope + '/') and not name.endswith(('/ExponentialMovingAverage', '/Momentum'))}
    assert weights and {name + '/ExponentialMovingAverage' for name in weights} <= saved


@pytest.fixture(scope='module')
def resumed_run(tiny_run, tmp_path_factory):
    """A copy of the shared run (12 steps) resumed to step 15 with its flags' seed, and a --fine_tune_checkpoint since
    deleted, which a run with checkpoints of its own never reads (README): (train_dir, completed process)."""
    root = tmp_path_factory.mktemp('resumed')
    resumed_dir = copy_train_dir(tiny_run, root, exports=False)
    result = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={resumed_dir}', '--max_steps=15',
                       f'--seed={tiny_run.config.flags["seed"]}', f'--fine_tune_checkpoint={root / "deleted.ckpt"}')
    return resumed_dir, result


def test_restart_resumes_from_saved_global_step_not_from_a_fine_tune_checkpoint(resumed_run):
    resumed_dir, result = resumed_run
    assert result.returncode == 0, result.stderr[-3000:]  # the deleted fine-tune checkpoint is not looked for
    assert logged_steps(result.stdout) == [14, 15]
    assert checkpoint_step(resumed_dir) == 15


def summary_images(train_dir, tag_prefix='augmented_inputs'):
    """Returns {global step: [encoded images]} of the image summaries under tag_prefix in train_dir's event files."""
    images = {}
    for name in os.listdir(train_dir):
        if name.startswith('events.out.tfevents'):
            for record in tf.compat.v1.io.tf_record_iterator(os.path.join(train_dir, name)):
                event = tf.compat.v1.Event.FromString(record)
                batch = [value.image.encoded_image_string for value in event.summary.value
                         if value.tag.startswith(tag_prefix)]
                images.setdefault(event.step, []).extend(batch)
    return {step: batch for step, batch in images.items() if batch}


def test_a_resumed_run_reads_new_batches_not_the_first_runs_again(resumed_run):
    resumed_dir, result = resumed_run
    assert result.returncode == 0, result.stderr[-3000:]
    # The augmented inputs of every step (the same seed repeats them exactly): steps 1-12 of the shared run, whose
    # event file the copy holds, and 13-15 resumed. The resumed steps' must not be the first steps' again.
    images = summary_images(resumed_dir)
    assert sorted(images) == list(range(1, 16))
    assert {len(batch) for batch in images.values()} == {3}  # README: three augmented input images a step
    first_run = {image for step in range(1, 13) for image in images[step]}
    repeated = [step for step in (13, 14, 15) if first_run & set(images[step])]
    assert repeated == [], f'the resumed steps {repeated} read batches the first run read'


def test_restart_after_kill_resumes_from_last_checkpoint(tiny_run, tmp_path):
    data_dir = tiny_run.data_dir
    train_dir = str(tmp_path / 'train')
    process = start_script('onu_train.py', *TINY_FLAGS, f'--data_dir={data_dir}', f'--train_dir={train_dir}',
                           '--max_steps=100000', '--save_checkpoint_steps=5', stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + TIMEOUT_SECS
        while time.time() < deadline:
            latest = tf.train.latest_checkpoint(train_dir)
            if latest and int(latest.rsplit('-', 1)[1]) >= 5:
                break
            time.sleep(0.5)
        else:
            pytest.fail('no checkpoint after step 5 appeared')
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    saved = checkpoint_step(train_dir)
    assert saved >= 5
    result = run_train(f'--data_dir={data_dir}', f'--train_dir={train_dir}', f'--max_steps={saved + 3}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert logged_steps(result.stdout) == [saved + 2, saved + 3]


def test_resuming_with_other_image_size_is_a_clear_error(tiny_run, tmp_path):
    train_dir = copy_train_dir(tiny_run, tmp_path)
    result = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}', '--max_steps=14',
                       '--image_size=48')
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f'error: {train_dir} holds a run with image_size=32, not 48')
    assert '--train_dir' in message
    assert checkpoint_step(train_dir) == 12
    assert 'Traceback' not in result.stderr


# Each option the training scripts themselves pass from their TrainingOptions into the graph, at a value other than
# its default (the batch size apart: the multi-GPU script's is per tower), for one step from the checkpoint at step 0
# to the one at step 1, in float32 (so that the arithmetic below holds to float32's precision).
SCRIPT_OPTIONS = {'weight_decay': 0.01, 'label_smoothing': 0.3, 'moving_average_decay': 0.05,
                  'trainable_scopes': 'SmallNet/Logits', 'optimizer': 'adam', 'augmentations': 'rotation',
                  'augment_on': 'model', 'histograms': True}
SCRIPT_OPTION_FLAGS = ('--model=small', '--image_size=32', '--max_steps=1', '--precision=float32', '--seed=1',
                       '--save_summaries_steps=1', '--save_checkpoint_secs=600',
                       *(f'--{name}' if value is True else f'--{name}={value}'
                         for name, value in SCRIPT_OPTIONS.items()))


def _graph_of_step_1(train_dir):
    """The training graph a run wrote with its checkpoint at step 1 (imported into a new graph, devices cleared)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(os.path.join(train_dir, 'model.ckpt-1.meta'), clear_devices=True)
    return graph


def _targets_for_class_0(graph):
    """The targets each cross-entropy of graph compares its logits with, when the input batch is all of class 0."""
    operations = graph.get_operations()
    labels = next(output for op in operations if op.type == 'IteratorGetNext' for output in op.outputs
                  if output.dtype.is_integer and output.shape.rank == 1)
    targets = [op.inputs[1] for op in operations if op.type == 'SoftmaxCrossEntropyWithLogits']
    with tf.compat.v1.Session(graph=graph) as session:
        return session.run(targets, {labels: np.zeros(labels.shape, labels.dtype.as_numpy_dtype)})


def assert_the_run_used_the_script_options(train_dir, batch_size, towers):
    """Asserts that the one-step run of SCRIPT_OPTION_FLAGS in train_dir (batch_size per tower) trained with each
    of SCRIPT_OPTIONS, as its checkpoints at steps 0 and 1, its event file and its graph show."""
    start, end = (tf.train.load_checkpoint(os.path.join(train_dir, f'model.ckpt-{step}')) for step in (0, 1))
    trainable = [name for name in start.get_variable_to_shape_map()
                 if name.startswith('SmallNet/') and name.rsplit('/', 1)[1] in ('weights', 'biases', 'beta', 'gamma')]
    scope = SCRIPT_OPTIONS['trainable_scopes']
    # trainable_scopes: only its variables moved; optimizer: only they have Adam's slots (no Momentum's).
    trained = sorted(name for name in trainable if not np.array_equal(start.get_tensor(name), end.get_tensor(name)))
    assert trained == sorted(name for name in trainable if name.startswith(scope + '/')) != []
    slots = {name for name in end.get_variable_to_shape_map() if name.endswith(('/Adam', '/Adam_1', '/Momentum'))}
    assert slots == {f'{name}/{slot}' for name in trained for slot in ('Adam', 'Adam_1')}
    # weight_decay: the logged regularization loss of step 1 is it times the L2 loss of the starting weights.
    tags = event_tags(train_dir)
    regularization = next(values[0] for tag, values in tags.items() if tag.endswith('losses/regularization'))
    l2 = sum(np.sum(np.square(start.get_tensor(name), dtype=np.float64)) / 2
             for name in trainable if name.endswith(('/weights', '/biases')))
    assert regularization / l2 == pytest.approx(SCRIPT_OPTIONS['weight_decay'], rel=1e-4)
    # moving_average_decay: shadow_1 = decay * shadow_0 + (1 - decay) * variable_1 (the decay is below the
    # (1 + step) / (10 + step) ExponentialMovingAverage caps it with early on).
    variable = f'{scope}/weights'
    value, shadow_0, shadow_1 = (end.get_tensor(variable), start.get_tensor(f'{variable}/ExponentialMovingAverage'),
                                 end.get_tensor(f'{variable}/ExponentialMovingAverage'))
    decay = np.sum((shadow_1 - value) * (shadow_0 - value)) / np.sum(np.square(shadow_0 - value))
    assert decay == pytest.approx(SCRIPT_OPTIONS['moving_average_decay'], rel=1e-3)
    # histograms: the activations' histograms are written.
    assert any('activations/' in tag for tag in tags), sorted(tags)
    graph = _graph_of_step_1(train_dir)
    # batch_size: each tower's cross-entropy is of that many logits; label_smoothing: its targets are smoothed.
    losses = [op for op in graph.get_operations() if op.type == 'SoftmaxCrossEntropyWithLogits']
    assert [op.inputs[0].shape[0] for op in losses] == [batch_size] * towers
    smoothing = SCRIPT_OPTIONS['label_smoothing']
    for targets in _targets_for_class_0(graph):
        np.testing.assert_allclose(targets, [[1.0 - smoothing / 2, smoothing / 2]] * batch_size, rtol=1e-6)
    # augment_on=model: the input pipeline yields the uint8 images (and draws) the graph augments itself;
    # augmentations=rotation: none of the HSV ones, which are on by default, is in the graph or its functions.
    assert tf.uint8 in [output.dtype for op in graph.get_operations() if op.type == 'IteratorGetNext'
                        for output in op.outputs]
    graph_def = graph.as_graph_def()
    op_types = {node.op for node in graph_def.node} | {
        node.op for function in graph_def.library.function for node in function.node_def}
    assert 'RGBToHSV' not in op_types


def test_every_option_the_script_passes_reaches_the_graph(tiny_data_dir, tmp_path):
    train_dir = str(tmp_path / 'options')
    result = run_script('onu_train.py', *SCRIPT_OPTION_FLAGS, '--batch_size=4', f'--data_dir={tiny_data_dir}',
                        f'--train_dir={train_dir}', timeout=TIMEOUT_SECS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_the_run_used_the_script_options(train_dir, batch_size=4, towers=1)


def test_fine_tune_with_other_class_count_uses_exclude_scopes(tiny_run, tmp_path):
    data_dir, train_dir = tiny_run.data_dir, tiny_run.train_dir
    three_class_dir = str(tmp_path / 'three')
    shutil.copytree(data_dir, three_class_dir, ignore=shutil.ignore_patterns('tfrecords'))
    for split in ('train', 'val'):
        shutil.copytree(os.path.join(three_class_dir, split, 'F603'), os.path.join(three_class_dir, split, 'F680'))

    mismatch = run_train(f'--data_dir={three_class_dir}', f'--train_dir={tmp_path / "no_exclude"}',
                         '--max_steps=1', f'--checkpoint_path={train_dir}')  # the deprecated spelling
    assert mismatch.returncode == 2
    assert mismatch.stderr.splitlines()[0] == (
        'warning: --checkpoint_path is deprecated and will be removed: use --fine_tune_checkpoint')
    message = mismatch.stderr.strip().splitlines()[-1]
    assert 'SmallNet/Logits/' in message and '--checkpoint_exclude_scopes' in message
    assert 'Traceback' not in mismatch.stderr

    tuned_dir = str(tmp_path / 'tuned')
    result = run_train(f'--data_dir={three_class_dir}', f'--train_dir={tuned_dir}', '--max_steps=1',
                       f'--fine_tune_checkpoint={train_dir}', '--checkpoint_exclude_scopes=SmallNet/Logits')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'excluded (freshly initialised): SmallNet/Logits/weights' in result.stdout
    assert 'deprecated' not in result.stderr
    assert onu_run_config.RunConfig.load(tuned_dir).num_classes == 3
    source = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
    start = tf.train.load_checkpoint(os.path.join(tuned_dir, 'model.ckpt-0'))
    np.testing.assert_array_equal(start.get_tensor('SmallNet/conv2/weights'),
                                  source.get_tensor('SmallNet/conv2/weights'))
    assert start.get_tensor('SmallNet/Logits/weights').shape[-1] == 3


def test_nan_loss_stops_with_step_and_learning_rate(tiny_run, tmp_path):
    train_dir = str(tmp_path / 'nan')
    result = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}', '--max_steps=50',
                       '--optimizer=sgd', '--learning_rate=1e30', '--learning_rate_schedule=fixed')
    assert result.returncode == 1
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith('error: loss is ')
    assert 'at step' in message and 'learning rate 1e+30' in message
    assert [kind_and_status[1] for kind_and_status in session_events(train_dir)][1:] == ['failure']
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.all(np.isfinite(value)), name


def test_missing_data_dir_is_a_one_line_error(tmp_path):
    missing = str(tmp_path / 'nowhere')
    result = run_train(f'--data_dir={missing}', f'--train_dir={tmp_path / "train"}', '--max_steps=1')
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f'error: {missing}: data dir not found; make sample data with python make_sample_data.py '
        f'--data_dir={missing}, or point --data_dir at your photos or records (README "Bring your own data")')
    assert not os.path.exists(missing)


def test_bare_class_folders_train_on_a_split_eval_keeps(make_tiny_dataset, tmp_path):
    data_dir = make_tiny_dataset(train_per_class=10)
    photos_dir = str(tmp_path / 'photos')
    for class_name in ('F603', 'F663N'):
        shutil.copytree(os.path.join(data_dir, 'train', class_name), os.path.join(photos_dir, class_name))
    val = [f'{c}/{n}' for c in ('F603', 'F663N') for n in sorted(os.listdir(os.path.join(photos_dir, c)))
           if onu_dataset.split_of(f'{c}/{n}', 30.0) == 'val']
    train_dir, eval_dir = str(tmp_path / 'train'), str(tmp_path / 'eval')
    result = run_train(f'--data_dir={photos_dir}', f'--train_dir={train_dir}', '--max_steps=2', '--model=small',
                       '--validation_percent=30', '--data_format=images')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'holding out 30% of the photos for val' in result.stdout
    assert f'on {20 - len(val)} photos of 2 classes' in result.stdout
    saved = onu_run_config.RunConfig.load(train_dir)
    assert (saved.layout, saved.validation_percent, saved.class_names) == ('class_folders', 30.0, ('F603', 'F663N'))
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--run_once',
                           '--max_mistakes=100')
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    record = json.loads(open(os.path.join(eval_dir, 'results.jsonl')).readline())
    assert record['num_examples'] == len(val) and set(record['misclassified']) <= set(val)
    other = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--run_once',
                       '--validation_percent=20')
    assert other.returncode == 2 and other.stderr.count('\n') == 1
    assert 'held out 30%' in other.stderr and 'photos it trained on' in other.stderr


def _checkpoint_dtypes(train_dir):
    """Returns {variable: dtype name} of train_dir's latest checkpoint."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(train_dir))
    return {name: dtype.name for name, dtype in reader.get_variable_to_dtype_map().items()}


def test_precision_is_printed_and_saved_and_runs_resume_in_the_other(tiny_run, tmp_path):
    data_dir, train_dir, result = tiny_run.data_dir, tiny_run.train_dir, tiny_run.result
    assert result.returncode == 0, result.stderr[-3000:]
    hardware = onu_precision.detect_hardware()
    expected, _ = onu_precision.choose_precision('auto', hardware)  # the default --precision=auto
    assert f'precision: {expected.describe()}' in result.stdout
    assert 'GPUs: none visible' in result.stdout and (hardware.cpu_model or 'unknown') in result.stdout
    run_config = onu_run_config.RunConfig.load(train_dir)
    assert (run_config.precision, run_config.compute_dtype) == (expected.name, expected.compute_dtype)
    assert run_config.flags['precision'] == 'auto' and run_config.flags['xla'] is False
    dtypes = _checkpoint_dtypes(train_dir)
    assert set(dtypes.values()) == {'float32', 'int64'} and dtypes['global_step'] == 'int64'
    assert not any('loss_scale' in name or 'good_steps' in name for name in dtypes)

    other = 'float32' if expected.name == 'mixed' else 'mixed'
    resumed_dir = copy_train_dir(tiny_run, tmp_path, 'resumed')
    resumed = run_train(f'--data_dir={data_dir}', f'--train_dir={resumed_dir}', '--max_steps=14',
                        f'--precision={other}')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert logged_steps(resumed.stdout)[-1] == 14 and checkpoint_step(resumed_dir) == 14
    assert _checkpoint_dtypes(resumed_dir) == dtypes  # the same float32 variables, whatever computed them
    if other == 'mixed' and not hardware.cpu_bfloat16_flags:  # no fast path: one warning, then float32
        warnings = [line for line in resumed.stderr.splitlines() if '--precision=mixed' in line]
        assert len(warnings) == 1 and 'training in float32 instead' in warnings[0]
        assert onu_run_config.RunConfig.load(resumed_dir).precision == 'float32'


def test_xla_trains_and_writes_the_same_variables(tiny_run, tmp_path):
    xla_dir = str(tmp_path / 'xla')
    result = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={xla_dir}', '--max_steps=3', '--xla',
                       '--precision=float32')
    assert result.returncode == 0, result.stderr[-3000:]
    assert checkpoint_step(xla_dir) == 3
    assert _checkpoint_dtypes(xla_dir) == _checkpoint_dtypes(tiny_run.train_dir)
    assert onu_run_config.RunConfig.load(xla_dir).flags['xla'] is True


@pytest.mark.parametrize('flag, choices', [('--precision=half', 'auto|float32|mixed'),
                                           ('--model=resnet', '|'.join(onu_model.MODEL_NAMES))])
def test_a_bad_precision_or_model_is_a_one_line_error(tiny_run, tmp_path, flag, choices):
    result = run_train(f'--data_dir={tiny_run.data_dir}', f'--train_dir={tmp_path / "bad"}', flag)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if flag in line]
    assert len(lines) == 1 and choices in lines[0]
    assert 'Traceback' not in result.stderr and not os.path.exists(tmp_path / 'bad')


# A line of TensorFlow's C++ log (absl format, e.g. "I0000 00:00:17.. 123 port.cc:153] ..."), absl's
# note that logging is not initialised, or a Python/TensorFlow deprecation or user warning.
NOISE_LINE = re.compile(r'^([IWEF]\d{4} \S+ +\d+ \S+:\d+\]|WARNING: All log messages|WARNING:tensorflow:)|'
                        r'deprecat|Warning:|warnings\.warn', re.IGNORECASE)


def lines_before_the_first_step(output):
    """Returns the lines of output before the first `step N, loss = ...` line."""
    lines = output.splitlines()
    first_step = next(index for index, line in enumerate(lines) if ', loss = ' in line)
    return lines[:first_step]


def test_main_job_starts_quietly_and_verbose_shows_everything(tiny_run, tmp_path):
    env = {name: value for name, value in os.environ.items() if not name.startswith(('TF_CPP', 'ONU_'))}
    args = [*TINY_FLAGS, f'--data_dir={tiny_run.data_dir}', '--max_steps=3']
    quiet = run_script('onu_train.py', *args, f'--train_dir={tmp_path / "quiet"}', env=env, fresh_process=True)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    start = lines_before_the_first_step(quiet.stdout) + quiet.stderr.splitlines()  # stderr: before any step too
    assert [line for line in start if NOISE_LINE.search(line)] == []
    assert start[0].startswith('GPUs: ') and any(line.startswith('Training small at 32x32') for line in start)
    verbose = run_script('onu_train.py', *args, f'--train_dir={tmp_path / "verbose"}', '--verbose', env=env)
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert [line for line in verbose.stderr.splitlines() if NOISE_LINE.search(line)]



# ---------------------------------------------------------------------------------------------
# Is my run starved? The input wait in the log, and a profile for TensorBoard's Profile tab.

STARVED_STEPS, PROFILED = 22, (12, 20)


@pytest.fixture(scope='module')
def starved_and_cached(tmp_path_factory):
    """Two runs on 16 photos of 3000x2000 read as images at 64x64, batch 8: decoding every step (starved), and from
    the decoded-epoch cache in memory; steps 12-28 of each profiled. Returns {'off': (train_dir, result), 'memory': ...}."""
    root = tmp_path_factory.mktemp('starved')
    data_dir = str(root / 'big')
    made = run_script('make_sample_data.py', f'--data_dir={data_dir}', '--train_per_class=8', '--val_per_class=1',
                      '--photo_size=3000x2000')
    assert made.returncode == 0, made.stderr
    runs = {}
    for cache in ('off', 'memory'):
        train_dir = str(root / f'train_{cache}')
        runs[cache] = (train_dir, run_script(
            'onu_train.py', f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--data_format=images',
            f'--cache_decoded_epoch={cache}', '--image_size=64', '--batch_size=8', '--model=small',
            '--log_frequency=2', f'--max_steps={STARVED_STEPS}', f'--profile_steps={PROFILED[0]},{PROFILED[1]}',
            timeout=TIMEOUT_SECS))
        assert runs[cache][1].returncode == 0, runs[cache][1].stderr[-3000:]
    return runs


def _logged_waits(stdout, first_step):
    """The logged input wait fractions of the steps from first_step on."""
    return [int(wait) / 100 for step, wait in re.findall(r'step (\d+), loss = .*; (\d+)% waiting for input', stdout)
            if int(step) >= first_step]


def _input_share(server):
    """The Profile tab's input pipeline analyzer over HTTP: (its step names, input time / step time)."""
    runs = server.wait_for_json('/data/plugin/profile/runs', bool, 'a profile run')
    assert len(runs) == 1, runs
    assert 'input_pipeline_analyzer' in server.get_json('/data/plugin/profile/run_tools', run=runs[0])
    hosts = server.get_json('/data/plugin/profile/hosts', run=runs[0], tag='input_pipeline_analyzer')
    table = server.get_json('/data/plugin/profile/data', run=runs[0], tag='input_pipeline_analyzer',
                            host=hosts[0]['hostname'])[1]
    columns = [column['id'] for column in table['cols']]
    steps = [row['c'][0]['v'] for row in table['rows']]
    input_ms = sum(row['c'][columns.index('infeedTimeMs')]['v'] for row in table['rows'])
    step_ms = sum(row['c'][columns.index('stepTimeMs')]['v'] for row in table['rows'])
    return steps, input_ms / step_ms


def test_a_starved_run_says_so_in_its_log_and_its_profile_and_a_cached_one_does_not(starved_and_cached,
                                                                                   tensorboard_server):
    off, on = starved_and_cached['off'], starved_and_cached['memory']
    for train_dir, result in (off, on):
        assert f'Profiled steps {PROFILED[0]}-{PROFILED[1]} into {train_dir}' in result.stdout
        assert 'DT_UINT8' not in result.stderr  # oneDNN's note on uint8 is dropped with the start-up lines
    assert 'Decoding the first epoch' not in off[1].stdout and 'Decoding the first epoch' in on[1].stdout
    starved, cached = _logged_waits(off[1].stdout, 10), _logged_waits(on[1].stdout, 10)
    assert len(starved) == len(cached) == (STARVED_STEPS - 10) // 2 + 1  # steps 10, 12, ..., STARVED_STEPS
    # Against each other, not a fixed share: a loaded machine slows the cached run's input too.
    assert np.median(starved) > 0.3 and np.median(cached) < np.median(starved) / 3, (starved, cached)
    works = {cache: [int(work) for work in re.findall(r'input work (-?\d+) ms per batch', result.stdout)]
             for cache, (_, result) in starved_and_cached.items()}
    assert all(len(works[cache]) >= STARVED_STEPS // 4 and min(works[cache]) >= 0 for cache in works), works  # half the lines
    assert np.median(works['off']) > 10 * np.median(works['memory']), works  # decoding 3000x2000 photos, every step
    assert 'on 16 photos of 2 classes' in off[1].stdout  # photos, not 'images examples'
    shares = {}
    for cache, (train_dir, _) in starved_and_cached.items():
        steps, shares[cache] = _input_share(tensorboard_server(logdir=train_dir))
        # The Profile tab drops the first and the last step it recorded.
        assert steps == [f'train {step}' for step in range(PROFILED[0] + 1, PROFILED[1])]
    assert shares['off'] > 0.3 and shares['memory'] < shares['off'] / 3, shares


def test_the_input_pipeline_analyzer_renders_in_a_headless_browser(starved_and_cached, tensorboard_server, tmp_path):
    chromium = shutil.which('chromium')
    if chromium is None:
        pytest.skip('chromium is not installed (apt-get install chromium; .ci/run installs it)')
    train_dir = starved_and_cached['off'][0]
    server = tensorboard_server(logdir=train_dir)
    _input_share(server)  # loaded
    run = server.get_json('/data/plugin/profile/runs')[0]
    page = (f'{server.url}/data/plugin/profile/index.html?tool=input_pipeline_analyzer&run={run}&host='
            f'{server.get_json("/data/plugin/profile/hosts", run=run, tag="input_pipeline_analyzer")[0]["hostname"]}')
    dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f'--user-data-dir={tmp_path / "chromium"}',
                          '--virtual-time-budget=25000', '--dump-dom', page],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'Summary of input-pipeline analysis' in dom.stdout
    assert re.search(r'HIGHLY input-bound because \d+\.\d% of the total step time sampled is waiting for input',
                     dom.stdout), dom.stdout[-3000:]


@pytest.mark.parametrize('value, steps', [('7', None), ('9,3', None), ('0,4', None), ('a,b', None), ('1,-2', None),
                                          ('3,3', (3, 3)), ('100, 110', (100, 110))])
def test_profile_steps_are_start_and_stop_with_1_at_least_and_start_first(value, steps):
    assert onu_training.parse_profile_steps(value) == steps


def test_a_bad_profile_steps_value_is_one_line(tmp_path):
    value = '9,3'  # the script's flag check; the values it refuses are parse_profile_steps's
    result = run_train(f'--train_dir={tmp_path / "train"}', f'--profile_steps={value}')
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if f'--profile_steps={value}' in line]
    assert len(lines) == 1 and 'START,STOP' in lines[0] and 'Traceback' not in result.stderr
    assert not os.path.exists(tmp_path / 'train')


def test_the_decoded_epoch_fills_with_a_progress_bar_on_a_terminal(tiny_run, tmp_path):
    code, output = run_on_a_terminal(
        'onu_train.py', *TINY_FLAGS, f'--data_dir={tiny_run.data_dir}', f'--train_dir={tmp_path / "train"}',
        '--max_steps=2', '--cache_decoded_epoch=on')  # the old spelling of memory
    assert code == 0, output
    assert 'decoding the first epoch into memory' in output and '/16 [' in output
    assert output.count('--cache_decoded_epoch=on is now spelled --cache_decoded_epoch=memory.') == 1
