"""Tests of onu_predict.py: conftest's shared tiny run (its checkpoints and exports) on good and bad photos.

The run's newest export and its latest checkpoint are both of step 12; an older export is of step 8.
"""
import io
import json
import os
import re
import shutil

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

from conftest import LAYOUT_CLASSES, layout_photos, run_script, write_layout
from test_onu_export import eval_graph_softmax

from onu_lib import onu_converter
from onu_lib import onu_dataset
from onu_lib import onu_photos
import onu_predict
from onu_lib import onu_serving
from onu_lib import onu_tflite
from onu_lib import onu_unrelated_photos

CLASS_NAMES = ['F603', 'F663N']


@pytest.fixture(scope='module')
def model(tiny_run):
    """The shared run's train_dir: checkpoints up to step 12, exported at 4, 8 and 12 to train_dir/export."""
    return tiny_run.train_dir


def version(model, step):
    """Returns the exported version folder of step."""
    return os.path.join(onu_serving.default_export_dir(model), str(step))


def predict(paths, model_dir, **options):
    """Runs onu_predict.predict in-process; returns (exit code, stdout lines, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    code = onu_predict.predict(list(paths), model_dir, out=out, err=err, **options)
    return code, out.getvalue().splitlines(), err.getvalue().splitlines()


UNKNOWN_LINE = re.compile(r'^unknown \(closest: (.+), (\d\.\d\d)\)$')


def text_row(line):
    """(path, class name, probability, known) of a text output line: `path<TAB>class<TAB>probability`, or
    `path<TAB>unknown (closest: class, probability)`."""
    path, *fields = line.split('\t')
    if len(fields) == 2:
        return path, fields[0], float(fields[1]), True
    closest = UNKNOWN_LINE.match(fields[0])
    assert closest and len(fields) == 1, line
    return path, closest.group(1), float(closest.group(2)), False


def unknown_summary(unknown, classified):
    """The last stderr line of a calibrated model's run."""
    return f'{unknown} of {classified} photos unknown: not like the val photos of any class the model knows'


def predicted_probabilities(paths, model_dir):
    """Returns {path: [probability per class]} of the images at paths, from --json output."""
    code, lines, _ = predict(paths, model_dir, as_json=True)
    assert code == 0
    results = [json.loads(line) for line in lines]
    return {result['path']: [result['probabilities'][name] for name in CLASS_NAMES]
            for result in results if 'error' not in result}


def write_undecodable_jpeg(path):
    """Writes a JPEG whose header Pillow accepts but whose scan TensorFlow cannot decode."""
    buffer = io.BytesIO()
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    Image.fromarray(image).save(buffer, 'JPEG', quality=90)
    data = buffer.getvalue()
    scan = data.find(b'\xff\xda')
    with open(path, 'wb') as f:
        f.write(data[:scan + 2] + b'\x00\x02' + bytes(50) + b'\xff\xd9')  # a bogus scan header length


@pytest.fixture
def photo_folder(messy_data_dir, tmp_path):
    """A copy of the messy photos plus a JPEG that only TensorFlow's decoder rejects."""
    folder = str(tmp_path / 'photos')
    shutil.copytree(os.path.join(messy_data_dir, 'train', 'F603'), folder)
    write_undecodable_jpeg(os.path.join(folder, 'scan_damaged.jpg'))
    return folder


def tflite_model(tiny_tflite_of, format_name):
    """The .tflite of format_name converted from the shared run's newest export (a copy of version 12)."""
    return onu_tflite.tflite_path(tiny_tflite_of('small'), format_name)


