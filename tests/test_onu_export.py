"""Tests of onu_export.py: conftest's shared tiny run (a real training run exporting every 2 epochs, 4
steps, with a checkpoint every 2 steps), exported again and compared with the eval graph."""
import errno
import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

from conftest import run_script, script_tested_models

from onu_lib import onu_checkpoint
from onu_lib import onu_converter
from onu_lib import onu_dataset
import onu_input
import onu_model
from onu_lib import onu_errors
from onu_lib import onu_known
from onu_lib import onu_photos
from onu_lib import onu_run_folder
from onu_lib import onu_serving

IMAGE_SIZE = 32
BATCH_SIZE = 8  # 16 training examples: an epoch is 2 steps of 8
MAX_STEPS = 12


def checkpoint(run, step):
    """Returns the path of run's checkpoint at step."""
    return os.path.join(run.train_dir, f'model.ckpt-{step}')


def val_files(run):
    """Returns the val image paths in the order the eval input reads them."""
    return list(onu_dataset.describe(run.data_dir).split('val', 'images').files)


def read_bytes(paths):
    """Returns the contents of the files at paths."""
    contents = []
    for path in paths:
        with open(path, 'rb') as f:
            contents.append(f.read())
    return contents


def eval_graph_softmax(checkpoint_path, moving_average_decay, data_dir, data_format='images',
                       split='val', model_name='small', temperature=1.0):
    """Returns (softmax of logits / temperature, images) of the eval input and model_name on a split, restored as eval
    does."""
    with tf.Graph().as_default():
        images, _ = onu_input.next_batch(
            onu_input.eval_batches(onu_dataset.describe(data_dir).split(split, data_format), 64, IMAGE_SIZE))
        logits, _ = onu_model.inference(images, 2, model_name, is_training=False, create_aux_logits=False)
        probabilities = tf.nn.softmax(logits / temperature)
        saver = tf.compat.v1.train.Saver(
            onu_checkpoint.variables_to_restore(moving_average_decay, checkpoint_path))
        with tf.compat.v1.Session() as session:
            saver.restore(session, checkpoint_path)
            return session.run([probabilities, images])


def serve(version_dir, signature, **inputs):
    """Returns the outputs of a signature of the SavedModel loaded in TF2, as numpy arrays."""
    outputs = tf.saved_model.load(version_dir).signatures[signature](
        **{key: tf.constant(value) for key, value in inputs.items()})
    return {key: value.numpy() for key, value in outputs.items()}


def listing(directory):
    """Returns the sorted names in directory."""
    return sorted(os.listdir(directory))


@pytest.mark.parametrize('model_name', script_tested_models())
def test_training_exports_a_version_every_n_epochs(tiny_run_of, model_name):
    run = tiny_run_of(model_name)
    assert listing(run.export_dir) == ['12', '4', '8', onu_serving.EXPORT_LOG_FILENAME]
    assert [step for step, _ in onu_serving.version_dirs(run.export_dir)] == [4, 8, 12]
    with open(os.path.join(run.export_dir, onu_serving.EXPORT_LOG_FILENAME)) as f:
        log = [json.loads(line) for line in f]
    assert [(e['step'], e['epoch'], e['checkpoint_path']) for e in log] == [
        (step, step / 2, checkpoint(run, step)) for step in (4, 8, 12)]
    assert all('error' not in entry for entry in log)
    for step, version_dir in onu_serving.version_dirs(run.export_dir):
        info = onu_serving.load_export_config(version_dir)
        assert info.export['global_step'] == step
        assert info.export['checkpoint_path'] == checkpoint(run, step)
        assert info.export['weights'] == onu_checkpoint.WEIGHTS_AVERAGED
        assert info.model == model_name
        assert info.class_names == ('F603', 'F663N') and info.image_size == IMAGE_SIZE
        assert onu_dataset.read_labels(os.path.join(version_dir, 'assets.extra', 'labels.txt')) == [
            'F603', 'F663N']
    assert run.result.stdout.count('Exported ') == 3


