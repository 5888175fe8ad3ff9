"""Shared tiny-data fixtures (small images, one tiny training run; in pytest's temp folders) and the script runner.

Test files mirror the modules: tests/test_X.py tests X.py (a script, a core library at the root, or a library in
onu_lib/). A library that is one script's engine is tested with it: onu_converter with convert_to_tfrecord,
onu_sample_data with make_sample_data, onu_serving with onu_export, run_local_cluster with onu_cluster.

  make_tiny_dataset(name='data', train_per_class=4, val_per_class=2, image_size=(64, 48)) -> data_dir
      factory: a fresh sample dataset (classes F603, F663N) under tmp_path/name, yours to modify.
  tiny_data_dir     session-wide, read-only: a sample dataset (4 train + 2 val JPEGs of 64x48 per class)
                    already converted to both record kinds in tiny_data_dir/tfrecords (2 shards per split).
  tiny_records_dir  session-wide, read-only: tiny_data_dir/tfrecords (shards, labels.txt, manifest.json).
  built_once(tmp_path_factory, name)  context: (folder, build) for a fixture the test processes of one pytest run
                    share: the first builds it (build True), the others wait, then read it.
  tiny_run          session-wide (built once for all test processes: built_once), read-only (copy it into tmp_path
                    before changing anything): one real
                    onu_train.py run (TINY_RUN_FLAGS: default model, i.e. small; 32x32, batch 8, seed 1) of 12
                    steps on 8 train + 4 val JPEGs of 96x72 per class. An epoch is 2 steps; checkpoints at 0,
                    2, ..., 12; SavedModels exported at 4, 8, 12; the encoded records made by that run; a
                    user's notes.txt in train_dir.
                    Attributes: data_dir, train_dir, export_dir, result (CompletedProcess), config (RunConfig).
  tiny_run_of(model_name) -> the tiny run of that registered model: tiny_run itself for its model, else the same
                    run (flags, steps, data) with --model, made once per session; read-only too, same attributes.
  script_tested_models()  the registered models the script tests train, evaluate and export for real: all but
                    HEAVY_MODELS, which test_onu_model.py builds and trains in-process.
  run_script(script, *args, timeout=300, env=None, fresh_process=False) -> CompletedProcess
                    runs `python REPO_ROOT/script *args` (a name without .py: that tool on PATH) in
                    REPO_ROOT, output as text; env None: this process's environment, as it is.
  start_script(script, *args, env=None, fresh_process=False, **popen_options) -> a Popen, or a ScriptProcess with
                    the same calls (poll, wait, communicate, send_signal, kill, pid, returncode, stdout, stderr):
                    a script that loads TensorFlow is forked from the tests' script server (tests/script_server.py),
                    which loaded TensorFlow once for this test process, so a run costs its work and not 3.5 s of
                    start. The child is the script as a fresh process would run it: its argv, environment, folder,
                    streams, signals and exit status. fresh_process: a new Python process all the same, for a test of
                    the start itself (--verbose, -X options and a TensorFlow log level of another environment are
                    always fresh: TensorFlow reads those as it loads).
  script_command(script, *args)  the command line run_script runs.
  run_on_a_terminal(script, *args) -> (exit code, output): a script run with stdout and stderr on a pseudo-terminal.
  ProcessOutput(process)  a Popen's output read by a thread: .text so far, .wait_for(pattern, timeout_secs) -> the
                    first match once printed, .finish() -> all of it.
  huge_png          session-wide: the path of a 23000x23000 one-colour RGB PNG (~1.5 MB, 529 M pixels), zlib-streamed.
  copy_train_dir(tiny_run, tmp_path, name='train', exports=True) -> a copy of tiny_run's train_dir, yours to change.
  file_states(*folders)  {path: (size, mtime in ns)} of every file below folders: what a test must not change.
  parsed(*args) -> TrainingOptions   factory: a training command line parsed in this process (flags reset after).
  messy_data_dir    session-wide, read-only: the bad input of real photo folders; train/F603 holds them all.
  messy_files       MESSY_FILES: name in messy_data_dir/train/F603 -> None (usable) or a word of its skip reason.
  pattern_image     the 48x32 RGB picture (four coloured quadrants) every messy image is made from.
  STUDY_AUGMENTATION_RANGES  the study's range of each augmentation's parameter, as literals.
  assert_spans(values, low, high, name)  values lie in [low, high] and reach close to both ends.
  mid_colour_image() and colour_effect(name, before, after): the parameter of a colour augmentation, measured per image.
"""

import atexit
import contextlib
import io
import json
import math
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types

import numpy as np
import pytest
from PIL import Image

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from onu_lib import onu_converter  # noqa: E402  (needs REPO_ROOT on sys.path)
from onu_lib import onu_dataset  # noqa: E402
from onu_lib import onu_layout_writer  # noqa: E402
from onu_lib import onu_layouts  # noqa: E402
from onu_lib import onu_run_config  # noqa: E402
from onu_lib import onu_sample_data  # noqa: E402

# The test files that take longest (seconds in one suite run, 2026-12-04), longest first. pytest-xdist hands out
# whole files (--dist loadfile) in collection order, so these go first: left to the alphabet, test_onu_train.py
# started last and ran alone for minutes while the other worker had nothing left to do.
LONGEST_FILES = ('test_onu_benchmark.py', 'test_onu_train.py', 'test_onu_cluster.py', 'test_onu_eval.py',
                 'test_onu_model.py', 'test_onu_decoded_cache.py', 'test_onu_input.py', 'test_onu_data_service.py',
                 'test_onu_layouts.py', 'test_onu_run_folder.py', 'test_onu_hparams.py', 'test_onu_checkpoint.py',
                 'test_onu_export.py', 'test_onu_multi_gpu_train.py', 'test_onu_cli.py', 'test_onu_tflite.py')


