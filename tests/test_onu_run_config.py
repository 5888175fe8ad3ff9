"""Tests of onu_lib/onu_run_config.py: RunConfig saved and loaded, older formats, clear errors."""

import json

import pytest

from onu_lib import onu_dataset
from onu_lib import onu_run_config


def test_run_config_round_trips(tmp_path):
    run_config = onu_run_config.RunConfig(model='small', image_size=64, class_names=['F603', 'F663N', 'Ü'],
                                          precision='mixed', compute_dtype='bfloat16', flags={'seed': 0})
    run_config.save(str(tmp_path))
    assert onu_run_config.RunConfig.load(str(tmp_path)) == run_config
    assert onu_run_config.RunConfig.load(str(tmp_path)).flags == {'seed': 0}
    assert onu_run_config.RunConfig.load(str(tmp_path / 'none')) is None
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        f.write('{not json')
    with pytest.raises(onu_dataset.DataError, match='unreadable run configuration'):
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
    with pytest.raises(onu_dataset.DataError, match='newer than this onu-classifier reads.*upgrade'):
        onu_run_config.RunConfig.load(str(tmp_path))
    with open(onu_run_config.path_in(str(tmp_path)), 'w') as f:
        json.dump({'image_size': 32}, f)
    with pytest.raises(onu_dataset.DataError, match='no model'):
        onu_run_config.RunConfig.load(str(tmp_path))