@pytest.mark.parametrize('model_name', script_tested_models())
def test_saved_model_equals_eval_graph_softmax_with_moving_averages(tiny_run_of, model_name):
    run = tiny_run_of(model_name)
    version_dir = os.path.join(run.export_dir, str(MAX_STEPS))
    paths = val_files(run)
    served = serve(version_dir, onu_serving.SERVING_SIGNATURE, image_bytes=read_bytes(paths))
    known = onu_serving.export_known(onu_serving.load_export_config(version_dir))
    expected, eval_images = eval_graph_softmax(checkpoint(run, MAX_STEPS), run.config.moving_average_decay,
                                               run.data_dir, model_name=model_name,
                                               temperature=known['temperature'])  # the export's, fitted on val

    assert served['probabilities'].shape == (len(paths), 2)
    np.testing.assert_allclose(served['probabilities'], expected, atol=1e-5)
    np.testing.assert_array_equal(served['classes'], expected.argmax(axis=1))
    np.testing.assert_array_equal(served['class_names'],
                                  [[b'F603', b'F663N'][i] for i in expected.argmax(axis=1)])
    # The float signature takes what the eval input feeds the model.
    from_images = serve(version_dir, onu_serving.IMAGES_SIGNATURE, images=eval_images)
    np.testing.assert_allclose(from_images['probabilities'], expected, atol=1e-5)
    # The raw weights give other outputs: the comparison above would catch a wrong restore.
    raw, _ = eval_graph_softmax(checkpoint(run, MAX_STEPS), 0, run.data_dir, model_name=model_name)
    assert np.abs(raw - expected).max() > 1e-3


def test_export_writes_a_temp_dir_then_renames_it_to_the_step(tiny_run, tmp_path, monkeypatch, capsys):
    export_dir = str(tmp_path / 'serving')
    renames = []
    publish = onu_serving._publish

    def watch(temp_dir, version_dir):
        renames.append((temp_dir, version_dir, listing(temp_dir), os.path.exists(version_dir)))
        publish(temp_dir, version_dir)
    monkeypatch.setattr(onu_serving, '_publish', watch)

    version_dir = onu_serving.export_saved_model(checkpoint(tiny_run, 6), tiny_run.config, export_dir)

    assert version_dir == os.path.join(export_dir, '6')
    assert renames == [(os.path.join(export_dir, f'.tmp-6-{os.getpid()}'), version_dir,
                        ['assets.extra', 'saved_model.pb', 'variables'], False)]
    assert listing(export_dir) == ['6']
    assert onu_serving.is_saved_model(version_dir)
    assert f'to {version_dir}' in capsys.readouterr().out


def test_existing_version_is_left_unchanged(tiny_run, tmp_path, capsys):
    export_dir = str(tmp_path / 'serving')
    version_dir = onu_serving.export_saved_model(checkpoint(tiny_run, 4), tiny_run.config, export_dir)
    model_file = os.path.join(version_dir, 'saved_model.pb')
    before = os.stat(model_file).st_mtime_ns, listing(version_dir)
    capsys.readouterr()

    assert onu_serving.export_saved_model(checkpoint(tiny_run, 4), tiny_run.config, export_dir) == version_dir

    assert (os.stat(model_file).st_mtime_ns, listing(version_dir)) == before
    assert listing(export_dir) == ['4']
    assert 'already exists: its SavedModel is left unchanged' in capsys.readouterr().out


@pytest.mark.parametrize('stage, finishes, error', [
    ('_write_saved_model', True, KeyboardInterrupt()),  # Ctrl-C once the model is written
    ('_write_metadata', True, OSError('No space left on device')),
    ('_publish', False, OSError('Read-only file system')),  # the rename itself fails
])
def test_interrupted_export_leaves_no_version_and_no_temp_dir(tiny_run, tmp_path, monkeypatch, stage, finishes,
                                                               error):
    export_dir = str(tmp_path / 'serving')
    real_stage = getattr(onu_serving, stage)

    def fail(*args):
        if finishes:
            real_stage(*args)
        raise error
    monkeypatch.setattr(onu_serving, stage, fail)
    with pytest.raises(type(error)):
        onu_serving.export_saved_model(checkpoint(tiny_run, 8), tiny_run.config, export_dir)
    assert listing(export_dir) == []

    monkeypatch.setattr(onu_serving, stage, real_stage)
    version_dir = onu_serving.export_saved_model(checkpoint(tiny_run, 8), tiny_run.config, export_dir)
    assert listing(export_dir) == ['8'] and onu_serving.is_saved_model(version_dir)


