"""Tests of make_sample_data: layout, determinism, re-run behaviour, and that classes differ in shape only."""

import os

import numpy as np
import pytest
from PIL import Image

from conftest import run_script

from onu_lib import onu_errors
from onu_lib import onu_sample_data
from onu_lib import onu_dataset

SCRIPT = 'make_sample_data.py'


def _files(data_dir):
    """{relative path: bytes} of every photo under data_dir/train and data_dir/val."""
    found = {}
    for split in onu_dataset.SPLITS:
        for root, _, names in os.walk(os.path.join(data_dir, split)):
            for name in names:
                path = os.path.join(root, name)
                with open(path, 'rb') as f:
                    found[os.path.relpath(path, data_dir)] = f.read()
    return found


def test_layout_sizes_and_jpeg_files(tmp_path):
    data_dir = str(tmp_path / 'data')
    info = onu_sample_data.generate_dataset(data_dir, 3, 2, photo_size=(96, 72), seed=1, processes=1)
    assert info['generated'] and info['files'] == 10
    assert onu_dataset.find_class_names(data_dir) == ['F603', 'F663N']
    for split, count in (('train', 3), ('val', 2)):
        for class_name in onu_sample_data.SAMPLE_CLASS_NAMES:
            names = sorted(os.listdir(os.path.join(data_dir, split, class_name)))
            assert names == [f'{i:05d}.jpg' for i in range(count)]
            for name in names:
                with Image.open(os.path.join(data_dir, split, class_name, name)) as image:
                    assert (image.format, image.mode, image.size) == ('JPEG', 'RGB', (96, 72))
    assert sum(len(data) for data in _files(data_dir).values()) == info['bytes']
    assert sorted(os.listdir(data_dir)) == [onu_sample_data.SAMPLE_INFO_FILENAME, 'train', 'val']


def test_same_seed_same_bytes_for_any_process_count(tmp_path):
    first = str(tmp_path / 'one')
    second = str(tmp_path / 'two')
    other_seed = str(tmp_path / 'three')
    onu_sample_data.generate_dataset(first, 2, 1, photo_size=(64, 48), seed=5, processes=1)
    onu_sample_data.generate_dataset(second, 2, 1, photo_size=(64, 48), seed=5, processes=2)
    onu_sample_data.generate_dataset(other_seed, 2, 1, photo_size=(64, 48), seed=6, processes=1)
    assert _files(first) == _files(second)
    first_files, other_files = _files(first), _files(other_seed)
    assert first_files.keys() == other_files.keys()
    assert all(first_files[name] != other_files[name] for name in first_files)


def test_rerun_is_noop_and_foreign_data_is_refused(tmp_path):
    data_dir = str(tmp_path / 'data')
    onu_sample_data.generate_dataset(data_dir, 1, 1, photo_size=(64, 48), processes=1)
    before = {p: os.stat(os.path.join(data_dir, p)).st_mtime_ns for p in _files(data_dir)}
    again = onu_sample_data.generate_dataset(data_dir, 1, 1, photo_size=(64, 48), processes=1)
    assert not again['generated']
    assert {p: os.stat(os.path.join(data_dir, p)).st_mtime_ns for p in _files(data_dir)} == before
    with pytest.raises(onu_errors.DataError) as error:
        onu_sample_data.generate_dataset(data_dir, 2, 1, photo_size=(64, 48), processes=1)
    assert 'other settings' in str(error.value) and data_dir in str(error.value)
    user_dir = tmp_path / 'photos'
    (user_dir / 'train' / 'router').mkdir(parents=True)
    (user_dir / 'train' / 'router' / 'mine.jpg').write_bytes(b'precious')
    with pytest.raises(onu_errors.DataError) as error:
        onu_sample_data.generate_dataset(str(user_dir), 1, 1, photo_size=(64, 48), processes=1)
    assert 'nothing was changed' in str(error.value)
    assert (user_dir / 'train' / 'router' / 'mine.jpg').read_bytes() == b'precious'
    assert sorted(os.listdir(user_dir)) == ['train']


