"""Builds the ONU classifiers, their loss and their train op (the CIFAR-10 tutorial's cifar10.py role).

Models (chosen by name), both fed float32 RGB images in [-1, 1]:
  inception_resnet_v2  Szegedy et al. 2016, "Inception-v4, Inception-ResNet and the Impact of
                       Residual Connections on Learning", with TF-slim's call signatures (defaults
                       included), scope, end-point and variable names, so code written for slim's nets
                       runs on it and the published inception_resnet_v2_2016_08_30.ckpt restores.
  small                a CIFAR-10-tutorial-sized CNN with batch norm for CPUs and quick runs.
A model is one entry of MODELS (a ModelSpec: its builder, arg scope and every setting that differs between
models); the flags' defaults and help, the benchmark and the tests read it, so adding a model adds one entry.

    logits, end_points = inference(images, num_classes, 'small', is_training=True)
    total_loss = loss(logits, labels, end_points)
    optimizer = make_optimizer('momentum', make_learning_rate(global_step, 0.01, 'fixed'))
    train_op = build_train_op(optimizer, optimizer.compute_gradients(total_loss), global_step)

build_train_op keeps moving averages of the weights and batch-norm statistics, which evaluation restores
through onu_checkpoint. Variables, moving averages and checkpoints stay float32 at every precision.

A library module: explicit arguments only, no flags.
"""
import collections
import dataclasses
import functools
import importlib
import sys

import tensorflow as tf
import tf_slim as slim

OPTIMIZER_NAMES = ('momentum', 'sgd', 'rmsprop', 'adam')
LR_SCHEDULES = ('exponential', 'fixed')
DEFAULT_MOVING_AVERAGE_DECAY = 0.9999
AUX_LOSS_WEIGHT = 0.4
MOVING_AVERAGE_NAME = 'ExponentialMovingAverage'  # tf.train.ExponentialMovingAverage's default
LOSS_SCALE_INITIAL = 2.0 ** 15  # TensorFlow's default for dynamic loss scaling

IRV2_SCOPE = 'InceptionResnetV2'
IRV2_END_POINTS = ('Conv2d_1a_3x3', 'Conv2d_2a_3x3', 'Conv2d_2b_3x3', 'MaxPool_3a_3x3',
                   'Conv2d_3b_1x1', 'Conv2d_4a_3x3', 'MaxPool_5a_3x3', 'Mixed_5b', 'Mixed_6a',
                   'PreAuxLogits', 'Mixed_7a', 'Conv2d_7b_1x1')

# TF 2.21's tf.compat.v1.layers (behind slim.batch_norm) lazily imports this module name, but
# tf-keras 2.21 ships the module under its src/ package; an alias under the expected name fixes it.
_KERAS_BATCH_NORM_MODULE = 'tf_keras.legacy_tf_layers.normalization'
_KERAS_BATCH_NORM_SOURCE = 'tf_keras.src.legacy_tf_layers.normalization'


def enable_slim_batch_norm():
    """Registers tf-keras's legacy batch-norm module where TF 2.21 looks for it, so slim.batch_norm works."""
    if _KERAS_BATCH_NORM_MODULE in sys.modules:
        return
    try:
        module = importlib.import_module(_KERAS_BATCH_NORM_SOURCE)
    except ImportError as e:
        raise ImportError(f'onu_model needs tf-keras matching tensorflow for batch norm ({e}); '
                          f'run: pip install -r requirements.txt') from None
    sys.modules[_KERAS_BATCH_NORM_MODULE] = module


enable_slim_batch_norm()


def _fast_graph_building(build):
    """Decorates a graph builder to run with TF1 tensor hashing and control flow, restored afterwards.

    tf-slim hashes every graph variable for each new weight, and TF2 hashing checks for eager mode each time;
    ExponentialMovingAverage builds a cond per variable, a function graph each in control flow v2. Same graph.
    """
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        if tf.executing_eagerly():
            return build(*args, **kwargs)
        equality_was_enabled = getattr(tf.Tensor, '_USE_EQUALITY', False)
        control_flow_v2_was_enabled = tf.compat.v1.control_flow_v2_enabled()
        tf.compat.v1.disable_tensor_equality()
        tf.compat.v1.disable_control_flow_v2()
        try:
            return build(*args, **kwargs)
        finally:
            if equality_was_enabled:
                tf.compat.v1.enable_tensor_equality()
            if control_flow_v2_was_enabled:
                tf.compat.v1.enable_control_flow_v2()
    return wrapper


