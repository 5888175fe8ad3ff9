"""Flags shared by the onu scripts: every flag used by several scripts is declared here once, with one meaning.

define_settings() declares the flags of a dataclass of settings (onu_settings.setting fields: onu_training's
TrainingOptions, SharedSettings), read_settings() reads them back into it. The data scripts take only SharedSettings'
and never load TensorFlow: nothing imported here at the top loads it. Scripts import onu_cli first.
"""
import dataclasses
import os

from absl import flags

from onu_lib import onu_cli
from onu_lib import onu_settings

FLAGS = flags.FLAGS
# The settings of the scripts that build a model (onu_eval.py, onu_benchmark.py), as training declares them.
MODEL_SETTINGS = ('data_dir', 'validation_percent', 'labels_offset', 'data_format', 'model', 'image_size',
                  'batch_size')


# pragma: no mutate start (runs once as a script starts, before a test can switch a mutant on)
def define_settings(settings, names=None):
    """Declares the flag of each setting of the dataclass settings (only those named, if names), unless declared
    already (by another script imported into this process: the tests)."""
    for field in dataclasses.fields(settings):
        flag = onu_settings.flag_of(field)
        if flag and (names is None or field.name in names) and field.name not in FLAGS:
            getattr(flags, f'DEFINE_{flag.kind}')(field.name, flag.default, help=flag.help, **flag.arguments)
            if flag.validator:
                flags.register_validator(field.name, *flag.validator)
# pragma: no mutate end


def read_settings(settings, **others):
    """Returns the dataclass settings of the flags' values: a list as a tuple, then read by its Flag's read (a value
    but None); others: its fields that are not settings."""
    values = {}
    for field in dataclasses.fields(settings):
        flag = onu_settings.flag_of(field)
        if flag:
            value = FLAGS[field.name].value
            value = tuple(value) if flag.kind == 'list' else value
            values[field.name] = flag.read(value) if flag.read and value is not None else value
    return settings(**values, **others)


# pragma: no mutate start (declarations, run once as a script starts: the checks they register are mutated below)
def define_data_dir_flag():
    """Declares --data_dir, the data every script reads or writes: photos or records (README "Bring your own data")."""
    define_settings(onu_settings.SharedSettings, ('data_dir',))


def define_split_flags():
    """Declares --validation_percent and --labels_offset: how a split is made, and labels read, where the data is silent."""
    define_settings(onu_settings.SharedSettings, ('validation_percent', 'labels_offset'))


def define_seed_flag():
    """Declares --seed (default 0, so that a rerun repeats itself)."""
    define_settings(onu_settings.SharedSettings, ('seed',))


def define_model_flags():
    """Declares the model and data flags of the scripts that build a model: MODEL_SETTINGS."""
    from onu_lib import onu_training  # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    define_settings(onu_training.TrainingOptions, MODEL_SETTINGS)


def define_batch_size_flag():
    """Declares --batch_size: images per batch (per tower and per worker when training)."""
    from onu_lib import onu_training  # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    define_settings(onu_training.TrainingOptions, ('batch_size',))


def define_checkpoint_dir_flag(help_text):
    """Declares --checkpoint_dir, the training run a script after training reads."""
    flags.DEFINE_string('checkpoint_dir', onu_settings.DEFAULT_TRAIN_DIR, help_text)


def define_allow_raw_weights_flag(help_text):
    """Declares --allow_raw_weights, the way out when a checkpoint has no moving averages."""
    flags.DEFINE_boolean('allow_raw_weights', False, help_text)


def define_known_recall_flag():
    """Declares --known_recall: the share of val photos the exported model's known threshold keeps (onu_known)."""
    from onu_lib import onu_known  # pylint: disable=import-outside-toplevel  (numpy only, but not for the data scripts)
    flags.DEFINE_float('known_recall', onu_known.DEFAULT_KNOWN_RECALL,
                       'The exported model answers "unknown" for a photo unlike the val photos of every class it '
                       'knows: its known threshold keeps this share of the val photos (each scored by a fit to the '
                       'others). Lower rejects more photos that are not ONUs, and more that are.',
                       lower_bound=0.5, upper_bound=1.0)


def define_precision_flag(default, help_text):
    """Declares --precision: auto (the hardware decides), float32 or mixed (see onu_precision.choose_precision)."""
    from onu_lib import onu_precision  # pylint: disable=import-outside-toplevel  (TensorFlow)
    flags.DEFINE_enum('precision', default, ('auto',) + onu_precision.PRECISIONS, help_text)


def define_training_flags():
    """Declares the flags of the training scripts (onu_train.py, onu_multi_gpu_train.py, every cluster task)."""
    if 'train_dir' in FLAGS:
        return
    from onu_lib import onu_training  # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    define_settings(onu_training.TrainingOptions)
    flags.register_multi_flags_validator(
        ['data_service', 'cache_decoded_epoch'], _no_local_cache_with_a_service,
        message='--cache_decoded_epoch=memory or disk keeps the decoded epoch on this machine: not with '
                '--data_service, whose workers each see only their share of an epoch')
    onu_cli.define_deprecated_alias('checkpoint_path', 'fine_tune_checkpoint')


def define_num_gpus_flag():
    """Declares --num_gpus, the towers of onu_multi_gpu_train.py."""
    if 'num_gpus' in FLAGS:
        return
    flags.DEFINE_integer('num_gpus', 1, 'How many GPUs to train on, one tower each; without GPUs the '
                         'towers run on the CPU.', lower_bound=1)


# pragma: no mutate end
def _no_local_cache_with_a_service(values):
    """Returns whether --data_service and --cache_decoded_epoch (in values) go together (the message says why)."""
    return not (values['data_service'] and values['cache_decoded_epoch'] not in ('auto', 'off'))


def training_options():
    """Returns the onu_training.TrainingOptions the training flags give: the flags, read once."""
    from onu_lib import onu_training  # pylint: disable=import-outside-toplevel  (TensorFlow: not for the data scripts)
    return read_settings(onu_training.TrainingOptions, flag_values=project_flag_values())


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
