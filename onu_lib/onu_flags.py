"""Flags shared by the onu scripts: every flag used by several scripts is declared here once, with one meaning.

Each script declares the groups it takes: define_data_dir_flag, define_split_flags and define_seed_flag (also the
data scripts, make_sample_data.py and convert_to_tfrecord.py, which never load TensorFlow: nothing imported here at
the top loads it), define_model_flags (the model and data flags of the scripts that build a model),
define_training_flags (onu_train.py, onu_multi_gpu_train.py, run_local_cluster.py); training_options() reads the
training flags, once, into the onu_training.TrainingOptions the training scripts pass to onu_training. Only flags
live here: declaring and reading them. Scripts import onu_cli first.
"""
import os

from absl import flags

from onu_lib import onu_cli
from onu_lib import onu_dataset

DEFAULT_TRAIN_DIR = '/tmp/onu_train'
DEPRECATED_CACHE_CHOICES = {'on': 'memory'}  # --cache_decoded_epoch: the old spelling and its new one

FLAGS = flags.FLAGS


# pragma: no mutate start (declarations, run once as a script starts: the checks they register are mutated below)
def _declared(name):
    """True when --name is declared already (by another script imported into this process: the tests)."""
    return name in FLAGS


def define_data_dir_flag():
    """Declares --data_dir, the data every script reads or writes: photos or records (README "Bring your own data")."""
    if _declared('data_dir'):
        return
    flags.DEFINE_string('data_dir', onu_dataset.DEFAULT_DATA_DIR,
                        'Folder with the data: photos in train/<class>/ and val/<class>/ or in <class>/ folders '
                        '(split by --validation_percent), this repo\'s records, or records written by the study, '
                        'TF-slim, the Inception/ImageNet converters or TFDS.')


def define_split_flags():
    """Declares --validation_percent and --labels_offset: how a split is made, and labels read, where the data is silent."""
    if _declared('validation_percent'):
        return
    flags.DEFINE_float('validation_percent', onu_dataset.DEFAULT_VALIDATION_PERCENT,
                       'Photos in <class>/ folders without a train/val split: the percent held out for val, chosen '
                       'by a hash of each file\'s path (the same on every run; adding photos never moves an old '
                       'one). Training saves it in run_config.json for eval.', lower_bound=0.0, upper_bound=99.0)
    flags.DEFINE_integer('labels_offset', None,
                         'Records of other tools: subtract this from each stored label (1 for labels that start at '
                         '1, label 0 unused as background); default: from the records\' own evidence.',
                         lower_bound=0)


def define_seed_flag():
    """Declares --seed (default 0, so that a rerun repeats itself)."""
    if _declared('seed'):
        return
    flags.DEFINE_integer('seed', 0, 'Seed of what the script draws at random: the photos make_sample_data.py '
                         'generates, the order convert_to_tfrecord.py gives training records, training\'s shuffling, '
                         'augmentation and initial weights (each worker of a cluster, and each restart, mixes in its '
                         'task index and start step). The same seed repeats a run.')


def model_defaults(field):
    """Returns each registered model's ModelSpec field for a help text: 'inception_resnet_v2 299, small 64'."""
    import onu_model  # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    return ', '.join(f'{name} {getattr(spec, field):g}' for name, spec in onu_model.MODELS.items())


def define_model_flags():
    """Declares the model and data flags of the scripts that build a model: --data_dir and the split flags,
    --data_format, --model, --image_size, --batch_size."""
    if _declared('model'):
        return
    import onu_model  # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    define_data_dir_flag()
    define_split_flags()
    flags.DEFINE_enum('data_format', None, onu_dataset.DATA_FORMATS,
                      'How images are fed: the original files (images), TFRecords of decoded pixels '
                      '(raw) or of the original file bytes (encoded); default: encoded for photos (converted on '
                      'demand), the records\' own format for records.')
    flags.DEFINE_enum('model', None, onu_model.MODEL_NAMES,
                      f'Network to train; default {onu_model.DEFAULT_MODEL_WITH_GPU} when a GPU is visible, else '
                      f'{onu_model.DEFAULT_MODEL_WITHOUT_GPU}.')
    flags.DEFINE_integer('image_size', None, 'Side of the square model input; default: the model\'s own '
                         f'({model_defaults("image_size")}).', lower_bound=16)
    define_batch_size_flag()


def define_batch_size_flag():
    """Declares --batch_size: images per batch (per tower and per worker when training)."""
    if not _declared('batch_size'):
        flags.DEFINE_integer('batch_size', 32, 'Images per batch.', lower_bound=1)