def pytest_collection_modifyitems(items):
    """Runs the files of LONGEST_FILES first, longest first, and the rest after them in their own order."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))


TINY_IMAGE_SIZE = (64, 48)
PATTERN_SIZE = (48, 32)
QUADRANT_COLOURS = ((220, 30, 30), (30, 200, 40), (30, 40, 210), (240, 240, 240))  # TL, TR, BL, BR
EXIF_ORIENTATION_TAG = 0x0112

# File name in messy_data_dir/train/F603 -> None if it must be used, else a word of its skip reason.
MESSY_FILES = {
    'plain.jpg': None,
    'gray.jpg': None,
    'cmyk.jpg': None,
    'exif_rotated.jpg': None,  # stored rotated 90 degrees, EXIF orientation 6: upright it is the pattern
    'png_named.jpg': None,  # PNG content under a .jpg name
    'rgba.png': None,
    'bitmap.bmp': None,
    'ünïcødé 照片.jpg': None,
    'trailing_data.jpg': None,  # a JPEG followed by other bytes (as in phone "motion photos")
    'truncated.jpg': 'damaged',
    'empty.jpg': 'empty',
    'notes.txt': 'not an image',
    '.DS_Store': 'hidden',
    'Thumbs.db': 'hidden',
    'subfolder': 'subfolder',
}


def _pattern():
    """Four coloured quadrants: any flip or rotation of it is visible."""
    width, height = PATTERN_SIZE
    pixels = np.zeros((height, width, 3), np.uint8)
    for index, colour in enumerate(QUADRANT_COLOURS):
        row, column = divmod(index, 2)
        pixels[row * height // 2:(row + 1) * height // 2, column * width // 2:(column + 1) * width // 2] = colour
    return Image.fromarray(pixels)


def _encoded(image, image_format, **options):
    """The bytes of image saved in image_format."""
    buffer = io.BytesIO()
    image.save(buffer, image_format, **options)
    return buffer.getvalue()


def _write(path, data):
    """Writes bytes to path, creating its folder."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        f.write(data)