# ---------------------------------------------------------------------------------------------
# Inception-ResNet-v2
# ---------------------------------------------------------------------------------------------

# One layer of a tower. depth is the number of filters of a convolution, or 'max'/'avg' for a
# pooling layer; padding None means the caller's reduction padding (VALID, or SAME when the
# feature maps are aligned).
_Layer = collections.namedtuple('_Layer', 'scope depth kernel stride padding')
_Layer.__new__.__defaults__ = (1, 'SAME')

_POOLS = {'max': slim.max_pool2d, 'avg': slim.avg_pool2d}

# Branches of the residual blocks (paper figures 16, 17 and 19, TF-slim's widths).
_BLOCK35_BRANCHES = (
    (_Layer('Conv2d_1x1', 32, 1),),
    (_Layer('Conv2d_0a_1x1', 32, 1), _Layer('Conv2d_0b_3x3', 32, 3)),
    (_Layer('Conv2d_0a_1x1', 32, 1), _Layer('Conv2d_0b_3x3', 48, 3), _Layer('Conv2d_0c_3x3', 64, 3)),
)
_BLOCK17_BRANCHES = (
    (_Layer('Conv2d_1x1', 192, 1),),
    (_Layer('Conv2d_0a_1x1', 128, 1), _Layer('Conv2d_0b_1x7', 160, [1, 7]),
     _Layer('Conv2d_0c_7x1', 192, [7, 1])),
)
_BLOCK8_BRANCHES = (
    (_Layer('Conv2d_1x1', 192, 1),),
    (_Layer('Conv2d_0a_1x1', 192, 1), _Layer('Conv2d_0b_1x3', 224, [1, 3]),
     _Layer('Conv2d_0c_3x1', 256, [3, 1])),
)
_MIXED_5B_BRANCHES = (
    (_Layer('Conv2d_1x1', 96, 1),),
    (_Layer('Conv2d_0a_1x1', 48, 1), _Layer('Conv2d_0b_5x5', 64, 5)),
    (_Layer('Conv2d_0a_1x1', 64, 1), _Layer('Conv2d_0b_3x3', 96, 3), _Layer('Conv2d_0c_3x3', 96, 3)),
    (_Layer('AvgPool_0a_3x3', 'avg', 3), _Layer('Conv2d_0b_1x1', 64, 1)),
)
# (name, residual branches, repeats, scale) of the three stacks of residual blocks.
_BLOCK35 = ('block35', _BLOCK35_BRANCHES, 10, 0.17)
_BLOCK17 = ('block17', _BLOCK17_BRANCHES, 20, 0.10)
_BLOCK8 = ('block8', _BLOCK8_BRANCHES, 9, 0.20)


def _reduction_a_branches(stride):
    """Returns the branches of Mixed_6a (35x35 -> 17x17, paper figure 7 with k=l=256, m=n=384)."""
    return (
        (_Layer('Conv2d_1a_3x3', 384, 3, stride, None),),
        (_Layer('Conv2d_0a_1x1', 256, 1), _Layer('Conv2d_0b_3x3', 256, 3),
         _Layer('Conv2d_1a_3x3', 384, 3, stride, None)),
        (_Layer('MaxPool_1a_3x3', 'max', 3, stride, None),),
    )


_REDUCTION_B_BRANCHES = (  # Mixed_7a (17x17 -> 8x8, paper figure 18)
    (_Layer('Conv2d_0a_1x1', 256, 1), _Layer('Conv2d_1a_3x3', 384, 3, 2, None)),
    (_Layer('Conv2d_0a_1x1', 256, 1), _Layer('Conv2d_1a_3x3', 288, 3, 2, None)),
    (_Layer('Conv2d_0a_1x1', 256, 1), _Layer('Conv2d_0b_3x3', 288, 3),
     _Layer('Conv2d_1a_3x3', 320, 3, 2, None)),
    (_Layer('MaxPool_1a_3x3', 'max', 3, 2, None),),
)


