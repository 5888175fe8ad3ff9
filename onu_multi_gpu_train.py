"""Trains an ONU photo classifier on several GPUs of one machine (the CIFAR-10 tutorial's
cifar10_multi_gpu_train.py role).

    python onu_multi_gpu_train.py --num_gpus=2 --batch_size=32     # 64 images per step

Synchronous data parallelism. One input pipeline reads num_gpus x batch_size images per step and
splits them into one slice per tower; tower i (name scope tower_<i>, on GPU i) runs the model on
its slice. The variables live on the CPU, created by tower 0 and shared by every tower. The
towers' gradients are averaged and applied once, so the global step advances once per step and
the learning rate decays per num_gpus x batch_size examples. Batch-norm statistics and summaries
come from tower 0; the moving averages of the weights are kept as in onu_train.py.

Everything else is onu_train.py's (through onu_flags and onu_training): flags, hooks, logging,
resuming, run_config.json and the checkpoints, whose variable names are the same, so onu_eval.py
evaluates them and either script resumes them; also the multi-machine flags (each worker then
trains its own towers). Without GPUs the towers run on the CPU: that exercises the tower logic, it
is not faster.
"""
import sys

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags
import tensorflow as tf

from onu_lib import onu_flags
from onu_lib import onu_precision
import onu_input
import onu_model
from onu_lib import onu_training

FLAGS = flags.FLAGS

onu_flags.define_training_flags()
onu_flags.define_num_gpus_flag()

TOWER_NAME = 'tower'
VARIABLE_DEVICE = '/cpu:0'
VARIABLE_OPS = ('Variable', 'VariableV2', 'VarHandleOp')


def tower_devices(num_towers, num_gpus_visible):
    """Returns the device of each tower: /gpu:<i>, or /cpu:0 for all of them when no GPU is visible."""
    if num_gpus_visible == 0:
        return [VARIABLE_DEVICE] * num_towers
    if num_gpus_visible < num_towers:
        raise ValueError(f'{num_towers} towers but TensorFlow sees {num_gpus_visible} GPU(s)')
    return [f'/gpu:{index}' for index in range(num_towers)]


def tower_device_function(device):
    """Returns a device function putting variables on VARIABLE_DEVICE and every other op on device."""
    def place(op):
        if op.device:  # placed explicitly inside the tower
            return op.device
        return VARIABLE_DEVICE if op.type in VARIABLE_OPS else device
    return place


def tower_scope(index):
    """Returns the name scope of tower index, e.g. tower_0."""
    return f'{TOWER_NAME}_{index}'


def tower_gradients(optimizer, tower_loss, batch, devices, variables_to_train=None):
    """Builds tower_loss(*slices) on each device's slice of batch (tensors split along their first dimension), tower
    i in name scope tower_<i> on devices[i], with the variables tower 0 creates; returns ([grads_and_vars], [loss]) by
    tower. variables_to_train() (default: every trainable variable) is called once tower 0 has created them."""
    slices = list(zip(*(tf.split(tensor, len(devices)) for tensor in batch)))
    tower_grads, tower_losses, var_list = [], [], None
    for index, device in enumerate(devices):
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), reuse=index > 0):
            with tf.compat.v1.device(tower_device_function(device)), tf.name_scope(tower_scope(index)):
                loss = tower_loss(*slices[index])
                if var_list is None:
                    var_list = (variables_to_train or tf.compat.v1.trainable_variables)()
                tower_grads.append(optimizer.compute_gradients(loss, var_list=var_list))
                tower_losses.append(loss)
    return tower_grads, tower_losses


def average_gradients(tower_grads):
    """Returns [(gradient averaged over the towers, variable)] from one grads_and_vars list per tower."""
    averaged = []
    for grads_and_vars in zip(*tower_grads):
        variable = grads_and_vars[0][1]
        if any(var is not variable for _, var in grads_and_vars):
            raise ValueError(f'the towers list different variables at {variable.op.name}')
        grads = [grad for grad, _ in grads_and_vars if grad is not None]
        if not grads:
            averaged.append((None, variable))
            continue
        if len(grads) != len(grads_and_vars):
            raise ValueError(f'only some towers have a gradient for {variable.op.name}')
        total = tf.add_n([tf.convert_to_tensor(grad) for grad in grads])
        averaged.append((total / len(grads), variable))
    return averaged


def _mean_over_towers(tower_tensors, name):
    """Returns the mean of one scalar per tower, as an op called name."""
    return tf.reduce_mean(tf.stack(tower_tensors), name=name)


def _tower_averaged_losses(num_towers):
    """Returns each LOSSES term of tower 0 averaged over the towers, named as in one-tower training."""
    prefix = tower_scope(0) + '/'
    per_tower = [tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES, tower_scope(index) + '/')
                 for index in range(num_towers)]
    return [_mean_over_towers(list(terms), terms[0].op.name[len(prefix):])
            for terms in zip(*per_tower)]