def _messy_file_bytes(pattern):
    """The content of each usable or broken file of MESSY_FILES (all but the subfolder)."""
    jpeg = _encoded(pattern, 'JPEG', quality=95)
    noisy = Image.fromarray(np.random.default_rng(0).integers(0, 256, (120, 160, 3), dtype=np.uint8))
    noisy_jpeg = _encoded(noisy, 'JPEG', quality=90)
    rotated = pattern.transpose(Image.Transpose.ROTATE_90)  # EXIF orientation 6 turns it back upright
    exif = Image.Exif()
    exif[EXIF_ORIENTATION_TAG] = 6
    rgba = pattern.convert('RGBA')
    rgba.putalpha(128)
    return {
        'plain.jpg': jpeg,
        'gray.jpg': _encoded(pattern.convert('L'), 'JPEG', quality=95),
        'cmyk.jpg': _encoded(pattern.convert('CMYK'), 'JPEG', quality=95),
        'exif_rotated.jpg': _encoded(rotated, 'JPEG', quality=95, exif=exif.tobytes()),
        'png_named.jpg': _encoded(pattern, 'PNG'),
        'rgba.png': _encoded(rgba, 'PNG'),
        'bitmap.bmp': _encoded(pattern, 'BMP'),
        'ünïcødé 照片.jpg': jpeg,
        'trailing_data.jpg': jpeg + b'\x00\x00\x00\x18ftypmp42' + bytes(200),
        'truncated.jpg': noisy_jpeg[:len(noisy_jpeg) * 2 // 3],  # header intact, image data cut short
        'empty.jpg': b'',
        'notes.txt': 'shot list: F603 front, back\n'.encode(),
        '.DS_Store': b'\x00\x00\x00\x01Bud1' + bytes(60),
        'Thumbs.db': bytes(range(256)),
    }


def write_messy_dataset(data_dir):
    """Writes train/{F603,F663N} and val/{F603,F663N}; train/F603 holds every file of MESSY_FILES."""
    pattern = _pattern()
    class_dir = os.path.join(data_dir, 'train', 'F603')
    for name, data in _messy_file_bytes(pattern).items():
        _write(os.path.join(class_dir, name), data)
    _write(os.path.join(class_dir, 'subfolder', 'more.jpg'), _encoded(pattern, 'JPEG'))
    for split, class_name in (('train', 'F663N'), ('val', 'F603'), ('val', 'F663N')):
        _write(os.path.join(data_dir, split, class_name, 'plain.jpg'), _encoded(pattern, 'JPEG', quality=90))
    return data_dir


@pytest.fixture
def make_tiny_dataset(tmp_path):
    """Factory: make_tiny_dataset(name, train_per_class, val_per_class, image_size) -> a fresh data_dir."""
    def make(name='data', train_per_class=4, val_per_class=2, image_size=TINY_IMAGE_SIZE, seed=0):
        data_dir = str(tmp_path / name)
        onu_sample_data.generate_dataset(data_dir, train_per_class, val_per_class, image_size, seed, processes=1)
        return data_dir
    return make


@pytest.fixture(scope='session')
def tiny_data_dir(tmp_path_factory):
    """A read-only tiny sample dataset, already converted to both record kinds in <it>/tfrecords."""
    data_dir = str(tmp_path_factory.mktemp('tiny') / 'data')
    onu_sample_data.generate_dataset(data_dir, 4, 2, TINY_IMAGE_SIZE, seed=0, processes=1)
    onu_converter.convert(onu_dataset.describe(data_dir), num_shards=2, processes=1)
    return data_dir


@pytest.fixture(scope='session')
def tiny_records_dir(tiny_data_dir):
    """The read-only records directory of tiny_data_dir."""
    return os.path.join(tiny_data_dir, 'tfrecords')


@pytest.fixture(scope='session')
def messy_data_dir(tmp_path_factory):
    """A read-only photo folder with every kind of bad input users' folders contain (see MESSY_FILES)."""
    return write_messy_dataset(str(tmp_path_factory.mktemp('messy') / 'data'))


@pytest.fixture(scope='session')
def messy_files():
    """MESSY_FILES: which files of messy_data_dir/train/F603 are usable, and why the others are skipped."""
    return dict(MESSY_FILES)


@pytest.fixture(scope='session')
def pattern_image():
    """The upright RGB image every usable file of messy_data_dir shows."""
    return _pattern()


# ----------------------------------------------------------------------------------------------
# The study's augmentation ranges, and what the augmentations do to an image

# Written out here, not read from onu_input, so that a range changed in the code fails the tests that check it:
# saturation and contrast factors, brightness delta (on [0, 1]), hue shift (of the colour circle), angle (radians).
STUDY_AUGMENTATION_RANGES = {
    'saturation': (0.8, 1.2),
    'brightness': (-32.0 / 255.0, 32.0 / 255.0),
    'contrast': (0.8, 1.2),
    'hue': (-0.2, 0.2),
    'rotation': (-math.radians(10.0), math.radians(10.0)),
}


def assert_spans(values, low, high, name):
    """Asserts values lie in [low, high] and reach close to both ends."""
    reach = 0.1 * (high - low)
    assert low - 1e-4 <= values.min() < low + reach and high - reach < values.max() <= high + 1e-4, (
        name, values.min(), values.max())


def mid_colour_image(size=8, seed=0):
    """A float32 [size, size, 3] RGB image in [0, 1] of mid-range colours: no colour augmentation clips it, and the
    hue and saturation of each pixel are defined."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.uniform(0.45, 0.6, (size, size)), rng.uniform(0.3, 0.4, (size, size)),
                     rng.uniform(0.2, 0.25, (size, size))], axis=-1).astype(np.float32)


def _hue_and_saturation(images):
    """The (hue in [0, 1), saturation) of each pixel of RGB images in [0, 1], by HSV's definition."""
    red, green, blue = np.moveaxis(images, -1, 0)
    high, low = images.max(axis=-1), images.min(axis=-1)
    span = np.maximum(high - low, 1e-12)
    sixths = np.select([high == red, high == green], [(green - blue) / span, 2.0 + (blue - red) / span],
                       4.0 + (red - green) / span)
    return (sixths / 6.0) % 1.0, (high - low) / np.maximum(high, 1e-12)


def colour_effect(name, before, after):
    """The parameter of the colour augmentation name (brightness, contrast, saturation or hue) of each image, measured
    between [n, h, w, 3] RGB images in [0, 1] before and after it ran alone (unclipped, on mid_colour_image)."""
    if name == 'brightness':
        return (after - before).mean(axis=(1, 2, 3))
    if name == 'contrast':
        return (after.std(axis=(1, 2)) / before.std(axis=(1, 2))).mean(axis=-1)
    (hue_before, saturation_before), (hue_after, saturation_after) = (
        _hue_and_saturation(images) for images in (before, after))
    if name == 'saturation':
        return (saturation_after / saturation_before).mean(axis=(1, 2))
    assert name == 'hue', name
    return np.median((hue_after - hue_before + 0.5) % 1.0 - 0.5, axis=(1, 2))


@pytest.fixture
def parsed():
    """Factory: parsed(*args) parses args as a training script's command line in this process; returns the
    TrainingOptions read from them. The flags are reset after."""
    from onu_lib import onu_flags  # pylint: disable=import-outside-toplevel
    from absl import flags  # pylint: disable=import-outside-toplevel
    onu_flags.define_training_flags()  # once per process

    def parse(*args):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(['onu_train.py', *args])
        return onu_flags.training_options()
    yield parse
    flags.FLAGS.unparse_flags()


# ----------------------------------------------------------------------------------------------
# The scripts as subprocesses, and the one tiny training run the script tests share

SCRIPT_TIMEOUT_SECS = 300
TINY_RUN_STEPS = 12
TINY_RUN_FLAGS = ('--image_size=32', '--batch_size=8', '--seed=1', '--log_frequency=1', '--save_summaries_steps=1',
                  '--save_checkpoint_steps=2', '--keep_checkpoint_max=20', '--export_every_n_epochs=2')
TINY_RUN_NOTES = 'mine'  # train_dir/notes.txt, the user's file training must leave alone


def script_command(script, *args):
    """Returns the command line that runs a repo script (or, for a name without .py, a tool on PATH)."""
    if script.endswith('.py'):
        return [sys.executable, os.path.join(REPO_ROOT, script), *args]
    return [script, *args]


def run_script(script, *args, timeout=SCRIPT_TIMEOUT_SECS, env=None, fresh_process=False):
    """Runs script_command(script, *args) in REPO_ROOT; returns the CompletedProcess (text output).

    A script that loads TensorFlow is forked from the tests' script server (start_script); fresh_process: a new
    Python process all the same, for a test of the process's start itself.
    """
    process = start_script(script, *args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                           fresh_process=fresh_process)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(script_command(script, *args), process.returncode, stdout, stderr)


def start_script(script, *args, env=None, fresh_process=False, **popen_options):
    """Starts script_command(script, *args) in REPO_ROOT as Popen(**popen_options) would (text output); returns it.

    A repo script that loads TensorFlow is forked from the tests' script server (tests/script_server.py), which has
    loaded it once: the run costs its work, not 3.5 s of start. Unless fresh_process, or --verbose or a TensorFlow
    log level of the environment differs from the server's (TensorFlow's C++ reads those once, as it loads).
    """
    return start_command(script_command(script, *args), env=env, fresh_process=fresh_process, **popen_options)


def start_command(command, env=None, fresh_process=False, **popen_options):
    """start_script's way for a whole command line: forked by the tests' script server when it runs command as a
    fresh process would (a repo script that loads TensorFlow, or `python -m tensorboard.main`), else a Popen."""
    environment = dict(os.environ if env is None else env)
    popen_options['text'] = True
    if fresh_process or not _SCRIPT_SERVER.serves(command, environment):
        return subprocess.Popen(command, env=env, cwd=REPO_ROOT, **popen_options)
    return ScriptProcess(_SCRIPT_SERVER.path, command, environment, **popen_options)


# What Python or TensorFlow reads from the environment once, as they load (the script server loaded them already).
READ_AS_PYTHON_AND_TF_LOAD = ('PYTHONPATH', 'PYTHONHASHSEED', 'PYTHONWARNINGS', 'PYTHONUNBUFFERED', 'PYTHONIOENCODING',
                              'TF_ENABLE_ONEDNN_OPTS', 'CUDA_VISIBLE_DEVICES', 'TF_CPP_VMODULE', 'TF_CPP_MAX_VLOG_LEVEL')


def _tensorflow_log_level(environment):
    """The TF_CPP_MIN_LOG_LEVEL a script loads TensorFlow with, given its environment (onu_cli's quiet start)."""
    from onu_lib import onu_cli  # pylint: disable=import-outside-toplevel
    if onu_cli.TF_LOG_LEVEL_ENV in environment and onu_cli.SET_BY_ONU_ENV not in environment:
        return environment[onu_cli.TF_LOG_LEVEL_ENV]
    return onu_cli.TF_LOG_LEVEL_ERRORS_ONLY


class ScriptServer:
    """The tests' script server of this test process (tests/script_server.py), started at its first use."""

    def __init__(self):
        self.path = None
        self.environment = None
        self._process = None
        self._uses_tensorflow = {}

    def serves(self, command, environment):
        """True when the server runs command as a fresh process would (starting the server if needed)."""
        if len(command) < 2 or command[0] != sys.executable or '--verbose' in command:
            return False
        if command[1:3] != ['-m', 'tensorboard.main']:  # TensorBoard loads TensorFlow too
            if not command[1].endswith('.py'):
                return False  # a Python option (-X, -c): a fresh process
            if not self._uses_tensorflow.setdefault(command[1], _loads_tensorflow(command[1])):
                return False  # a data script starts quickly, without TensorFlow: run it as it is
        if self._process is None:
            self._start()
        return (_tensorflow_log_level(environment) == _tensorflow_log_level(self.environment) and
                all(environment.get(name) == self.environment.get(name) for name in READ_AS_PYTHON_AND_TF_LOAD))

    def _start(self):
        """Starts the server; returns once it has loaded TensorFlow and listens."""
        folder = tempfile.mkdtemp(prefix='onu-script-server-')
        self.path = os.path.join(folder, 'socket')
        self.environment = dict(os.environ)
        self._process = subprocess.Popen([sys.executable, os.path.join(REPO_ROOT, 'tests', 'script_server.py'),
                                          self.path], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT,
                                         stderr=open(os.path.join(folder, 'log'), 'w'))  # pylint: disable=consider-using-with
        ready = self._process.stdout.readline()
        assert ready == 'ready\n', f'the script server did not start: {open(os.path.join(folder, "log")).read()}'
        atexit.register(self._stop, folder)

    def _stop(self, folder):
        """Stops the server (the scripts it started run on) and removes its folder."""
        self._process.terminate()
        self._process.wait()
        shutil.rmtree(folder, ignore_errors=True)


def _loads_tensorflow(script_path):
    """True when the script loads TensorFlow (onu_cli.import_tensorflow, or a test's own script importing it)."""
    with open(script_path, encoding='utf-8') as source:
        text = source.read()
    return 'onu_cli.import_tensorflow()' in text or 'import tensorflow' in text


_SCRIPT_SERVER = ScriptServer()


class ScriptProcess:
    """A script run forked by the script server, with the parts of Popen the tests use (text streams only)."""

    def __init__(self, server_path, command, environment, stdin=None, stdout=None, stderr=None, text=False,
                 start_new_session=False):
        assert text or subprocess.PIPE not in (stdout, stderr), 'ScriptProcess gives text streams only'
        self.args = command
        self.returncode = None
        self.stdin = None
        self.stdout = self.stderr = None
        sent, closed_after_send = [], []

        def stream(choice, default_fd):
            """The file descriptor the child gets for one standard stream, and this side's end of a pipe."""
            if choice is None:
                return default_fd, None
            if choice == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                closed_after_send.append(fd)
                return fd, None
            if choice == subprocess.PIPE:
                read_end, write_end = os.pipe()
                closed_after_send.append(write_end)
                return write_end, open(read_end, encoding='utf-8', errors='replace')  # pylint: disable=consider-using-with
            return (choice if isinstance(choice, int) else choice.fileno()), None

        assert stdin in (None, subprocess.DEVNULL), 'ScriptProcess gives the script no input'
        sent.append(stream(subprocess.DEVNULL, 0)[0])
        stdout_fd, self.stdout = stream(stdout, 1)
        sent.append(stdout_fd)
        if stderr == subprocess.STDOUT:
            sent.append(stdout_fd)
        else:
            stderr_fd, self.stderr = stream(stderr, 2)
            sent.append(stderr_fd)
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._connection.connect(server_path)
        request = {'argv': command, 'env': environment, 'cwd': REPO_ROOT, 'new_session': start_new_session}
        socket.send_fds(self._connection, [json.dumps(request).encode() + b'\n'], sent)
        for fd in closed_after_send:
            os.close(fd)
        self._replies = b''
        self.pid = self._reply(None)['pid']

    def _reply(self, timeout):
        """The server's next reply; None when none came within timeout seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b'\n' not in self._replies:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._connection], [], [], wait)[0]:
                return None
            chunk = self._connection.recv(4096)
            assert chunk, f'the script server lost {self.args}'
            self._replies += chunk
        line, self._replies = self._replies.split(b'\n', 1)
        return json.loads(line)

    def poll(self):
        """The exit status once the script has exited, else None."""
        return self._returncode(0)

    def wait(self, timeout=None):
        """Waits for the script to exit; returns its exit status (raises TimeoutExpired as Popen does)."""
        if self._returncode(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _returncode(self, timeout):
        if self.returncode is None and (reply := self._reply(timeout)) is not None:
            self.returncode = reply['returncode']
            self._connection.close()
        return self.returncode

    def communicate(self, timeout=None):
        """Reads stdout and stderr to their ends and waits for the exit; returns (stdout, stderr)."""
        outputs = {}
        readers = [threading.Thread(target=lambda name=name, pipe=pipe: outputs.__setitem__(name, pipe.read()),
                                    daemon=True) for name, pipe in (('out', self.stdout), ('err', self.stderr)) if pipe]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.1, deadline - time.monotonic()))
        return outputs.get('out'), outputs.get('err')

    def send_signal(self, number):
        """Sends the signal to the script while it runs."""
        if self.poll() is None:
            os.kill(self.pid, number)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        for pipe in (self.stdout, self.stderr):
            if pipe:
                pipe.close()
        self.wait()


def finish(process, timeout_secs=SCRIPT_TIMEOUT_SECS):
    """Waits for a process whose stdout a test read line by line; returns (the rest of stdout, all of stderr).

    Not Popen.communicate: it reads the pipe itself, so the lines the text wrapper had already buffered past the
    last line the test read would be lost. The process is killed after timeout_secs.
    """
    stderr = []
    reader = threading.Thread(target=lambda: stderr.append(process.stderr.read()), daemon=True)
    reader.start()
    killer = threading.Timer(timeout_secs, process.kill)
    killer.start()
    try:
        rest = process.stdout.read()
        process.wait()
    finally:
        killer.cancel()
    reader.join()
    return rest, stderr[0]


def run_on_a_terminal(script, *args):
    """Runs a script with stdout and stderr on a pseudo-terminal; returns (exit code, everything it printed)."""
    import fcntl, pty, struct, termios  # pylint: disable=import-outside-toplevel,multiple-imports  (POSIX only)
    main_fd, terminal_fd = pty.openpty()
    # 24 rows of 100 columns, as a terminal window has (a new pseudo-terminal is 0x0: no room for a bar).
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 100, 0, 0))
    process = start_script(script, *args, stdout=terminal_fd, stderr=terminal_fd)
    os.close(terminal_fd)
    output = b''
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        output += chunk
    os.close(main_fd)
    return process.wait(timeout=SCRIPT_TIMEOUT_SECS), output.decode(errors='replace')


class ProcessOutput:
    """The merged output of a running process (text=True, stdout a pipe), read line by line by a thread.

    text: what it printed so far; wait_for(pattern): the first match, once printed; finish(): all of it.
    """

    def __init__(self, process):
        self.process = process
        self.text = ''
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            with self._changed:
                self.text += line
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, pattern, timeout_secs):
        """Returns the first match of the regular expression pattern in the output, once there; fails at once
        when the output has ended without it."""
        deadline = time.monotonic() + timeout_secs
        with self._changed:
            while not (match := re.search(pattern, self.text)):
                assert self._reader.is_alive(), f'{pattern!r} never printed:\n{self.text[-4000:]}'
                assert time.monotonic() < deadline, f'{pattern!r} not printed in {timeout_secs} s:\n{self.text[-4000:]}'
                self._changed.wait(1)
            return match

    def finish(self):
        """Returns the whole output once the process has closed it."""
        self._reader.join(timeout=30)
        return self.text


# Inception-ResNet-v2 needs inputs of 75x75 or more, builds for most of a minute and writes ~700 MB per
# checkpoint (weights, moving averages, momentum): too heavy for real script runs in the tests.
HEAVY_MODELS = ('inception_resnet_v2',)


def script_tested_models():
    """Returns the registered models the script tests run for real: every one but HEAVY_MODELS, in registry order."""
    import onu_model  # pylint: disable=import-outside-toplevel  (TensorFlow: only in the test files that use it)
    return [name for name in onu_model.MODEL_NAMES if name not in HEAVY_MODELS]


def mount(target, *options):
    """Mounts a filesystem at target (needs root); skips the test where this machine does not allow it."""
    os.makedirs(target, exist_ok=True)
    done = subprocess.run(['mount', *options, target], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f'cannot mount here: {done.stderr.strip()}')


@contextlib.contextmanager
def read_only_bind_mount(source, target):
    """Within it, source is mounted read-only at target (needs root); skips the test where this machine does not allow
    it."""
    os.makedirs(target, exist_ok=True)
    done = subprocess.run(['mount', '--bind', source, target], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f'cannot bind-mount here: {done.stderr.strip()}')
    try:
        subprocess.run(['mount', '-o', 'remount,ro,bind', target], check=True)
        with pytest.raises(OSError):
            open(os.path.join(target, 'probe'), 'w').close()
        yield target
    finally:
        subprocess.run(['umount', target], check=True)


def copy_train_dir(tiny_run, tmp_path, name='train', exports=True):
    """Returns a copy of tiny_run's train_dir at tmp_path/name (exports=False: without its export folder)."""
    copy = str(tmp_path / name)
    shutil.copytree(tiny_run.train_dir, copy, ignore=None if exports else shutil.ignore_patterns('export'))
    return copy


def file_states(*folders):
    """Returns {path: (size, mtime in ns)} of every file below folders."""
    states = {}
    for folder in folders:
        for root, _, names in os.walk(folder):
            for name in names:
                info = os.stat(os.path.join(root, name))
                states[os.path.join(root, name)] = (info.st_size, info.st_mtime_ns)
    return states


def session_events(train_dir):
    """[(kind, content)] of the HParams summaries in train_dir's event files, in the order they were written: 'start'
    with the settings {name: value}, 'end' with its status ('success' or 'failure')."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from tensorboard.plugins.hparams import metadata  # pylint: disable=import-outside-toplevel
    from onu_lib import onu_hparams  # pylint: disable=import-outside-toplevel
    found = []  # (wall time, kind, content)
    for name in (name for name in os.listdir(train_dir) if '.hparams-' in name):
        for event in tf.compat.v1.train.summary_iterator(os.path.join(train_dir, name)):
            for value in event.summary.value:
                content = value.metadata.plugin_data.content
                if value.tag == metadata.SESSION_START_INFO_TAG:
                    start = metadata.parse_session_start_info_plugin_data(content)
                    found.append((event.wall_time, 'start', {key: getattr(hparam, hparam.WhichOneof('kind'))
                                                             for key, hparam in start.hparams.items()}))
                elif value.tag == metadata.SESSION_END_INFO_TAG:
                    status = metadata.parse_session_end_info_plugin_data(content).status
                    found.append((event.wall_time, 'end', next(name for name, code in onu_hparams.STATUSES.items()
                                                               if code == status)))
    # By the events' times, not the files' names: those count whole seconds, and 'end' sorts before 'start'.
    return [(kind, content) for _, kind, content in sorted(found, key=lambda item: item[0])]


@contextlib.contextmanager
def built_once(tmp_path_factory, name):
    """A folder that the test processes of one pytest run share: yields (its path, True for the one process that
    must build it now); the others wait until it is built, then get False. One process alone always builds."""
    import fcntl  # pylint: disable=import-outside-toplevel  (POSIX only)
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base  # pytest-xdist: one folder per worker
    folder, done = root / f'shared-{name}', root / f'shared-{name}.built'
    with open(root / f'shared-{name}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if done.exists():
                yield str(folder), False
                return
            os.makedirs(folder)
            yield str(folder), True
            done.touch()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
    """The shared tiny training run (see the module docstring); fails at teardown if a test changed it."""
    with built_once(tmp_path_factory, 'tiny_run') as (root, build):
        data_dir, train_dir = os.path.join(root, 'data'), os.path.join(root, 'train')
        if build:
            onu_sample_data.generate_dataset(data_dir, 8, 4, (96, 72), seed=0, processes=1)  # no records yet
            os.makedirs(train_dir)
            with open(os.path.join(train_dir, 'notes.txt'), 'w') as f:
                f.write(TINY_RUN_NOTES)
            # No --model: the run also shows the default (small, as no machine of this project has a GPU).
            result = run_script('onu_train.py', *TINY_RUN_FLAGS, f'--max_steps={TINY_RUN_STEPS}',
                                f'--data_dir={data_dir}', f'--train_dir={train_dir}')
            assert result.returncode == 0, result.stderr[-3000:]
            with open(os.path.join(root, 'result.json'), 'w') as f:
                json.dump([result.args, result.returncode, result.stdout, result.stderr], f)
        with open(os.path.join(root, 'result.json')) as f:
            result = subprocess.CompletedProcess(*json.load(f))
    from onu_lib import onu_serving  # pylint: disable=import-outside-toplevel  (TensorFlow: only where the run is used)
    before = file_states(data_dir, train_dir)
    yield types.SimpleNamespace(data_dir=data_dir, train_dir=train_dir, result=result,
                                export_dir=onu_serving.default_export_dir(train_dir),
                                config=onu_run_config.RunConfig.load(train_dir))
    after = file_states(data_dir, train_dir)
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    assert not changed, f'tests changed the shared tiny_run (copy it with shutil.copytree first): {changed}'


@pytest.fixture(scope='session')
def tiny_run_of(tiny_run, tmp_path_factory):
    """Factory: tiny_run_of(model_name) -> tiny_run for its own model, else tiny_run's training of that model."""
    from onu_lib import onu_serving  # pylint: disable=import-outside-toplevel  (TensorFlow: only where the runs are used)
    runs = {tiny_run.config.model: tiny_run}

    def run_of(model_name):
        if model_name not in runs:
            train_dir = str(tmp_path_factory.mktemp(f'tiny_run_{model_name}') / 'train')
            result = run_script('onu_train.py', *TINY_RUN_FLAGS, f'--max_steps={TINY_RUN_STEPS}',
                                f'--model={model_name}', f'--data_dir={tiny_run.data_dir}', f'--train_dir={train_dir}')
            assert result.returncode == 0, result.stderr[-3000:]
            runs[model_name] = types.SimpleNamespace(
                data_dir=tiny_run.data_dir, train_dir=train_dir, result=result,
                export_dir=onu_serving.default_export_dir(train_dir), config=onu_run_config.RunConfig.load(train_dir))
        return runs[model_name]
    return run_of


@pytest.fixture(scope='session')
def tiny_tflite_of(tiny_run_of, tmp_path_factory):
    """Factory: tiny_tflite_of(model_name) -> a copy of that model's newest export (step TINY_RUN_STEPS) holding the
    .tflite of every onu_tflite format, converted in this process (int8 calibrated on 8 of the run's train photos),
    each with its known threshold (fitted on the run's val photos)."""
    from onu_lib import onu_serving  # pylint: disable=import-outside-toplevel  (TensorFlow: only where it is used)
    from onu_lib import onu_tflite  # pylint: disable=import-outside-toplevel
    versions = {}

    def version_of(model_name):
        if model_name not in versions:
            run = tiny_run_of(model_name)
            version_dir = str(tmp_path_factory.mktemp(f'tflite_{model_name}') / str(TINY_RUN_STEPS))
            shutil.copytree(os.path.join(run.export_dir, str(TINY_RUN_STEPS)), version_dir)
            calibration = onu_tflite.calibration_pixels(run.config, run.data_dir, 8)
            val_pixels = onu_serving.known_val_pixels(run.config, run.data_dir)[0]
            for entry in onu_tflite.TFLITE_FORMATS:
                onu_tflite.write_tflite(version_dir, entry.name, run.config, calibration, val_pixels)
            versions[model_name] = version_dir
        return versions[model_name]
    return version_of


HUGE_PNG_SIDE = 23000


def _png_chunk(kind, payload):
    """One PNG chunk: length, type, payload, CRC."""
    import struct  # pylint: disable=import-outside-toplevel
    import zlib  # pylint: disable=import-outside-toplevel
    return struct.pack('>I', len(payload)) + kind + payload + struct.pack('>I', zlib.crc32(kind + payload))


@pytest.fixture(scope='session')
def huge_png(tmp_path_factory):
    """The path of a HUGE_PNG_SIDE x HUGE_PNG_SIDE RGB PNG of one colour (529 M pixels in about 1.5 MB: the
    decompression bomb of issue 41), written row by row with zlib, never held whole in memory."""
    import struct  # pylint: disable=import-outside-toplevel
    import zlib  # pylint: disable=import-outside-toplevel
    path = tmp_path_factory.mktemp('huge_png') / 'huge.png'
    side = HUGE_PNG_SIDE
    compressor = zlib.compressobj(9)
    row = b'\0' + bytes((200, 120, 40)) * side  # filter type 0, then the row's pixels
    data = b''.join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n')
        f.write(_png_chunk(b'IHDR', struct.pack('>IIBBBBB', side, side, 8, 2, 0, 0, 0)))  # 8-bit RGB
        f.write(_png_chunk(b'IDAT', data))
        f.write(_png_chunk(b'IEND', b''))
    return str(path)


# ----------------------------------------------------------------------------------------------
# A real TensorBoard server
#
#   tensorboard_server(logdir=None, logdir_spec=None) -> TensorBoardServer
#       factory: starts `python -m tensorboard.main` on 127.0.0.1 at a port the OS picks, once it
#       serves HTTP; every server it started is stopped (terminate, then kill) at teardown.
#       server.wait_for_tags(plugin, run, tags) polls /data/plugin/<plugin>/tags until the run lists
#       them (TensorBoard loads event files a few seconds after it starts); server.get_json(route,
#       **params) and server.get_bytes(route, **params) read any other route.

import gzip  # noqa: E402  (kept with the fixture they serve)
import urllib.error  # noqa: E402
import urllib.parse  # noqa: E402
import urllib.request  # noqa: E402

TENSORBOARD_TIMEOUT_SECS = 60
TENSORBOARD_SERVING_LINE = re.compile(r'TensorBoard \S+ at (http://[^\s/]+)/? \(Press CTRL\+C')


class TensorBoardServer:
    """A TensorBoard subprocess on 127.0.0.1 (port chosen by the OS) and its HTTP API."""

    def __init__(self, logdir_args, log_path, timeout=TENSORBOARD_TIMEOUT_SECS):
        self.log_path = log_path
        with open(log_path, 'wb') as log:  # a file, not a pipe: nobody has to drain it
            self.process = start_command(
                [sys.executable, '-m', 'tensorboard.main', *logdir_args, '--host', '127.0.0.1',
                 '--port', '0', '--reload_interval', '1'],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
        try:
            self.url = self._wait_for_url(timeout)
        except BaseException:
            self.stop()
            raise

    def log(self):
        """Returns what the server printed so far."""
        with open(self.log_path, encoding='utf-8', errors='replace') as f:
            return f.read()

    def _wait_for_url(self, timeout):
        """Returns the server's address once it prints that it serves (its socket is bound by then)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = TENSORBOARD_SERVING_LINE.search(self.log())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                raise RuntimeError(f'TensorBoard exited with {self.process.returncode}:\n{self.log()}')
            time.sleep(0.1)
        raise TimeoutError(f'TensorBoard did not start in {timeout} s:\n{self.log()}')

    def get_bytes(self, route, **params):
        """Returns the body of GET route?params."""
        query = '?' + urllib.parse.urlencode(params) if params else ''
        with urllib.request.urlopen(self.url + route + query, timeout=30) as response:
            body = response.read()
            # The profile plugin compresses its answers whatever the request accepts.
            return gzip.decompress(body) if response.headers.get('Content-Encoding') == 'gzip' else body

    def get_json(self, route, **params):
        """Returns the JSON answer of GET route?params."""
        return json.loads(self.get_bytes(route, **params))

    def post_json(self, route, body):
        """Returns the JSON answer of POST route with a JSON body (the HParams plugin's requests)."""
        request = urllib.request.Request(self.url + route, data=json.dumps(body).encode(),
                                         headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def wait_for_json(self, route, ready, waiting_for, timeout=TENSORBOARD_TIMEOUT_SECS, **params):
        """Returns the JSON answer of GET route?params once ready(answer) holds (waiting_for says what, for the error):
        TensorBoard loads a run's events in the background, after it has started serving."""
        deadline = time.monotonic() + timeout
        answer = None
        while time.monotonic() < deadline:
            try:
                answer = self.get_json(route, **params)
            except (urllib.error.URLError, ConnectionError):
                answer = None
            if answer is not None and ready(answer):
                return answer
            if self.process.poll() is not None:
                raise RuntimeError(f'TensorBoard exited with {self.process.returncode}:\n{self.log()}')
            time.sleep(0.25)
        raise TimeoutError(f'after {timeout} s TensorBoard answers {route} {params} with {answer}, not {waiting_for}:\n'
                           f'{self.log()}')

    def wait_for_tags(self, plugin, run, tags, timeout=TENSORBOARD_TIMEOUT_SECS):
        """Returns {tag: metadata} of the run's plugin tags once it lists every one of tags."""
        listed = self.wait_for_json(f'/data/plugin/{plugin}/tags',
                                    lambda answer: run in answer and set(tags) <= set(answer[run]),
                                    f'{run}: {sorted(tags)}', timeout)
        return listed[run]

    def stop(self):
        """Stops the server: terminate, and kill it if it has not exited within 10 seconds."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def tensorboard_server(tmp_path):
    """Factory: tensorboard_server(logdir=None, logdir_spec=None) -> a serving TensorBoardServer."""
    servers = []

    def start(logdir=None, logdir_spec=None):
        if (logdir is None) == (logdir_spec is None):
            raise ValueError('give exactly one of logdir and logdir_spec')
        args = ['--logdir', str(logdir)] if logdir is not None else ['--logdir_spec', logdir_spec]
        servers.append(TensorBoardServer(args, str(tmp_path / f'tensorboard-{len(servers)}.log')))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


# ----------------------------------------------------------------------------------------------
# Headless Chromium
#
#   chromium_page(url) -> ChromiumPage (fixture factory; skips the test when chromium is not installed)
#       a page of headless Chromium (`apt-get install chromium`; .ci/run installs it) driven through the DevTools
#       protocol: page.text() is every text node, shadow roots included (Polymer dashboards keep their tables in
#       them, which --dump-dom leaves out); page.wait_for_text(*words) polls until all show; page.screenshot(path).
#   CHROMIUM_FLAGS  the flags of a quiet, offline headless Chromium.

import base64  # noqa: E402
import struct  # noqa: E402

CHROMIUM_FLAGS = ('--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update', '--disable-sync')
DEVTOOLS_LINE = re.compile(r'DevTools listening on (ws://\S+)')
# Every text node of the document, walking into shadow roots and same-origin frames.
PAGE_TEXT_JS = """(() => { const out = []; const walk = (node) => {
  if (node.nodeType === Node.TEXT_NODE) out.push(node.textContent);
  if (node.shadowRoot) walk(node.shadowRoot);
  if (node.tagName === 'IFRAME' && node.contentDocument) walk(node.contentDocument);
  for (const child of node.childNodes) walk(child); };
  walk(document); return out.join(' ').replace(/\\s+/g, ' '); })()"""


class ChromiumPage:
    """One headless Chromium showing url, driven through the DevTools protocol over a minimal WebSocket client."""

    def __init__(self, chromium, url, user_data_dir, window_size=(1500, 900)):
        self._process = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, '--remote-debugging-port=0', f'--user-data-dir={user_data_dir}',
             f'--window-size={window_size[0]},{window_size[1]}', url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._next_id = 0
        browser_url = self._devtools_url()
        port = urllib.parse.urlparse(browser_url).port
        deadline = time.time() + TENSORBOARD_TIMEOUT_SECS
        while True:
            with urllib.request.urlopen(f'http://127.0.0.1:{port}/json/list', timeout=10) as response:
                pages = [target for target in json.load(response) if target['type'] == 'page']
            if pages or time.time() > deadline:
                break
            time.sleep(0.2)
        self._socket = self._connect(pages[0]['webSocketDebuggerUrl'])

    def _devtools_url(self):
        """Returns the browser's DevTools address from the line Chromium prints on stderr."""
        for line in self._process.stderr:
            match = DEVTOOLS_LINE.search(line)
            if match:
                threading.Thread(target=self._process.stderr.read, daemon=True).start()  # keep the pipe drained
                return match.group(1)
        raise RuntimeError(f'chromium exited ({self._process.wait()}) without a DevTools address')

    @staticmethod
    def _connect(url):
        """Opens a WebSocket (RFC 6455 handshake) to url; returns the socket."""
        parts = urllib.parse.urlparse(url)
        sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(f'GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n'
                     f'Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n'
                     .encode())
        answer = b''
        while b'\r\n\r\n' not in answer:
            answer += sock.recv(4096)
        if b' 101 ' not in answer.split(b'\r\n')[0]:
            raise RuntimeError(f'DevTools refused the WebSocket: {answer[:200]!r}')
        return sock

    def _receive_exactly(self, count):
        data = b''
        while len(data) < count:
            chunk = self._socket.recv(count - len(data))
            if not chunk:
                raise ConnectionError('DevTools closed the WebSocket')
            data += chunk
        return data

    def _receive_message(self):
        """Returns the next text message (its frames joined)."""
        message = b''
        while True:
            first, second = self._receive_exactly(2)
            length = second & 0x7F
            if length == 126:
                (length,) = struct.unpack('>H', self._receive_exactly(2))
            elif length == 127:
                (length,) = struct.unpack('>Q', self._receive_exactly(8))
            message += self._receive_exactly(length)
            if first & 0x80:  # FIN
                return json.loads(message)

    def call(self, method, **params):
        """Sends a DevTools command and returns its result."""
        self._next_id += 1
        payload = json.dumps({'id': self._next_id, 'method': method, 'params': params}).encode()
        mask = os.urandom(4)
        length = len(payload)
        header = bytes([0x81]) + (bytes([0x80 | length]) if length < 126 else
                                  bytes([0x80 | 126]) + struct.pack('>H', length) if length < 65536 else
                                  bytes([0x80 | 127]) + struct.pack('>Q', length))
        self._socket.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
        while True:
            message = self._receive_message()
            if message.get('id') == self._next_id:
                if 'error' in message:
                    raise RuntimeError(f'{method}: {message["error"]}')
                return message['result']

    def text(self):
        """Every text node of the page, shadow roots included, whitespace collapsed."""
        return self.call('Runtime.evaluate', expression=PAGE_TEXT_JS, returnByValue=True)['result'].get('value', '')

    def wait_for_text(self, *words, timeout=TENSORBOARD_TIMEOUT_SECS):
        """Returns the page's text once every word shows in it; fails the test after timeout."""
        deadline = time.time() + timeout
        while True:
            text = self.text()
            if all(word in text for word in words) or time.time() > deadline:
                break
            time.sleep(0.5)
        missing = [word for word in words if word not in text]
        assert not missing, f'{missing} not on the page after {timeout} s: {text[-2000:]}'
        return text

    def screenshot(self, path):
        """Writes what the page shows as a PNG."""
        with open(path, 'wb') as f:
            f.write(base64.b64decode(self.call('Page.captureScreenshot', format='png')['data']))

    def close(self):
        self._socket.close()
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, 9)
            self._process.wait()


@pytest.fixture
def chromium_page(tmp_path):
    """Factory: chromium_page(url) -> a ChromiumPage; every page is closed at teardown."""
    chromium = shutil.which('chromium')
    if chromium is None:
        pytest.skip('chromium is not installed (apt-get install chromium; .ci/run installs it)')
    pages = []

    def open_page(url):
        pages.append(ChromiumPage(chromium, url, str(tmp_path / f'chromium-{len(pages)}')))
        return pages[-1]

    yield open_page
    for page in pages:
        page.close()


# ----------------------------------------------------------------------------------------------
# Records as other tools write them, derived from each onu_layouts.RECORD_LAYOUTS entry (its file names, keys, label
# base, names and counts files): a new layout is written, found and trained on by every test that takes `layout`.
#
#   layout_photos(classes=LAYOUT_CLASSES, train=4, val=2, val_classes=None, mode='RGB') -> [LayoutPhoto]
#       tiny photos (distinct colour per class, JPEG unless mode says otherwise) of each split.
#   write_layout(layout, folder, photos, classes=LAYOUT_CLASSES, data_format='encoded', **options) -> the data_dir to
#       give --data_dir: the photos written as the layout's tool writes them (onu_layout_writer.write_records' options).
#   layout_class_names(layout, classes=LAYOUT_CLASSES)  the class names found in what write_layout wrote.
#   write_tfrecord(path, serialized, compression) and _example(features): TensorFlow's own writer and Example, for
#       records no tool would write (an independent check of onu_tfrecord).

LAYOUT_CLASSES = ('daisy', 'rose', 'tulip')
LAYOUT_PHOTO_SIZE = (40, 30)  # width, height


class LayoutPhoto(types.SimpleNamespace):
    """One photo of a layout fixture: split ('train'/'val'), label (0-based class), name, PIL image, file bytes."""


def layout_photos(classes=LAYOUT_CLASSES, train=4, val=2, val_classes=None, mode='RGB', seed=0):
    """Tiny photos of each class (a colour per class plus noise), as a list of LayoutPhoto."""
    rng = np.random.default_rng(seed)
    photos = []
    for split, count in (('train', train), ('val', val)):
        for label in range(len(classes)):
            if split == 'val' and val_classes is not None and label not in val_classes:
                continue
            for index in range(count):
                base = np.array(QUADRANT_COLOURS[label % len(QUADRANT_COLOURS)], np.int16)
                noise = rng.integers(-25, 26, (LAYOUT_PHOTO_SIZE[1], LAYOUT_PHOTO_SIZE[0], 3))
                image = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).convert(mode)
                file_format = 'PNG' if mode in ('RGBA', 'LA', 'P') else 'JPEG'
                photos.append(LayoutPhoto(split=split, label=label, image=image,
                                          name=f'{classes[label]}_{split}_{index}.{"jpg" if file_format == "JPEG" else "png"}',
                                          data=_encoded(image, file_format, **({'quality': 95} if file_format == 'JPEG'
                                                                               else {}))))
    return photos


def write_layout(layout, folder, photos, classes=LAYOUT_CLASSES, data_format='encoded', **options):
    """Writes photos as the layout's tool does (onu_layout_writer.write_records of its entry); returns the data_dir.

    Raw records hold PIL's tobytes of each photo as opened (grey, RGB or RGBA), as the study's converter wrote them.
    """
    def stored(photo):
        """The photo as its record holds it: the file's bytes, or the pixels of the file as opened."""
        with Image.open(io.BytesIO(photo.data)) as opened:
            data = opened.tobytes() if data_format == 'raw' else photo.data
            return onu_layout_writer.StoredImage(photo.split, photo.label, data, opened.width, opened.height, photo.name)
    images = [stored(photo) for photo in photos]
    return onu_layout_writer.write_records(onu_layouts.layout_named(layout), folder, images, classes, data_format,
                                           **options)


def layout_class_names(layout, classes=LAYOUT_CLASSES):
    """The class names found in write_layout's records of layout: the tool's names file or class texts, if it writes
    either, else class_<label>."""
    entry = onu_layouts.layout_named(layout)
    if entry.writes_names_file or entry.text_key in entry.written_keys:
        return tuple(classes)
    return tuple(f'class_{label}' for label in range(len(classes)))


def _example(features):
    """A serialized tf.train.Example of {key: bytes, str, int or list of them}, made by TensorFlow."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    example = tf.train.Example()
    for key, value in features.items():
        values = value if isinstance(value, list) else [value]
        feature = example.features.feature[key]
        if isinstance(values[0], int):
            feature.int64_list.value.extend(values)
        elif isinstance(values[0], float):
            feature.float_list.value.extend(values)
        else:
            feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in values)
    return example.SerializeToString()


def write_tfrecord(path, serialized, compression=''):
    """Writes the serialized records to path with TensorFlow's own writer."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path, tf.io.TFRecordOptions(compression_type=compression)) as writer:
        for record in serialized:
            writer.write(record)


@pytest.fixture(autouse=True, scope='session')
def _cache_in_a_temp_folder(tmp_path_factory):
    """Record counts and the records of read-only folders go to a temp cache, never the user's ~/.cache."""
    os.environ['ONU_CACHE_DIR'] = str(tmp_path_factory.mktemp('onu_cache'))


# A shell word: quoted and bare parts run together ('/a b'"'"'s' is one word).
SHELL_WORD = r"(?:'[^']*'|\"[^\"]*\"|[^\s'\"();,])+"
PRINTED_COMMAND = re.compile(rf'python [\w.]+\.py(?: --\w+={SHELL_WORD})*')
PRINTED_FLAG = re.compile(rf'--\w+={SHELL_WORD}')


def pasted(command):
    """The arguments a POSIX shell gives `python` when command is pasted into it (python's own name left out)."""
    shown = subprocess.run(['sh', '-c', 'python() { printf "%s\\0" "$@"; }; ' + command],
                           capture_output=True, text=True, check=True).stdout
    return shown.split('\0')[:-1]


def printed_command(message):
    """The one `python SCRIPT.py --flag=value ...` command in message."""
    found = PRINTED_COMMAND.findall(message)
    assert len(found) == 1, message
    return found[0]
