"""Tests of onu_model: the batch-norm work-around, the registry and every model in it (also called as TF-slim's
nets are), the loss, the train op, moving averages, the float16 optimizer."""

import dataclasses
import importlib
import inspect
import math
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_slim as slim

from onu_lib import onu_checkpoint
import onu_model
from onu_lib import onu_precision

IRV2 = 'inception_resnet_v2'
# The side of the inputs a model takes a train step on where it is not 32 (Inception-ResNet-v2's reductions
# need 75x75 at least).
TRAIN_STEP_SIZE = {IRV2: 75}

# The published inception_resnet_v2_2016_08_30.ckpt, written as its convolutions:
# "scope kernel_height kernel_width input_depth output_depth", scopes relative to InceptionResnetV2/.
# Every convolution has weights and batch norm without scale (beta, moving_mean, moving_variance),
# except the residual projections marked "+bias": weights and biases, no batch norm.
# {i} stands for the block number within its Repeat scope.
STEM_AND_REDUCTIONS = """
Conv2d_1a_3x3 3 3 3 32
Conv2d_2a_3x3 3 3 32 32
Conv2d_2b_3x3 3 3 32 64
Conv2d_3b_1x1 1 1 64 80
Conv2d_4a_3x3 3 3 80 192
Mixed_5b/Branch_0/Conv2d_1x1 1 1 192 96
Mixed_5b/Branch_1/Conv2d_0a_1x1 1 1 192 48
Mixed_5b/Branch_1/Conv2d_0b_5x5 5 5 48 64
Mixed_5b/Branch_2/Conv2d_0a_1x1 1 1 192 64
Mixed_5b/Branch_2/Conv2d_0b_3x3 3 3 64 96
Mixed_5b/Branch_2/Conv2d_0c_3x3 3 3 96 96
Mixed_5b/Branch_3/Conv2d_0b_1x1 1 1 192 64
Mixed_6a/Branch_0/Conv2d_1a_3x3 3 3 320 384
Mixed_6a/Branch_1/Conv2d_0a_1x1 1 1 320 256
Mixed_6a/Branch_1/Conv2d_0b_3x3 3 3 256 256
Mixed_6a/Branch_1/Conv2d_1a_3x3 3 3 256 384
Mixed_7a/Branch_0/Conv2d_0a_1x1 1 1 1088 256
Mixed_7a/Branch_0/Conv2d_1a_3x3 3 3 256 384
Mixed_7a/Branch_1/Conv2d_0a_1x1 1 1 1088 256
Mixed_7a/Branch_1/Conv2d_1a_3x3 3 3 256 288
Mixed_7a/Branch_2/Conv2d_0a_1x1 1 1 1088 256
Mixed_7a/Branch_2/Conv2d_0b_3x3 3 3 256 288
Mixed_7a/Branch_2/Conv2d_1a_3x3 3 3 288 320
Conv2d_7b_1x1 1 1 2080 1536
AuxLogits/Conv2d_1b_1x1 1 1 1088 128
AuxLogits/Conv2d_2a_5x5 5 5 128 768
"""
BLOCK35 = """
Repeat/block35_{i}/Branch_0/Conv2d_1x1 1 1 320 32
Repeat/block35_{i}/Branch_1/Conv2d_0a_1x1 1 1 320 32
Repeat/block35_{i}/Branch_1/Conv2d_0b_3x3 3 3 32 32
Repeat/block35_{i}/Branch_2/Conv2d_0a_1x1 1 1 320 32
Repeat/block35_{i}/Branch_2/Conv2d_0b_3x3 3 3 32 48
Repeat/block35_{i}/Branch_2/Conv2d_0c_3x3 3 3 48 64
Repeat/block35_{i}/Conv2d_1x1 1 1 128 320 +bias
"""
BLOCK17 = """
Repeat_1/block17_{i}/Branch_0/Conv2d_1x1 1 1 1088 192
Repeat_1/block17_{i}/Branch_1/Conv2d_0a_1x1 1 1 1088 128
Repeat_1/block17_{i}/Branch_1/Conv2d_0b_1x7 1 7 128 160
Repeat_1/block17_{i}/Branch_1/Conv2d_0c_7x1 7 1 160 192
Repeat_1/block17_{i}/Conv2d_1x1 1 1 384 1088 +bias
"""
BLOCK8 = """
{repeat}Branch_0/Conv2d_1x1 1 1 2080 192
{repeat}Branch_1/Conv2d_0a_1x1 1 1 2080 192
{repeat}Branch_1/Conv2d_0b_1x3 1 3 192 224
{repeat}Branch_1/Conv2d_0c_3x1 3 1 224 256
{repeat}Conv2d_1x1 1 1 448 2080 +bias
"""
# (scope, input depth) of the two fully connected classifiers.
CLASSIFIERS = (('AuxLogits/Logits', 768), ('Logits/Logits', 1536))

