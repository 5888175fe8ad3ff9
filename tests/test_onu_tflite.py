"""Tests of onu_tflite and onu_export.py --tflite: the real converter and the LiteRT interpreter on conftest's tiny runs.

tiny_tflite_of(model) is a copy of the model's newest export with a .tflite of every format, converted once per
session; the script tests convert again only where the script's own path (calibration photos, errors) is the point.
"""
import glob
import os
import shutil
import subprocess

from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter
import numpy as np
import pytest
import tensorflow as tf

from conftest import TINY_RUN_STEPS, file_states, mount, read_only_bind_mount, run_script, script_tested_models
from test_onu_export import serve

from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_serving
from onu_lib import onu_tflite
from onu_lib import onu_unrelated_photos
import onu_input

FORMATS = onu_tflite.TFLITE_FORMAT_NAMES
# How far each format's probabilities may be from the SavedModel's on the same pixels: float16 rounds the weights
# (about 3 significant digits), int8 the weights and every activation (256 levels each).
TOLERANCE = {'float32': 1e-5, 'float16': 5e-3, 'int8': 0.06}
# The type each format stores its weights in (the constant tensors of the file).
WEIGHTS = {'float32': 'float32', 'float16': 'float16', 'int8': 'int8'}


def interpreter(path):
    """A LiteRT interpreter of the .tflite at path, tensors allocated, on one thread."""
    model = Interpreter(model_path=path, num_threads=1)
    model.allocate_tensors()
    return model


def run_tflite(path, pixels, output=onu_serving.OUTPUT_PROBABILITIES):
    """Returns an output (probabilities [n, classes], known_score [n]) of the .tflite at path for uint8 pixels
    [n, size, size, 3], one at a time."""
    model = interpreter(path)
    index = onu_tflite.output_details(model)[output]['index']
    rows = []
    for image in pixels:
        model.set_tensor(model.get_input_details()[0]['index'], image[np.newaxis])
        model.invoke()
        rows.append(model.get_tensor(index)[0])
    return np.array(rows)


def photo_pixels(path, image_size):
    """uint8 pixels of the photo at path as eval preprocesses it, decoded on its own."""
    return onu_input.to_pixels(onu_input.preprocess_for_eval(
        onu_input.decode_image_bytes(tf.io.read_file(path)), image_size)).numpy()


def split_pixels(run, split):
    """uint8 pixels of every example of a split of the run's data, as eval preprocesses them, in eval's order."""
    info = onu_dataset.describe(run.data_dir).split(split, run.config.data_format)
    return onu_input.eval_pixels(info, run.config.image_size, info.num_examples)[0]


def converted(tiny_run_of, tiny_tflite_of, model_name, format_name):
    """(the tiny run of model_name, its export's version folder with every .tflite, the .tflite of format_name)."""
    version_dir = tiny_tflite_of(model_name)
    return tiny_run_of(model_name), version_dir, onu_tflite.tflite_path(version_dir, format_name)


@pytest.mark.parametrize('model_name', script_tested_models())
@pytest.mark.parametrize('format_name', FORMATS)
def test_every_format_takes_uint8_pixels_and_gives_the_saved_models_probabilities(tiny_run_of, tiny_tflite_of,
                                                                                 model_name, format_name):
    run, version_dir, path = converted(tiny_run_of, tiny_tflite_of, model_name, format_name)
    model = interpreter(path)
    size = run.config.image_size
    (given,), outputs = model.get_input_details(), onu_tflite.output_details(model)
    assert (given['dtype'], list(given['shape'])) == (np.uint8, [1, size, size, 3])
    known = {'known_score': (np.float32, [1])} if onu_tflite.tflite_format(format_name).known else {}
    assert {name: (output['dtype'], list(output['shape'])) for name, output in outputs.items()} == {
        'probabilities': (np.float32, [1, 2]), **known}
    assert os.path.exists(onu_tflite.known_path(path)) == bool(known)

    pixels = split_pixels(run, 'val')
    served = serve(version_dir, onu_serving.PIXELS_SIGNATURE, pixels=pixels)
    got = run_tflite(path, pixels)
    np.testing.assert_allclose(got.sum(axis=1), 1, atol=1e-2)  # probabilities, not logits
    np.testing.assert_allclose(got, served['probabilities'], atol=TOLERANCE[format_name])
    with open(os.path.join(version_dir, onu_tflite.LABELS_FILENAME), encoding='utf-8') as f:
        assert f.read() == 'F603\nF663N\n'  # output i is line i


def assert_rejects(scores, threshold, rejected):
    """The scores below threshold are rejected photos in number, but for ties at the threshold (int8's score takes 256
    values), which are kept."""
    below, at = int(np.sum(scores < threshold)), int(np.sum(scores == threshold))
    assert below == rejected or (at > 1 and below < rejected < below + at), (below, at, rejected)


