"""Tests of onu_cli.py: the native start-up lines filter, deprecated flag spellings, one-line errors."""
import os
import subprocess
import sys

from absl import flags
import pytest

from conftest import REPO_ROOT, SCRIPT_TIMEOUT_SECS, ScriptProcess, run_script, start_script
from onu_lib import onu_cli
from onu_lib import onu_errors

START_UP_LINES = [
    'WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n',
    'I0000 00:00:1796124987.368846    7252 port.cc:153] oneDNN custom operations are on.\n',
    'I0000 00:00:1796124987.369246    7252 cudart_stub.cc:31] Could not find cuda drivers on your machine.\n',
    'E0000 00:00:1796125000.192303    7414 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error\n',
    'I0000 00:00:1796126237.971660   32646 cpu_feature_guard.cc:227] This TensorFlow binary is optimized.\n',
    'To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild TensorFlow with the '
    'appropriate compiler flags.\n',
]
KEPT_LINES = ['warning: /data/train/F603/x.jpg skipped: truncated\n',
              'E0000 00:00:1796125000.1    7414 kernel.cc:1] a real error\n']


def test_native_start_up_lines_are_dropped_and_everything_else_kept(capfd):
    with onu_cli.native_lines_dropped(onu_cli.NATIVE_START_UP_LINE):
        for line in START_UP_LINES[:3] + KEPT_LINES[:1] + START_UP_LINES[3:] + KEPT_LINES[1:]:
            os.write(2, line.encode())
    assert capfd.readouterr().err == ''.join(KEPT_LINES)


def env_with_log_level(level):
    """Returns this environment with TF_CPP_MIN_LOG_LEVEL at level (None: unset), no onu_cli setting inherited."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(('TF_CPP', 'ONU_'))}
    if level is not None:
        env[onu_cli.TF_LOG_LEVEL_ENV] = level
    return env


# What TensorFlow 2.21 prints while it loads and probes its devices (none of it the script's).
START_UP_NOISE = ('oneDNN', 'cuInit', 'cudart', 'absl::InitializeLog', 'cpu_feature_guard', 'rebuild TensorFlow')


@pytest.mark.parametrize('level', [None, '0', '2'])  # unset, everything, and the common quiet setting
def test_a_script_starts_quietly_whatever_the_users_log_level(tmp_path, level):
    # onu_export.py imports TensorFlow, then stops at once: no run_config.json in the folder.
    result = run_script('onu_export.py', f'--checkpoint_dir={tmp_path}', env=env_with_log_level(level),
                        fresh_process=True)  # the point is the start: not a fork of the tests' script server
    assert result.returncode == 2
    noise = [line for line in result.stderr.splitlines() if any(word in line for word in START_UP_NOISE)]
    assert noise == []
    assert result.stderr.splitlines() == [f'error: {tmp_path}/run_config.json not found: pass the --checkpoint_dir '
                                          '(train_dir) that onu_train.py wrote, which holds the model, image size '
                                          'and class names']
    if level != '0':  # the tests' script server runs it as this fresh process did: the same output and exit status
        forked = start_script('onu_export.py', f'--checkpoint_dir={tmp_path}', env=env_with_log_level(level),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert isinstance(forked, ScriptProcess)
        assert (forked.communicate(timeout=60), forked.returncode) == ((result.stdout, result.stderr), result.returncode)


# After start-up, TensorFlow's C++ WARNING that a dataset's cache was read in part: shown at levels 0 and 1 only.
# Also: Keras's optional imports are left out of the start and import as usual afterwards (so does tensorflow.keras),
# and the garbage collection at exit is skipped (this handler, registered first, runs last).
AFTER_START_UP = '''
import atexit, gc, sys
atexit.register(lambda: print(f'frozen at exit: {gc.get_freeze_count() > 0}', file=sys.stderr, flush=True))
from onu_lib import onu_cli
from onu_lib import onu_errors
from onu_lib import onu_errors
tf = onu_cli.import_tensorflow()
print('started', file=sys.stderr, flush=True)
print(f'loaded: {[name for name in onu_cli.KERAS_OPTIONAL_IMPORTS if name in sys.modules]}', file=sys.stderr)
import matplotlib.pyplot  # IPython is kept out the same way, but is in no requirements file: not imported here
print(f'imported: {matplotlib.pyplot.figure is not None}', file=sys.stderr)
from tensorflow.keras import layers
print(f'tf.keras: {layers.Dense(2)(tf.ones([1, 3])).shape}', file=sys.stderr)
next(iter(tf.data.Dataset.range(10).cache()))  # the iterator is dropped with 9 elements unread
'''
CACHE_WARNING = 'The calling iterator did not fully read the dataset being cached'


@pytest.mark.parametrize('level, shown', [('0', True), (None, False)])
def test_the_users_log_level_governs_what_tensorflow_logs_after_start_up(level, shown):
    result = subprocess.run([sys.executable, '-c', AFTER_START_UP], capture_output=True, text=True, cwd=REPO_ROOT,
                            env=env_with_log_level(level), timeout=SCRIPT_TIMEOUT_SECS)
    assert result.returncode == 0, result.stderr[-3000:]
    start_up, after = result.stderr.split('started\n')
    assert start_up == ''
    assert (CACHE_WARNING in after) == shown
    assert after.startswith('loaded: []\nimported: True\ntf.keras: (1, 2)\n')
    assert after.endswith('frozen at exit: True\n')


@pytest.fixture
def alias_flags(monkeypatch):
    """A fresh FlagValues with --new_name and its deprecated spelling --old_name, used by onu_cli."""
    values = flags.FlagValues()
    flags.DEFINE_string('new_name', 'default', 'A flag.', flag_values=values)
    monkeypatch.setattr(onu_cli, 'FLAGS', values)
    monkeypatch.setattr(onu_cli, '_ALIASES', {})
    onu_cli.define_deprecated_alias('old_name', 'new_name')
    return values


def test_a_deprecated_spelling_sets_its_flag_with_one_warning(alias_flags, capsys):
    alias_flags(['prog', '--old_name=given'])
    onu_cli.apply_deprecated_aliases()
    assert alias_flags.new_name == 'given' and alias_flags['new_name'].present
    assert capsys.readouterr().err == 'warning: --old_name is deprecated and will be removed: use --new_name\n'
    assert onu_cli.is_deprecated_alias('old_name') and not onu_cli.is_deprecated_alias('new_name')


def test_both_spellings_with_different_values_are_an_error(alias_flags):
    alias_flags(['prog', '--old_name=a', '--new_name=b'])
    with pytest.raises(flags.Error, match='--old_name .deprecated. and --new_name disagree'):
        onu_cli.apply_deprecated_aliases()


def test_run_script_turns_user_errors_and_failures_into_one_line(capsys):
    def data_error():
        raise onu_errors.DataError('/data: no train/ folder; put photos in /data/train/<class>/')

    def failure():
        raise RuntimeError('loss is nan at step 3')

    assert onu_cli.run_script(data_error, ['prog']) == 2
    assert capsys.readouterr().err == 'error: /data: no train/ folder; put photos in /data/train/<class>/\n'
    assert onu_cli.run_script(failure, ['prog'], failures=(RuntimeError,)) == 1
    assert capsys.readouterr().err == 'error: loss is nan at step 3\n'
    assert onu_cli.run_script(lambda: None, ['prog', 'extra']) == 2
    assert 'unexpected arguments' in capsys.readouterr().err