# Keras documents its InceptionResNetV2 (ImageNet, 1000 classes, no auxiliary head) with 55,873,736
# parameters: 55,813,192 trainable plus 60,544 batch-norm statistics. TF-slim's network is the same
# plus a 1001st class (1536 weights + 1 bias) and the auxiliary head: 1088*128 + 128 (1x1 conv and
# its beta), 5*5*128*768 + 768 (5x5 conv and beta), 768*1001 + 1001 (its logits).
KERAS_INCEPTION_RESNET_V2_TRAINABLE = 55813192
AUX_HEAD_TRAINABLE = 1088 * 128 + 128 + 5 * 5 * 128 * 768 + 768 + 768 * 1001 + 1001
IRV2_1001_TRAINABLE = KERAS_INCEPTION_RESNET_V2_TRAINABLE + 1536 + 1 + AUX_HEAD_TRAINABLE  # 59,182,258

IRV2_SHAPES_299 = {
    'Conv2d_1a_3x3': [149, 149, 32], 'Conv2d_2a_3x3': [147, 147, 32], 'Conv2d_2b_3x3': [147, 147, 64],
    'MaxPool_3a_3x3': [73, 73, 64], 'Conv2d_3b_1x1': [73, 73, 80], 'Conv2d_4a_3x3': [71, 71, 192],
    'MaxPool_5a_3x3': [35, 35, 192], 'Mixed_5b': [35, 35, 320], 'Mixed_6a': [17, 17, 1088],
    'PreAuxLogits': [17, 17, 1088], 'Mixed_7a': [8, 8, 2080], 'Conv2d_7b_1x1': [8, 8, 1536],
    'global_pool': [1, 1, 1536], 'PreLogitsFlatten': [1536],
}


def published_checkpoint_variables(num_classes=1001):
    """Returns {variable name: shape} of the published checkpoint's model, from the tables above."""
    lines = STEM_AND_REDUCTIONS.split('\n')
    lines += [line.format(i=i) for i in range(1, 11) for line in BLOCK35.split('\n')]
    lines += [line.format(i=i) for i in range(1, 21) for line in BLOCK17.split('\n')]
    lines += [line.format(repeat=repeat) for repeat in [f'Repeat_2/block8_{i}/' for i in range(1, 10)] + ['Block8/']
              for line in BLOCK8.split('\n')]
    variables = {}
    for line in filter(None, lines):
        scope, height, width, depth_in, depth_out, *bias = line.split()
        prefix = f'InceptionResnetV2/{scope}/'
        variables[prefix + 'weights'] = [int(height), int(width), int(depth_in), int(depth_out)]
        if bias:
            variables[prefix + 'biases'] = [int(depth_out)]
        else:
            for name in ('beta', 'moving_mean', 'moving_variance'):
                variables[f'{prefix}BatchNorm/{name}'] = [int(depth_out)]
    for scope, depth_in in CLASSIFIERS:
        variables[f'InceptionResnetV2/{scope}/weights'] = [depth_in, num_classes]
        variables[f'InceptionResnetV2/{scope}/biases'] = [num_classes]
    return variables


def parameter_count(variables):
    """Returns the number of scalars in variables."""
    return sum(int(np.prod(v.shape.as_list())) for v in variables)


def fast_session_config():
    """A session config without Grappler: big test graphs start in seconds instead of tens of seconds."""
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def variable_values(session, variables):
    """Returns {name: value} of variables."""
    return dict(zip([v.op.name for v in variables], session.run(variables)))


@pytest.fixture(scope='module')
def models_by_slims_minimal_call():
    """Every registered model built (not run) as code written for TF-slim's nets calls them, build(images)
    inside arg_scope(), on 2 inputs of its default size, each in its own graph: {model name: (graph, logits,
    end_points)}."""
    built = {}
    for name, spec in onu_model.MODELS.items():
        graph = tf.Graph()
        with graph.as_default():
            images = tf.compat.v1.placeholder(tf.float32, [2, spec.image_size, spec.image_size, 3])
            with slim.arg_scope(spec.arg_scope()):
                built[name] = (graph, *spec.build(images))
    return built


@pytest.fixture(scope='module')
def irv2_299(models_by_slims_minimal_call):
    """Inception-ResNet-v2 as TF-slim's train_image_classifier.py builds it (1001 classes, training mode) on a
    2x299x299x3 input: (graph, end_points)."""
    graph, _, end_points = models_by_slims_minimal_call[IRV2]
    assert onu_model.MODELS[IRV2].image_size == 299
    return graph, end_points


# --- the TF 2.21 batch-norm work-around ---