def test_temp_dir_of_a_killed_export_is_removed_by_the_next(tiny_run, tmp_path):
    export_dir = tmp_path / 'serving'
    dead = subprocess.Popen(['true'])  # its process id no longer runs once it is waited for
    dead.wait()
    stale = export_dir / f'.tmp-2-{dead.pid}'
    (stale / 'variables').mkdir(parents=True)
    mine = export_dir / 'README'  # not the exporter's: kept
    mine.write_text('models for the F603 line')

    onu_serving.export_saved_model(checkpoint(tiny_run, 2), tiny_run.config, str(export_dir))

    assert listing(export_dir) == ['2', 'README']
    assert mine.read_text() == 'models for the F603 line'


def test_listener_exports_at_boundaries_and_a_failure_does_not_block_the_next(
        tiny_run, tmp_path, monkeypatch, capsys):
    checkpoint_dir, export_dir = str(tmp_path / 'train'), str(tmp_path / 'serving')
    os.makedirs(checkpoint_dir)
    listener = onu_serving.PeriodicExportListener(checkpoint_dir, tiny_run.config, export_dir,
                                                 every_n_epochs=1, examples_per_step=BATCH_SIZE)
    failures = [OSError(errno.EIO, 'Input/output error')]
    publish = onu_serving._publish

    def publish_or_fail(temp_dir, version_dir):
        if failures:
            raise failures.pop()
        publish(temp_dir, version_dir)
    monkeypatch.setattr(onu_serving, '_publish', publish_or_fail)

    for step in (0, 2, 4, 10):  # as the saver would call it; an epoch is 2 steps
        tf.compat.v1.train.update_checkpoint_state(checkpoint_dir, checkpoint(tiny_run, step))
        assert listener.after_save(None, step) is None  # never asks training to stop

    # step 2 failed; 4 exported; 10 is the first checkpoint after the boundaries at 6 and 8.
    assert [step for step, _ in onu_serving.version_dirs(export_dir)] == [4, 10]
    assert listing(export_dir) == ['10', '4', onu_serving.EXPORT_LOG_FILENAME]
    with open(os.path.join(export_dir, onu_serving.EXPORT_LOG_FILENAME)) as f:
        log = [json.loads(line) for line in f]
    assert [(e['step'], e['epoch'], 'error' in e) for e in log] == [(2, 1, True), (4, 2, False),
                                                                     (10, 5, False)]
    assert 'Input/output error' in log[0]['error']
    warnings = [line for line in capsys.readouterr().err.splitlines() if 'warning:' in line]
    assert len(warnings) == 1
    assert 'export of step 2 failed' in warnings[0]
    assert f'--checkpoint_path={checkpoint(tiny_run, 2)}' in warnings[0]
    # A full disk is another matter: nothing more can be written, training stops with one line.
    failures.append(OSError(errno.ENOSPC, 'No space left on device', os.path.join(export_dir, '.tmp-12')))
    tf.compat.v1.train.update_checkpoint_state(checkpoint_dir, checkpoint(tiny_run, 12))
    with pytest.raises(onu_run_folder.WriteFailed) as error:
        listener.after_save(None, 12)
    assert str(error.value).startswith(f'{export_dir}: the disk is full (exporting a SavedModel); ')


def test_listener_does_not_export_the_checkpoint_training_resumes_from(tiny_run, tmp_path):
    checkpoint_dir, export_dir = str(tmp_path / 'train'), str(tmp_path / 'serving')
    os.makedirs(checkpoint_dir)
    listener = onu_serving.PeriodicExportListener(checkpoint_dir, tiny_run.config, export_dir,
                                                 every_n_epochs=2, examples_per_step=BATCH_SIZE)
    for step in (6, 8, 10):  # resumed at 6; boundaries every 4 steps
        tf.compat.v1.train.update_checkpoint_state(checkpoint_dir, checkpoint(tiny_run, step))
        listener.after_save(None, step)
    assert [step for step, _ in onu_serving.version_dirs(export_dir)] == [8]