def _apply_layer(net, layer, reduction_padding):
    """Applies one convolution or pooling layer."""
    padding = layer.padding or reduction_padding
    if layer.depth in _POOLS:
        return _POOLS[layer.depth](net, layer.kernel, stride=layer.stride, padding=padding,
                                   scope=layer.scope)
    return slim.conv2d(net, layer.depth, layer.kernel, stride=layer.stride, padding=padding,
                       scope=layer.scope)


def _concat_branches(net, branches, reduction_padding='VALID'):
    """Runs each branch (a sequence of layers) on net in scopes Branch_<i>, concatenated on depth."""
    outputs = []
    for index, layers in enumerate(branches):
        with tf.compat.v1.variable_scope(f'Branch_{index}'):
            branch = net
            for layer in layers:
                branch = _apply_layer(branch, layer, reduction_padding)
            outputs.append(branch)
    return tf.concat(outputs, 3)


def _residual_block(net, branches, scale, activation_fn, scope):
    """Adds scale x (1x1 projection of the concatenated branches) to net, then applies activation_fn."""
    with tf.compat.v1.variable_scope(scope):
        mixed = _concat_branches(net, branches)
        # The projection back to the input depth is linear, unnormalized and has biases.
        residual = slim.conv2d(mixed, net.shape[3], 1, normalizer_fn=None, activation_fn=None,
                               scope='Conv2d_1x1')
        net = net + scale * residual
        return activation_fn(net) if activation_fn else net


def _residual_stack(net, block, activation_fn, scope):
    """Applies a block's repeats in scopes <scope>/<name>_1 .. <name>_<repeats>."""
    name, branches, repeats, scale = block
    with tf.compat.v1.variable_scope(scope):
        for index in range(1, repeats + 1):
            net = _residual_block(net, branches, scale, activation_fn, f'{name}_{index}')
    return net


@_fast_graph_building
def inception_resnet_v2_base(inputs, final_endpoint='Conv2d_7b_1x1', output_stride=16,
                             align_feature_maps=False, scope=None, activation_fn=tf.nn.relu):
    """Builds Inception-ResNet-v2 from inputs up to final_endpoint (TF-slim's signature); returns (net, end_points)."""
    if output_stride not in (8, 16):
        raise ValueError(f'output_stride must be 8 or 16, not {output_stride}')
    if final_endpoint not in IRV2_END_POINTS:
        raise ValueError(f'final_endpoint {final_endpoint!r} is not one of {IRV2_END_POINTS}')
    if output_stride == 8 and IRV2_END_POINTS.index(final_endpoint) > IRV2_END_POINTS.index('PreAuxLogits'):
        raise ValueError('output_stride=8 is supported only up to the PreAuxLogits end point')
    reduction_padding = 'SAME' if align_feature_maps else 'VALID'
    atrous = output_stride == 8

    def stem(*layer_args):
        return lambda net: _apply_layer(net, _Layer(*layer_args), reduction_padding)

    def block35_then_reduction_a(net):
        net = _residual_stack(net, _BLOCK35, activation_fn, 'Repeat')
        with tf.compat.v1.variable_scope('Mixed_6a'):
            return _concat_branches(net, _reduction_a_branches(1 if atrous else 2), reduction_padding)

    def block17_stack(net):
        with slim.arg_scope([slim.conv2d], rate=2 if atrous else 1):
            return _residual_stack(net, _BLOCK17, activation_fn, 'Repeat_1')

    def reduction_b(net):
        with tf.compat.v1.variable_scope('Mixed_7a'):
            return _concat_branches(net, _REDUCTION_B_BRANCHES, reduction_padding)

    def block8_stack_then_conv(net):
        net = _residual_stack(net, _BLOCK8, activation_fn, 'Repeat_2')
        net = _residual_block(net, _BLOCK8_BRANCHES, 1.0, None, 'Block8')
        return slim.conv2d(net, 1536, 1, scope='Conv2d_7b_1x1')

    def mixed_5b(net):
        with tf.compat.v1.variable_scope('Mixed_5b'):
            return _concat_branches(net, _MIXED_5B_BRANCHES)

    stages = (  # shapes for a 299x299 input
        ('Conv2d_1a_3x3', stem('Conv2d_1a_3x3', 32, 3, 2, None)),    # 149 x 149 x 32
        ('Conv2d_2a_3x3', stem('Conv2d_2a_3x3', 32, 3, 1, None)),    # 147 x 147 x 32
        ('Conv2d_2b_3x3', stem('Conv2d_2b_3x3', 64, 3)),             # 147 x 147 x 64
        ('MaxPool_3a_3x3', stem('MaxPool_3a_3x3', 'max', 3, 2, None)),  # 73 x 73 x 64
        ('Conv2d_3b_1x1', stem('Conv2d_3b_1x1', 80, 1, 1, None)),    # 73 x 73 x 80
        ('Conv2d_4a_3x3', stem('Conv2d_4a_3x3', 192, 3, 1, None)),   # 71 x 71 x 192
        ('MaxPool_5a_3x3', stem('MaxPool_5a_3x3', 'max', 3, 2, None)),  # 35 x 35 x 192
        ('Mixed_5b', mixed_5b),                                      # 35 x 35 x 320
        ('Mixed_6a', block35_then_reduction_a),                      # 17 x 17 x 1088
        ('PreAuxLogits', block17_stack),                             # 17 x 17 x 1088
        ('Mixed_7a', reduction_b),                                   # 8 x 8 x 2080
        ('Conv2d_7b_1x1', block8_stack_then_conv),                   # 8 x 8 x 1536
    )
    end_points = {}
    with tf.compat.v1.variable_scope(scope, IRV2_SCOPE, [inputs]):
        with slim.arg_scope([slim.conv2d, slim.max_pool2d, slim.avg_pool2d], stride=1, padding='SAME'):
            net = inputs
            for name, build in stages:
                net = build(net)
                end_points[name] = net
                if name == final_endpoint:
                    return net, end_points
    raise AssertionError('unreachable: final_endpoint was checked')


