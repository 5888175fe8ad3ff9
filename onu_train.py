"""Trains an ONU photo classifier (the CIFAR-10 tutorial's cifar10_train.py role).

    python onu_train.py                  # built-in sample data, encoded records, resumes if it can
    python onu_train.py --data_dir=DATA --data_format=raw --model=inception_resnet_v2
    python onu_train.py --data_dir=PHOTOS          # <class>/ folders: 10% held out for val (--validation_percent)
    python onu_train.py --data_dir=/data/imagenet  # records of other tools, read as they are (onu_layouts.py)
    python onu_train.py --data_service=grpc://HOST:5050  # batches made by a tf.data service (run_data_service.py)

Training never deletes --train_dir: it resumes from the latest checkpoint there. The run's
configuration (onu_run_config.RunConfig) is saved as train_dir/run_config.json so onu_eval.py and
onu_export.py rebuild the same model without repeating flags. train() reads as the CIFAR-10
tutorial's: the graph (input, inference, loss, train op), the hooks, the MonitoredTrainingSession loop.

Across machines, every machine runs this script as one task of a cluster (TensorFlow's
between-graph replication, see onu_cluster.py), described by TF_CONFIG or the cluster flags:

    CLUSTER="--ps_hosts=h0:2222 --worker_hosts=h1:2222,h2:2222 --model=small"
    python onu_train.py $CLUSTER --job_name=ps --task_index=0       # on h0: holds the variables
    python onu_train.py $CLUSTER --job_name=worker --task_index=0   # on h1: the chief
    python onu_train.py $CLUSTER --job_name=worker --task_index=1   # on h2
    python run_local_cluster.py --num_workers=2    # or all of them on this machine, to try it

Updates are asynchronous; --sync_replicas averages one batch of every worker per step.
"""

from onu_lib import onu_cli  # first: quiet start
onu_cli.import_tensorflow()  # noqa: E402  (TensorFlow's start-up lines dropped)
from absl import app
from absl import flags
import tensorflow as tf

from onu_lib import onu_flags
import onu_input
import onu_model
from onu_lib import onu_training

FLAGS = flags.FLAGS

onu_flags.define_training_flags()


def train():
    """Trains the model the flags describe, here or as this process's cluster task; returns the exit code: 0, or
    128 + the signal that stopped training."""
    options = onu_flags.training_options()
    precision, role = onu_training.training_role(options)
    if role.is_ps:
        return role.serve()
    run_config, train_data, resume_from = onu_training.begin_training_run(options, precision, role)
    examples_per_step = onu_training.examples_per_step(options, role)

    with tf.Graph().as_default():
        # The graph: input, inference, loss, train op (its variables on the ps tasks of a cluster).
        with role.device_scope():
            seed = onu_training.input_seed(options.seed, role.task_index, resume_from)
            tf.compat.v1.set_random_seed(seed)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            images, labels = onu_input.distorted_inputs(
                onu_training.input_pipeline(options, run_config, train_data, role, seed, options.batch_size),
                options.augmentations)
            logits, end_points = onu_model.inference(images, run_config.num_classes, run_config.model,
                                                     is_training=True, weight_decay=options.weight_decay)
            total_loss = onu_model.loss(logits, labels, end_points, options.label_smoothing)
            average_op = onu_training.add_training_summaries(logits, labels, end_points, total_loss,
                                                             histograms=options.histograms)
            learning_rate = onu_training.learning_rate(options, global_step, run_config, examples_per_step)
            optimizer = role.synchronous(
                onu_model.make_optimizer(options.optimizer, learning_rate, run_config.compute_dtype),
                global_step, options.moving_average_decay)
            grads_and_vars = optimizer.compute_gradients(
                total_loss, var_list=onu_model.variables_to_train(options.trainable_scopes))
            train_op = onu_model.build_train_op(optimizer, grads_and_vars, global_step,
                                                options.moving_average_decay, extra_ops=[average_op])

        # The hooks: stop at --max_steps or on a signal, NaN check, logging, checkpoints.
        scaffold = onu_training.make_scaffold(options, resume_from)
        hooks = onu_training.training_hooks(options, run_config, role, scaffold, total_loss, learning_rate,
                                            examples_per_step)

        # The loop: MonitoredTrainingSession restores or initialises, runs the hooks, saves at the end.
        role.wait_for_chief()
        with onu_training.monitored_training_session(options, role, scaffold, hooks, train_data) as session:
            while not session.should_stop():
                session.run(train_op)
    return onu_training.finish(options, hooks, role)


def main(argv):
    return onu_cli.run_script(train, argv, **onu_training.SCRIPT_ERRORS)


if __name__ == '__main__':
    app.run(main)