def write_checkpoint_without_moving_averages(directory):
    """Saves a freshly initialised small model (no moving averages) at step 0; returns its path."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        onu_model.inference(tf.zeros([1, IMAGE_SIZE, IMAGE_SIZE, 3]), 2, 'small', is_training=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(session, os.path.join(directory, 'model.ckpt'),
                                                   global_step=global_step)


def test_checkpoint_without_moving_averages_needs_allow_raw_weights(tiny_run, tmp_path):
    path = write_checkpoint_without_moving_averages(str(tmp_path))
    export_dir = str(tmp_path / 'serving')
    with pytest.raises(onu_errors.DataError, match='no moving average of SmallNet/.*--allow_raw_weights'):
        onu_serving.export_saved_model(path, tiny_run.config, export_dir)
    assert not os.path.exists(os.path.join(export_dir, '0'))

    version_dir = onu_serving.export_saved_model(path, tiny_run.config, export_dir, allow_raw_weights=True)
    assert onu_serving.load_export_config(version_dir).export['weights'] == onu_checkpoint.WEIGHTS_RAW


def test_checkpoint_of_another_model_is_a_clear_error(tiny_run, tmp_path):
    three_classes = tiny_run.config.replace(class_names=['F603', 'F663N', 'HG8245'])
    with pytest.raises(onu_errors.DataError, match=r'model.ckpt-12: SmallNet/Logits/weights has shape '
                                                    r'\[256, 2\] but the model needs \[256, 3\]'):
        onu_serving.export_saved_model(checkpoint(tiny_run, MAX_STEPS), three_classes, str(tmp_path))
    assert listing(tmp_path) == []


def test_saved_model_cli_shows_and_runs_both_signatures(tiny_run, tmp_path):
    version_dir = os.path.join(tiny_run.export_dir, str(MAX_STEPS))
    shown = run_script('saved_model_cli', 'show', '--all', '--dir', version_dir)
    assert shown.returncode == 0, shown.stderr[-2000:]
    for text in ("signature_def['serving_default']", "signature_def['predict_images']",
                 "inputs['image_bytes']", "inputs['images']", "outputs['probabilities']",
                 "outputs['classes']", "outputs['class_names']", 'shape: (-1, 32, 32, 3)'):
        assert text in shown.stdout

    paths = val_files(tiny_run)[:3]
    inputs = str(tmp_path / 'image_bytes.npy')
    np.save(inputs, np.array(read_bytes(paths), dtype=object), allow_pickle=True)
    result = run_script('saved_model_cli', 'run', '--dir', version_dir, '--tag_set', 'serve',
                        '--signature_def', 'serving_default', '--inputs', f'image_bytes={inputs}',
                        '--outdir', str(tmp_path / 'out'))
    assert result.returncode == 0, result.stderr[-2000:]
    expected = serve(version_dir, onu_serving.SERVING_SIGNATURE, image_bytes=read_bytes(paths))
    np.testing.assert_allclose(np.load(tmp_path / 'out' / 'probabilities.npy'),
                               expected['probabilities'], atol=1e-6)
    np.testing.assert_array_equal(np.load(tmp_path / 'out' / 'class_names.npy', allow_pickle=True),
                                  expected['class_names'])


def test_export_script_exports_the_latest_checkpoint(tiny_run, tmp_path):
    export_dir = str(tmp_path / 'serving')
    result = run_script('onu_export.py', f'--checkpoint_dir={tiny_run.train_dir}', f'--export_dir={export_dir}')
    assert result.returncode == 0, result.stderr[-2000:]
    assert listing(export_dir) == [str(MAX_STEPS)]
    assert f'Exported {checkpoint(tiny_run, MAX_STEPS)} (small 32x32, moving_averages weights' in result.stdout



def test_train_dir_without_run_config_is_a_clear_error(tmp_path):
    with pytest.raises(onu_errors.DataError) as error:
        onu_serving.load_training_config(str(tmp_path))
    assert str(error.value) == (
        f'{tmp_path}/run_config.json not found: pass the --checkpoint_dir (train_dir) that '
        f'onu_train.py wrote, which holds the model, image size and class names')
    with pytest.raises(onu_errors.DataError, match=f'{tmp_path}: no checkpoint; train first'):
        onu_checkpoint.find_checkpoint(str(tmp_path))


# ---------------------------------------------------------------------------------------------
# The pixel limit (issue 41): image sizes read from headers in the graph, refused before decoding.

def encoded_image(image_format, width=53, height=37, frames=1, **options):
    """Bytes of a width x height image of random pixels in image_format, written by Pillow ('BMP-top-down': a BMP
    whose rows are stored top first, its header's height negative; 'GIF' with frames > 1: an animation)."""
    rng = np.random.default_rng(width * height)
    images = [Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)) for _ in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, image_format.replace('-top-down', ''), save_all=frames > 1, append_images=images[1:],
                   **options)
    data = buffer.getvalue()
    if image_format == 'BMP-top-down':  # flip the rows and negate the height (Pillow writes bottom-up only)
        offset = int.from_bytes(data[10:14], 'little')
        stride = (width * 3 + 3) // 4 * 4
        rows = [data[offset + i * stride:offset + (i + 1) * stride] for i in range(height)]
        data = (data[:22] + (-height).to_bytes(4, 'little', signed=True) + data[26:offset]
                + b''.join(reversed(rows)) + data[offset + height * stride:])
    return data