@pytest.mark.parametrize('kind', ['saved_model', 'int8'])
def test_bad_files_get_one_error_line_each_and_the_rest_are_classified(model, tiny_tflite_of, kind, photo_folder,
                                                                       messy_files):
    missing = os.path.join(photo_folder, 'not_there.jpg')
    model_dir = version(model, 12) if kind == 'saved_model' else tflite_model(tiny_tflite_of, kind)
    code, lines, errors = predict([photo_folder, missing], model_dir, batch_size=3)

    assert code == 0
    usable = sorted(os.path.join(photo_folder, name) for name, reason in messy_files.items()
                    if reason is None) + [os.path.join(photo_folder, 'subfolder', 'more.jpg')]
    rows = [text_row(line) for line in lines]
    assert sorted(path for path, _, _, _ in rows) == sorted(usable)
    for _, class_name, probability, _ in rows:
        assert class_name in CLASS_NAMES and 0.5 <= probability <= 1.0
    reasons = dict(line[len('error: '):].split(': ', 1) for line in errors if line.startswith('error: '))
    assert len(reasons) == 5 and errors[0].startswith('Classifying with the ')
    if kind == 'saved_model':  # int8 has no known score: no count of the unknown
        assert len(errors) == 7 and errors[-1] == unknown_summary(sum(not known for _, _, _, known in rows), len(rows))
    else:
        assert len(errors) == 6
    assert reasons[missing] == 'no such file or folder'
    assert reasons[os.path.join(photo_folder, 'empty.jpg')] == 'empty file'
    assert reasons[os.path.join(photo_folder, 'notes.txt')].startswith('not an image')
    assert reasons[os.path.join(photo_folder, 'truncated.jpg')].startswith('damaged JPEG file')
    assert reasons[os.path.join(photo_folder, 'scan_damaged.jpg')].startswith('cannot be decoded (')
    assert all('\n' not in reason and len(reason) < 300 for reason in reasons.values())


def test_predictions_equal_the_eval_softmax_on_the_same_photos(model, tiny_run, messy_data_dir, tmp_path):
    data_dir = str(tmp_path / 'data')
    shutil.copytree(messy_data_dir, data_dir)
    onu_converter.convert(onu_dataset.describe(data_dir), formats=('encoded',), num_shards=1, processes=1)
    info = onu_dataset.describe(data_dir).split('train', 'encoded')
    temperature = onu_serving.export_known(onu_serving.load_export_config(version(model, 12)))['temperature']
    expected, _ = eval_graph_softmax(os.path.join(model, 'model.ckpt-12'), tiny_run.config.moving_average_decay,
                                     data_dir, 'encoded', 'train', temperature=temperature)
    filenames = [tf.train.Example.FromString(record.numpy()).features.feature[onu_dataset.KEY_FILENAME]
                 .bytes_list.value[0].decode() for record in tf.data.TFRecordDataset(list(info.files))]
    assert 'train/F603/exif_rotated.jpg' in filenames and len(filenames) == len(expected)

    predicted = predicted_probabilities([os.path.join(data_dir, 'train')], version(model, 12))

    for filename, probabilities in zip(filenames, expected):
        np.testing.assert_allclose(predicted[os.path.join(data_dir, filename)], probabilities, atol=1e-5,
                                   err_msg=filename)


def test_export_folder_uses_the_newest_version_and_train_dir_its_latest_checkpoint(model, messy_data_dir):
    photos = [os.path.join(messy_data_dir, 'val', name, 'plain.jpg') for name in CLASS_NAMES]
    def probabilities(model_dir):
        predicted = predicted_probabilities(photos, model_dir)
        assert list(predicted) == photos
        return np.array(list(predicted.values()))
    newest = probabilities(version(model, 12))
    np.testing.assert_allclose(probabilities(onu_serving.default_export_dir(model)), newest, atol=1e-6)
    np.testing.assert_allclose(probabilities(model), newest, atol=1e-5)  # built from the checkpoint
    assert np.abs(probabilities(version(model, 8)) - newest).max() > 1e-4


def test_nothing_classified_exits_1_and_a_bad_model_dir_exits_2(model, photo_folder, tmp_path):
    code, lines, errors = predict([os.path.join(photo_folder, 'empty.jpg')], version(model, 12))
    assert (code, lines) == (1, [])
    assert errors == [f'Classifying with the SavedModel {version(model, 12)}',
                      f'error: {photo_folder}/empty.jpg: empty file',
                      'error: none of the 1 paths could be classified']

    code, _, errors = predict([photo_folder], str(tmp_path))
    assert code == 2
    assert errors == [f'error: {tmp_path}: neither a SavedModel, nor a folder of exported versions, nor a '
                      f'training run, nor a .tflite file; pass --model_dir=<train_dir>/export (after python '
                      f'onu_export.py) or the --train_dir of onu_train.py']
    assert predict([], version(model, 12))[0] == 2