def test_batch_norm_workaround_makes_slim_batch_norm_normalize_and_update_statistics():
    alias = sys.modules.get('tf_keras.legacy_tf_layers.normalization')
    assert alias is importlib.import_module('tf_keras.src.legacy_tf_layers.normalization')
    with tf.Graph().as_default():
        values = np.random.RandomState(0).normal(3.0, 2.0, [16, 4, 4, 5]).astype(np.float32)
        outputs = slim.batch_norm(tf.constant(values), decay=0.5, is_training=True, scope='bn')
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        moving_mean = tf.compat.v1.global_variables('bn/moving_mean')[0]
        assert len(update_ops) == 2
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            normalized, _ = session.run([outputs, update_ops])
            mean_after_update = session.run(moving_mean)
    np.testing.assert_allclose(normalized.mean(axis=(0, 1, 2)), 0.0, atol=1e-4)
    np.testing.assert_allclose(normalized.std(axis=(0, 1, 2)), 1.0, atol=1e-3)
    np.testing.assert_allclose(mean_after_update, 0.5 * values.mean(axis=(0, 1, 2)), rtol=1e-4)


def test_building_a_model_leaves_tensorflow_settings_as_they_were():
    control_flow_v2 = tf.compat.v1.control_flow_v2_enabled()
    with tf.Graph().as_default():
        onu_model.inference(tf.zeros([1, 32, 32, 3]), 2, 'small', is_training=True)
    assert tf.compat.v1.control_flow_v2_enabled() == control_flow_v2
    assert isinstance(tf.constant(1) == tf.constant(1), tf.Tensor)  # TF2 elementwise equality still on


# --- the registry: every model ---

def test_every_model_has_its_own_scope_and_the_defaults_are_registered():
    scopes = [spec.scope for spec in onu_model.MODELS.values()]
    assert len(set(scopes)) == len(scopes)  # no model restores another's variables
    assert {onu_model.DEFAULT_MODEL_WITH_GPU, onu_model.DEFAULT_MODEL_WITHOUT_GPU} <= set(onu_model.MODELS)


@pytest.mark.parametrize('model_name', onu_model.MODEL_NAMES)
def test_every_registered_model_has_every_setting(model_name):
    spec = onu_model.MODELS[model_name]
    assert spec.name == model_name and callable(spec.build) and callable(spec.arg_scope)
    assert spec.image_size > 0 and spec.learning_rate > 0 and spec.weight_decay >= 0
    assert 0 < spec.dropout_keep_prob <= 1
    assert spec.prior_sec_per_step_32 > 0 and spec.prior_build_seconds > 0
    assert spec.benchmark_steps >= 1 and spec.benchmark_warmup_steps >= 0
    assert spec.classifier_scopes and all(scope.startswith(spec.scope + '/') for scope in spec.classifier_scopes)


@pytest.mark.parametrize('model_name', onu_model.MODEL_NAMES)
def test_every_model_builds_with_slims_minimal_call_under_its_scope(models_by_slims_minimal_call, model_name):
    spec = onu_model.MODELS[model_name]
    graph, logits, end_points = models_by_slims_minimal_call[model_name]
    assert logits.shape.as_list() == [2, 1001]  # TF-slim's ImageNet classes: 1000 and background
    assert end_points['Predictions'].shape.as_list() == [2, 1001]
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    assert variables and all(v.op.name.startswith(spec.scope + '/') for v in variables)
    for scope in spec.classifier_scopes:  # each ends in a layer of one output per class
        weights = [v for v in variables if v.op.name.startswith(scope + '/') and v.op.name.endswith('/weights')]
        assert weights and weights[-1].shape[-1] == 1001, scope
    assert graph.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)  # the arg scope's weight decay
    assert graph.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)  # training mode: batch-norm updates


def test_inference_builds_with_the_registry_values_not_the_builders_defaults(monkeypatch):
    small = onu_model.MODELS['small']
    variant = dataclasses.replace(small, name='small_variant', weight_decay=0.003, dropout_keep_prob=0.25)
    monkeypatch.setitem(onu_model.MODELS, variant.name, variant)
    with tf.Graph().as_default():
        images = tf.constant(np.random.RandomState(3).uniform(-1, 1, [4, 32, 32, 3]).astype(np.float32))
        _, end_points = onu_model.inference(images, 3, variant.name, is_training=True)
        decayed = [v for v in tf.compat.v1.trainable_variables() if v.op.name.endswith(('/weights', '/biases'))]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            regularization, weights, pooled, dropped_out = session.run([
                tf.compat.v1.losses.get_regularization_loss(), decayed,
                slim.flatten(end_points['global_pool']), end_points['PreLogitsFlatten']])
    assert regularization == pytest.approx(0.003 * sum((w ** 2).sum() for w in weights) / 2, rel=1e-5)
    kept = dropped_out != 0
    assert kept.any()
    np.testing.assert_allclose(dropped_out[kept] / pooled[kept], 1 / 0.25, rtol=1e-5)  # slim.dropout's 1 / keep