def _aux_logits(net, num_classes):
    """Builds the auxiliary classifier on the 17x17 features (in the caller's AuxLogits scope)."""
    # 5x5/3 pooling as in TF-slim; smaller inputs (e.g. 75x75, 3x3 features) pool what there is.
    pool_kernel = [min(5, int(side)) for side in net.shape[1:3]]
    net = slim.avg_pool2d(net, pool_kernel, stride=3, padding='VALID', scope='Conv2d_1a_3x3')
    net = slim.conv2d(net, 128, 1, scope='Conv2d_1b_1x1')
    net = slim.conv2d(net, 768, net.shape[1:3], padding='VALID', scope='Conv2d_2a_5x5')
    net = slim.flatten(net)
    return slim.fully_connected(net, num_classes, activation_fn=None, scope='Logits')


def _global_average_pool(net, scope):
    """Averages net over its spatial dimensions, keeping them as 1x1."""
    if net.shape[1:3].is_fully_defined():
        return slim.avg_pool2d(net, net.shape[1:3], padding='VALID', scope=scope)
    return tf.reduce_mean(net, [1, 2], keepdims=True, name='global_pool')


def _classifier_head(net, num_classes, dropout_keep_prob, is_training, end_points, pool_scope):
    """Global pool, dropout and a linear layer named Logits; fills the usual end points."""
    net = _global_average_pool(net, pool_scope)
    end_points['global_pool'] = net
    net = slim.flatten(net)
    net = slim.dropout(net, dropout_keep_prob, is_training=is_training, scope='Dropout')
    end_points['PreLogitsFlatten'] = net
    logits = slim.fully_connected(net, num_classes, activation_fn=None, scope='Logits')
    end_points['Logits'] = logits
    end_points['Predictions'] = tf.nn.softmax(logits, name='Predictions')
    return logits