@pytest.mark.parametrize('format_name, atol', [('float32', 0.01), ('int8', 0.08)])
def test_a_tflite_model_classifies_upright_photos_as_its_saved_model_does(model, tiny_tflite_of, messy_data_dir,
                                                                         format_name, atol, capfd):
    folder = os.path.join(messy_data_dir, 'train')
    expected = predicted_probabilities([folder], version(model, 12))
    assert os.path.join(folder, 'F603', 'exif_rotated.jpg') in expected  # turned upright by both

    capfd.readouterr()
    code, lines, errors = predict([folder], tflite_model(tiny_tflite_of, format_name))
    assert 'XNNPACK' not in capfd.readouterr().err  # LiteRT's note on its CPU delegate, dropped
    assert code == 0 and errors[0] == f'Classifying with the TensorFlow Lite model ' \
                                      f'{tflite_model(tiny_tflite_of, format_name)} (LiteRT)'
    rows = {path: (name, probability) for path, name, probability, _ in map(text_row, lines)}
    assert rows.keys() == expected.keys()
    for path, (name, probability) in rows.items():
        # Rounded to uint8 pixels first, as an app feeds them: close to the SavedModel's float pixels, not equal.
        assert abs(probability - max(expected[path])) <= atol, path
        if abs(expected[path][0] - expected[path][1]) > 2 * atol:
            assert name == CLASS_NAMES[int(np.argmax(expected[path]))], path