def define_checkpoint_dir_flag(help_text):
    """Declares --checkpoint_dir, the training run a script after training reads."""
    flags.DEFINE_string('checkpoint_dir', DEFAULT_TRAIN_DIR, help_text)


def define_allow_raw_weights_flag(help_text):
    """Declares --allow_raw_weights, the way out when a checkpoint has no moving averages."""
    flags.DEFINE_boolean('allow_raw_weights', False, help_text)


def define_precision_flag(default, help_text):
    """Declares --precision: auto (the hardware decides), float32 or mixed (see onu_precision.choose_precision)."""
    from onu_lib import onu_precision  # pylint: disable=import-outside-toplevel  (TensorFlow)
    flags.DEFINE_enum('precision', default, ('auto',) + onu_precision.PRECISIONS, help_text)


def define_training_flags():
    """Declares the flags of the training scripts (onu_train.py, onu_multi_gpu_train.py, every cluster task)."""
    if _declared('train_dir'):
        return
    # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    from onu_lib import onu_cluster
    from onu_lib import onu_data_service
    from onu_lib import onu_decoded_cache
    import onu_input
    import onu_model
    define_model_flags()
    flags.DEFINE_string('train_dir', DEFAULT_TRAIN_DIR,
                        'Where checkpoints, event files and run_config.json go; training resumes from it.')
    flags.DEFINE_integer('max_steps', 2000, 'Global step at which training stops (counted across restarts).',
                         lower_bound=1)
    flags.DEFINE_integer('log_frequency', 10, 'Print loss, speed and what input costs (waiting, work) every this '
                         'many steps.', lower_bound=1)
    flags.DEFINE_integer('save_checkpoint_secs', 120, 'Save a checkpoint every this many seconds (0: none by time; '
                         'a checkpoint is still saved at the start, at the end and when stopped by a signal).',
                         lower_bound=0)
    flags.DEFINE_integer('save_checkpoint_steps', None,
                         'Save a checkpoint every this many steps (replaces --save_checkpoint_secs).')
    flags.DEFINE_integer('keep_checkpoint_max', 5, 'How many recent checkpoints to keep.', lower_bound=1)
    flags.DEFINE_integer('export_every_n_epochs', 0,
                         'Every this many epochs, export a SavedModel to <train_dir>/export/<step>/ from the '
                         'first checkpoint at or after the boundary (0: never; see onu_export.py).',
                         lower_bound=0)
    flags.DEFINE_integer('save_summaries_steps', 100, 'Write TensorBoard summaries every this many steps.')
    flags.DEFINE_boolean('histograms', False, 'Also write weight and activation histograms.')
    define_seed_flag()
    flags.DEFINE_string('fine_tune_checkpoint', None,
                        'Checkpoint (or folder) to fine-tune from when train_dir has no checkpoint yet, '
                        'e.g. inception_resnet_v2_2016_08_30.ckpt.')
    flags.DEFINE_list('checkpoint_exclude_scopes', [],
                      'Variable scopes not restored from --fine_tune_checkpoint; to fine-tune to other classes, '
                      'the classifier\'s: ' + '; '.join(f'{name}: {",".join(spec.classifier_scopes)}'
                                                       for name, spec in onu_model.MODELS.items()) + '.')
    flags.DEFINE_list('trainable_scopes', [], 'Train only variables in these scopes (default: all).')
    flags.DEFINE_enum('optimizer', 'momentum', onu_model.OPTIMIZER_NAMES, 'Optimizer.')
    flags.DEFINE_float('learning_rate', None, 'Initial learning rate; default: the model\'s own '
                       f'({model_defaults("learning_rate")}).')
    flags.DEFINE_enum('learning_rate_schedule', 'exponential', onu_model.LR_SCHEDULES,
                      'fixed, or exponential decay every --num_epochs_per_decay epochs.')
    flags.DEFINE_float('num_epochs_per_decay', 2.0, 'Epochs between learning-rate decays.')
    flags.DEFINE_float('learning_rate_decay_factor', 0.94, 'Learning-rate decay factor.')
    flags.DEFINE_float('moving_average_decay', onu_model.DEFAULT_MOVING_AVERAGE_DECAY,
                       'Decay of the moving averages of the weights that eval restores (0: none).')
    flags.DEFINE_float('weight_decay', None, 'L2 weight decay; default: the model\'s own '
                       f'({model_defaults("weight_decay")}).')
    flags.DEFINE_float('label_smoothing', 0.0, 'Label smoothing of the cross-entropy.')
    flags.DEFINE_list('augmentations', list(onu_input.default_augmentation_names()),
                      'Training augmentations to apply (empty: none); the choices: '
                      + ', '.join(onu_input.augmentation_names()) + '.')
    flags.register_validator(
        'augmentations', lambda names: set(names) <= set(onu_input.augmentation_names()),
        message='--augmentations takes a comma-separated subset of ' + ','.join(onu_input.augmentation_names()))
    flags.DEFINE_enum('cache_decoded_epoch', 'auto', onu_decoded_cache.MODES + tuple(DEPRECATED_CACHE_CHOICES),
                      'Where one epoch of decoded, resized training images is kept, so that later epochs train from '
                      'it instead of decoding again: memory (the first epoch is decoded before step 1), disk (in '
                      '--cache_dir, written while the first epoch trains), or off (every epoch decoded); auto: memory '
                      f'when the epoch fits {onu_input.DECODED_CACHE_BYTES // 2**30} GiB, else disk when --cache_dir\'s '
                      'disk has room, else off. on: the old spelling of memory.')
    flags.DEFINE_string('cache_dir', None,
                        'Where --cache_decoded_epoch=disk keeps decoded epochs, one folder per data, image size and '
                        'decode options (reused by later runs); default: $ONU_CACHE_DIR/decoded, else '
                        '~/.cache/onu-classifier/decoded. A local disk: it is read every epoch.')
    flags.DEFINE_string('profile_steps', None,
                        'START,STOP: write a TensorBoard profile of global steps START to STOP into --train_dir, '
                        'with step markers, for the Profile tab (overview, input pipeline analyzer, trace viewer); '
                        'on a cluster the chief profiles.')
    flags.register_validator('profile_steps', _is_profile_steps,
                             message='--profile_steps takes START,STOP: two global steps with 1 <= START <= STOP, '
                                     'e.g. --profile_steps=100,110')
    flags.DEFINE_enum('augment_on', 'input', onu_input.AUGMENT_PLACEMENTS,
                      'Where training augmentation runs: in the input pipeline on the CPU (input), or in '
                      'the training graph on the model\'s device, each GPU tower its own share (model); the '
                      'pipeline then only reads, decodes and resizes. Same augmentations either way.')
    flags.DEFINE_boolean('reduced_decode', False,
                         'Decode training JPEGs at a reduced DCT scale (1/2, 1/4 or 1/8, as --image_size '
                         'allows): less CPU per photo, but smoother pixels than evaluation\'s exact decode; on '
                         'the sample data at 64x64 it cost 5-7 points of precision (BENCHMARKS.md).')
    flags.DEFINE_string('data_service', None,
                        f'{onu_data_service.ADDRESS_FORM} of a tf.data service\'s dispatcher (run_data_service.py): its '
                        'workers read, decode and resize (and, with --augment_on=input, augment) the training batches '
                        'instead of this machine\'s CPU; each example once per epoch. No decoded-epoch cache then.')
    flags.register_validator('data_service', _is_service_address,
                             message=f'--data_service takes {onu_data_service.ADDRESS_FORM}, '
                                     f'e.g. --data_service=grpc://localhost:{onu_data_service.DEFAULT_PORT}')
    flags.register_multi_flags_validator(
        ['data_service', 'cache_decoded_epoch'], _no_local_cache_with_a_service,
        message='--cache_decoded_epoch=memory or disk keeps the decoded epoch on this machine: not with '
                '--data_service, whose workers each see only their share of an epoch')
    define_precision_flag(
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
    flags.DEFINE_float('ps_wait_secs', onu_cluster.PS_WAIT_SECS,
                       'Multi-machine training: how long a worker waits for a parameter server that stopped '
                       'answering (for a supervisor to restart it) before it exits with one line.', lower_bound=0)
    onu_cli.define_deprecated_alias('checkpoint_path', 'fine_tune_checkpoint')


def define_num_gpus_flag():
    """Declares --num_gpus, the towers of onu_multi_gpu_train.py."""
    if 'num_gpus' in FLAGS:
        return
    flags.DEFINE_integer('num_gpus', 1, 'How many GPUs to train on, one tower each; without GPUs the '
                         'towers run on the CPU.', lower_bound=1)


# pragma: no mutate end
def _is_service_address(value):
    """Returns whether value is None or an address of a tf.data service (onu_data_service.service_address)."""
    from onu_lib import onu_data_service  # pylint: disable=import-outside-toplevel  (TensorFlow)
    try:
        return value is None or bool(onu_data_service.service_address(value))
    except onu_data_service.ServiceError:
        return False


def _no_local_cache_with_a_service(values):
    """Returns whether --data_service and --cache_decoded_epoch (in values) go together: no memory or disk cache with a
    service, whose workers each see only their share of an epoch."""
    return not (values['data_service'] and values['cache_decoded_epoch'] not in ('auto', 'off'))


def _is_profile_steps(value):
    """Returns whether value is None or a --profile_steps value (parse_profile_steps)."""
    return value is None or parse_profile_steps(value) is not None


def parse_profile_steps(value):
    """Returns (start, stop) of a --profile_steps value START,STOP with 1 <= START <= STOP, or None if it is not one."""
    parts = value.split(',')
    if len(parts) != 2 or not all(part.strip().isdigit() for part in parts):
        return None
    start, stop = (int(part) for part in parts)
    return (start, stop) if 1 <= start <= stop else None


def cache_mode(value):
    """Returns the --cache_decoded_epoch mode value names; a deprecated spelling says its new one in one line."""
    if value in DEPRECATED_CACHE_CHOICES:
        print(f'--cache_decoded_epoch={value} is now spelled --cache_decoded_epoch={DEPRECATED_CACHE_CHOICES[value]}.',
              flush=True)
    return DEPRECATED_CACHE_CHOICES.get(value, value)


def training_options():
    """Returns the onu_training.TrainingOptions the training flags give: the flags, read once."""
    # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    from onu_lib import onu_data_service
    from onu_lib import onu_training
    import onu_input
    return onu_training.TrainingOptions(
        train_dir=FLAGS.train_dir, data_dir=FLAGS.data_dir, data_format=FLAGS.data_format,
        validation_percent=FLAGS.validation_percent, labels_offset=FLAGS.labels_offset, model=FLAGS.model,
        image_size=FLAGS.image_size, batch_size=FLAGS.batch_size, max_steps=FLAGS.max_steps,
        precision=FLAGS.precision, xla=FLAGS.xla, seed=FLAGS.seed,
        augmentations=onu_input.AugmentOptions(FLAGS.augmentations), augment_on=FLAGS.augment_on,
        cache_decoded_epoch=cache_mode(FLAGS.cache_decoded_epoch), cache_dir=FLAGS.cache_dir,
        reduced_decode=FLAGS.reduced_decode, optimizer=FLAGS.optimizer, learning_rate=FLAGS.learning_rate,
        learning_rate_schedule=FLAGS.learning_rate_schedule, num_epochs_per_decay=FLAGS.num_epochs_per_decay,
        learning_rate_decay_factor=FLAGS.learning_rate_decay_factor,
        moving_average_decay=FLAGS.moving_average_decay, weight_decay=FLAGS.weight_decay,
        label_smoothing=FLAGS.label_smoothing, trainable_scopes=tuple(FLAGS.trainable_scopes),
        fine_tune_checkpoint=FLAGS.fine_tune_checkpoint,
        checkpoint_exclude_scopes=tuple(FLAGS.checkpoint_exclude_scopes), log_frequency=FLAGS.log_frequency,
        save_checkpoint_secs=FLAGS.save_checkpoint_secs, save_checkpoint_steps=FLAGS.save_checkpoint_steps,
        keep_checkpoint_max=FLAGS.keep_checkpoint_max, save_summaries_steps=FLAGS.save_summaries_steps,
        export_every_n_epochs=FLAGS.export_every_n_epochs,
        profile_steps=parse_profile_steps(FLAGS.profile_steps) if FLAGS.profile_steps else None,
        histograms=FLAGS.histograms, ps_hosts=tuple(FLAGS.ps_hosts), worker_hosts=tuple(FLAGS.worker_hosts),
        job_name=FLAGS.job_name, task_index=FLAGS.task_index, sync_replicas=FLAGS.sync_replicas,
        ps_wait_secs=FLAGS.ps_wait_secs,
        data_service=onu_data_service.service_address(FLAGS.data_service) if FLAGS.data_service else None,
        flag_values=project_flag_values())


def project_flag_values():
    """Returns {name: value} of the flags this project's modules and scripts define."""
    repo_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    values = {}
    for module, module_flags in FLAGS.flags_by_module_dict().items():
        # A script run as __main__ is known by its path, an imported module by its dotted name.
        relative = os.path.basename(module) if module.endswith('.py') else os.path.join(*module.split('.')) + '.py'
        if os.path.isfile(os.path.join(repo_dir, relative)):
            values.update((flag.name, flag.value) for flag in module_flags
                          if not onu_cli.is_deprecated_alias(flag.name))
    return values


def value_or_saved(flag_name, run_config):
    """Returns the flag's value when given on the command line, else the training run's (a RunConfig)."""
    if FLAGS[flag_name].present or not run_config:
        return FLAGS[flag_name].value
    return getattr(run_config, flag_name)