@_fast_graph_building
def inception_resnet_v2(inputs, num_classes=1001, is_training=True, dropout_keep_prob=0.8, reuse=None,
                        scope=IRV2_SCOPE, create_aux_logits=True, activation_fn=tf.nn.relu):
    """Builds Inception-ResNet-v2 and its classifier (TF-slim's signature, defaults); returns (logits, end_points)."""
    with tf.compat.v1.variable_scope(scope, IRV2_SCOPE, [inputs], reuse=reuse) as var_scope:
        with slim.arg_scope([slim.batch_norm, slim.dropout], is_training=is_training):
            net, end_points = inception_resnet_v2_base(inputs, scope=var_scope,
                                                       activation_fn=activation_fn)
            if create_aux_logits and num_classes:
                with tf.compat.v1.variable_scope('AuxLogits'):
                    end_points['AuxLogits'] = _aux_logits(end_points['PreAuxLogits'], num_classes)
            with tf.compat.v1.variable_scope('Logits'):
                if not num_classes:
                    net = _global_average_pool(net, 'AvgPool_1a_8x8')
                    end_points['global_pool'] = net
                    return net, end_points
                logits = _classifier_head(net, num_classes, dropout_keep_prob, is_training,
                                          end_points, 'AvgPool_1a_8x8')
    return logits, end_points


def _conv_bn_arg_scope(weight_decay, batch_norm_decay, batch_norm_epsilon, activation_fn,
                       batch_norm_updates_collections, batch_norm_scale):
    """Returns an arg_scope: L2-decayed conv/fc weights and biases, batch-normed convolutions."""
    regularizer = slim.l2_regularizer(weight_decay)
    batch_norm_params = {'decay': batch_norm_decay, 'epsilon': batch_norm_epsilon, 'scale': batch_norm_scale,
                         'updates_collections': batch_norm_updates_collections}
    with slim.arg_scope([slim.conv2d, slim.fully_connected], weights_regularizer=regularizer,
                        biases_regularizer=regularizer):
        with slim.arg_scope([slim.conv2d], activation_fn=activation_fn, normalizer_fn=slim.batch_norm,
                            normalizer_params=batch_norm_params) as scope:
            return scope


def inception_resnet_v2_arg_scope(weight_decay=0.00004, batch_norm_decay=0.9997, batch_norm_epsilon=0.001,
                                  activation_fn=tf.nn.relu,
                                  batch_norm_updates_collections=tf.compat.v1.GraphKeys.UPDATE_OPS,
                                  batch_norm_scale=False):
    """Returns the arg_scope Inception-ResNet-v2 is built (and its checkpoint was trained) with; TF-slim's defaults.

    batch_norm_updates_collections None fails inside tf-slim on TF 2.21 (its fused batch norm uses ops.Tensor).
    """
    return _conv_bn_arg_scope(weight_decay, batch_norm_decay, batch_norm_epsilon, activation_fn,
                              batch_norm_updates_collections, batch_norm_scale)


# ---------------------------------------------------------------------------------------------
# small: a CIFAR-10-tutorial-sized CNN
# ---------------------------------------------------------------------------------------------

SMALL_SCOPE = 'SmallNet'
SMALL_DEPTHS = (32, 64, 128, 256)


@_fast_graph_building
def small_net(inputs, num_classes=1001, is_training=True, dropout_keep_prob=0.5, reuse=None, scope=SMALL_SCOPE):
    """Builds the small CNN (3x3 conv+BN layers, 2x2 pooling between, global pool, dropout, linear) at any size."""
    end_points = {}
    with tf.compat.v1.variable_scope(scope, values=[inputs], reuse=reuse):
        with slim.arg_scope([slim.batch_norm, slim.dropout], is_training=is_training):
            net = inputs
            for index, depth in enumerate(SMALL_DEPTHS, start=1):
                if index > 1:
                    net = slim.max_pool2d(net, 2, stride=2, padding='SAME', scope=f'pool{index - 1}')
                net = slim.conv2d(net, depth, 3, scope=f'conv{index}')
                end_points[f'conv{index}'] = net
            logits = _classifier_head(net, num_classes, dropout_keep_prob, is_training, end_points,
                                      'global_pool')
    return logits, end_points


def small_net_arg_scope(weight_decay=0.0005, batch_norm_decay=0.99, batch_norm_epsilon=0.001):
    """Returns the small model's arg_scope; its batch-norm statistics adapt within a short run."""
    return _conv_bn_arg_scope(weight_decay, batch_norm_decay, batch_norm_epsilon, tf.nn.relu,
                              tf.compat.v1.GraphKeys.UPDATE_OPS, batch_norm_scale=True)