def _keep_first_tower_summaries(num_towers):
    """Drops the summaries towers 1.. added, so TensorBoard shows tower 0's once."""
    others = tuple(tower_scope(index) + '/' for index in range(1, num_towers))
    summaries = tf.compat.v1.get_collection_ref(tf.compat.v1.GraphKeys.SUMMARIES)
    summaries[:] = [summary for summary in summaries if not summary.op.name.startswith(others)]


def tower_inputs(options, batches):
    """Returns the step's batch: (images, labels), or (uint8 images, labels, draws) to augment per tower."""
    if options.augment_on == 'model':  # each tower augments its own slice on its own device
        return onu_input.next_batch(batches)
    return onu_input.distorted_inputs(batches)


def train():
    """Trains the model the flags describe on --num_gpus towers, here or as a cluster task; returns the exit code: 0,
    or 128 + the signal that stopped training."""
    options = onu_flags.training_options()
    precision, role = onu_training.training_role(options)
    if role.is_ps:
        return role.serve()
    run_config, train_data, resume_from = onu_training.begin_training_run(options, precision, role, FLAGS.num_gpus)
    devices = tower_devices(FLAGS.num_gpus, len(onu_precision.visible_gpus()))
    if devices[0] == VARIABLE_DEVICE:
        print(f'{len(devices)} towers on the CPU (TensorFlow sees no GPU): this exercises the tower '
              f'logic, it is not faster than onu_train.py.', flush=True)
    else:
        print(f'{len(devices)} towers on {", ".join(devices)}, variables on {VARIABLE_DEVICE}.', flush=True)
    print(f'{options.batch_size} examples per tower, {options.batch_size * len(devices)} per step.', flush=True)
    examples_per_step = onu_training.examples_per_step(options, role, len(devices))

    with tf.Graph().as_default():
        # The graph: one input pipeline, a tower per device, the averaged update.
        with role.device_scope(), tf.device(VARIABLE_DEVICE):
            seed = onu_training.input_seed(options.seed, role.task_index, resume_from)
            tf.compat.v1.set_random_seed(seed)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            batch = tower_inputs(options, onu_training.input_pipeline(options, run_config, train_data, role, seed,
                                                                      options.batch_size * len(devices)))
            learning_rate = onu_training.learning_rate(options, global_step, run_config, examples_per_step)
            optimizer = onu_model.make_optimizer(options.optimizer, learning_rate, run_config.compute_dtype)
            tower_outputs = []

            def tower_loss(tower_images, tower_labels, tower_draws=None):
                if tower_draws is not None:
                    tower_images = onu_input.augment_batch(tower_images, tower_draws, options.augmentations)
                    if not tower_outputs:
                        onu_input.add_input_summary(tower_images)
                logits, end_points = onu_model.inference(
                    tower_images, run_config.num_classes, run_config.model, is_training=True,
                    weight_decay=options.weight_decay)
                tower_outputs.append((logits, end_points))
                return onu_model.loss(logits, tower_labels, end_points, options.label_smoothing)

            tower_grads, tower_losses = tower_gradients(
                optimizer, tower_loss, batch, devices,
                lambda: onu_model.variables_to_train(options.trainable_scopes))
            _keep_first_tower_summaries(len(devices))
            # The batch's losses (the towers' mean), named as in onu_train.py so that the checkpoints
            # hold the same variables (the losses' moving averages among them).
            total_loss = _mean_over_towers(tower_losses, 'total_loss')
            average_op = onu_training.add_training_summaries(
                tf.concat([logits for logits, _ in tower_outputs], 0), batch[1], tower_outputs[0][1],
                total_loss, _tower_averaged_losses(len(devices)), histograms=options.histograms)
            optimizer = role.synchronous(optimizer, global_step, options.moving_average_decay)
            train_op = onu_model.build_train_op(
                optimizer, average_gradients(tower_grads), global_step, options.moving_average_decay,
                update_ops=tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, tower_scope(0) + '/'),
                extra_ops=[average_op])

        # The hooks and the loop: as in onu_train.py.
        scaffold = onu_training.make_scaffold(options, resume_from)
        hooks = onu_training.training_hooks(options, run_config, role, scaffold, total_loss, learning_rate,
                                            examples_per_step)
        role.wait_for_chief()
        with onu_training.monitored_training_session(options, role, scaffold, hooks, train_data) as session:
            while not session.should_stop():
                session.run(train_op)
    return onu_training.finish(options, hooks, role)


def main(argv):
    num_gpus_visible = len(onu_precision.visible_gpus())
    if 0 < num_gpus_visible < FLAGS.num_gpus:
        print(f'error: --num_gpus={FLAGS.num_gpus} but TensorFlow sees {num_gpus_visible} GPU(s); '
              f'use --num_gpus={num_gpus_visible} or fewer', file=sys.stderr)
        return 2
    return onu_cli.run_script(train, argv, **onu_training.SCRIPT_ERRORS)


if __name__ == '__main__':
    app.run(main)