# How far each format's known score may be from the SavedModel's (standardized units: the threshold is a few below 0).
KNOWN_TOLERANCE = {'float32': 1e-3, 'float16': 0.1}
KNOWN_FORMATS = tuple(entry.name for entry in onu_tflite.TFLITE_FORMATS if entry.known)


@pytest.mark.parametrize('model_name', script_tested_models())
@pytest.mark.parametrize('format_name', KNOWN_FORMATS)
def test_every_format_scores_known_as_its_saved_model_and_rejects_as_many_val_photos(tiny_run_of, tiny_tflite_of,
                                                                                    model_name, format_name):
    run, version_dir, path = converted(tiny_run_of, tiny_tflite_of, model_name, format_name)
    pixels, _ = onu_serving.known_val_pixels(run.config)  # what the threshold was fitted on
    served = serve(version_dir, onu_serving.PIXELS_SIGNATURE, pixels=pixels)
    scores = run_tflite(path, pixels, onu_serving.OUTPUT_KNOWN_SCORE)
    np.testing.assert_allclose(scores, served['known_score'], atol=KNOWN_TOLERANCE[format_name])
    known = onu_tflite.read_known(path)
    export = onu_serving.export_known(onu_serving.load_export_config(version_dir))
    assert known['saved_model_threshold'] == export['threshold'] and known['score'] == export['score']
    assert_rejects(scores, known['threshold'], int(np.sum(served['known_score'] < export['threshold'])))
    np.testing.assert_array_equal(served['known'], served['known_score'] >= export['threshold'])


@pytest.mark.parametrize('model_name', script_tested_models())
def test_the_pixels_signature_scales_inside_as_eval_does(tiny_run_of, model_name):
    run = tiny_run_of(model_name)
    version_dir = os.path.join(run.export_dir, str(TINY_RUN_STEPS))
    pixels = split_pixels(run, 'val')
    from_pixels = serve(version_dir, onu_serving.PIXELS_SIGNATURE, pixels=pixels)
    from_images = serve(version_dir, onu_serving.IMAGES_SIGNATURE,
                        images=(pixels.astype(np.float32) / 255 * 2 - 1))  # README: 0 -> -1, 255 -> 1
    np.testing.assert_allclose(from_pixels['probabilities'], from_images['probabilities'], atol=1e-5)
    np.testing.assert_array_equal(from_pixels['class_names'], from_images['class_names'])


def stored_weights(path):
    """Returns {numpy dtype: bytes} of the weights stored in the .tflite at path (its tensors with data in the file)."""
    with open(path, 'rb') as f:
        model = schema.Model.GetRootAs(f.read())
    names = {getattr(schema.TensorType, name): name.lower() for name in dir(schema.TensorType) if name.isupper()}
    stored = {}
    for index in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(index)
        for tensor in (subgraph.Tensors(i) for i in range(subgraph.TensorsLength())):
            size = model.Buffers(tensor.Buffer()).DataLength()
            if size:
                dtype = np.dtype(names[tensor.Type()])
                stored[dtype] = stored.get(dtype, 0) + size
    return stored


@pytest.mark.parametrize('model_name', script_tested_models())
@pytest.mark.parametrize('format_name', FORMATS)
def test_each_format_stores_its_weights_in_its_type_at_its_share_of_the_float32_size(tiny_tflite_of, model_name,
                                                                                     format_name):
    version_dir = tiny_tflite_of(model_name)
    path = onu_tflite.tflite_path(version_dir, format_name)
    stored = stored_weights(path)
    promised = np.dtype(WEIGHTS[format_name])
    assert stored.get(promised, 0) >= 0.99 * sum(stored.values()), stored  # int8: its biases are int32
    assert not [dtype for dtype in stored if dtype.kind == 'f' and dtype != promised], stored
    # float16 is half the float32 file, int8 (no known score: its constants are not in the file) a quarter of the
    # SavedModel's weights: the weights are nearly all of a file.
    if onu_tflite.tflite_format(format_name).known:
        reference = os.path.getsize(onu_tflite.tflite_path(version_dir, 'float32'))
    else:
        variables = os.path.join(version_dir, 'variables')
        reference = sum(os.path.getsize(os.path.join(variables, name)) for name in os.listdir(variables))
    share = os.path.getsize(path) / reference
    assert share == pytest.approx(promised.itemsize / 4, abs=0.05)


@pytest.mark.parametrize('model_name', script_tested_models())
def test_int8_computes_in_integers(tiny_tflite_of, model_name):
    version_dir = tiny_tflite_of(model_name)
    tensors = interpreter(onu_tflite.tflite_path(version_dir, 'int8')).get_tensor_details()
    kinds = [tensor['dtype'] for tensor in tensors]
    assert kinds.count(np.int8) >= 0.7 * len(kinds) and kinds.count(np.float32) <= 3  # pixels in, probabilities out