def test_an_unknown_model_is_one_line_naming_the_registered_ones():
    expected = f"unknown model 'resnet'; choose one of {', '.join(onu_model.MODEL_NAMES)}"
    with pytest.raises(ValueError) as error:
        onu_model.model_spec('resnet')
    assert str(error.value) == expected and '\n' not in str(error.value)
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as error:
            onu_model.inference(tf.zeros([1, 8, 8, 3]), 2, 'resnet', is_training=True)
        assert not tf.compat.v1.global_variables()  # refused before anything is built
    assert str(error.value) == expected


# --- Inception-ResNet-v2 ---

def test_irv2_called_as_tf_slim_builds_1001_class_logits_and_aux_logits(models_by_slims_minimal_call):
    _, logits, end_points = models_by_slims_minimal_call[IRV2]
    assert logits is end_points['Logits'] and logits.shape.as_list() == [2, 1001]
    assert end_points['AuxLogits'].shape.as_list() == [2, 1001]


def test_irv2_signatures_are_tf_slims_with_its_defaults():
    def parameters(function):  # in order: slim's callers pass some of them by position
        return [(name, parameter.default) for name, parameter in inspect.signature(function).parameters.items()]
    assert parameters(onu_model.inception_resnet_v2) == [
        ('inputs', inspect.Parameter.empty), ('num_classes', 1001), ('is_training', True), ('dropout_keep_prob', 0.8),
        ('reuse', None), ('scope', 'InceptionResnetV2'), ('create_aux_logits', True), ('activation_fn', tf.nn.relu)]
    assert parameters(onu_model.inception_resnet_v2_arg_scope) == [
        ('weight_decay', 0.00004), ('batch_norm_decay', 0.9997), ('batch_norm_epsilon', 0.001),
        ('activation_fn', tf.nn.relu), ('batch_norm_updates_collections', tf.compat.v1.GraphKeys.UPDATE_OPS),
        ('batch_norm_scale', False)]


def test_irv2_end_points_at_299(irv2_299):
    _, end_points = irv2_299
    shapes = {name: end_points[name].shape.as_list()[1:] for name in IRV2_SHAPES_299}
    assert shapes == IRV2_SHAPES_299
    assert set(onu_model.IRV2_END_POINTS) <= set(end_points)
    for name in ('AuxLogits', 'Logits', 'Predictions'):
        assert end_points[name].shape.as_list() == [2, 1001]


def test_irv2_trainable_parameter_count_matches_the_published_network(irv2_299):
    graph, _ = irv2_299
    table = published_checkpoint_variables()
    trainable_in_table = sum(int(np.prod(shape)) for name, shape in table.items() if 'moving_' not in name)
    assert trainable_in_table == IRV2_1001_TRAINABLE == 59182258
    assert parameter_count(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)) == 59182258
    decayed = [name for name in table if name.endswith(('/weights', '/biases'))]  # weight decay on these only
    assert len(graph.get_collection(tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES)) == len(decayed) == 290


def test_irv2_variables_have_the_published_checkpoint_names_and_shapes(irv2_299):
    graph, _ = irv2_299
    variables = {v.op.name: v.shape.as_list() for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
    model_variables = {v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.MODEL_VARIABLES)}
    expected = published_checkpoint_variables()
    assert sorted(set(variables) - set(expected)) == []
    assert sorted(set(expected) - set(variables)) == []
    assert variables == expected
    assert model_variables == set(expected)
    assert len(expected) == 908


def test_irv2_end_points_at_150_with_aux_logits():
    with tf.Graph().as_default():
        _, end_points = onu_model.inference(tf.zeros([1, 150, 150, 3]), 5, IRV2, is_training=False)
        variables = {v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()}
    expected = published_checkpoint_variables(num_classes=5)
    expected['InceptionResnetV2/AuxLogits/Conv2d_2a_5x5/weights'] = [1, 1, 128, 768]  # what the 5x5/3 pool leaves
    assert variables == expected  # inference() builds the published names
    shapes = {name: end_points[name].shape.as_list()[1:] for name in
              ('Conv2d_1a_3x3', 'MaxPool_5a_3x3', 'Mixed_5b', 'PreAuxLogits', 'Mixed_7a', 'Conv2d_7b_1x1')}
    assert shapes == {'Conv2d_1a_3x3': [74, 74, 32], 'MaxPool_5a_3x3': [16, 16, 192], 'Mixed_5b': [16, 16, 320],
                      'PreAuxLogits': [7, 7, 1088], 'Mixed_7a': [3, 3, 2080], 'Conv2d_7b_1x1': [3, 3, 1536]}
    assert end_points['AuxLogits'].shape.as_list() == [1, 5]
    assert end_points['Logits'].shape.as_list() == [1, 5]