def test_a_damaged_tflite_file_is_one_line(tiny_tflite_of, photo_folder, tmp_path):
    damaged = str(tmp_path / 'model_int8.tflite')
    with open(tflite_model(tiny_tflite_of, 'int8'), 'rb') as f:
        data = f.read()
    with open(damaged, 'wb') as f:
        f.write(data[:len(data) // 3])  # a copy cut short
    code, lines, errors = predict([photo_folder], damaged)
    assert (code, lines) == (2, [])
    assert len(errors) == 1 and errors[0].startswith(f'error: {damaged}: cannot load the model (')
    assert errors[0].endswith('); export it again with python onu_export.py, or pass another --model_dir')


def test_script_prints_json_lines_and_errors(model, photo_folder):
    good, empty = os.path.join(photo_folder, 'plain.jpg'), os.path.join(photo_folder, 'empty.jpg')
    result = run_script('onu_predict.py', good, empty, f'--model_dir={onu_serving.default_export_dir(model)}',
                        '--json', '--batch_size=2')

    assert result.returncode == 0, result.stderr[-2000:]
    classified, failed = [json.loads(line) for line in result.stdout.splitlines()]
    assert classified['path'] == good and classified['class_name'] in CLASS_NAMES
    assert classified['probability'] == max(classified['probabilities'].values())
    assert sum(classified['probabilities'].values()) == pytest.approx(1.0, abs=1e-6)
    assert failed == {'path': empty, 'error': 'empty file'}
    assert f'error: {empty}: empty file' in result.stderr.splitlines()
    assert f'Classifying with the SavedModel {version(model, 12)}\n' in result.stderr  # the newest


def test_a_run_on_inception_records_exports_and_predicts_what_eval_saw(tmp_path):
    """Labels 1-based in the records: training, eval, export and predict agree on the classes (run_config.json)."""
    photos = layout_photos()
    data_dir = write_layout('inception', str(tmp_path / 'data'), photos)
    train_dir, eval_dir = str(tmp_path / 'train'), str(tmp_path / 'eval')
    for script, *args in (('onu_train.py', f'--data_dir={data_dir}', f'--train_dir={train_dir}', '--max_steps=6',
                           '--image_size=32', '--batch_size=6', '--model=small', '--learning_rate=0.05'),
                          ('onu_eval.py', f'--checkpoint_dir={train_dir}', f'--eval_dir={eval_dir}', '--run_once',
                           '--max_mistakes=100'),
                          ('onu_export.py', f'--checkpoint_dir={train_dir}')):
        done = run_script(script, *args)
        assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(open(os.path.join(eval_dir, 'results.jsonl')).readline())
    photo_dir = str(tmp_path / 'val')
    os.makedirs(photo_dir)
    val = {photo.name: photo for photo in photos if photo.split == 'val'}
    for name, photo in val.items():
        with open(os.path.join(photo_dir, name), 'wb') as f:
            f.write(photo.data)
    code, lines, _ = predict([photo_dir], onu_serving.default_export_dir(train_dir), as_json=True)
    assert code == 0
    predicted = {os.path.basename(result['path']): result for result in map(json.loads, lines)}
    assert all(sorted(result['probabilities']) == list(LAYOUT_CLASSES) for result in predicted.values())
    wrong = sorted(name for name, result in predicted.items() if result['class_name'] != LAYOUT_CLASSES[val[name].label])
    assert wrong == sorted(record['misclassified'])
    assert np.trace(np.array(record['confusion_matrix'])) == len(val) - len(wrong)


def test_images_over_the_models_pixel_limit_are_refused_before_pillow_decodes_them(model, tiny_run, tmp_path):
    # An export with a small limit: onu_predict applies the limit the export records to Pillow's header read.
    limit = 53 * 37
    version_dir = onu_serving.export_saved_model(os.path.join(model, 'model.ckpt-12'), tiny_run.config,
                                                 str(tmp_path / 'export'), max_image_pixels=limit)
    rng = np.random.default_rng(0)
    for name, (width, height) in {'at_limit.png': (53, 37), 'over.png': (54, 37), 'over.gif': (37, 54),
                                  'over.bmp': (60, 60)}.items():
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(tmp_path / name)
    paths = [str(tmp_path / name) for name in ('at_limit.png', 'over.png', 'over.gif', 'over.bmp')]
    code, lines, errors = predict(paths, version_dir)
    assert code == 0
    assert [line.split('\t')[0] for line in lines] == paths[:1]
    assert errors[1:-1] == [
        f'error: {paths[1]}: too many pixels: 54 x 37 = 1998 pixels, over the limit of {limit} '
        f'(onu_export.py --max_image_pixels)',
        f'error: {paths[2]}: too many pixels: 37 x 54 = 1998 pixels, over the limit of {limit} '
        f'(onu_export.py --max_image_pixels)',
        f'error: {paths[3]}: too many pixels: 60 x 60 = 3600 pixels, over the limit of {limit} '
        f'(onu_export.py --max_image_pixels)']


def test_the_default_limit_is_one_value_for_pillow_and_the_graph(model, huge_png):
    assert onu_predict.Classifier(None, None, None, [], '').max_image_pixels == onu_photos.MAX_IMAGE_PIXELS
    assert onu_serving.export_max_image_pixels(None) == onu_photos.MAX_IMAGE_PIXELS  # an export without the entry
    code, _, errors = predict([huge_png], version(model, 12))
    assert code == 1
    # Pillow's own decompression-bomb check refuses this one as it opens it (over twice its 89 M): the size is not
    # read, the pixel count and the limit are named.
    assert errors[1] == (f'error: {huge_png}: too many pixels: 529000000 pixels (size not read: Pillow refuses to '
                         f'open it), over the limit of {onu_photos.MAX_IMAGE_PIXELS} (onu_export.py --max_image_pixels)')


@pytest.fixture(scope='module')
def half_known(model, tiny_run, tmp_path_factory):
    """An export of step 12 whose known threshold keeps only 60% of the val photos (some are unknown)."""
    return onu_serving.export_saved_model(os.path.join(model, 'model.ckpt-12'), tiny_run.config,
                                          str(tmp_path_factory.mktemp('half_known')), known_recall=0.6)


def test_every_output_says_known_and_an_unknown_photo_names_its_closest_class(half_known, tiny_run, tmp_path):
    # Photos the threshold was not fitted on: the train split's, and some that are not ONUs.
    photos = str(tmp_path / 'photos')
    shutil.copytree(os.path.join(tiny_run.data_dir, 'train'), photos)
    onu_unrelated_photos.write_unrelated_photos(photos, 2, kinds=('noise', 'flat', 'face'))
    code, lines, errors = predict([photos], half_known, as_json=True)
    assert code == 0
    results = {result['path']: result for result in map(json.loads, lines)}
    assert all(isinstance(result['known'], bool) and isinstance(result['known_score'], float)
               for result in results.values())
    unknown = sorted(path for path, result in results.items() if not result['known'])
    assert 0 < len(unknown) < len(results) == 22
    threshold = onu_serving.export_known(onu_serving.load_export_config(half_known))['threshold']
    assert all((result['known_score'] >= threshold) == result['known'] for result in results.values())
    assert errors[-1] == unknown_summary(len(unknown), 22)

    code, lines, errors = predict([photos], half_known)
    assert code == 0 and errors[-1] == unknown_summary(len(unknown), 22)
    for line in lines:
        path, name, probability, known = text_row(line)
        assert known == results[path]['known'] and name == results[path]['class_name']
        assert probability == pytest.approx(results[path]['probability'], abs=0.005 if known else 0.0051)
    assert sorted(line.split('\t')[0] for line in lines if '\tunknown (closest: ' in line) == unknown


@pytest.mark.parametrize('kind', ['train_dir'] + list(onu_tflite.TFLITE_FORMAT_NAMES))
def test_a_train_dir_and_every_tflite_format_with_a_known_score_say_known_too(model, tiny_tflite_of, tiny_run, kind):
    model_dir = model if kind == 'train_dir' else tflite_model(tiny_tflite_of, kind)
    code, lines, errors = predict([os.path.join(tiny_run.data_dir, 'val')], model_dir, as_json=True)
    results = [json.loads(line) for line in lines]
    assert code == 0 and len(results) == 8
    if kind != 'train_dir' and not onu_tflite.tflite_format(kind).known:  # int8: classes only, as before
        assert all('known' not in result for result in results) and len(errors) == 1
        return
    assert all(isinstance(result['known'], bool) and isinstance(result['known_score'], float) for result in results)
    assert errors[-1] == unknown_summary(sum(not result['known'] for result in results), 8)


@pytest.fixture(scope='module')
def old_export(model, tiny_run, tmp_path_factory):
    """Step 12 exported as before there was a calibration: no known outputs, no known entry in its metadata; and its
    float32 .tflite beside it."""
    version_dir = str(tmp_path_factory.mktemp('old_export') / '12')
    onu_serving._write_saved_model(version_dir, os.path.join(model, 'model.ckpt-12'), tiny_run.config, False,
                                   onu_photos.MAX_IMAGE_PIXELS, None)
    onu_serving._write_metadata(version_dir, tiny_run.config, {'global_step': 12, 'weights': 'moving_averages'})
    onu_tflite.write_tflite(version_dir, 'float32', tiny_run.config)
    return version_dir


@pytest.mark.parametrize('kind', ['saved_model', 'tflite'])
def test_an_export_from_before_the_calibration_still_predicts_as_before(old_export, model, tiny_run, kind):
    model_dir = old_export if kind == 'saved_model' else onu_tflite.tflite_path(old_export, 'float32')
    assert not os.path.exists(onu_tflite.known_path(onu_tflite.tflite_path(old_export, 'float32')))
    val = os.path.join(tiny_run.data_dir, 'val')
    code, lines, errors = predict([val], model_dir)
    assert code == 0 and len(errors) == 1 and errors[0].startswith('Classifying with the ')  # no unknown count
    assert all(len(line.split('\t')) == 3 for line in lines) and len(lines) == 8
    results = [json.loads(line) for line in predict([val], model_dir, as_json=True)[1]]
    assert all('known' not in result and 'known_score' not in result for result in results)
    # Untempered probabilities: the eval graph's softmax.
    expected, _ = eval_graph_softmax(os.path.join(model, 'model.ckpt-12'), tiny_run.config.moving_average_decay,
                                     tiny_run.data_dir)
    got = np.array([[result['probabilities'][name] for name in CLASS_NAMES] for result in results])
    np.testing.assert_allclose(got, expected, atol=1e-5 if kind == 'saved_model' else 0.01)