def _global_statistics(data_dir, split):
    """Per image [mean brightness, mean R, mean G, mean B, brightness std], and the labels."""
    features, labels = [], []
    images, _ = onu_dataset.list_split_images(data_dir, split, list(onu_sample_data.SAMPLE_CLASS_NAMES))
    for info in images:
        pixels = np.asarray(Image.open(info.path), dtype=np.float32)
        brightness = pixels.mean(axis=2)
        features.append([brightness.mean(), *pixels.mean(axis=(0, 1)), brightness.std()])
        labels.append(info.label)
    return np.array(features), np.array(labels)


def _threshold_accuracy(train_values, train_labels, test_values, test_labels):
    """Test accuracy of the best one-feature threshold rule fitted on the training values."""
    best_accuracy, best_rule = -1.0, None
    for threshold in train_values:
        for sign in (1, -1):
            accuracy = np.mean((sign * (train_values - threshold) > 0) == train_labels)
            if accuracy > best_accuracy:
                best_accuracy, best_rule = accuracy, (threshold, sign)
    threshold, sign = best_rule
    return np.mean((sign * (test_values - threshold) > 0) == test_labels)


def test_classes_not_separable_by_global_colour_or_brightness(tmp_path):
    data_dir = str(tmp_path / 'data')
    onu_sample_data.generate_dataset(data_dir, 60, 60, photo_size=(160, 120), seed=3, processes=1)
    train_features, train_labels = _global_statistics(data_dir, 'train')
    test_features, test_labels = _global_statistics(data_dir, 'val')
    accuracies = [_threshold_accuracy(train_features[:, i], train_labels, test_features[:, i], test_labels)
                  for i in range(train_features.shape[1])]
    # 120 test images: chance is 0.5 +- 0.046; a real colour cue would give far more than 0.65.
    assert max(accuracies) < 0.65, accuracies
    centroids = [train_features[train_labels == c, 1:4].mean(axis=0) for c in (0, 1)]
    nearest = np.argmin([np.linalg.norm(test_features[:, 1:4] - c, axis=1) for c in centroids], axis=0)
    assert np.mean(nearest == test_labels) < 0.65


def test_script_runs_and_reports_bad_flags(tmp_path):
    data_dir = str(tmp_path / 'data')
    args = [f'--data_dir={data_dir}', '--train_per_class=1', '--val_per_class=1', '--photo_size=64x48',
            '--processes=1']
    first = run_script(SCRIPT, *args, timeout=120)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith('wrote 4 photos')
    second = run_script(SCRIPT, *args, timeout=120)
    assert second.returncode == 0 and 'nothing to do' in second.stdout
    bad = run_script(SCRIPT, *args[:-2], '--photo_size=64by48', timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.startswith('error: ') and bad.stderr.count('\n') == 1 and '--photo_size' in bad.stderr


def test_old_flag_spellings_still_work_with_a_deprecation_warning(tmp_path):
    data_dir = str(tmp_path / 'data')
    old = run_script(SCRIPT, f'--output_dir={data_dir}', '--train_per_class=1', '--val_per_class=1',
                     '--image_size=64x48', '--processes=1', timeout=120)
    assert old.returncode == 0, old.stderr
    assert old.stdout.startswith('wrote 4 photos') and data_dir in old.stdout
    warnings = [line for line in old.stderr.splitlines() if line.startswith('warning: ')]
    assert warnings == ['warning: --output_dir is deprecated and will be removed: use --data_dir',
                        'warning: --image_size is deprecated and will be removed: use --photo_size']
    with Image.open(next(os.path.join(root, name) for root, _, names in os.walk(os.path.join(data_dir, 'train'))
                         for name in names)) as image:
        assert image.size == (64, 48)
    both = run_script(SCRIPT, f'--output_dir={data_dir}', f'--data_dir={tmp_path}/other', timeout=120)
    assert both.returncode == 2 and both.stderr.startswith('error: --output_dir (deprecated) and --data_dir disagree')
