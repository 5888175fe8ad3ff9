"""Tests of onu_multi_gpu_train.py: the tower logic in-process, then the real script on tiny data.

Without GPUs the towers run on the CPU, which is how the tower logic is tested here.
"""
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

from conftest import LAYOUT_CLASSES, layout_photos, run_script, write_layout, session_events
from test_onu_train import (SCRIPT_OPTION_FLAGS, TIMEOUT_SECS, assert_logged_speeds_count,
                             assert_the_run_used_the_script_options, checkpoint_step, event_tags)

from onu_lib import onu_sample_data
import onu_input
import onu_model
import onu_multi_gpu_train
from onu_lib import onu_run_config

TINY_FLAGS = ['--image_size=32', '--batch_size=2', '--log_frequency=1', '--save_summaries_steps=1',
              '--save_checkpoint_secs=600']


def device_type(device):
    """Returns 'CPU' or 'GPU' of a device string."""
    return tf.DeviceSpec.from_string(device).device_type


def linear_conv_loss(images, labels):
    """A model without batch norm or dropout: conv + linear layer, cross-entropy plus weight decay."""
    with slim.arg_scope([slim.conv2d, slim.fully_connected],
                        weights_regularizer=slim.l2_regularizer(0.05), activation_fn=None):
        net = slim.conv2d(images, 4, 3, scope='conv')
        net = slim.flatten(tf.nn.relu(net))
        logits = slim.fully_connected(net, 3, scope='logits')
    return onu_model.loss(logits, labels)


def test_two_towers_on_half_batches_average_to_the_whole_batch_gradient():
    rng = np.random.default_rng(0)
    with tf.Graph().as_default():
        images = tf.constant(rng.uniform(-1, 1, (8, 6, 6, 3)), tf.float32)
        labels = tf.constant(rng.integers(0, 3, 8), tf.int32)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        tower_grads, tower_losses = onu_multi_gpu_train.tower_gradients(
            optimizer, linear_conv_loss, (images, labels), ['/cpu:0', '/cpu:0'])
        averaged = onu_multi_gpu_train.average_gradients(tower_grads)
        variables = tf.compat.v1.trainable_variables()
        # The same variables on the whole batch, as one-tower training computes it.
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=True):
            whole_loss = linear_conv_loss(images, labels)
        whole_grads = tf.gradients(whole_loss, variables)
        regularization = tf.compat.v1.losses.get_regularization_loss()

        assert [v.op.name for v in variables] == ['conv/weights', 'conv/biases', 'logits/weights',
                                                  'logits/biases']  # created once, shared
        assert all(device_type(v.device) == 'CPU' for v in variables)
        assert [var for _, var in averaged] == variables
        assert tower_losses[0].op.name.startswith('tower_0/') and tower_losses[1].op.name.startswith('tower_1/')
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            averaged_values, whole_values, reg = sess.run(
                ([grad for grad, _ in averaged], whole_grads, regularization))
    assert reg > 0.01  # the weight decay is part of each tower's loss, so it must count once
    for variable, mean, whole in zip(variables, averaged_values, whole_values):
        assert np.abs(whole).max() > 0, variable.op.name
        np.testing.assert_allclose(mean, whole, rtol=1e-5, atol=1e-7, err_msg=variable.op.name)


def test_average_gradients_keeps_missing_gradients_and_rejects_mismatched_towers():
    with tf.Graph().as_default():
        a = tf.Variable(1.0, name='a')
        b = tf.Variable(2.0, name='b')
        averaged = onu_multi_gpu_train.average_gradients(
            [[(tf.constant(1.0), a), (None, b)], [(tf.constant(3.0), a), (None, b)]])
        assert averaged[1] == (None, b)
        with tf.compat.v1.Session() as sess:
            assert sess.run(averaged[0][0]) == 2.0
        with pytest.raises(ValueError, match='different variables'):
            onu_multi_gpu_train.average_gradients([[(tf.constant(1.0), a)], [(tf.constant(1.0), b)]])
        with pytest.raises(ValueError, match='only some towers'):
            onu_multi_gpu_train.average_gradients([[(tf.constant(1.0), a)], [(None, a)]])


def test_tower_devices_use_the_gpus_or_else_the_cpu():
    assert onu_multi_gpu_train.tower_devices(2, 0) == ['/cpu:0', '/cpu:0']
    assert onu_multi_gpu_train.tower_devices(2, 4) == ['/gpu:0', '/gpu:1']
    with pytest.raises(ValueError, match='2 GPU'):
        onu_multi_gpu_train.tower_devices(4, 2)
    with tf.Graph().as_default():
        with tf.compat.v1.device(onu_multi_gpu_train.tower_device_function('/gpu:1')):
            variable = tf.compat.v1.get_variable('w', [2])
            product = variable * 2.0
    assert (device_type(variable.device), device_type(product.device)) == ('CPU', 'GPU')
    assert tf.DeviceSpec.from_string(product.device).device_index == 1


def test_augmentation_on_the_model_builds_on_each_tower_device():
    """--augment_on=model: the uint8 slice of a tower is augmented on that tower's GPU."""
    with tf.Graph().as_default():
        images = tf.zeros([4, 8, 8, 3], tf.uint8)
        draws = tf.zeros([4, onu_input.NUM_DRAWS])
        with tf.compat.v1.device(onu_multi_gpu_train.tower_device_function('/gpu:1')):
            augmented = onu_input.augment_batch(images, draws)
    assert augmented.dtype == tf.float32 and augmented.shape == (4, 8, 8, 3)
    assert device_type(augmented.device) == 'GPU'
    assert tf.DeviceSpec.from_string(augmented.device).device_index == 1


