"""What every onu script does first and last: a quiet start, deprecated flag spellings, one-line errors.

Each script imports this module first, before TensorFlow. On import, unless --verbose, it filters the known harmless
deprecation warnings and sets TensorFlow's C++ logging to errors only unless the user set TF_CPP_MIN_LOG_LEVEL. A
script that uses TensorFlow then calls import_tensorflow(), which drops the start-up lines TensorFlow writes before
any log level applies. The scripts' own warnings always print; the data scripts never import TensorFlow.
"""
import atexit
import contextlib
import gc
import os
import re
import sys
import tempfile
import warnings

from absl import flags
from absl import logging

from onu_lib import onu_errors

FLAGS = flags.FLAGS
VERBOSE_FLAG = 'verbose'
TF_LOG_LEVEL_ENV = 'TF_CPP_MIN_LOG_LEVEL'
TF_LOG_LEVEL_ERRORS_ONLY = '2'  # TF_CPP_MIN_LOG_LEVEL: 0 everything, 1 no INFO, 2 no WARNING
SET_BY_ONU_ENV = 'ONU_SET_TF_CPP_MIN_LOG_LEVEL'  # inherited by child processes: not the user's setting
USER_SET_TF_LOG_LEVEL = TF_LOG_LEVEL_ENV in os.environ and SET_BY_ONU_ENV not in os.environ
# Deprecation warnings that tf-slim and the tf.compat.v1 layers give on every run about their own code
# ("`layer.apply` is deprecated", ...).
HARMLESS_WARNING_MODULES = r'(tf_slim|tf_keras|tensorflow|keras)(\.|$)'
HARMLESS_WARNING_MESSAGES = r'.*(deprecated|dtype argument)'
# Keras 3, which TensorFlow imports, imports these at start-up if it can, for notebook display and image galleries
# that no script uses: kept out while TensorFlow loads (Keras goes without them).
# (Keras 3 itself stays: kept out, it would leave `from tensorflow.keras import ...` broken for the whole process.)
KERAS_OPTIONAL_IMPORTS = ('IPython', 'matplotlib')
# TensorFlow's C++ lines at start-up: INFO and WARNING lines, absl's note that logging is not
# initialised yet, and the CUDA driver probe failing on a machine without a GPU.
NATIVE_START_UP_LINE = re.compile(r'([IW]\d{4} [\d:.]+ +\d+ \S+:\d+\] |'
                                  r'WARNING: All log messages before absl::InitializeLog\(\) |'
                                  r'E\d{4} .*\] failed call to cuInit: |'
                                  r'E\d{4} .*\] oneDNN supports DT_UINT8 only |'
                                  r'To enable the following instructions: .* rebuild TensorFlow with)')
# TensorFlow Lite's lines, printed whatever the log level: the converter's summary of each conversion, and LiteRT's
# note on the CPU delegate of every model it loads.
TFLITE_LINE = re.compile(r'(fully_quantize: \d+, inference_type: |INFO: Created TensorFlow Lite XNNPACK delegate)')


def verbose_requested(argv=None):
    """Returns True when the command line asks for --verbose (read before flags are parsed)."""
    spellings = {f'--{VERBOSE_FLAG}'} | {f'--{VERBOSE_FLAG}={value}' for value in ('true', 'True', '1')}
    return any(arg in spellings for arg in (sys.argv[1:] if argv is None else argv))


def quiet_start(verbose):
    """Quiets TensorFlow's C++ start-up lines and the known deprecation warnings, unless verbose."""
    if verbose:
        if SET_BY_ONU_ENV in os.environ:  # a parent onu script's quiet setting: not for a verbose run
            os.environ.pop(TF_LOG_LEVEL_ENV, None)
            os.environ.pop(SET_BY_ONU_ENV)
        return
    if not USER_SET_TF_LOG_LEVEL:
        os.environ[TF_LOG_LEVEL_ENV] = TF_LOG_LEVEL_ERRORS_ONLY
        os.environ[SET_BY_ONU_ENV] = '1'
    warnings.filterwarnings('ignore', category=DeprecationWarning, module=HARMLESS_WARNING_MODULES)
    warnings.filterwarnings('ignore', category=FutureWarning, module=HARMLESS_WARNING_MODULES)
    warnings.filterwarnings('ignore', message=HARMLESS_WARNING_MESSAGES, category=UserWarning,
                            module=HARMLESS_WARNING_MODULES)


quiet_start(verbose_requested())