def test_eval_pixels_are_eval_preprocessed_photos_spread_over_the_split(tiny_run):
    info = onu_dataset.describe(tiny_run.data_dir).split('train', 'images')
    size = tiny_run.config.image_size
    pixels, labels = onu_input.eval_pixels(info, size, 8)  # 8 of 16 photos: every other one, both classes

    assert pixels.shape == (8, size, size, 3) and pixels.dtype == np.uint8
    np.testing.assert_array_equal(pixels, [photo_pixels(path, size) for path in info.files[::2]])
    assert labels.tolist() == list(info.labels[::2]) and set(labels.tolist()) == {0, 1}


def test_int8_calibrates_on_every_train_photo_and_no_val_photo(tiny_run):
    size = tiny_run.config.image_size
    # As many as there are: the run's records (its data format) decode to the photos' pixels.
    pixels = onu_tflite.calibration_pixels(tiny_run.config, tiny_run.data_dir, 1000)
    photos = {split: {photo_pixels(path, size).tobytes()
                      for path in glob.glob(os.path.join(tiny_run.data_dir, split, '*', '*.jpg'))}
              for split in ('train', 'val')}
    assert len(photos['train']) == 16 and len(photos['val']) == 8 and not photos['train'] & photos['val']
    split_of = {image: split for split, images in photos.items() for image in images}
    assert [split_of.get(image.tobytes(), 'neither') for image in pixels] == ['train'] * 16
    assert len({image.tobytes() for image in pixels}) == 16  # each once


def test_to_pixels_inverts_the_model_range():
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    scaled = onu_input.pixels_to_model_range(pixels)
    assert float(tf.reduce_min(scaled)) == -1.0 and float(tf.reduce_max(scaled)) == 1.0
    np.testing.assert_array_equal(onu_input.to_pixels(scaled), pixels)


@pytest.fixture
def export_copy(tiny_run, tmp_path):
    """A copy of the shared run's train_dir without its exports, whose export_dir is tmp_path/export."""
    train_dir = str(tmp_path / 'train')
    shutil.copytree(tiny_run.train_dir, train_dir, ignore=shutil.ignore_patterns('export'))
    return train_dir


@pytest.mark.script
def test_export_script_writes_a_calibrated_int8_model_beside_the_saved_model(tiny_run, export_copy, tmp_path):
    export_dir = str(tmp_path / 'export')
    result = run_script('onu_export.py', f'--checkpoint_dir={export_copy}', f'--export_dir={export_dir}',
                        '--tflite=int8', '--calibration_examples=4')
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ''  # the converter's own lines are dropped
    version_dir = os.path.join(export_dir, str(TINY_RUN_STEPS))
    path = os.path.join(version_dir, 'model_int8.tflite')
    assert sorted(os.listdir(version_dir)) == ['assets.extra', 'labels.txt', 'model_int8.tflite', 'saved_model.pb',
                                               'variables']  # int8 has no known score (onu_tflite.TFLITE_FORMATS)
    assert f'Wrote {path} (int8, calibrated on 4 train photos, ' in result.stdout
    assert 'uint8 pixels 32x32 in, probabilities out' in result.stdout
    # The model is the one calibrated on the 4 train photos calibration_pixels picks, converted here again.
    calibration = onu_tflite.calibration_pixels(tiny_run.config, tiny_run.data_dir, 4)
    with open(path, 'rb') as f:
        assert f.read() == onu_tflite.convert(version_dir, 'int8', tiny_run.config.image_size, calibration), (
            'not the model calibrated on those train photos')

    # Another format for the same version: the SavedModel is kept, the new .tflite added.
    before = file_states(version_dir)
    again = run_script('onu_export.py', f'--checkpoint_dir={export_copy}', f'--export_dir={export_dir}',
                       '--tflite=float16')
    assert again.returncode == 0, again.stderr[-3000:]
    assert 'its SavedModel is left unchanged' in again.stdout
    assert {name: state for name, state in file_states(version_dir).items() if name in before} == before
    assert os.path.isfile(os.path.join(version_dir, 'model_float16.tflite'))
    assert 'uint8 pixels 32x32 in, probabilities and known_score out' in again.stdout
    assert onu_tflite.read_known(os.path.join(version_dir, 'model_float16.tflite'))['score'] == 'layer_distance'


@pytest.mark.script
def test_int8_without_train_photos_is_one_line_and_writes_nothing(export_copy, tmp_path):
    export_dir = str(tmp_path / 'export')
    missing = str(tmp_path / 'moved_away')
    result = run_script('onu_export.py', f'--checkpoint_dir={export_copy}', f'--export_dir={export_dir}',
                        '--tflite=int8', f'--data_dir={missing}')
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f'error: --tflite=int8 calibrates on photos of the train split, and there are none at hand ({missing}: data '
        f'dir not found): pass --data_dir=<the training data>, or choose --tflite=float16 (no calibration)']
    assert not os.path.exists(export_dir)