def test_irv2_without_aux_logits_on_a_330x400_input():
    with tf.Graph().as_default():
        logits, end_points = onu_model.inference(tf.zeros([1, 330, 400, 3]), 3, IRV2, is_training=True,
                                                 create_aux_logits=False)
        names = [v.op.name for v in tf.compat.v1.global_variables()]
    assert 'AuxLogits' not in end_points
    assert not [name for name in names if '/AuxLogits/' in name]
    assert end_points['PreAuxLogits'].shape.as_list() == [1, 18, 23, 1088]
    assert end_points['Conv2d_7b_1x1'].shape.as_list() == [1, 8, 11, 1536]
    assert logits.shape.as_list() == [1, 3]


def test_irv2_base_stops_at_final_endpoint_and_rejects_bad_arguments():
    with tf.Graph().as_default():
        net, end_points = onu_model.inception_resnet_v2_base(tf.zeros([1, 299, 299, 3]), final_endpoint='Mixed_5b')
        assert net.shape.as_list() == [1, 35, 35, 320]
        assert list(end_points) == list(onu_model.IRV2_END_POINTS[:8])
        aligned, _ = onu_model.inception_resnet_v2_base(tf.zeros([1, 64, 64, 3]), final_endpoint='MaxPool_5a_3x3',
                                                        align_feature_maps=True, scope='Aligned')
        assert aligned.shape.as_list() == [1, 8, 8, 192]  # SAME padding: 64 / 2 / 2 / 2
        with pytest.raises(ValueError, match='final_endpoint'):
            onu_model.inception_resnet_v2_base(tf.zeros([1, 299, 299, 3]), final_endpoint='Mixed_9z')
        with pytest.raises(ValueError, match='output_stride'):
            onu_model.inception_resnet_v2_base(tf.zeros([1, 299, 299, 3]), output_stride=8)


def train_op_for(total_loss, global_step, num_examples_per_epoch, batch_size, optimizer='momentum',
                 learning_rate=0.01, lr_schedule='exponential', moving_average_decay=onu_model.DEFAULT_MOVING_AVERAGE_DECAY,
                 trainable_scopes=None):
    """Returns the train op the training scripts build (learning rate, optimizer, onu_model.build_train_op)."""
    rate = onu_model.make_learning_rate(global_step, learning_rate, lr_schedule, num_examples_per_epoch, batch_size)
    opt = onu_model.make_optimizer(optimizer, rate)
    grads_and_vars = opt.compute_gradients(total_loss, var_list=onu_model.variables_to_train(trainable_scopes))
    return onu_model.build_train_op(opt, grads_and_vars, global_step, moving_average_decay)


@pytest.mark.parametrize('model_name', onu_model.MODEL_NAMES)
def test_a_train_step_of_every_model_updates_weights_batch_norm_statistics_and_moving_averages(model_name):
    size = TRAIN_STEP_SIZE.get(model_name, 32)
    with tf.Graph().as_default():
        images = tf.constant(np.random.RandomState(1).uniform(-1, 1, [2, size, size, 3]).astype(np.float32))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        logits, end_points = onu_model.inference(images, 2, model_name, is_training=True)
        total_loss = onu_model.loss(logits, tf.constant([0, 1]), end_points)
        train_op = train_op_for(total_loss, global_step, 10, 2, optimizer='sgd', learning_rate=0.001,
                                lr_schedule='fixed')
        trainable = tf.compat.v1.trainable_variables()
        statistics = [v for v in tf.compat.v1.model_variables() if v.op.name.endswith('/moving_mean')]
        watched = [trainable[0], trainable[-1]] + statistics[:1]  # first layer, classifier, batch norm
        shadows = {v.op.name for v in tf.compat.v1.global_variables() if v.op.name.endswith('/ExponentialMovingAverage')}
        averaged = {v.op.name for v in onu_model.averaged_variables()}
        with tf.compat.v1.Session(config=fast_session_config()) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = variable_values(session, watched)
            _, loss_value = session.run([train_op, total_loss])
            after = variable_values(session, watched)
            step = session.run(global_step)
    assert math.isfinite(loss_value) and step == 1
    for name in before:
        assert not np.allclose(before[name], after[name]), name
    assert shadows == {name + '/ExponentialMovingAverage' for name in averaged}


# --- the small model ---

