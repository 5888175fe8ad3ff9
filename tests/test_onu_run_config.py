"""Tests of onu_lib/onu_run_config.py: RunConfig saved and loaded, older formats, clear errors."""

import json
import re

import pytest

from test_onu_dataset import _bare_class_folders

from onu_lib import onu_dataset
from onu_lib import onu_errors
from onu_lib import onu_run_config


def test_run_config_round_trips(tmp_path):
    run_config = onu_run_config.RunConfig(model='small', image_size=64, class_names=['F603', 'F663N', 'Ü'],
                                          precision='mixed', compute_dtype='bfloat16', flags={'seed': 0})
    run_config.save(str(tmp_path))
    assert onu_run_config.RunConfig.load(str(tmp_path)) == run_config
    assert onu_run_config.RunConfig.load(str(tmp_path)).flags == {'seed': 0}
    with open(onu_run_config.path_in(str(tmp_path)), encoding='utf-8') as f:
        saved = json.load(f)  # the contract with eval, export and predict: every field, the format, no more
    fields = {name: value for name, value in vars(run_config).items() if name != 'export'}  # export: none here
    assert saved == dict(fields, class_names=['F603', 'F663N', 'Ü'], format_version=onu_run_config.FORMAT_VERSION)
    exported = run_config.replace(export={'step': 6})
    assert (exported.export, run_config.export, exported.model) == ({'step': 6}, None, 'small')
    exported.save(str(tmp_path))
    assert onu_run_config.RunConfig.load(str(tmp_path)).export == {'step': 6}
    assert run_config == onu_run_config.RunConfig.from_dict(dict(saved, class_names=('F603', 'F663N', 'Ü')))
    assert onu_run_config.RunConfig.load(str(tmp_path / 'none')) is None
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        f.write('{not json')
    with pytest.raises(onu_errors.DataError, match='unreadable run configuration'):
        onu_run_config.RunConfig.load(str(tmp_path))


def test_run_config_of_the_previous_format_loads_and_a_newer_one_is_a_clear_error(tmp_path):
    old = {'model': 'small', 'image_size': 32, 'class_names': ['F603', 'F663N'], 'num_classes': 2,
           'num_examples_per_epoch': 8, 'data_dir': '/data', 'data_format': 'encoded', 'max_steps': 6,
           'moving_average_decay': 0.9999, 'flags': {'batch_size': 4}}  # format 1: before mixed precision
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        json.dump(old, f)
    run_config = onu_run_config.RunConfig.load(str(tmp_path))
    assert (run_config.model, run_config.image_size, run_config.num_classes) == ('small', 32, 2)
    assert (run_config.precision, run_config.compute_dtype, run_config.max_steps) == ('float32', 'float32', 6)
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        json.dump(dict(old, format_version=onu_run_config.FORMAT_VERSION + 1), f)
    with pytest.raises(onu_errors.DataError, match='newer than this onu-classifier reads.*upgrade'):
        onu_run_config.RunConfig.load(str(tmp_path))
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        json.dump({'image_size': 32}, f)
    with pytest.raises(onu_errors.DataError, match=f'{re.escape(str(tmp_path))}.*no model'):  # names the file to restore
        onu_run_config.RunConfig.load(str(tmp_path))


def test_a_run_config_of_the_memory_cache_s_old_spelling_loads_as_memory(tmp_path):
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        json.dump({'model': 'small', 'image_size': 32, 'format_version': 3, 'cache_decoded_epoch': 'on'}, f)
    assert onu_run_config.RunConfig.load(str(tmp_path)).cache_decoded_epoch == 'memory'


def test_a_runs_split_is_read_as_the_run_read_it_or_from_the_data_given(make_tiny_dataset):
    photos_dir = _bare_class_folders(make_tiny_dataset, per_class=6)
    run_config = onu_run_config.RunConfig(model='small', image_size=32, data_dir=photos_dir, data_format='images',
                                          layout=onu_dataset.CLASS_FOLDERS, validation_percent=50.0)
    held_out = onu_dataset.describe(photos_dir, 50.0).split('val', 'images')
    default_held_out = onu_dataset.describe(photos_dir).split('val', 'images')
    assert held_out.files != default_held_out.files  # else the run's own percent would go unnoticed
    info = run_config.split_info('val')
    assert (info.files, info.data_format, info.split) == (held_out.files, 'images', 'val')
    other_dir = make_tiny_dataset('other', train_per_class=1, val_per_class=1)
    assert run_config.split_info('val', other_dir).data_dir == other_dir
    given = run_config.split_info('val', data=onu_dataset.describe(photos_dir))
    assert given.files == default_held_out.files
