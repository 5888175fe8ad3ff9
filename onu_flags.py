"""Flags shared by the onu scripts, and the run configuration that training saves for them.

Every script imports this module, so a flag used by several scripts is declared here once.
The run configuration (train_dir/run_config.json) is the contract between training and
everything after it: eval, export and predict rebuild the same model from it.
"""
import dataclasses
import json
import os
import sys

from absl import flags
from absl import logging
import tensorflow as tf

import onu_dataset
import onu_model

DEFAULT_DATA_DIR = '/tmp/onu_data'
DEFAULT_TRAIN_DIR = '/tmp/onu_train'
RUN_CONFIG_FILENAME = 'run_config.json'

flags.DEFINE_string('data_dir', DEFAULT_DATA_DIR,
                    'Folder with train/<class>/ and val/<class>/ photos (and tfrecords/ after '
                    'convert_to_tfrecord.py).')
flags.DEFINE_enum('data_format', 'encoded', onu_dataset.DATA_FORMATS,
                  'How images are fed: the original files (images), TFRecords of decoded pixels '
                  '(raw) or of the original file bytes (encoded).')
flags.DEFINE_enum('model', None, onu_model.MODEL_NAMES,
                  'Network to train; default inception_resnet_v2 when a GPU is visible, else small.')
flags.DEFINE_integer('image_size', None, 'Side of the square model input; default: the model\'s own.',
                     lower_bound=16)
flags.DEFINE_integer('batch_size', 32, 'Images per batch.', lower_bound=1)

FLAGS = flags.FLAGS


def define_checkpoint_dir_flag(help_text):
    """Declares --checkpoint_dir, the training run a script after training reads."""
    flags.DEFINE_string('checkpoint_dir', DEFAULT_TRAIN_DIR, help_text)


def define_allow_raw_weights_flag(help_text):
    """Declares --allow_raw_weights, the way out when a checkpoint has no moving averages."""
    flags.DEFINE_boolean('allow_raw_weights', False, help_text)


def define_precision_flag(default, help_text):
    """Declares --precision: auto (the hardware decides), float32 or mixed (see onu_model.choose_precision)."""
    flags.DEFINE_enum('precision', default, ('auto',) + onu_model.PRECISIONS, help_text)


def resolve_precision(requested, use_gpus=True):
    """Returns the onu_model.Precision that --precision gives here; prints the devices, it and any warning.

    use_gpus False: the model runs on the CPU even where GPUs are visible (onu_eval --device=cpu).
    """
    hardware = onu_model.detect_hardware()
    if not use_gpus:
        hardware = dataclasses.replace(hardware, gpus=())
    precision, warning = onu_model.choose_precision(requested, hardware)
    if warning:
        print(f'warning: {warning}', file=sys.stderr, flush=True)
    gpus = ', '.join(f'{name} (compute capability {".".join(map(str, capability))})'
                     for name, capability in hardware.gpus) or 'none visible' + ('' if use_gpus else ' (--device=cpu)')
    bfloat16 = ', '.join(hardware.cpu_bfloat16_flags) or 'no bfloat16 instructions'
    print(f'GPUs: {gpus}; CPU: {hardware.cpu_model or "unknown"} ({bfloat16}); precision: '
          f'{precision.describe()}', flush=True)
    return precision


def session_config(hide_gpus=False):
    """Returns the session config: soft placement so one graph runs on CPU or GPU, GPU memory on demand."""
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    if hide_gpus:
        config.device_count['GPU'] = 0
    config.gpu_options.allow_growth = True
    return config


def run_script(body, argv, takes_arguments=False, user_errors=()):
    """Runs body() for a script's main; a DataError (or user_errors) becomes `error: <message>`, exit 2."""
    if len(argv) > 1 and not takes_arguments:
        print(f'error: unexpected arguments {argv[1:]}; see --help', file=sys.stderr)
        return 2
    if not FLAGS['verbosity'].present:  # TensorFlow's INFO and deprecation lines drown the script's own
        logging.set_verbosity(logging.WARNING)
        tf.get_logger().setLevel('ERROR')
    try:
        return body() or 0
    except (onu_dataset.DataError,) + tuple(user_errors) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2


def project_flag_values():
    """Returns {name: value} of the flags this project's modules and scripts define."""
    repo_dir = os.path.dirname(os.path.abspath(__file__))
    values = {}
    for module, module_flags in FLAGS.flags_by_module_dict().items():
        name = os.path.splitext(os.path.basename(module))[0]
        if os.path.isfile(os.path.join(repo_dir, name + '.py')):
            values.update((flag.name, flag.value) for flag in module_flags)
    return values


def run_config_path(train_dir):
    """Returns the path of the run configuration in train_dir."""
    return os.path.join(train_dir, RUN_CONFIG_FILENAME)


def save_run_config(train_dir, config):
    """Writes config as JSON to train_dir/run_config.json, atomically."""
    os.makedirs(train_dir, exist_ok=True)
    path = run_config_path(train_dir)
    tmp_path = path + '.tmp'
    with open(tmp_path, 'w', encoding='utf-8') as f:
        json.dump(config, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write('\n')
    os.replace(tmp_path, path)


def load_run_config(train_dir):
    """Returns the run configuration saved in train_dir, or None when there is none."""
    path = run_config_path(train_dir)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding='utf-8') as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise onu_dataset.DataError(
            f'{path}: unreadable run configuration ({e}); restore it or train into a new --train_dir')


def value_or_saved(flag_name, run_config, config_key=None):
    """Returns the flag's value when given on the command line, else the training run's saved one."""
    if FLAGS[flag_name].present or not run_config:
        return FLAGS[flag_name].value
    return run_config.get(config_key or flag_name, FLAGS[flag_name].value)