HEADER_CASES = {  # name: (format, Pillow options)
    'jpeg': ('JPEG', {}), 'png': ('PNG', {}), 'gif': ('GIF', {}), 'bmp': ('BMP', {}),
    'bmp_top_down': ('BMP-top-down', {}), 'webp_lossy': ('WEBP', {}), 'webp_lossless': ('WEBP', {'lossless': True}),
    'webp_extended': ('WEBP', {'exif': b'Exif\0\0MM\0*\0\0\0\x08\0\0'}),  # a VP8X chunk first
}


@pytest.fixture(scope='module')
def header_graph():
    """run(encoded, max_image_pixels) -> (header (width, height, frames), decoded shape or the refusal's text)."""
    graph = tf.Graph()
    with graph.as_default():
        encoded = tf.compat.v1.placeholder(tf.string, [])
        limit = tf.compat.v1.placeholder(tf.int64, [])
        size = onu_serving.image_header_size(encoded)
        # The limit as build_serving_graph applies it, with the limit fed (the graph takes a constant).
        width, height, frames = size
        pixels = width * height * frames
        check = tf.debugging.Assert(pixels <= limit, [pixels])
        with tf.control_dependencies([check]):
            decoded = tf.shape(onu_input.decode_image_bytes(tf.identity(encoded)))
        constant_limits = {n: tf.shape(onu_input.decode_image_bytes(onu_serving.refuse_too_many_pixels(encoded, n)))
                           for n in (53 * 37 - 1, 53 * 37, 53 * 37 * 3 - 1)}
    session = tf.compat.v1.Session(graph=graph)

    def run(data, max_image_pixels=None):
        header = tuple(int(value) for value in session.run(size, {encoded: data}))
        if max_image_pixels is None:
            return header, tuple(session.run(decoded, {encoded: data, limit: 2 ** 40}))
        try:
            return header, tuple(session.run(constant_limits[max_image_pixels], {encoded: data}))
        except tf.errors.InvalidArgumentError as e:
            return header, e.message
    yield run
    session.close()


@pytest.mark.parametrize('case', sorted(HEADER_CASES))
def test_the_header_size_read_in_the_graph_is_the_decoded_size(header_graph, case):
    image_format, options = HEADER_CASES[case]
    for width, height in ((53, 37), (37, 53)):  # a swap of width and height shows
        header, shape = header_graph(encoded_image(image_format, width, height, **options))
        assert header == (width, height, 1)
        assert shape == (height, width, 3)  # what TensorFlow decodes: the header told the truth


@pytest.mark.parametrize('case', sorted(HEADER_CASES))
def test_an_image_at_the_limit_is_decoded_and_one_pixel_over_it_refused_naming_both(header_graph, case):
    image_format, options = HEADER_CASES[case]
    data = encoded_image(image_format, 53, 37, **options)
    assert header_graph(data, 53 * 37)[1] == (37, 53, 3)
    refusal = header_graph(data, 53 * 37 - 1)[1]
    assert f'too many pixels: 53 x 37 = 1961 pixels, over the limit of {53 * 37 - 1}' in refusal
    assert '--max_image_pixels' in refusal


def test_every_frame_of_a_gif_counts_as_tensorflow_reads_them_all(header_graph):
    data = encoded_image('GIF', 53, 37, frames=3)
    assert header_graph(data)[0] == (53, 37, 3)
    assert '53 x 37 (3 frames) = 5883 pixels' in header_graph(data, 53 * 37 * 3 - 1)[1]
    # TensorFlow's canvas is the largest frame, not the logical screen the GIF's header names: a GIF claiming a
    # 1x1 screen still decodes to its frame's size, and is counted so.
    small_screen = bytearray(encoded_image('GIF', 53, 37))
    small_screen[6:10] = bytes([1, 0, 1, 0])
    assert header_graph(bytes(small_screen)) == ((53, 37, 1), (37, 53, 3))