# ---------------------------------------------------------------------------------------------
# The registry: one entry per model, with everything that differs between models
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A registered model: how inference() builds it and every setting that differs between models.

    build(images, num_classes, is_training=, dropout_keep_prob=, reuse=, scope=) returns (logits, end_points),
    inside arg_scope(weight_decay=); with aux_logits it also takes create_aux_logits= (an 'AuxLogits' end point).
    """
    name: str                     # --model's spelling, saved in run_config.json
    build: object
    arg_scope: object
    scope: str                    # the variable scope of every variable of the model
    classifier_scopes: tuple      # the layers sized by the class count: excluded to fine-tune to other classes
    image_size: int               # --image_size's default: the side of the square input
    learning_rate: float          # --learning_rate's default
    weight_decay: float           # --weight_decay's default
    dropout_keep_prob: float
    prior_sec_per_step_32: float  # the benchmark's first guess of a training step at batch 32 and image_size
    prior_build_seconds: float    # the benchmark's first guess of building the training graph
    benchmark_steps: int          # onu_benchmark.py --train_steps's default: timed steps per repeat
    benchmark_warmup_steps: int   # onu_benchmark.py --train_warmup_steps's default
    known_end_points: tuple       # the end points whose activation statistics the known score reads (onu_known)
    aux_logits: bool = False      # build takes create_aux_logits (an auxiliary classifier)


MODELS = {spec.name: spec for spec in (
    ModelSpec(name='inception_resnet_v2', build=inception_resnet_v2, arg_scope=inception_resnet_v2_arg_scope,
              scope=IRV2_SCOPE, classifier_scopes=(f'{IRV2_SCOPE}/Logits', f'{IRV2_SCOPE}/AuxLogits'),
              image_size=299, learning_rate=0.01, weight_decay=0.00004, dropout_keep_prob=0.8,
              prior_sec_per_step_32=16.0, prior_build_seconds=40.0, benchmark_steps=1, benchmark_warmup_steps=2,
              known_end_points=('Conv2d_2b_3x3', 'Conv2d_4a_3x3', 'Mixed_5b', 'Conv2d_7b_1x1'), aux_logits=True),
    ModelSpec(name='small', build=small_net, arg_scope=small_net_arg_scope,
              scope=SMALL_SCOPE, classifier_scopes=(f'{SMALL_SCOPE}/Logits',),
              image_size=64, learning_rate=0.02, weight_decay=0.0005, dropout_keep_prob=0.5,
              prior_sec_per_step_32=0.5, prior_build_seconds=3.0, benchmark_steps=20, benchmark_warmup_steps=5,
              known_end_points=tuple(f'conv{index}' for index in range(1, len(SMALL_DEPTHS) + 1))),
)}
MODEL_NAMES = tuple(MODELS)
# --model's default where TensorFlow sees a GPU, and where it sees none.
DEFAULT_MODEL_WITH_GPU = 'inception_resnet_v2'
DEFAULT_MODEL_WITHOUT_GPU = 'small'


def model_spec(model_name):
    """Returns the ModelSpec registered as model_name; ValueError naming the registered models otherwise."""
    if model_name not in MODELS:
        raise ValueError(f'unknown model {model_name!r}; choose one of {", ".join(MODEL_NAMES)}')
    return MODELS[model_name]


# ---------------------------------------------------------------------------------------------
# inference, loss, train
# ---------------------------------------------------------------------------------------------

def inference(images, num_classes, model_name, is_training, weight_decay=None, dropout_keep_prob=None,
              create_aux_logits=True, reuse=None):
    """Builds model_name on images (float32 [batch, h, w, 3] in [-1, 1]); returns (logits, end_points)."""
    spec = model_spec(model_name)
    options = {'create_aux_logits': create_aux_logits} if spec.aux_logits else {}
    with slim.arg_scope(spec.arg_scope(weight_decay=spec.weight_decay if weight_decay is None else weight_decay)):
        return spec.build(images, num_classes, is_training=is_training, reuse=reuse, scope=spec.scope,
                          dropout_keep_prob=spec.dropout_keep_prob if dropout_keep_prob is None else dropout_keep_prob,
                          **options)


KNOWN_STATISTICS = ('mean', 'std', 'max')  # per channel, over the positions of an end point


def known_features(end_points, model_name):
    """Returns ([float32 [batch, channels]: one KNOWN_STATISTIC of the channels of one of model_name's
    known_end_points], their layout ((end point/statistic, channels) in the same order)): what onu_known's
    layer_distance reads, a tensor per block (tf.concat makes its feature vector)."""
    columns, blocks = [], []
    for name in model_spec(model_name).known_end_points:
        net = tf.cast(end_points[name], tf.float32)
        for statistic, reduce in zip(KNOWN_STATISTICS, (tf.reduce_mean, tf.math.reduce_std, tf.reduce_max)):
            columns.append(reduce(net, axis=[1, 2], name=f'known_{statistic}'))
            blocks.append((f'{name}/{statistic}', int(net.shape[-1])))
    return columns, tuple(blocks)


def loss(logits, labels, end_points=None, label_smoothing=0.0):
    """Returns the total loss: cross-entropy + 0.4 x auxiliary cross-entropy + weight decay; summaries losses/*."""
    onehot_labels = tf.one_hot(labels, logits.shape[-1], dtype=logits.dtype)
    parts = {'cross_entropy': tf.compat.v1.losses.softmax_cross_entropy(
        onehot_labels, logits, label_smoothing=label_smoothing, scope='cross_entropy')}
    if end_points and 'AuxLogits' in end_points:
        parts['aux_cross_entropy'] = tf.compat.v1.losses.softmax_cross_entropy(
            onehot_labels, end_points['AuxLogits'], weights=AUX_LOSS_WEIGHT,
            label_smoothing=label_smoothing, scope='aux_cross_entropy')
    parts['regularization'] = tf.compat.v1.losses.get_regularization_loss(name='regularization_loss')
    total_loss = tf.add_n(list(parts.values()), name='total_loss')
    for name, value in list(parts.items()) + [('total', total_loss)]:
        tf.compat.v1.summary.scalar(f'losses/{name}', value)
    return total_loss


def loss_name(loss_tensor):
    """Returns the name loss() gives a loss term in TensorBoard (losses/<name>), from its op's scope."""
    scope = loss_tensor.op.name.split('/')[0]
    return {'total_loss': 'total', 'regularization_loss': 'regularization'}.get(scope, scope)


def make_learning_rate(global_step, initial_learning_rate, schedule='exponential',
                       num_examples_per_epoch=None, batch_size=None, num_epochs_per_decay=2.0,
                       decay_factor=0.94):
    """Returns the learning-rate tensor (named learning_rate, with a learning_rate summary)."""
    if schedule == 'fixed':
        rate = tf.constant(initial_learning_rate, tf.float32)
    elif schedule == 'exponential':
        if not num_examples_per_epoch or not batch_size:
            raise ValueError('the exponential learning-rate schedule needs num_examples_per_epoch '
                             'and batch_size (the epoch size from the data)')
        decay_steps = max(1, int(num_examples_per_epoch / batch_size * num_epochs_per_decay))
        rate = tf.compat.v1.train.exponential_decay(initial_learning_rate, global_step, decay_steps,
                                                    decay_factor, staircase=True)
    else:
        raise ValueError(f'unknown learning-rate schedule {schedule!r}; choose one of '
                         f'{", ".join(LR_SCHEDULES)}')
    rate = tf.identity(rate, name='learning_rate')
    # An explicit tag: summary.scalar would take its tag from a fresh op name, 'learning_rate_1'.
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SUMMARIES, tf.raw_ops.ScalarSummary(
        tags='learning_rate', values=rate, name='learning_rate_summary'))
    return rate


def make_optimizer(name, learning_rate, compute_dtype='float32', momentum=0.9, rmsprop_decay=0.9,
                   epsilon=None):
    """Returns the tf.compat.v1 optimizer called name (see OPTIMIZER_NAMES), loss-scaled for float16."""
    train = tf.compat.v1.train
    if name == 'sgd':
        optimizer = train.GradientDescentOptimizer(learning_rate)
    elif name == 'momentum':
        optimizer = train.MomentumOptimizer(learning_rate, momentum)
    elif name == 'rmsprop':
        optimizer = train.RMSPropOptimizer(learning_rate, decay=rmsprop_decay, momentum=momentum,
                                           epsilon=1.0 if epsilon is None else epsilon)  # as Inception was trained
    elif name == 'adam':
        optimizer = train.AdamOptimizer(learning_rate, epsilon=1e-8 if epsilon is None else epsilon)
    else:
        raise ValueError(f'unknown optimizer {name!r}; choose one of {", ".join(OPTIMIZER_NAMES)}')
    return loss_scaled(optimizer, compute_dtype)


def loss_scaled(optimizer, compute_dtype, initial_loss_scale=LOSS_SCALE_INITIAL):
    """Returns optimizer wrapped in dynamic loss scaling when compute_dtype is float16, else optimizer.

    The scale's variables are local (never in a checkpoint), so either precision resumes from the other's.
    """
    if compute_dtype != 'float16':
        return optimizer
    graph = tf.compat.v1.get_default_graph()
    global_variables = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    known = {id(var) for var in global_variables}
    loss_scale = tf.compat.v1.mixed_precision.DynamicLossScale(initial_loss_scale=initial_loss_scale)
    scale_variables = [var for var in global_variables if id(var) not in known]
    global_variables[:] = [var for var in global_variables if id(var) in known]
    for var in scale_variables:
        graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, var)
    return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, loss_scale)


def scope_list(scopes):
    """Returns scopes (None, a comma-separated string or a sequence) as a list of stripped names."""
    if not scopes:
        return []
    if isinstance(scopes, str):
        scopes = scopes.split(',')
    return [scope.strip().rstrip('/') for scope in scopes if scope.strip()]


def in_scopes(name, scopes):
    """Returns True when the variable name lies under any of scopes (a scope_list)."""
    return any(name.startswith(scope + '/') for scope in scopes)


def variables_to_train(trainable_scopes=None):
    """Returns the trainable variables under any of trainable_scopes (all of them when empty)."""
    variables = tf.compat.v1.trainable_variables()
    scopes = scope_list(trainable_scopes)
    if not scopes:
        return variables
    for scope in scopes:
        if not any(in_scopes(v.op.name, [scope]) for v in variables):
            examples = ' or '.join(spec.classifier_scopes[0] for spec in MODELS.values())
            raise ValueError(f'trainable scope {scope!r} matches no trainable variable; scopes look '
                             f'like {examples}')
    return [v for v in variables if in_scopes(v.op.name, scopes)]


def averaged_variables():
    """Returns the variables whose moving averages training keeps: trainable ones and batch-norm statistics."""
    trainable = tf.compat.v1.trainable_variables()
    names = {v.op.name for v in trainable}
    return trainable + [v for v in tf.compat.v1.model_variables() if v.op.name not in names]


@_fast_graph_building
def _apply_moving_average(moving_average_decay, global_step, variables):
    """Creates the shadow variables of variables (see moving_average_name); returns their update op."""
    ema = tf.compat.v1.train.ExponentialMovingAverage(moving_average_decay, num_updates=global_step,
                                                      name=MOVING_AVERAGE_NAME)
    return ema.apply(variables)


def build_train_op(optimizer, grads_and_vars, global_step, moving_average_decay=DEFAULT_MOVING_AVERAGE_DECAY,
                   update_ops=None, extra_ops=()):
    """Returns the train op: batch-norm updates (default: UPDATE_OPS), the gradient step, moving averages, extra_ops.

    moving_average_decay 0 or None keeps no moving averages; a SyncReplicasOptimizer keeps them itself.
    """
    if update_ops is None:
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        step_op = optimizer.apply_gradients(grads_and_vars, global_step=global_step)
    if moving_average_decay and not isinstance(optimizer, tf.compat.v1.train.SyncReplicasOptimizer):
        with tf.control_dependencies([step_op]):
            step_op = _apply_moving_average(moving_average_decay, global_step, averaged_variables())
    return tf.group(step_op, *extra_ops, name='train_op')


def moving_average_name(var):
    """Returns the checkpoint name of var's moving average: <var>/ExponentialMovingAverage."""
    # ExponentialMovingAverage.average_name would uniquify the name in a graph that already holds it.
    return f'{var.op.name}/{MOVING_AVERAGE_NAME}'
