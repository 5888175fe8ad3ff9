"""What every onu script does first and last: a quiet start, deprecated flag spellings, one-line errors.

Each script imports this module before TensorFlow (before any onu module that imports it): on
import it sets TensorFlow's C++ logging to errors only, unless the user set TF_CPP_MIN_LOG_LEVEL
or passed --verbose, and filters the known harmless deprecation warnings of tf-slim and the legacy
layers. Real warnings (a skipped photo, a damaged record, a precision fallback) are the scripts'
own lines and always print. This module imports no TensorFlow itself.
"""
import os
import sys
import warnings

from absl import flags
from absl import logging

import onu_dataset  # no TensorFlow there either

FLAGS = flags.FLAGS
VERBOSE_FLAG = 'verbose'
TF_LOG_LEVEL_ERRORS_ONLY = '2'  # TF_CPP_MIN_LOG_LEVEL: 0 everything, 1 no INFO, 2 no WARNING
# Deprecation warnings that tf-slim and the tf.compat.v1 layers give on every run, about code that is
# theirs: "`tf.layers.batch_normalization` is deprecated", "Call initializer instance with the dtype
# argument", "`layer.apply` is deprecated", ... (Python warnings and TensorFlow's own logger).
HARMLESS_WARNING_MODULES = r'(tf_slim|tf_keras|tensorflow|keras|absl)(\.|$)'


def verbose_requested(argv=None):
    """Returns True when the command line asks for --verbose (read before flags are parsed)."""
    return any(arg in (f'--{VERBOSE_FLAG}', f'--{VERBOSE_FLAG}=true', f'--{VERBOSE_FLAG}=True')
               for arg in (sys.argv[1:] if argv is None else argv))


def quiet_start(verbose):
    """Quiets TensorFlow's C++ start-up lines and the known deprecation warnings, unless verbose."""
    if verbose:
        return
    os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', TF_LOG_LEVEL_ERRORS_ONLY)
    warnings.filterwarnings('ignore', category=DeprecationWarning, module=HARMLESS_WARNING_MODULES)
    warnings.filterwarnings('ignore', category=FutureWarning, module=HARMLESS_WARNING_MODULES)
    warnings.filterwarnings('ignore', category=UserWarning, module=r'(tf_slim|tf_keras)(\.|$)')


quiet_start(verbose_requested())

flags.DEFINE_boolean(VERBOSE_FLAG, False, 'Show everything: TensorFlow\'s C++ log, its INFO lines and '
                     'the deprecation warnings a normal run hides.')



def define_data_dir_flag():
    """Declares --data_dir, the photo folder every script reads or writes (train/<class>/, val/<class>/)."""
    flags.DEFINE_string('data_dir', onu_dataset.DEFAULT_DATA_DIR,
                        'Folder with train/<class>/ and val/<class>/ photos (and tfrecords/ after '
                        'convert_to_tfrecord.py).')


def define_seed_flag(help_text):
    """Declares --seed (default 0, so that a rerun repeats itself)."""
    flags.DEFINE_integer('seed', 0, help_text)


_ALIASES = {}  # deprecated flag name -> the flag it spells


def define_deprecated_alias(old_name, new_name):
    """Declares --old_name as a deprecated spelling of the declared flag --new_name, kept for a release."""
    flag = FLAGS[new_name]
    flags.DEFINE_flag(flags.Flag(flag.parser, flag.serializer, old_name, None,
                                 f'Deprecated spelling of --{new_name}; use that.'))
    _ALIASES[old_name] = new_name


def is_deprecated_alias(name):
    """Returns True when the flag called name is a deprecated spelling (not saved with a run's flags)."""
    return name in _ALIASES


def apply_deprecated_aliases():
    """Moves the values given under deprecated spellings to their flags, warning once each.

    Raises flags.Error when a flag is given under both spellings with different values.
    """
    for old_name, new_name in _ALIASES.items():
        if not FLAGS[old_name].present:
            continue
        old, new = FLAGS[old_name], FLAGS[new_name]
        if new.present and new.value != old.value:
            raise flags.Error(f'--{old_name} (deprecated) and --{new_name} disagree; give only '
                              f'--{new_name}')
        print(f'warning: --{old_name} is deprecated and will be removed: use --{new_name}',
              file=sys.stderr, flush=True)
        new.value = old.value
        new.present = old.present


def run_script(body, argv, takes_arguments=False, user_errors=()):
    """Runs body() for a script's main; a user error becomes one `error: <message>` line, exit 2.

    user_errors: exception types whose message is for the user (onu_dataset.DataError and
    flags.Error always are).
    """
    if len(argv) > 1 and not takes_arguments:
        print(f'error: unexpected arguments {argv[1:]}; see --help', file=sys.stderr)
        return 2
    if not FLAGS.verbose and not FLAGS['verbosity'].present:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines drown the script's own
        if 'tensorflow' in sys.modules:
            sys.modules['tensorflow'].get_logger().setLevel('ERROR')
    try:
        apply_deprecated_aliases()
        return body() or 0
    except (onu_dataset.DataError, flags.Error) + tuple(user_errors) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