def test_small_model_shapes_at_default_and_other_sizes():
    size = onu_model.MODELS['small'].image_size
    with tf.Graph().as_default():
        logits, end_points = onu_model.inference(tf.zeros([4, size, size, 3]), 2, 'small', is_training=True)
        names = {v.op.name for v in tf.compat.v1.global_variables()}
    assert logits.shape.as_list() == [4, 2]
    assert end_points['conv4'].shape.as_list() == [4, size // 8, size // 8, onu_model.SMALL_DEPTHS[-1]]
    assert end_points['Predictions'].shape.as_list() == [4, 2]
    assert {'SmallNet/conv1/weights', 'SmallNet/conv1/BatchNorm/gamma', 'SmallNet/conv1/BatchNorm/moving_mean',
            'SmallNet/Logits/weights', 'SmallNet/Logits/biases'} <= names
    with tf.Graph().as_default():
        other, _ = onu_model.inference(tf.zeros([3, 100, 80, 3]), 7, 'small', is_training=False)
    assert other.shape.as_list() == [3, 7]


# --- loss ---

def softmax_cross_entropy(logits, onehot):
    """Mean softmax cross-entropy in numpy."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-(onehot * log_probabilities).sum(axis=1).mean())


def summary_values(session):
    """Returns {tag: value} of the scalar summaries in the default graph."""
    values = {}
    for serialized in session.run(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)):
        for value in tf.compat.v1.Summary.FromString(serialized).value:
            values[value.tag] = value.simple_value
    return values


def test_loss_adds_cross_entropy_aux_and_regularization():
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0]], np.float32)
    aux_logits = np.array([[0.3, 0.3, -2.0], [1.0, -1.0, 0.0]], np.float32)
    labels = np.array([0, 1])
    onehot = np.eye(3)[labels]
    with tf.Graph().as_default():
        tf.compat.v1.get_variable('w', initializer=tf.constant([[3.0, 4.0]]), regularizer=slim.l2_regularizer(0.01))
        total = onu_model.loss(tf.constant(logits), tf.constant(labels), {'AuxLogits': tf.constant(aux_logits)})
        parts = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            total_value, part_values = session.run([total, parts])
            summaries = summary_values(session)
    regularization = 0.01 * (9.0 + 16.0) / 2  # slim's l2 regularizer: scale * sum(w^2) / 2
    cross_entropy = softmax_cross_entropy(logits, onehot)
    aux = onu_model.AUX_LOSS_WEIGHT * softmax_cross_entropy(aux_logits, onehot)
    assert total_value == pytest.approx(cross_entropy + aux + regularization, rel=1e-5)
    assert part_values == pytest.approx([cross_entropy, aux], rel=1e-5)
    assert summaries == pytest.approx({'losses/cross_entropy': cross_entropy, 'losses/aux_cross_entropy': aux,
                                       'losses/regularization': regularization,
                                       'losses/total': cross_entropy + aux + regularization}, rel=1e-5)


def test_loss_label_smoothing_and_no_regularization():
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 3.0]], np.float32)
    labels = np.array([2, 1])
    smoothed = np.eye(3)[labels] * 0.9 + 0.1 / 3
    with tf.Graph().as_default():
        total = onu_model.loss(tf.constant(logits), tf.constant(labels), {'Logits': tf.constant(logits)},
                               label_smoothing=0.1)
        with tf.compat.v1.Session() as session:
            total_value = session.run(total)
            summaries = summary_values(session)
    assert total_value == pytest.approx(softmax_cross_entropy(logits, smoothed), rel=1e-5)
    assert summaries['losses/regularization'] == 0.0
    assert 'losses/aux_cross_entropy' not in summaries


# --- train op, learning rate, optimizers, moving averages ---

def build_small_training(batch_size=8, **train_args):
    """Builds the small model on a fixed random batch and its train op; returns (train_op, total_loss, global_step)."""
    rng = np.random.RandomState(2)
    images = tf.constant(rng.uniform(-1, 1, [batch_size, 32, 32, 3]).astype(np.float32))
    labels = tf.constant(rng.randint(0, 2, batch_size).astype(np.int32))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    logits, end_points = onu_model.inference(images, 2, 'small', is_training=True)
    total_loss = onu_model.loss(logits, labels, end_points)
    train_op = train_op_for(total_loss, global_step, num_examples_per_epoch=40, batch_size=batch_size, **train_args)
    return train_op, total_loss, global_step


def small_variables(*names):
    """Returns the small model's variables called SmallNet/<name>."""
    return [tf.compat.v1.global_variables(f'SmallNet/{name}')[0] for name in names]


def test_train_op_changes_weights_runs_batch_norm_updates_and_keeps_moving_averages():
    decay = 0.9999
    with tf.Graph().as_default():
        train_op, _, global_step = build_small_training(moving_average_decay=decay)
        watched = small_variables('conv1/weights', 'conv1/BatchNorm/moving_mean', 'conv4/BatchNorm/moving_variance',
                                  'Logits/weights')
        shadows = [tf.compat.v1.global_variables(v.op.name + '/ExponentialMovingAverage')[0] for v in watched]
        shadow_names = {v.op.name for v in tf.compat.v1.global_variables() if 'ExponentialMovingAverage' in v.op.name}
        averaged_names = {v.op.name for v in tf.compat.v1.trainable_variables()}
        averaged_names |= {v.op.name for v in tf.compat.v1.global_variables()
                           if v.op.name.endswith(('moving_mean', 'moving_variance'))}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(watched)
            session.run(train_op)
            after, shadow_values, step = session.run([watched, shadows, global_step])
    assert step == 1
    for name, old, new in zip(['weights', 'moving_mean', 'moving_variance', 'logits'], before, after):
        assert not np.allclose(old, new), name
    assert shadow_names == {name + '/ExponentialMovingAverage' for name in averaged_names}
    # With num_updates=global_step the first update decays by min(decay, (1 + 1) / (10 + 1)).
    first_decay = min(decay, 2 / 11)
    for old, new, shadow in zip(before, after, shadow_values):
        np.testing.assert_allclose(shadow, first_decay * old + (1 - first_decay) * new, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('optimizer', onu_model.OPTIMIZER_NAMES)
def test_each_optimizer_lowers_the_loss_on_a_fixed_batch(optimizer):
    learning_rate = {'adam': 0.01, 'rmsprop': 0.01}.get(optimizer, 0.05)
    with tf.Graph().as_default():
        train_op, total_loss, _ = build_small_training(optimizer=optimizer, learning_rate=learning_rate,
                                                       moving_average_decay=None)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            losses = [session.run([train_op, total_loss])[1] for _ in range(15)]
    assert np.mean(losses[-3:]) < losses[0]


def test_make_optimizer_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown optimizer 'adagrad'; choose one of momentum, sgd, rmsprop, adam"):
        onu_model.make_optimizer('adagrad', 0.1)


def test_learning_rate_schedules():
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # 100 examples / batch 10 = 10 steps an epoch; a decay every 2 epochs = every 20 steps.
        exponential = onu_model.make_learning_rate(global_step, 0.1, 'exponential', num_examples_per_epoch=100,
                                                   batch_size=10, num_epochs_per_decay=2.0, decay_factor=0.5)
        assert exponential.name == 'learning_rate:0'
        fixed = onu_model.make_learning_rate(global_step, 0.03, 'fixed')
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            rates = {}
            for step in (0, 19, 20, 45):
                session.run(global_step.assign(step))
                rates[step] = session.run([exponential, fixed])
        with pytest.raises(ValueError, match='num_examples_per_epoch'):
            onu_model.make_learning_rate(global_step, 0.1, 'exponential')
        with pytest.raises(ValueError, match="unknown learning-rate schedule 'cosine'"):
            onu_model.make_learning_rate(global_step, 0.1, 'cosine')
    assert rates == {0: pytest.approx([0.1, 0.03]), 19: pytest.approx([0.1, 0.03]),
                     20: pytest.approx([0.05, 0.03]), 45: pytest.approx([0.025, 0.03])}


def test_trainable_scopes_freeze_the_rest_but_batch_norm_statistics_still_update():
    with tf.Graph().as_default():
        train_op, _, _ = build_small_training(trainable_scopes='SmallNet/Logits, SmallNet/conv4')
        assert [v.op.name for v in onu_model.variables_to_train(['SmallNet/conv4/'])] == [
            'SmallNet/conv4/weights', 'SmallNet/conv4/BatchNorm/gamma', 'SmallNet/conv4/BatchNorm/beta']
        with pytest.raises(ValueError, match="trainable scope 'SmallNet/conv9' matches no trainable variable"):
            onu_model.variables_to_train('SmallNet/conv9')
        watched = small_variables('conv1/weights', 'conv1/BatchNorm/moving_mean', 'conv4/weights', 'Logits/weights')
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(watched)
            session.run(train_op)
            after = session.run(watched)
    changed = [not np.allclose(old, new) for old, new in zip(before, after)]
    assert changed == [False, True, True, True]


def test_variables_to_restore_loads_the_moving_averages_a_checkpoint_holds(tmp_path):
    averaged_path = str(tmp_path / 'averaged' / 'model.ckpt')
    plain_path = str(tmp_path / 'plain' / 'model.ckpt')
    for path, decay in ((averaged_path, 0.9999), (plain_path, None)):
        with tf.Graph().as_default():
            train_op, _, _ = build_small_training(moving_average_decay=decay)
            saver = tf.compat.v1.train.Saver()
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                for _ in range(3):
                    session.run(train_op)
                saver.save(session, path)
    averaged = tf.train.load_checkpoint(averaged_path)
    plain = tf.train.load_checkpoint(plain_path)
    for path, reader, suffix in ((averaged_path, averaged, '/ExponentialMovingAverage'), (plain_path, plain, '')):
        with tf.Graph().as_default():
            onu_model.inference(tf.zeros([1, 32, 32, 3]), 2, 'small', is_training=False)
            restore = onu_checkpoint.variables_to_restore(0.9999, checkpoint_path=path)
            conv1, moving_mean = small_variables('conv1/weights', 'conv1/BatchNorm/moving_mean')
            assert restore['SmallNet/conv1/weights' + suffix] is conv1
            assert restore['SmallNet/conv1/BatchNorm/moving_mean' + suffix] is moving_mean
            with tf.compat.v1.Session() as session:
                tf.compat.v1.train.Saver(restore).restore(session, path)
                conv1_value, mean_value = session.run([conv1, moving_mean])
        np.testing.assert_array_equal(conv1_value, reader.get_tensor('SmallNet/conv1/weights' + suffix))
        np.testing.assert_array_equal(mean_value, reader.get_tensor('SmallNet/conv1/BatchNorm/moving_mean' + suffix))
    assert not np.array_equal(averaged.get_tensor('SmallNet/conv1/weights/ExponentialMovingAverage'),
                              averaged.get_tensor('SmallNet/conv1/weights'))
    with tf.Graph().as_default():
        onu_model.inference(tf.zeros([1, 32, 32, 3]), 2, 'small', is_training=False)
        assert 'SmallNet/Logits/biases/ExponentialMovingAverage' in onu_checkpoint.variables_to_restore(0.9999)
        assert 'SmallNet/Logits/biases' in onu_checkpoint.variables_to_restore(None)


def test_variables_to_restore_in_a_training_graph_maps_each_variable_once():
    with tf.Graph().as_default():
        build_small_training()
        restore = onu_checkpoint.variables_to_restore(0.9999)
        conv1 = small_variables('conv1/weights')[0]
    assert restore['SmallNet/conv1/weights/ExponentialMovingAverage'] is conv1
    assert len(set(map(id, restore.values()))) == len(restore)
    assert not [name for name, var in restore.items() if var.op.name.endswith('ExponentialMovingAverage')]


# ---------------------------------------------------------------------------------------------
# The float16 optimizer.

def _loss_scaled_step(initial_loss_scale, checkpoint_prefix, loss_factor=1.0):
    """One float16-path training step of a tiny model on the CPU, then a checkpoint at checkpoint_prefix.

    loss_factor multiplies the loss, so that a large loss scale overflows it. Returns (weights before,
    weights after, loss scale before, loss scale after, loss), the weights of every trainable variable.
    """
    with tf.Graph().as_default():
        images = tf.constant(np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)), tf.float32)
        labels = tf.constant([0, 1, 0, 1])
        global_step = tf.compat.v1.train.get_or_create_global_step()
        logits, end_points = onu_model.inference(images, 2, 'small', is_training=True)
        total_loss = onu_model.loss(logits, labels, end_points) * loss_factor
        optimizer = onu_model.loss_scaled(tf.compat.v1.train.GradientDescentOptimizer(0.1), 'float16',
                                          initial_loss_scale=initial_loss_scale)
        train_op = onu_model.build_train_op(optimizer, optimizer.compute_gradients(total_loss), global_step)
        weights = tf.concat([tf.reshape(v, [-1]) for v in tf.compat.v1.trainable_variables()], 0)
        scale = optimizer._loss_scale()  # pylint: disable=protected-access
        assert not any('loss_scale' in v.op.name or 'good_steps' in v.op.name
                       for v in tf.compat.v1.global_variables())
        assert any('current_loss_scale' in v.op.name for v in tf.compat.v1.local_variables())
        saver = tf.compat.v1.train.Saver()
        config = onu_precision.set_precision_options(tf.compat.v1.ConfigProto(), 'float16')
        with tf.compat.v1.Session(config=config) as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            before, scale_before = sess.run([weights, scale])
            _, loss = sess.run([train_op, total_loss])
            after, scale_after = sess.run([weights, scale])
            saver.save(sess, checkpoint_prefix)
    return before, after, scale_before, scale_after, loss


def test_float16_loss_scaling_skips_an_overflowing_step_without_error(tmp_path):
    """The GPU's float16 path, run on the CPU: the optimizer wrapping and the loss-scale variables."""
    prefix = str(tmp_path / 'overflow' / 'model.ckpt')
    # 2^127 x a loss of about 700 overflows float32: the scaled gradients are not finite.
    before, after, scale_before, scale_after, loss = _loss_scaled_step(2.0 ** 127, prefix, loss_factor=1000.0)
    assert np.isfinite(loss)
    np.testing.assert_array_equal(before, after)  # skipped, not applied as inf/NaN
    assert scale_after == scale_before / 2
    names = [name for name, _ in tf.train.list_variables(prefix)]
    assert 'global_step' in names and not any('loss_scale' in name or 'good_steps' in name for name in names)
    before, after, scale_before, scale_after, loss = _loss_scaled_step(2.0 ** 10, str(tmp_path / 'ok' / 'model.ckpt'))
    assert np.isfinite(loss) and not np.array_equal(before, after) and scale_after == scale_before
    assert np.isfinite(after).all()