@pytest.mark.script
def test_a_read_only_export_folder_is_one_line(tiny_run, tmp_path):
    version_dir = str(tmp_path / 'export' / str(TINY_RUN_STEPS))
    shutil.copytree(os.path.join(tiny_run.export_dir, str(TINY_RUN_STEPS)), version_dir)
    mounted = str(tmp_path / 'mounted')
    with read_only_bind_mount(str(tmp_path / 'export'), mounted):
        before = file_states(version_dir)
        result = run_script('onu_export.py', f'--checkpoint_dir={tiny_run.train_dir}', f'--export_dir={mounted}',
                            '--tflite=float32')
        assert result.returncode == 1
        assert result.stderr.splitlines() == [
            f'error: {mounted}: the file system is read-only (exporting); make {mounted} writable, or use another '
            f'folder, then run the same command again']
        assert file_states(version_dir) == before


def test_a_tflite_is_written_whole_or_not_at_all_and_an_existing_one_is_kept(tiny_run, tmp_path):
    """README: a .tflite is renamed into place when complete; an existing one is left as it is."""
    source = os.path.join(tiny_run.export_dir, str(TINY_RUN_STEPS))
    val_pixels = onu_serving.known_val_pixels(tiny_run.config)[0]
    saved_model_bytes = sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(source)
                            for name in names)
    small = str(tmp_path / 'small')  # room for the SavedModel, not for its float32 .tflite beside it
    mount(small, '-t', 'tmpfs', '-o', f'size={saved_model_bytes + (256 << 10)}', 'tmpfs')
    try:
        version_dir = os.path.join(small, str(TINY_RUN_STEPS))
        shutil.copytree(source, version_dir)
        before = sorted(os.listdir(version_dir))
        with pytest.raises(OSError):
            onu_tflite.write_tflite(version_dir, 'float32', tiny_run.config, val_pixels=val_pixels)
        assert sorted(os.listdir(version_dir)) == before  # no .tflite cut short, no threshold, no temporary file
    finally:
        subprocess.run(['umount', small], check=True)
    version_dir = str(tmp_path / str(TINY_RUN_STEPS))
    shutil.copytree(source, version_dir)
    path = onu_tflite.tflite_path(version_dir, 'float32')
    with open(path, 'wb') as f:
        f.write(b'a model the user made')
    assert onu_tflite.write_tflite(version_dir, 'float32', tiny_run.config, val_pixels=val_pixels) == path
    with open(path, 'rb') as f:
        assert f.read() == b'a model the user made'


def test_an_export_without_the_pixels_signature_is_one_line(tmp_path):
    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def double(self, x):
            return {'y': 2 * x}
    module = Doubler()
    old = str(tmp_path / 'old')
    tf.saved_model.save(module, old, signatures={'serving_default': module.double})
    with pytest.raises(onu_errors.DataError) as error:
        onu_tflite.convert(old, 'float32', 32)
    assert str(error.value) == (f'{old}: no predict_pixels signature (exported before it existed); export the '
                                f'checkpoint again into another --export_dir')


def test_unknown_format_names_the_choices():
    with pytest.raises(ValueError, match="unknown TensorFlow Lite format 'int4'; choose one of float32, float16, int8"):
        onu_tflite.tflite_format('int4')


@pytest.mark.parametrize('format_name', KNOWN_FORMATS)
def test_a_tflite_threshold_rejects_as_many_photos_as_the_saved_models_does(tiny_run, tiny_tflite_of, tmp_path,
                                                                          format_name):
    # Photos some of which the SavedModel rejects: the train split's, and some that are not ONUs.
    version_dir = tiny_tflite_of('small')
    size = tiny_run.config.image_size
    unrelated = onu_unrelated_photos.write_unrelated_photos(str(tmp_path), 3, kinds=('noise', 'flat', 'face'))
    pixels = np.concatenate([split_pixels(tiny_run, 'train'), np.stack(
        [photo_pixels(path, size) for paths in unrelated.values() for path in paths])])
    export = onu_serving.export_known(onu_serving.load_export_config(version_dir))
    rejected = int(np.sum(serve(version_dir, onu_serving.PIXELS_SIGNATURE, pixels=pixels)['known_score']
                          < export['threshold']))
    assert 0 < rejected < len(pixels)
    with open(onu_tflite.tflite_path(version_dir, format_name), 'rb') as f:
        model = f.read()
    known = onu_tflite.tflite_known(version_dir, model, pixels)
    scores = onu_tflite.known_scores(model, pixels)
    assert_rejects(scores, known['threshold'], rejected)
    assert known['val_known'] == pytest.approx(np.mean(scores >= known['threshold']))