def test_bytes_of_no_image_format_pass_to_the_decoder_which_refuses_them(header_graph):
    # The last: a PNG cut inside IHDR, after its width: the height reads as the zeros past the end.
    for data, size in ((b'', (0, 0, 1)), (b'not an image', (0, 0, 1)), (encoded_image('PNG')[:20], (53, 0, 1))):
        header, refusal = header_graph(data, 53 * 37)
        assert header == size
        assert isinstance(refusal, str) and 'too many pixels' not in refusal  # the decoder's own error


LOADED_MODEL_SCRIPT = r'''
import json, re, sys, time
import tensorflow as tf
def peak_mb():  # this process's own peak (VmHWM); ru_maxrss keeps the forking parent's across exec
    return int(re.search(r'VmHWM:\s+(\d+) kB', open('/proc/self/status').read()).group(1)) / 1024
version_dir, huge_path, photo_path = sys.argv[1:]
serve = tf.saved_model.load(version_dir).signatures['serving_default']
loaded_mb = peak_mb()
huge = open(huge_path, 'rb').read()
started = time.time()
try:
    serve(image_bytes=tf.constant([huge]))
    error = None
except tf.errors.InvalidArgumentError as e:
    error = e.message
seconds = time.time() - started
classes = serve(image_bytes=tf.constant([open(photo_path, 'rb').read()]))['class_names'].numpy().tolist()
print(json.dumps({'error': error, 'seconds': seconds, 'loaded_mb': loaded_mb, 'huge_bytes': len(huge),
                  'peak_mb': peak_mb(),
                  'classes': [name.decode() for name in classes]}))
'''


def test_a_loaded_saved_model_refuses_a_23000_pixel_square_png_fast_and_small_then_classifies(tiny_run, huge_png):
    # The training run's periodic export: the default limit. Loaded in a process of its own, so that its peak
    # memory is the model's and this one request's.
    version_dir = os.path.join(tiny_run.export_dir, str(MAX_STEPS))
    photo = val_files(tiny_run)[0]
    result = subprocess.run([sys.executable, '-c', LOADED_MODEL_SCRIPT, version_dir, huge_png, photo],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.splitlines()[-1])
    print(f'\n23000x23000 PNG ({measured["huge_bytes"]} bytes): refused in {measured["seconds"]:.2f} s, peak RSS '
          f'{measured["peak_mb"]:.0f} MB (loaded model {measured["loaded_mb"]:.0f} MB)')
    assert measured['error'] is not None
    assert (f'too many pixels: 23000 x 23000 = 529000000 pixels, over the limit of {onu_photos.MAX_IMAGE_PIXELS} '
            f'(onu_export.py --max_image_pixels)') in measured['error']
    assert measured['seconds'] < 20
    assert measured['peak_mb'] < 1500
    assert measured['classes'] in (['F603'], ['F663N'])  # the same loaded model goes on classifying


def test_max_image_pixels_is_recorded_and_applied_by_the_export(tiny_run, tmp_path):
    limit = 53 * 37
    result = run_script('onu_export.py', f'--checkpoint_dir={tiny_run.train_dir}', f'--export_dir={tmp_path}',
                        f'--max_image_pixels={limit}')
    assert result.returncode == 0, result.stderr
    version_dir = os.path.join(tmp_path, str(MAX_STEPS))
    assert onu_serving.load_export_config(version_dir).export['max_image_pixels'] == limit
    assert onu_serving.export_max_image_pixels(onu_serving.load_export_config(version_dir)) == limit
    at_limit = encoded_image('PNG', 53, 37)
    assert serve(version_dir, onu_serving.SERVING_SIGNATURE, image_bytes=[at_limit])['probabilities'].shape == (1, 2)
    for over in (encoded_image('PNG', 54, 37), encoded_image('JPEG', 37, 54)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f'over the limit of {limit}'):
            serve(version_dir, onu_serving.SERVING_SIGNATURE, image_bytes=[at_limit, over])
    # The training run's own exports took the default, and say so.
    default_export = onu_serving.load_export_config(os.path.join(tiny_run.export_dir, str(MAX_STEPS)))
    assert default_export.export['max_image_pixels'] == onu_photos.MAX_IMAGE_PIXELS


# ---------------------------------------------------------------------------------------------
# Known or not: the calibration fitted on val as the model exports