@contextlib.contextmanager
def native_lines_dropped(pattern):
    """Within it, native stderr (fd 2) is kept back; after it, all but the lines pattern matches print."""
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors='replace').splitlines(keepends=True)
                    if not pattern.match(line)]
            sys.stderr.write(''.join(kept))
            sys.stderr.flush()


@contextlib.contextmanager
def keras_optional_imports_skipped():
    """Within it, the packages of KERAS_OPTIONAL_IMPORTS not loaded yet cannot be imported."""
    skipped = [name for name in KERAS_OPTIONAL_IMPORTS if name not in sys.modules]
    for name in skipped:
        sys.modules[name] = None  # an import of it raises ImportError, which Keras catches
    try:
        yield
    finally:
        for name in skipped:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def import_tensorflow():
    """Imports TensorFlow and lets it probe its devices, its start-up lines dropped unless --verbose."""
    # Python's last garbage collection walks every TensorFlow object: skipped (what must be written is closed
    # explicitly). Registered before TensorFlow's exit handlers, so it runs after them.
    atexit.register(gc.freeze)
    # Dropped even at a TF_CPP_MIN_LOG_LEVEL the user set: no level stops these lines.
    if verbose_requested():
        with keras_optional_imports_skipped():
            import tensorflow as tf  # pylint: disable=import-outside-toplevel
        return tf
    with native_lines_dropped(NATIVE_START_UP_LINE), keras_optional_imports_skipped():
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from onu_lib import onu_precision  # pylint: disable=import-outside-toplevel  (it imports TensorFlow)
        onu_precision.visible_gpus()
        # oneDNN's once-per-process error line at its first uint8 transpose, said here to be dropped; a graph
        # session without GPUs leaves the eager runtime uninitialised, so a script can still choose its devices.
        with tf.Graph().as_default():
            with tf.compat.v1.Session(config=onu_precision.session_config(hide_gpus=True)) as session:
                session.run(tf.transpose(tf.zeros([1, 2, 1], tf.uint8), [1, 0, 2]))
    return tf


def tflite_lines_dropped():
    """Within it, TensorFlow Lite's notes (TFLITE_LINE) are dropped, unless --verbose."""
    return contextlib.nullcontext() if verbose_requested() else native_lines_dropped(TFLITE_LINE)


flags.DEFINE_boolean(VERBOSE_FLAG, False, 'Show everything: TensorFlow\'s C++ log, its INFO lines and '
                     'the deprecation warnings a normal run hides.')


def show_progress():
    """True when a progress bar can be seen: stdout and stderr both a terminal (never into logs or pipes)."""
    return sys.stdout.isatty() and sys.stderr.isatty()


_ALIASES = {}  # deprecated flag name -> the flag it spells


def define_deprecated_alias(old_name, new_name):
    """Declares --old_name as a deprecated spelling of the declared flag --new_name, kept for a release."""
    flag = FLAGS[new_name]
    flags.DEFINE_flag(flags.Flag(flag.parser, flag.serializer, old_name, None,
                                 f'Deprecated spelling of --{new_name}; use that.'), flag_values=FLAGS)
    _ALIASES[old_name] = new_name


def is_deprecated_alias(name):
    """Returns True when the flag called name is a deprecated spelling (not saved with a run's flags)."""
    return name in _ALIASES


def apply_deprecated_aliases():
    """Moves the values given under deprecated spellings to their flags, warning once each; flags.Error when a flag
    is given under both spellings with different values."""
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


def run_script(body, argv, takes_arguments=False, user_errors=(), failures=(), completions=()):
    """Runs body() for a script's main; a user error becomes one `error: <message>` line, exit 2.

    user_errors: exception types whose message is for the user (besides UserError and flags.Error); failures: those
    that end a run that went wrong (one line, exit 1); completions: nothing to do (the message on stdout, exit 0).
    """
    if len(argv) > 1 and not takes_arguments:
        print(f'error: unexpected arguments {argv[1:]}; see --help', file=sys.stderr)
        return 2
    if not FLAGS[VERBOSE_FLAG].value and not FLAGS['verbosity'].present:
        logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines drown the script's own
        if 'tensorflow' in sys.modules:
            sys.modules['tensorflow'].get_logger().setLevel('ERROR')
    try:
        apply_deprecated_aliases()
        return body() or 0
    except (onu_errors.UserError, flags.Error) + tuple(user_errors) as e:
        print(f'error: {e}', file=sys.stderr)
        return 2
    except tuple(failures) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    except tuple(completions) as e:
        print(e, flush=True)
        return 0