@pytest.fixture(scope='module')
def multi_gpu_run(tmp_path_factory):
    """A 6-step --num_gpus=2 run on 16 tiny photos: (data_dir, train_dir, completed process)."""
    root = tmp_path_factory.mktemp('multi_gpu')
    data_dir = str(root / 'data')
    onu_sample_data.generate_dataset(data_dir, 8, 2, (96, 72), seed=0, processes=1)
    train_dir = str(root / 'train')
    # 2 towers x 2 = 4 examples a step, 16 a epoch: the learning rate halves every 4 steps.
    result = run_script('onu_multi_gpu_train.py', *TINY_FLAGS, '--num_gpus=2', f'--data_dir={data_dir}',
                        f'--train_dir={train_dir}', '--max_steps=6', '--model=small', '--learning_rate=0.01',
                        '--num_epochs_per_decay=1', '--learning_rate_decay_factor=0.5', '--seed=1',
                        '--augment_on=model')  # each tower augments its slice (onu_train.py tests the pipeline's)
    return data_dir, train_dir, result


def test_two_towers_on_the_cpu_train_once_per_step_with_the_effective_batch(multi_gpu_run):
    _, train_dir, result = multi_gpu_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert '2 towers on the CPU (TensorFlow sees no GPU)' in result.stdout
    assert '2 examples per tower, 4 per step.' in result.stdout
    assert checkpoint_step(train_dir) == 6  # one global step per synchronous step of both towers
    waits = re.findall(r' sec/batch; (\d+)% waiting for input', result.stdout)
    assert waits and all(0 <= int(wait) <= 100 for wait in waits)
    assert_logged_speeds_count(result.stdout, 4)
    tags = event_tags(train_dir)
    rates = next(values for tag, values in tags.items() if tag.startswith('learning_rate'))
    assert set(np.round(rates, 6)) == {0.01, 0.005}  # decayed after 16 examples, i.e. 4 steps
    assert 'tower_0/losses/total' in tags and not any(tag.startswith('tower_1/') for tag in tags)
    assert any(tag.startswith('tower_0/augmented_inputs') for tag in tags), sorted(tags)
    assert 'losses_averaged/total' in tags and 'examples/sec' in tags and 'input/wait_fraction' in tags
    run_config = onu_run_config.RunConfig.load(train_dir)
    assert run_config.model == 'small' and run_config.flags['num_gpus'] == 2
    # The HParams row: the examples a step trains on, of 2 towers.
    (kind, settings), _ = session_events(train_dir)
    assert (kind, settings['batch_size'], settings['replicas']) == ('start', '4', '2')


def test_checkpoint_evaluates_and_resumes_with_the_single_gpu_script(multi_gpu_run, tmp_path):
    data_dir, train_dir, result = multi_gpu_run
    assert result.returncode == 0, result.stderr[-3000:]
    multi_gpu_variables = sorted(tf.train.list_variables(tf.train.latest_checkpoint(train_dir)))

    eval_dir = str(tmp_path / 'eval')
    evaluated = run_script('onu_eval.py', f'--checkpoint_dir={train_dir}', '--run_once', f'--eval_dir={eval_dir}')
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert 'step 6, precision @ 1 = ' in evaluated.stdout
    with open(os.path.join(eval_dir, 'results.jsonl')) as f:
        record = json.loads(f.readline())
    assert record['step'] == 6 and record['weights'] == 'moving_averages'

    resumed = run_script('onu_train.py', *TINY_FLAGS, f'--data_dir={data_dir}', f'--train_dir={train_dir}',
                         '--max_steps=8', '--model=small')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert checkpoint_step(train_dir) == 8
    # The single-GPU script restored every variable of the multi-GPU checkpoint and saved the same set.
    assert sorted(tf.train.list_variables(tf.train.latest_checkpoint(train_dir))) == multi_gpu_variables


def test_every_option_the_script_passes_reaches_each_tower(tiny_data_dir, tmp_path):
    train_dir = str(tmp_path / 'options')
    result = run_script('onu_multi_gpu_train.py', *SCRIPT_OPTION_FLAGS, '--num_gpus=2', '--batch_size=3',
                        f'--data_dir={tiny_data_dir}', f'--train_dir={train_dir}', timeout=TIMEOUT_SECS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_the_run_used_the_script_options(train_dir, batch_size=3, towers=2)


def test_towers_train_on_other_tools_records(tmp_path):
    data_dir = write_layout('tfds', str(tmp_path / 'tfds'), layout_photos())
    train_dir = str(tmp_path / 'train')
    result = run_script('onu_multi_gpu_train.py', *TINY_FLAGS, '--num_gpus=2', '--max_steps=2', '--model=small',
                        f'--data_dir={data_dir}', f'--train_dir={train_dir}')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'tfds records' in result.stdout and 'Training stopped at step 2' in result.stdout
    saved = onu_run_config.RunConfig.load(train_dir)
    assert (saved.layout, saved.class_names, saved.num_examples_per_epoch) == ('tfds', LAYOUT_CLASSES, 12)