def test_every_signature_returns_known_and_the_score_onu_known_computes(tiny_run):
    version_dir = os.path.join(tiny_run.export_dir, str(MAX_STEPS))
    known = onu_serving.export_known(onu_serving.load_export_config(version_dir))
    pixels, labels = onu_serving.known_val_pixels(tiny_run.config)
    logits, features, blocks = onu_serving.val_outputs(checkpoint(tiny_run, MAX_STEPS), tiny_run.config, pixels)
    calibration = onu_known.calibrate(logits, features, labels, blocks)  # as the export did, here again
    assert calibration.summary() == pytest.approx(known)
    probabilities, scores, is_known = onu_known.known_of(logits, features, calibration)

    paths = val_files(tiny_run)
    signatures = tf.saved_model.load(version_dir).signatures
    for signature, inputs in ((onu_serving.PIXELS_SIGNATURE, {'pixels': pixels}),
                              (onu_serving.IMAGES_SIGNATURE, {'images': pixels.astype(np.float32) / 127.5 - 1}),
                              (onu_serving.SERVING_SIGNATURE, {'image_bytes': read_bytes(paths)})):
        served = {key: value.numpy() for key, value in signatures[signature](
            **{key: tf.constant(value) for key, value in inputs.items()}).items()}
        assert served['known'].dtype == bool and served['known_score'].dtype == np.float32
        np.testing.assert_array_equal(served['known'], served['known_score'] >= known['threshold'])
        if signature != onu_serving.SERVING_SIGNATURE:  # the same pixels: the numpy score, in graph ops
            np.testing.assert_allclose(served['known_score'], scores, rtol=1e-3, atol=1e-3)
            np.testing.assert_array_equal(served['known'], is_known)
            np.testing.assert_allclose(served['probabilities'], probabilities, atol=1e-5)  # temperature-scaled
    assert known['score'] == onu_known.SERVED_SCORE and known['val_examples'] == len(paths) == 8


def _data_copy(tiny_run, tmp_path, name, replace):
    """A copy of the run's photos with the photos of one split (replace: (split, with the photos of split)) swapped,
    converted to the run's records."""
    data_dir = str(tmp_path / name)
    shutil.copytree(tiny_run.data_dir, data_dir, ignore=shutil.ignore_patterns('tfrecords'))
    split, other = replace
    shutil.rmtree(os.path.join(data_dir, split))
    shutil.copytree(os.path.join(tiny_run.data_dir, other), os.path.join(data_dir, split))
    onu_converter.convert(onu_dataset.describe(data_dir), formats=(tiny_run.config.data_format,), num_shards=1,
                          processes=1)
    return data_dir


def test_the_known_threshold_is_fitted_on_the_val_photos_and_only_those(tiny_run, tmp_path):
    path = checkpoint(tiny_run, MAX_STEPS)

    def exported_known(data_dir, known_recall=0.95):
        version_dir = onu_serving.export_saved_model(path, tiny_run.config, str(tmp_path / f'{data_dir}-{known_recall}'),
                                                     known_recall=known_recall, data_dir=data_dir)
        return onu_serving.export_known(onu_serving.load_export_config(version_dir))

    own = exported_known(tiny_run.data_dir)
    assert own == exported_known(_data_copy(tiny_run, tmp_path, 'other_train', ('train', 'val')))  # train: no part
    train_as_val = exported_known(_data_copy(tiny_run, tmp_path, 'train_as_val', ('val', 'train')))
    assert train_as_val['threshold'] != own['threshold'] and train_as_val['val_examples'] == 16
    # A lower recall keeps fewer val photos: a higher threshold.
    lower = exported_known(tiny_run.data_dir, known_recall=0.6)
    assert lower['threshold'] > own['threshold'] and lower['val_known'] < own['val_known']
    assert own['val_known'] >= 0.95 and lower['val_known'] >= 0.6 and lower['known_recall'] == 0.6


def test_an_export_without_val_photos_is_a_clear_error_and_writes_nothing(tiny_run, tmp_path):
    missing = str(tmp_path / 'moved_away')
    with pytest.raises(onu_errors.DataError) as error:
        onu_serving.export_saved_model(checkpoint(tiny_run, MAX_STEPS), tiny_run.config, str(tmp_path / 'export'),
                                       data_dir=missing)
    assert str(error.value) == (f'the model\'s known threshold is fitted on the val split, and there is none at hand '
                                f'({missing}: data dir not found): pass --data_dir=<the training data>')
    assert not os.path.exists(tmp_path / 'export')
