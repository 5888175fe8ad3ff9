"""onu_benchmark.py --quick on tiny generated photos: every row measured, every output written."""

import json
import os
import subprocess
import sys

from conftest import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, 'onu_benchmark.py')
PIPELINE_ROWS = ('images', 'raw', 'encoded', 'serial_cv2', 'keras_baseline')
TRAINING_ROWS = ('images', 'raw', 'encoded', 'serial_cv2', 'synthetic')


def _numbers(value, path=''):
    """Yields (path, number) for every number nested in value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f'{path}/{key}')
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def test_quick_run_measures_every_row(make_tiny_dataset, tmp_path):
    data_dir = make_tiny_dataset('photos', train_per_class=8, val_per_class=2, image_size=(96, 72))
    output_dir = tmp_path / 'results'
    done = subprocess.run(
        [sys.executable, SCRIPT, '--quick', f'--data_dir={data_dir}', f'--output_dir={output_dir}',
         f'--work_dir={tmp_path}', '--image_size=32', '--batch_size=4', '--model=small'],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    outputs = sorted(os.listdir(output_dir))
    assert [os.path.splitext(name)[1] for name in outputs] == ['.json', '.md', '.png']
    report = json.loads((output_dir / outputs[0]).read_text())
    rows = report['rows']
    assert set(rows) == {'images', 'raw', 'encoded', 'serial_cv2', 'keras_baseline', 'decode_limit', 'synthetic'}
    for name in PIPELINE_ROWS:
        assert rows[name]['eval_images_per_sec'] > 0 and rows[name]['train_images_per_sec'] > 0, name
    for name in TRAINING_ROWS:
        entry = rows[name]['training']['small']
        assert entry['sec_per_batch'] > 0 and entry['examples_per_sec'] > 0, name
        assert entry['batch_size'] == 4 and entry['image_size'] == 32
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
        if not path.endswith('input_bound_fraction'):
            assert number > 0, path

    assert report['settings']['models'] == ['small'] and report['data']['photos'] == 20
    # 4 storage + 11 pipeline (decode limit, 5 ways x eval/train) + 5 training measurements, one repeat each
    assert report['other_processes']['measurements'] == 20 == len(report['measurements'])
    assert report['hardware']['usable_cores'] >= 1 and report['hardware']['cpu_model']
    assert {target['issue'] for target in report['targets']} == {2, 3}  # issue 7's targets need Inception-ResNet-v2
    assert all(isinstance(target['passed'], bool) for target in report['targets'])
    markdown = (output_dir / outputs[1]).read_text()
    assert 'serial cv2 loop + feed_dict' in markdown and '| issue | target | measured | verdict |' in markdown
    assert markdown in done.stdout  # the tables are also printed
    assert (output_dir / outputs[2]).read_bytes().startswith(b'\x89PNG')
    assert [name for name in os.listdir(tmp_path) if name.startswith('onu_benchmark-')] == []  # work folder removed
