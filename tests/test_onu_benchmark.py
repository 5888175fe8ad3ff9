"""onu_benchmark.py --quick on tiny generated photos: every row measured, every output written; its parts."""

import dataclasses
import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from conftest import (REPO_ROOT, STUDY_AUGMENTATION_RANGES, assert_spans, colour_effect, layout_photos,
                      mid_colour_image, script_command, write_layout, session_events)
from benchmark import baselines as benchmark_baselines
from benchmark import measure as benchmark_measure
from benchmark import plan as benchmark_plan
from benchmark import report as benchmark_report
from onu_lib import onu_dataset
from onu_lib import onu_hparams
import onu_input

PIPELINE_ROWS = ('images', 'raw', 'encoded', 'serial_cv2', 'keras_reader')
TRAINING_ROWS = ('images', 'raw', 'encoded', 'serial_cv2', 'synthetic')
IMAGE_SIZE = 32
QUICK_SIZE = 64  # the small model's own: training preprocessing is measured at one size (two: see below)


def _numbers(value, path=''):
    """Yields (path, number) for every number nested in value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f'{path}/{key}')
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def own_loopback(command):
    """command in a network namespace of its own where this machine allows it (root): the benchmark counts the bytes
    the loopback carries as the tf.data service's, and other tests' servers on 127.0.0.1 run beside it."""
    if subprocess.run(['unshare', '--net', 'true'], capture_output=True).returncode:
        return command
    return ['unshare', '--net', 'sh', '-c', 'ip link set lo up && exec "$@"', 'sh', *command]


def run_quick_benchmark(data_dir, tmp_path):
    """Runs onu_benchmark.py --quick (small model, 64x64, batch 4) on data_dir; checks it wrote its three outputs.

    Returns (CompletedProcess, the report, its Markdown, its PNG's path).
    """
    output_dir = tmp_path / 'results'
    command = script_command('onu_benchmark.py', '--quick', f'--data_dir={data_dir}', f'--output_dir={output_dir}',
                             f'--work_dir={tmp_path}', f'--image_size={QUICK_SIZE}', '--batch_size=4', '--model=small')
    done = subprocess.run(own_loopback(command), capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = sorted(name for name in os.listdir(output_dir) if not name.endswith('-hparams'))
    assert [os.path.splitext(name)[1] for name in outputs] == ['.json', '.md', '.png']
    assert os.path.isdir(output_dir / (os.path.splitext(outputs[0])[0] + '-hparams'))
    assert (output_dir / outputs[2]).read_bytes().startswith(b'\x89PNG')
    return (done, json.loads((output_dir / outputs[0]).read_text()), (output_dir / outputs[1]).read_text(),
            output_dir / outputs[2])


def test_quick_run_measures_every_row(make_tiny_dataset, tmp_path):
    data_dir = make_tiny_dataset('photos', train_per_class=8, val_per_class=2, image_size=(96, 72))
    done, report, markdown, _ = run_quick_benchmark(data_dir, tmp_path)
    rows = report['rows']
    assert set(rows) == {'images', 'raw', 'encoded', 'serial_cv2', 'keras_layers', 'keras_reader', 'decode_limit',
                         'synthetic', 'encoded_decoding', 'encoded_on_model', 'plain_tf_image', 'study_serial',
                         'inception'}
    for name in PIPELINE_ROWS:
        assert rows[name]['eval_images_per_sec'] > 0 and rows[name]['train_images_per_sec'] > 0, name
    # Without augmentation the two Keras ways are one pipeline, measured once.
    assert rows['keras_layers']['train_images_per_sec'] > 0 and 'eval_images_per_sec' not in rows['keras_layers']
    for name in TRAINING_ROWS + benchmark_plan.SMALL_MODEL_TRAINING_WAYS + ('inception',):
        entry = rows[name]['training']['small']
        assert entry['sec_per_batch'] > 0 and entry['examples_per_sec'] > 0, name
        assert entry['batch_size'] == 4 and entry['image_size'] == QUICK_SIZE
        if name != 'synthetic':
            assert 0 <= entry['input_bound_fraction'] < 1, name
    assert rows['decode_limit']['eval_images_per_sec'] == rows['decode_limit']['cores'] * rows['decode_limit'][
        'single_core_images_per_sec'] > 0
    # The single-core rate was measured in a process pinned to one CPU: it cannot keep two busy.
    assert rows['decode_limit']['single_core_cores_busy'] <= 1.05
    for name in ('raw', 'encoded'):
        assert rows[name]['conversion_seconds'] > 0
    assert rows['raw']['conversion_seconds_1_process'] > 0 and rows['images']['read_seconds'] > 0
    # 16 + 4 photos of 96x72: raw records hold their pixels, encoded ones their bytes (plus metadata).
    assert rows['raw']['pixel_bytes'] == 20 * 96 * 72 * 3 < rows['raw']['disk_bytes']
    assert rows['images']['disk_bytes'] < rows['encoded']['disk_bytes'] < rows['raw']['pixel_bytes']
    for path, number in _numbers(rows):
        if not path.endswith(('input_bound_fraction', 'wait_fraction')):
            assert number > 0, path

    # Training preprocessing at 64 (the pipelines' size here and the small model's): 3 ways x (cached in memory, on
    # disk, decoding, reduced decode, plain tf.image) + on the model + the study's loop + SerialCv2Loader.
    augmentation = report['augmentation']
    assert len(augmentation) == 18
    for size in (QUICK_SIZE,):
        for way in ('images', 'raw', 'encoded'):
            for variant in ('cached', 'disk', 'decoding', 'reduced_decode', 'plain_tf_image'):
                assert augmentation[f'{way} {size} {variant}']['cpu_ms_per_image'] > 0
        for name in ('encoded', 'study_serial', 'serial_cv2'):
            variant = {'encoded': 'on_model'}.get(name, 'serial')
            result = augmentation[f'{name} {size} {variant}']
            assert result['cpu_ms_per_image'] == pytest.approx(1000 * result['cores_busy'] / result['images_per_sec'])
    assert '### Training preprocessing: CPU ms per image' in markdown

    assert report['settings']['models'] == ['small'] and report['data']['photos'] == 20
    # Mixed precision and XLA, model only and end to end, next to float32.
    entries = report['precision']['small']
    assert set(entries) == {f'{way} {variant}' for way in ('synthetic', 'encoded')
                            for variant in ('float32', 'mixed', 'xla')}
    for name, entry in entries.items():
        assert entry['examples_per_sec'] > 0 and np.isfinite(entry['final_loss']), name
    assert '### Precision and XLA' in markdown
    # Where the small model's step time goes, float32 and mixed, at its training size and batch here.
    profile = report['step_profile']
    assert (profile['model'], profile['batch_size'], profile['image_size']) == ('small', 4, QUICK_SIZE)
    for name in ('float32', 'mixed'):
        assert profile[name]['step_ms'] > 0 and profile[name]['traced_steps'] == 2, name
        assert set(profile[name]['kinds_ms']) == set(benchmark_measure.STEP_KINDS), name
    assert '### Where the small model\'s step time goes, float32 vs mixed (model only)' in markdown

    # The same photos as Inception/ImageNet shards (1-based labels, no extension), trained on side by side with
    # the encoded records; and a synthetic set of TF-slim shards found and counted, cold and cached.
    assert set(rows['inception']['side_by_side']) == {'encoded', 'inception'}
    assert rows['inception']['side_by_side']['inception'] == rows['inception']['training']['small']['examples_per_sec']
    assert rows['images']['disk_bytes'] < rows['inception']['disk_bytes'] < 1.2 * rows['encoded']['disk_bytes']
    counting = report['record_counting']
    assert (counting['shards'], counting['records']) == (20, 2000) and counting['cold'] > 0 and counting['cached'] > 0
    assert report['measurements']['count_records cold'][0]['records'] == 2000
    assert 'Finding and counting 20 TF-slim shards of 2,000 records' in markdown

    # The input wait training would log, next to the input-bound fraction (serial loops: fed before each step);
    # and the main job with and without a step traced for it.
    for name in TRAINING_ROWS + benchmark_plan.SMALL_MODEL_TRAINING_WAYS + ('inception',):
        entry = rows[name]['training']['small']
        assert ('wait_fraction' in entry) == (name not in benchmark_plan.FEED_DICT_WAYS), name
        assert ('work_ms_per_batch' in entry) == (name not in benchmark_plan.FEED_DICT_WAYS + ('synthetic',)), name
        assert 0 <= entry.get('wait_fraction', 0) <= 1 and entry.get('work_ms_per_batch', 1) > 0, name
    tracing = report['wait_tracing']
    assert tracing['traced'] > 0 and tracing['untraced'] > 0 and tracing['trace_every'] == 10
    assert '| logged: waiting, input work |' in markdown and 'Measuring what input costs as training logs' in markdown

    # The pipeline here and on a tf.data service worker (started by the benchmark): the worker's CPU and the bytes
    # it sent are counted only where it works; a uint8 image of 64x64 is 12 kB before the service compresses it
    # (float32 would be four times that).
    service = report['data_service']
    for part, size in (('training', QUICK_SIZE), ('pipeline', QUICK_SIZE)):
        assert set(service[part]) == set(benchmark_measure.DATA_SERVICE_PLACEMENTS), part
        assert service[part]['local']['worker_cpu_ms_per_image'] == 0 and service[part]['local']['bytes_per_example'] < 500
        for placement in ('service', 'service_on_model'):
            result = service[part][placement]
            assert result['trainer_cpu_ms_per_image'] > 0 and result['worker_cpu_ms_per_image'] > 0, (part, placement)
            assert 0 < result['bytes_per_example'] < 1.5 * size * size * 3, (part, placement)
    assert '### tf.data service: the pipeline here or on one local service worker' in markdown
    assert f'Cores to feed one H100-class GPU training Inception-ResNet-v2 at {QUICK_SIZE}x{QUICK_SIZE}' in markdown

    # 4 storage + 1 Inception shards written + 2 countings + 9 pipeline (decode limit, 5 ways eval, 3 train)
    # + 18 training preprocessing + 9 training measurements + 2 side by side (Inception shards, wait tracing)
    # + 2 of float32, mixed and XLA side by side + 1 step profile + 1 tf.data service, one repeat each
    assert report['other_processes']['measurements'] == 49 == len(report['measurements'])
    assert report['hardware']['usable_cores'] >= 1 and report['hardware']['cpu_model']
    assert {target['issue'] for target in report['targets']} == {2, 3, 12, 13, 20, 21}  # 7's need Inception-ResNet-v2
    assert all(isinstance(target['passed'], bool) for target in report['targets'])
    assert 'serial cv2 loop + feed_dict' in markdown and '| issue | target | measured | verdict |' in markdown
    assert markdown in done.stdout  # the tables are also printed
    assert [name for name in os.listdir(tmp_path) if name.startswith('onu_benchmark-')] == []  # work folder removed

    # Each training row as a finished HParams session, with its way's settings and the report's figures.
    logdir = tmp_path / 'results' / f'{report["timestamp"]}-hparams'
    assert f'tensorboard --logdir={logdir}' in done.stdout
    assert sorted(os.listdir(logdir)) == sorted(f'{way}-small' for way, row in rows.items() if 'training' in row)
    for way in ('encoded_on_model', 'serial_cv2'):
        (start, settings), end = session_events(str(logdir / f'{way}-small'))
        assert (start, end) == ('start', ('end', 'success'))
        assert settings == onu_hparams.as_shown(dict(benchmark_plan.TRAINING_WAY_SETTINGS[way], model='small',
                                                     image_size=QUICK_SIZE, batch_size=4, replicas=1,
                                                     precision='float32'))
        entry = rows[way]['training']['small']
        scalars = {value.tag: value.simple_value for name in os.listdir(logdir / f'{way}-small')
                   for event in tf.compat.v1.train.summary_iterator(str(logdir / f'{way}-small' / name))
                   for value in event.summary.value if value.HasField('simple_value')}
        assert scalars[onu_hparams.EXAMPLES_PER_SEC_TAG] == pytest.approx(entry['examples_per_sec'], rel=1e-6)
        assert (onu_hparams.WAIT_FRACTION_TAG in scalars) == (way not in benchmark_plan.FEED_DICT_WAYS)


def test_training_preprocessing_is_measured_and_tabled_at_the_pipelines_size_and_the_small_models():
    assert benchmark_plan.augmentation_sizes(299) == (299, 64) and benchmark_plan.augmentation_sizes(64) == (64,)
    # A figure per way, variant and size, each its own number: the table puts each in its row and column.
    augmentation = {f'{way} {size} {variant}': {'cpu_ms_per_image': index + size / 1000, 'images_per_sec': 100 + index}
                    for index, (way, variant) in enumerate([(way, variant) for way in benchmark_plan.TF_DATA_WAYS
                                                            for variant in benchmark_plan.AUGMENTATION_VARIANTS])
                    for size in (32, 64)}
    table = benchmark_report.augmentation_table({'settings': {'image_size': 32}, 'augmentation': augmentation})
    lines = table.splitlines()
    assert lines[0].strip(' |').split(' | ')[1:] == ['32x32', '64x64']
    rows = [line.strip(' |').split(' | ') for line in lines[2:]]
    assert len(rows) == len(augmentation) // 2
    for way in benchmark_plan.TF_DATA_WAYS:
        for variant in benchmark_plan.AUGMENTATION_VARIANTS:
            cells = [f'{augmentation[f"{way} {size} {variant}"]["cpu_ms_per_image"]:.2f} '
                     f'({augmentation[f"{way} {size} {variant}"]["images_per_sec"]:.0f})' for size in (32, 64)]
            assert [row[0] for row in rows if row[1:] == cells] == [row[0] for row in rows if row[0].startswith(
                f'{way}, ')][benchmark_plan.AUGMENTATION_VARIANTS.index(variant):][:1], (way, variant)


def test_every_training_way_has_the_settings_of_a_training_run_fed_that_way():
    ways = (benchmark_plan.TRAINING_WAYS + benchmark_plan.SMALL_MODEL_TRAINING_WAYS + benchmark_plan.LAYOUT_WAYS)
    assert set(benchmark_plan.TRAINING_WAY_SETTINGS) == set(ways)
    choices = {setting.name: setting.choices for setting in onu_hparams.SETTINGS}
    for way, settings in benchmark_plan.TRAINING_WAY_SETTINGS.items():
        for name, value in settings.items():
            assert name in choices and (choices[name] is None or value in choices[name]), (way, name)


def test_a_folder_of_records_is_measured_in_the_formats_it_holds(tmp_path):
    photos = layout_photos(train=6)
    study = write_layout('single_file', str(tmp_path / 'study'), photos, data_format='raw')
    write_layout('single_file', study, photos, data_format='encoded')
    done, report, markdown, _ = run_quick_benchmark(study, tmp_path)
    assert (report['kind'], report['layout'], report['data']['records']) == ('records', 'single_file', 18)
    rows = report['rows']
    assert set(rows) == {'encoded', 'raw', 'synthetic'}
    for data_format in ('encoded', 'raw'):
        assert rows[data_format]['eval_images_per_sec'] > 0 and rows[data_format]['train_images_per_sec'] > 0
        assert rows[data_format]['disk_bytes'] == os.path.getsize(
            os.path.join(study, f'603_663_train_{"raw" if data_format == "raw" else "g"}.tfrecord'))
        assert 0 <= rows[data_format]['training']['small']['input_bound_fraction'] < 1
    assert rows['raw']['disk_bytes'] > rows['encoded']['disk_bytes']
    assert '### Feeding modes compared: small' in markdown and markdown in done.stdout
    assert report['record_counting']['records'] == 2000 and len(report['measurements']) == 2 + 4 + 3


def _augmented_copies(layer, image, copies=300):
    """Returns (copies of image, the layer's output on them), each copy augmented with its own draw."""
    batch = np.repeat(image[np.newaxis], copies, axis=0)
    return batch, np.asarray(layer(batch, training=True))


@pytest.fixture(scope='module')
def keras_layers():
    """The Keras baseline's augmentation layers by name."""
    return benchmark_baselines.keras_augmentation_layers()


def test_keras_baseline_draws_the_same_colour_ranges_per_image(keras_layers):
    image = mid_colour_image()
    for name in ('brightness', 'contrast', 'saturation', 'hue'):
        before, after = _augmented_copies(keras_layers[name], image)
        assert_spans(colour_effect(name, before, after), *STUDY_AUGMENTATION_RANGES[name], name)


@pytest.mark.parametrize('baseline', [lambda: benchmark_baselines.plain_tf_image_augmentations(IMAGE_SIZE),
                                      benchmark_baselines.keras_augmentation_layers],
                         ids=['plain_tf_image', 'keras_layers'])
def test_baselines_implement_every_augmentation_or_say_which_in_one_line(baseline, monkeypatch):
    assert list(baseline()) == list(onu_input.augmentation_names())
    added = dataclasses.replace(onu_input.AUGMENTATIONS[0], name='added_later')
    monkeypatch.setattr(onu_input, 'AUGMENTATIONS', onu_input.AUGMENTATIONS + (added,))
    with pytest.raises(NotImplementedError) as error:
        baseline()
    assert 'added_later' in str(error.value) and '\n' not in str(error.value)


def test_keras_baseline_rotates_up_to_the_same_angle(keras_layers):
    # A white square rotated uncovers grey corners; the uncovered share grows with the angle.
    image = np.ones((64, 64, 3), np.float32)
    _, rotated = _augmented_copies(keras_layers['rotation'], image)
    uncovered = (rotated < 0.75).all(axis=-1).mean(axis=(1, 2))
    rotation_only = onu_input.AugmentOptions({'rotation'})
    at_max_angle = onu_input.augment_batch(tf.constant(np.full((1, 64, 64, 3), 255, np.uint8)),
                                           tf.ones([1, onu_input.NUM_DRAWS]), rotation_only)
    at_max = ((at_max_angle.numpy()[0] + 1.0) / 2.0 < 0.75).all(axis=-1).mean()
    assert 0.8 * at_max < uncovered.max() <= 1.1 * at_max, (uncovered.max(), at_max)
    assert uncovered.min() < 0.1 * at_max and np.mean(uncovered < 0.5 * at_max) > 0.3


def test_serial_cv2_baseline_matches_the_pipeline(tiny_data_dir):
    with tf.Graph().as_default():  # the 4 val photos: the eval pipeline's one batch
        with tf.compat.v1.Session() as sess:
            reference, reference_labels = sess.run(onu_input.next_batch(onu_input.eval_batches(
                onu_dataset.describe(tiny_data_dir).split('val', 'images'), 4, IMAGE_SIZE)))
    with tf.Graph().as_default():
        loader = benchmark_baselines.SerialCv2Loader(tiny_data_dir, 'val', batch_size=4, image_size=IMAGE_SIZE)
        feeds = list(loader.feed_dicts(epochs=1))
        with tf.compat.v1.Session() as sess:
            images, labels = sess.run((loader.images, loader.labels), feeds[0])
    assert len(feeds) == 1 and images.shape == (4, IMAGE_SIZE, IMAGE_SIZE, 3)
    np.testing.assert_array_equal(labels, reference_labels)
    assert np.abs(images - reference).mean() / 2.0 < 2.0 / 255.0  # RGB like the pipeline, not BGR


def test_op_kinds_cover_tensorflow_and_onednn_op_types():
    kinds = {op_type: benchmark_measure.op_kind(op_type) for op_type in (
        'Conv2D', '_MklNativeConv2D', '_MklNativeFusedConv2D', 'Conv2DBackpropInput',
        '_MklNativeConv2DBackpropInput', 'Conv2DBackpropFilter', '_MklNativeConv2DBackpropFilter',
        'DepthwiseConv2dNativeBackpropFilter', 'FusedBatchNormV3', '_MklNativeFusedBatchNormEx',
        '_MklNativeFusedBatchNormGradV3', 'MaxPoolGrad', 'Cast', 'ResourceApplyMomentum')}
    assert kinds == {
        'Conv2D': 'forward_conv', '_MklNativeConv2D': 'forward_conv', '_MklNativeFusedConv2D': 'forward_conv',
        'Conv2DBackpropInput': 'input_gradient_conv', '_MklNativeConv2DBackpropInput': 'input_gradient_conv',
        'Conv2DBackpropFilter': 'weight_gradient_conv', '_MklNativeConv2DBackpropFilter': 'weight_gradient_conv',
        'DepthwiseConv2dNativeBackpropFilter': 'weight_gradient_conv', 'FusedBatchNormV3': 'batch_norm',
        '_MklNativeFusedBatchNormEx': 'batch_norm', '_MklNativeFusedBatchNormGradV3': 'batch_norm',
        'MaxPoolGrad': 'other', 'Cast': 'other', 'ResourceApplyMomentum': 'other'}


def test_step_profile_measures_every_kind_in_float32_and_mixed(tiny_data_dir):
    photos = onu_dataset.describe(tiny_data_dir).split('train', 'images')
    profile = benchmark_measure.measure_step_profile('small', lambda way: photos, batch_size=4,
                                                     image_size=IMAGE_SIZE, warmup=1, steps=2)
    assert profile['compute_dtypes'] == {'float32': 'float32', 'mixed': 'bfloat16'}
    for name in ('float32', 'mixed'):
        entry = profile[name]
        assert list(entry['kinds_ms']) == list(benchmark_measure.STEP_KINDS), name
        assert all(ms > 0 for ms in entry['kinds_ms'].values()), (name, entry['kinds_ms'])
        assert entry['ops_ms'] == pytest.approx(sum(entry['kinds_ms'].values()))
        assert entry['ops_ms'] == pytest.approx(sum(entry['op_types_ms'].values()))
        assert entry['step_ms'] > 0 and entry['traced_steps'] == 2 and entry['timed_steps'] == 2
    # The rewrite ran: the mixed step computes its convolutions in bfloat16, the float32 step nothing.
    assert profile['float32']['bfloat16_op_types'] == []
    assert sum(benchmark_measure.op_kind(op_type) == 'forward_conv'
               for op_type in profile['mixed']['bfloat16_op_types']) >= 1

    table = benchmark_report.step_profile_table(profile).splitlines()
    assert len(table) == 2 + len(benchmark_measure.STEP_KINDS) + 2  # header, rule, kinds, all ops, whole step
    assert table[-1].startswith('| whole step') and 'weight-gradient convolutions' in table[4]
    summary = benchmark_report.step_profile_summary(profile)
    assert summary.startswith('With the bfloat16 rewrite the whole step takes')
    assert all(benchmark_report.STEP_KIND_TITLES[kind].split(' (')[0] in summary
               for kind in benchmark_measure.STEP_KINDS)
